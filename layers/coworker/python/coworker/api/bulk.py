"""Bulk actions: retry or cancel every task that matches a filter, a bounded page at a time.

A filter names one status (an index partition set, read oldest first) and optionally a task
type, a batch and a window on ``created_at``. Each page reads some index entries (type and batch
are filtered by DynamoDB, ``created_at``, which the index does not carry, by one BatchGetItem of
the candidates), then applies the action to each match with the same conditional writes as the
single-task routes (:func:`coworker.engine.redrive.retry_all`, :func:`coworker.engine.lifecycle.cancel`).

Re-running is safe: an action moves a task out of the status it was found in (retry: to
``todo``; cancel: to ``ignored``), so a second run, or a run resumed from an older cursor, finds
only what it has not changed yet; a task that changed state between the read and the write is
counted as skipped, never changed twice. A dry run reads the same pages and writes nothing.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from datetime import datetime

from coworker.config import Settings
from coworker.data import writes
from coworker.data.models import TaskModel, TaskStatus
from coworker.engine import lifecycle, redrive

# Writes sent at once by one page of a bulk action.
WRITE_THREADS = 8


class BulkAction(enum.StrEnum):
    RETRY = "retry"
    CANCEL = "cancel"


# The statuses each action can start from (the single-task routes accept the same).
ACTION_STATUSES: dict[BulkAction, tuple[str, ...]] = {
    BulkAction.RETRY: lifecycle.REDRIVABLE,
    BulkAction.CANCEL: tuple(status.value for status in TaskStatus.open()),
}


@dataclasses.dataclass(frozen=True)
class TaskFilter:
    """Which tasks a bulk action touches: one status, and optionally type, batch and a window on
    ``created_at`` (``created_after`` <= created_at < ``created_before``)."""

    status: str
    task_type: str | None = None
    batch_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None

    @property
    def by_creation(self) -> bool:
        return self.created_after is not None or self.created_before is not None

    def created_in_window(self, created_at: datetime | None) -> bool:
        if created_at is None:
            return False
        if self.created_after is not None and created_at < self.created_after:
            return False
        return self.created_before is None or created_at < self.created_before


@dataclasses.dataclass(frozen=True)
class PageOutcome:
    matched: int  # tasks of the page that match the whole filter
    changed: int  # of those, changed by this call (0 in a dry run)
    skipped: int  # matched, but changed state before the write reached them
    unreached: int = 0  # matched, but not written within the request's window (writes were slow)


def check_action(action: BulkAction, status: str) -> None:
    """Raise ValueError, worded for a person, if ``action`` cannot start from ``status``."""
    allowed = ACTION_STATUSES[action]
    if status not in allowed:
        names = f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1 else allowed[0]
        raise ValueError(f"{action.value} applies to {names} tasks, not {status}")


def matching(tasks: Sequence[TaskModel], task_filter: TaskFilter) -> list[TaskModel]:
    """The index entries of ``tasks`` that also fall in the filter's ``created_at`` window
    (one eventually consistent BatchGetItem of the candidates' creation times, when there is a
    window; type, batch and status were already matched by the index read)."""
    if not task_filter.by_creation or not tasks:
        return list(tasks)
    created = {item.key: item.created_at for item in TaskModel.batch_get(
        [task.key for task in tasks], attributes_to_get=["key", "created_at"])}
    return [task for task in tasks if task_filter.created_in_window(created.get(task.key))]


def apply(action: BulkAction, tasks: Sequence[TaskModel], task_filter: TaskFilter, settings: Settings,
          *, dry_run: bool = False, reason: str = "in bulk", window: writes.Window | None = None) -> PageOutcome:
    """Apply ``action`` to the entries of one page that match ``task_filter``, within ``window``
    if given (the tasks not reached in it are counted apart); ``dry_run`` only counts them."""
    check_action(action, task_filter.status)
    matched = matching(tasks, task_filter)
    if dry_run or not matched:
        return PageOutcome(matched=len(matched), changed=0, skipped=0)

    if action is BulkAction.RETRY:
        redriven, unreached = redrive.retry_all(matched, settings, window=window)
        changed = len(redriven)
    else:
        def cancel(task: TaskModel) -> bool:
            return lifecycle.cancel(task.key, settings, reason=reason) is not None

        outcomes, unreached = writes.each_within(cancel, matched, WRITE_THREADS, window)
        changed = sum(1 for outcome in outcomes if outcome)
    return PageOutcome(matched=len(matched), changed=changed, skipped=len(matched) - changed - unreached,
                       unreached=unreached)
