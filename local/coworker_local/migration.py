"""Moving an existing table onto the current index layout.

Every indexed item (a task with a ``due_at``, or a worker slot) must carry the ``status_shard``
its key and status call for. Items written by a release before the sharded index have none, and
lowering ``COWORKER_STATUS_SHARDS`` leaves items in shards nobody reads any more: in both cases
the coordinator cannot see them until :func:`reshard` gives them the right value. Raising the
shard count needs nothing (each item moves on its next write; every shard below the new count is
read). Running it twice changes nothing the second time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from coworker.data import layout, writes
from coworker.data.layout import SLOT_STATUS
from coworker.data.models import TaskModel
from coworker.engine import control


@dataclasses.dataclass
class ReshardReport:
    scanned: int = 0  # indexed items looked at
    moved: int = 0  # items given their shard (or that would be, in a dry run)
    changed_meanwhile: int = 0  # items another writer moved first (already right)


def expected_shard(key: str, status: str, current: str | None = None, task_type: str | None = None) -> str:
    """The ``status_shard`` an item of this key and status must carry (a task held while its
    type is paused stays held, in the held partition of its shard; a blocked task stays blocked)."""
    if status == SLOT_STATUS:
        return SLOT_STATUS
    if control.is_held(current) and task_type is not None:
        return control.held_value(task_type, key)
    if current and current.startswith(layout.BLOCKED_PREFIX):
        return current  # waiting for a place in its concurrency group: one partition per group, not sharded
    return TaskModel.shard_value_of(key, status)


def reshard(dry_run: bool = False, progress: Callable[[ReshardReport], None] | None = None,
            segment: int | None = None, total_segments: int | None = None) -> ReshardReport:
    """Give every indexed item of the bound table the shard the current layout wants.

    One scan of the table (keys, status and shard of the items that have a ``due_at``), and one
    conditional UpdateItem per item to move, conditional on its status being the one just read:
    an item a worker wrote in between already carries the right shard and is left alone.
    ``segment`` / ``total_segments`` split the scan between parallel runs.
    """
    report = ReshardReport()
    items = TaskModel.scan(
        filter_condition=TaskModel.due_at.exists(),
        attributes_to_get=[layout.PARTITION_KEY, layout.STATUS_ATTRIBUTE, layout.STATUS_INDEX_PARTITION_KEY,
                           "type"],
        segment=segment, total_segments=total_segments,
    )
    for item in items:
        report.scanned += 1
        if item.status is None:
            continue
        wanted = expected_shard(item.key, item.status, item.status_shard, item.task_type)
        if item.status_shard == wanted:
            continue
        if not dry_run and not _move(item, wanted):
            report.changed_meanwhile += 1
        else:
            report.moved += 1
        if progress is not None and report.scanned % 1000 == 0:
            progress(report)
    if progress is not None:
        progress(report)
    return report


def _move(item: TaskModel, wanted: str) -> bool:
    seen = (TaskModel.status_shard == item.status_shard if item.status_shard is not None
            else TaskModel.status_shard.does_not_exist())
    return writes.update(TaskModel(item.key), [TaskModel.status_shard.set(wanted)],
                         (TaskModel.status == item.status) & seen, f"move {item.key!r} to {wanted!r}", refresh=False)
