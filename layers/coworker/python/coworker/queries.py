"""Reads through the status index: what the coordinator dispatches, and bounded counts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from pynamodb.constants import CAMEL_COUNT, COUNT

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


def count_running(now: datetime, limit: int) -> int:
    """How many tasks hold a live lock, counting at most ``limit``: one Query request.

    ``Model.count(limit=...)`` is not bounded (with Select=COUNT no items come back, so
    pynamodb keeps paging), hence the single low-level request: DynamoDB's ``Limit`` caps the
    items it evaluates, so the read never exceeds ``limit`` index items.
    """
    response = TaskModel._get_connection().query(
        TaskStatus.PROCESSING.value,
        range_key_condition=TaskModel.due_at > now,
        index_name=TaskModel.status_index.Meta.index_name,
        limit=limit,
        select=COUNT,
    )
    return int(response[CAMEL_COUNT])
