"""Control of task types (pause and resume) and of stopped batches, through one control record
in the task table.

The record ``control#types`` holds the set of paused types and the set of types whose tasks may
be *held* (parked out of the way, see below). Pausing a type:

* stops its claims: every claim carries the claimer's view of the paused types in its condition
  (:func:`coworker.engine.lifecycle.claim`), and that view is at most ``control_cache_seconds`` old;
* stops its dispatch: the coordinator reads the record once per tick, the API and self-feeding
  workers use the same cached view, so a paused type costs no read per task;
* moves its waiting tasks out of the way: the coordinator *parks* the due ``todo`` and ``failed``
  tasks of a paused type it meets (and lost ones) by moving their index entry to the partition
  ``held#<type>#<shard>``. Their status does not change (they stay todo or failed), and a held
  task cannot be claimed by anyone, whatever their view; other types behind them in the queue
  start at once instead of waiting behind a paused backlog.

Running tasks of a paused type finish normally. Resuming removes the type from the paused set;
the coordinator then moves its held tasks back, oldest first, a bounded number per tick.

A batch stopped at its failure threshold (:func:`coworker.engine.batches.stop_if_failing`) is in the
record's ``stopped_batches``: its tasks are excluded from claims and skipped by self-feeding
workers, and the coordinator cancels the open ones it meets (todo, failed, lost). Running tasks
finish. A redrive of the batch takes it out again.

Both readers of the queue, the coordinator's tick and a self-feeding worker, decide what to do
with a due task they meet by one rule, :func:`due_action`.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pynamodb.exceptions import DoesNotExist
from pynamodb.expressions.condition import Condition, size
from pynamodb.transactions import TransactWrite

from coworker.data import index, layout, writes
from coworker.data.layout import CONTROL_KEY, HELD_PREFIX
from coworker.data.models import ControlModel, TaskModel, TaskStatus, status_shards, utcnow
from coworker.errors import TooManyPausedTypesError, TooManyRateLimitsError
from coworker.observability import logger

# DynamoDB's IN takes at most 100 operands: the claim condition lists the paused types.
MAX_PAUSED_TYPES = 100
# Batches stopped at their failure threshold and still settling, at most (the control record
# lists them; batch ids are at most 128 characters, so this stays far below DynamoDB's 400 KB).
MAX_STOPPED_BATCHES = 1000
# Rate limits set in the record, at most: every claimer reads it every few seconds, so it stays
# a few KB (a task's own rate_limit covers keys without number, like every crawled domain).
MAX_RATE_LIMITS = 100


@dataclass(frozen=True)
class Rate:
    """At most ``limit`` starts per ``interval_ms`` milliseconds (see :mod:`coworker.engine.rates`)."""

    limit: int
    interval_ms: int

    @property
    def interval_seconds(self) -> float:
        return self.interval_ms / 1000

    def to_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "interval_seconds": self.interval_seconds}


@dataclass(frozen=True)
class ControlView:
    """The control record as read at one moment."""

    paused: frozenset[str] = frozenset()
    held_types: frozenset[str] = frozenset()
    version: int = 0
    stopped_batches: frozenset[str] = frozenset()
    limits: Mapping[str, int] = dataclasses.field(default_factory=dict)  # type -> concurrency limit
    # The most index shards per status the table may hold items in (None: never recorded), and
    # since when the count in use is lower (see coworker.engine.reshard).
    status_shards: int | None = None
    shards_lowered_at: datetime | None = None
    # Rate limits set for a group: "type:<type>" or "key:<rate key>" (the latter wins over the
    # limit its tasks carry).
    rate_limits: Mapping[str, Rate] = dataclasses.field(default_factory=dict)

    def is_paused(self, task_type: str | None) -> bool:
        return task_type is not None and task_type in self.paused

    def is_stopped(self, batch_id: str | None) -> bool:
        return batch_id is not None and batch_id in self.stopped_batches

    @property
    def claim_exclusions(self) -> tuple[frozenset[str], frozenset[str]]:
        """(paused types, stopped batches) for a claim's condition: at most MAX_PAUSED_TYPES of
        each (DynamoDB's IN limit); stopped batches beyond it are still skipped and cancelled by
        the coordinator and by self-feeding workers, only a stale hint could claim one."""
        return self.paused, frozenset(sorted(self.stopped_batches)[:MAX_PAUSED_TYPES])

    @property
    def to_release(self) -> frozenset[str]:
        """Types that were paused and are not now: their held tasks go back to the queue."""
        return self.held_types - self.paused


def read(consistent: bool = False) -> ControlView:
    """Read the control record (half a read unit); an absent record means nothing is paused."""
    try:
        item = ControlModel.get(CONTROL_KEY, consistent_read=consistent)
    except DoesNotExist:
        return ControlView()
    limits: dict[str, Any] = item.limits.as_dict() if item.limits is not None else {}
    rates: dict[str, Any] = item.rate_limits.as_dict() if item.rate_limits is not None else {}
    return ControlView(frozenset(item.paused or ()), frozenset(item.held_types or ()), int(item.version or 0),
                       frozenset(item.stopped_batches or ()), {name: int(n) for name, n in limits.items()},
                       int(item.status_shards) if item.status_shards is not None else None,
                       item.shards_lowered_at,
                       {group: Rate(int(rate["limit"]), int(rate["interval_ms"])) for group, rate in rates.items()})


def _update(actions: list[Any], condition: Condition | None = None) -> bool:
    return writes.update(ControlModel(CONTROL_KEY), actions, condition, "update the control record")


def pause(task_type: str, now: datetime | None = None) -> bool:
    """Pause ``task_type``; ``False`` if it was paused already."""
    now = now or utcnow()
    current = read(consistent=True)
    if task_type in current.paused:
        return False
    if len(current.paused) >= MAX_PAUSED_TYPES:
        raise TooManyPausedTypesError(f"{MAX_PAUSED_TYPES} task types are paused already; resume one first")
    changed = _update([ControlModel.paused.add({task_type}), ControlModel.held_types.add({task_type}),
                       ControlModel.version.add(1), ControlModel.updated_at.set(now)],
                      ~ControlModel.paused.contains(task_type))
    if changed:
        _cache.invalidate()
    return changed


def resume(task_type: str, now: datetime | None = None) -> bool:
    """Resume ``task_type``; ``False`` if it was not paused."""
    now = now or utcnow()
    changed = _update([ControlModel.paused.delete({task_type}), ControlModel.version.add(1),
                       ControlModel.updated_at.set(now)], ControlModel.paused.contains(task_type))
    if changed:
        _cache.invalidate()
    return changed


def set_limit(task_type: str, limit: int | None, now: datetime | None = None) -> bool:
    """Let at most ``limit`` tasks of ``task_type`` run at once (``None``: no limit); ``False``
    if that was the limit already. Claimers see it within ``control_cache_seconds``."""
    now = now or utcnow()
    if read(consistent=True).limits.get(task_type) == limit:
        return False
    path = ControlModel.limits[task_type]
    # A record made before limits existed has no map to set an entry in: make it first.
    _update([ControlModel.limits.set(ControlModel.limits | {})])
    changed = _update([path.set(limit) if limit is not None else path.remove(), ControlModel.version.add(1),
                       ControlModel.updated_at.set(now)])
    if changed:
        _cache.invalidate()
    return changed


def set_rate(group: str, rate: Rate | None, now: datetime | None = None) -> bool:
    """Limit the starts of rate group ``group`` (``type:<type>`` or ``key:<rate key>``) to
    ``rate`` (``None``: lift the limit set here); ``False`` if that was the limit already.
    Claimers see it within ``control_cache_seconds``."""
    now = now or utcnow()
    current = read(consistent=True).rate_limits
    if current.get(group) == rate:
        return False
    if rate is not None and group not in current and len(current) >= MAX_RATE_LIMITS:
        raise TooManyRateLimitsError(f"{MAX_RATE_LIMITS} rate limits are set already; lift one first "
                                     "(tasks may carry their key's limit instead: rate_limit)")
    path = ControlModel.rate_limits[group]
    # A record made before rate limits existed has no map to set an entry in: make it first.
    _update([ControlModel.rate_limits.set(ControlModel.rate_limits | {})])
    value = {"limit": rate.limit, "interval_ms": rate.interval_ms} if rate is not None else None
    changed = _update([path.set(value) if value is not None else path.remove(), ControlModel.version.add(1),
                       ControlModel.updated_at.set(now)])
    if changed:
        _cache.invalidate()
    return changed


def forget_held(task_type: str) -> bool:
    """Drop ``task_type`` from the held types once none of its tasks is held (unless it was
    paused again meanwhile)."""
    return _update([ControlModel.held_types.delete({task_type})], ~ControlModel.paused.contains(task_type))


def stop_batch_actions(transaction: TransactWrite, batch_id: str, now: datetime) -> None:
    """Add ``batch_id`` to the stopped batches, inside the caller's transaction, unless
    MAX_STOPPED_BATCHES are stopped already (the transaction then fails: the batch is stopped
    at a later failure, once the coordinator has settled some of the others)."""
    room = (ControlModel.stopped_batches.does_not_exist()
            | (size(ControlModel.stopped_batches) < MAX_STOPPED_BATCHES))
    transaction.update(ControlModel(CONTROL_KEY), actions=[
        ControlModel.stopped_batches.add({batch_id}), ControlModel.version.add(1), ControlModel.updated_at.set(now)],
        condition=room)
    _cache.invalidate()


def reopen_batch_actions(transaction: TransactWrite, batch_id: str, now: datetime) -> None:
    """Take ``batch_id`` out of the stopped batches, inside the caller's transaction."""
    transaction.update(ControlModel(CONTROL_KEY), actions=[
        ControlModel.stopped_batches.delete({batch_id}), ControlModel.version.add(1),
        ControlModel.updated_at.set(now)])
    _cache.invalidate()


def record_status_shards(shards: int, seen: int | None, lowered_at: datetime | None = None) -> bool:
    """Record that the table's items are in at most ``shards`` index shards per status (and since
    when a lower count is in use: ``lowered_at``), if the record still says ``seen``."""
    unchanged = (ControlModel.status_shards == seen if seen is not None
                 else ControlModel.status_shards.does_not_exist())
    lowered = ControlModel.shards_lowered_at.set(lowered_at) if lowered_at else ControlModel.shards_lowered_at.remove()
    return _update([ControlModel.status_shards.set(shards), lowered, ControlModel.updated_at.set(utcnow())],
                   unchanged)


def forget_stopped_batch(batch_id: str) -> bool:
    """Drop a stopped batch that has no open task left (it stays failed on its own item)."""
    return _update([ControlModel.stopped_batches.delete({batch_id})])


class ControlCache:
    """The control record as a process sees it: read again once ``seconds`` have passed, so
    checking a task against it costs no request. A failed read keeps the last view."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._view = ControlView()
        self._read_at: float | None = None

    def get(self, seconds: float) -> ControlView:
        with self._lock:
            if self._read_at is not None and time.monotonic() - self._read_at < seconds:
                return self._view
            try:
                self._view = read()
            except Exception:  # noqa: BLE001 - keep working with the last view; logged
                logger.exception("could not read the control record; using the last view")
            self._read_at = time.monotonic()
            return self._view

    def invalidate(self) -> None:
        with self._lock:
            self._read_at = None


_cache = ControlCache()


def cached(seconds: float) -> ControlView:
    """This process's view of the control record, at most ``seconds`` old."""
    return _cache.get(seconds)


# -- held tasks ----------------------------------------------------------------------------------


def held_value(task_type: str, key: str) -> str:
    """The index partition where a held task of ``task_type`` waits."""
    return f"{HELD_PREFIX}{task_type}#{layout.shard_of(key, status_shards())}"


def held_values(task_type: str) -> list[str]:
    return [f"{HELD_PREFIX}{task_type}#{shard}" for shard in range(status_shards())]


def is_held(status_shard: str | None) -> bool:
    return status_shard is not None and status_shard.startswith(HELD_PREFIX)


def park(task: TaskModel, now: datetime) -> bool:
    """Move a due task of a paused type out of the queue (status unchanged), if it is still
    where the index showed it; ``False`` otherwise."""
    key, status = task.key, task.status
    condition = ((TaskModel.status == status) & (TaskModel.task_type == task.task_type)
                 & (TaskModel.status_shard == TaskModel.shard_value_of(key, status)) & (TaskModel.due_at <= now))
    return _task_update(key, [TaskModel.status_shard.set(held_value(task.task_type, key))], condition)


def unpark(task: TaskModel) -> bool:
    """Put a held task back in its status's queue (its place kept: ``due_at`` is unchanged)."""
    key = task.key
    condition = TaskModel.status_shard == held_value(task.task_type, key)
    return _task_update(key, [TaskModel.status_shard.set(TaskModel.shard_value_of(key, task.status))], condition)


def _task_update(key: str, actions: list[Any], condition: Condition) -> bool:
    return writes.update(TaskModel(key), actions, condition, f"move task {key!r}")


def held(task_type: str, limit: int) -> list[TaskModel]:
    """About ``limit`` held tasks of ``task_type``, oldest first within each shard."""
    return index.first_entries(held_values(task_type), limit)


def count_held(task_type: str, cap: int) -> tuple[int, bool]:
    """Held tasks of ``task_type``, counted up to about ``cap``."""
    return index.count_partitions(held_values(task_type), cap)


def types_listed(view: ControlView, registered: Iterable[str]) -> list[str]:
    """Every type worth showing: the registered ones, and any paused, held or limited."""
    return sorted(set(registered) | view.paused | view.held_types | set(view.limits))


# -- the due-work rule ---------------------------------------------------------------------------


class DueAction(str, enum.Enum):
    """What a reader of the queue does with a due task it meets."""

    RUN = "run"  # hand it to a worker (or claim it)
    PARK = "park"  # its type is paused: move it out of the queue (the coordinator does)
    CANCEL = "cancel"  # its batch stopped at its failure threshold (the coordinator does)
    REAP = "reap"  # lost on its last allowed attempt: no claim can take it (the coordinator retires it)


def due_action(view: ControlView, task: TaskModel, status: TaskStatus) -> DueAction:
    """The one rule both the coordinator's tick and a self-feeding worker apply to a due task
    found in ``status``'s queue (index entries carry type, batch and attempts)."""
    if view.is_stopped(task.batch_id):
        return DueAction.CANCEL
    if view.is_paused(task.task_type):
        return DueAction.PARK
    if status is TaskStatus.PROCESSING and task.attempts >= task.max_attempts:
        return DueAction.REAP
    return DueAction.RUN
