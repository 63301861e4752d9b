"""Reads through the status index: what the coordinator dispatches, and bounded counts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from coworker.model import TaskModel, TaskStatus


def due(status: TaskStatus, now: datetime, limit: int) -> Iterator[TaskModel]:
    """Tasks in ``status`` whose ``due_at`` has passed, oldest first, at most ``limit``.

    One key-condition query on the index (eventually consistent, as every GSI read is); it
    reads only the items it returns, however large the backlog.
    """
    if limit <= 0:
        return iter(())
    return TaskModel.status_index.query(
        status.value,
        range_key_condition=TaskModel.due_at <= now,
        scan_index_forward=True,
        limit=limit,
        page_size=limit,
    )


def count_running(now: datetime) -> int:
    """How many tasks hold a live lock, exactly.

    ``Select=COUNT`` queries stop at 1 MB of index data per page, so this pages on until
    DynamoDB has no more to say; it reads every live lock's index entry (as many as
    ``max_concurrency``, each a couple of hundred bytes).
    """
    return TaskModel.status_index.count(TaskStatus.PROCESSING.value, TaskModel.due_at > now)
