"""Changing ``COWORKER_STATUS_SHARDS`` on a live table: no task is hidden by the change.

Readers query the shards ``0 .. S-1`` of a status. Raising S needs nothing: every item sits in a
shard below the new count, and moves to its new shard on its next write. Lowering S leaves
items in shards ``S .. old-1``, where nobody looks: the coordinator moves them.

The control record keeps the most shards per status the table may hold items in
(``status_shards``). At each tick the coordinator compares it with the count in use:

* lower or equal (or not yet recorded on a new table): it records the count in use;
* higher: it reads the retired shards of every indexed status (and of held tasks), up to
  :data:`BUDGET` entries, and moves each to its shard under the count in use: one conditional
  write, on the item still being in the shard it was read in (a worker that rewrote it meanwhile
  already put it where it belongs). Once the retired shards read empty, and
  :data:`GRACE_SECONDS` have passed since the lower count was first seen (a writer still on the
  old setting during a deploy may add items there), it records the count in use.

A table whose count was never recorded (a new one, or one made by an earlier release) gets the
count in use recorded at the first tick: lowering the count in the same deploy as the upgrade from
such a release still needs ``coworker migrate-index`` (docs/deploy.md).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from coworker.data import index, writes
from coworker.data.layout import HELD_PREFIX, shard_value
from coworker.data.models import TaskModel, TaskStatus, status_shards
from coworker.engine import control
from coworker.engine.control import ControlView

# Statuses whose index entries are sharded (finished tasks leave the index).
SHARDED_STATUSES = (TaskStatus.TODO, TaskStatus.FAILED, TaskStatus.PROCESSING, TaskStatus.IGNORED)
# Entries moved per tick at most (each one conditional write).
BUDGET = 1000
# How long after the count was lowered the retired shards are still checked.
GRACE_SECONDS = 300.0
MOVE_THREADS = 16


def retired_partitions(view: ControlView, recorded: int, shards: int) -> list[str]:
    """The index partitions of shards ``shards .. recorded-1``: every sharded status, and the held
    tasks of each type that was ever paused."""
    retired = range(shards, recorded)
    values = [shard_value(status.value, n) for status in SHARDED_STATUSES for n in retired]
    return values + [f"{HELD_PREFIX}{task_type}#{n}" for task_type in sorted(view.held_types) for n in retired]


def wanted_shard(entry: TaskModel) -> str:
    """Where an entry read in a retired shard belongs under the count in use."""
    if entry.status_shard and entry.status_shard.startswith(HELD_PREFIX):
        return control.held_value(entry.task_type, entry.key)
    return TaskModel.shard_value_of(entry.key, entry.status)


def move(entry: TaskModel) -> bool:
    """Move one entry to its shard, if it is still where it was read."""
    wanted = wanted_shard(entry)
    return writes.update(TaskModel(entry.key), [TaskModel.status_shard.set(wanted)],
                         TaskModel.status_shard == entry.status_shard, f"move task {entry.key!r} to {wanted!r}",
                         refresh=False)


def step(view: ControlView, now: datetime) -> int:
    """One tick's share of the work (see the module's docstring); returns the entries moved."""
    shards = status_shards()
    recorded = view.status_shards
    if recorded is not None and recorded <= shards:
        if recorded < shards:
            control.record_status_shards(shards, recorded)
        return 0
    if recorded is None:  # a new table, or one of a release that did not record it
        control.record_status_shards(shards, None)
        return 0
    lowered_at = view.shards_lowered_at
    if lowered_at is None:
        lowered_at = now
        control.record_status_shards(recorded, recorded, lowered_at)
    entries = index.first_entries(retired_partitions(view, recorded, shards), BUDGET)
    if not entries:
        if (now - lowered_at).total_seconds() >= GRACE_SECONDS:
            control.record_status_shards(shards, recorded)
        return 0
    with ThreadPoolExecutor(max_workers=min(MOVE_THREADS, len(entries)), thread_name_prefix="coworker-reshard") as pool:
        return sum(pool.map(move, entries))
