"""Redrives: a failed or ignored task runs again, and its batch waits to count it.

A redrive is :func:`coworker.engine.lifecycle.retry` (one conditional write per task) followed,
for each batch the redriven tasks belong to, by :func:`coworker.engine.batches.settle`, so that
the batch cannot read done before the stream follower has counted the redrives.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from coworker.config import Settings
from coworker.data import writes
from coworker.data.models import TaskModel, utcnow
from coworker.engine import batches, lifecycle

# Writes sent at once by one redrive of many tasks.
WRITE_THREADS = 8


def retry(key: str, settings: Settings, reason: str = "through the API") -> TaskModel | None:
    """Redrive one task; ``None`` if it is not failed or ignored."""
    task = lifecycle.retry(key, settings, reason)
    if task is not None and task.batch_id:
        batches.settle(task.batch_id)
    return task


def retry_all(tasks: Sequence[TaskModel], settings: Settings, reason: str = "in bulk through the API",
              window: writes.Window | None = None) -> tuple[list[TaskModel], int]:
    """Redrive each of ``tasks`` (index entries: key and batch id), WRITE_THREADS at a time, within
    ``window`` if given; returns the tasks redriven (the others had left failed and ignored
    meanwhile) and how many were not reached in the window. Each batch touched is settled once;
    one with a redrive still under way, as of when it may land (PUT_WINDOW_SECONDS)."""
    def redrive_one(task: TaskModel) -> list[TaskModel]:
        redriven = lifecycle.retry(task.key, settings, reason)
        return [] if redriven is None else [redriven]

    outcomes, unreached = writes.each_within(redrive_one, tasks, WRITE_THREADS, window)
    redriven = [task for outcome in outcomes for task in outcome or ()]
    later = utcnow() + timedelta(seconds=batches.PUT_WINDOW_SECONDS)
    pending = {entry.batch_id for entry, outcome in zip(tasks, outcomes, strict=True)
               if outcome is None and entry.batch_id}
    for batch_id in sorted({task.batch_id for task in redriven if task.batch_id} | pending):
        batches.settle(batch_id, at=later if batch_id in pending else None)
    return redriven, unreached
