"""Redrives: a failed or ignored task runs again, and its batch waits to count it.

A redrive is :func:`coworker.engine.lifecycle.retry` (one conditional write per task) followed,
for each batch the redriven tasks belong to, by :func:`coworker.engine.batches.settle`, so that
the batch cannot read done before the stream follower has counted the redrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from coworker.config import Settings
from coworker.data.models import TaskModel
from coworker.engine import batches, lifecycle

# Writes sent at once by one redrive of many tasks.
WRITE_THREADS = 8


def retry(key: str, settings: Settings, reason: str = "through the API") -> TaskModel | None:
    """Redrive one task; ``None`` if it is not failed or ignored."""
    task = lifecycle.retry(key, settings, reason)
    if task is not None and task.batch_id:
        batches.settle(task.batch_id)
    return task


def retry_all(keys: Sequence[str], settings: Settings, reason: str = "in bulk through the API") -> list[TaskModel]:
    """Redrive each of ``keys`` (WRITE_THREADS at a time); the tasks redriven (the others had left
    failed and ignored meanwhile). Each batch touched is settled once."""
    if not keys:
        return []
    with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(keys)), thread_name_prefix="coworker-redrive") as pool:
        redriven = [task for task in pool.map(lambda key: lifecycle.retry(key, settings, reason), keys)
                    if task is not None]
    for batch_id in sorted({task.batch_id for task in redriven if task.batch_id}):
        batches.settle(batch_id)
    return redriven
