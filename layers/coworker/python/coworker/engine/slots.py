"""Worker slots and the coordinator's lease: items with a holder and an expiry, taken and kept by
conditional writes. The slots are how ``max_concurrency`` is enforced.

Two kinds live in the task table next to the tasks:

``slot#NNNN`` -- worker slots, the capacity accounting
    There are ``Settings.worker_slots`` of them (``ceil(max_concurrency / batch_size)``), the
    same number as the worker function's reserved concurrency. Whoever starts a worker first
    *reserves* a free slot (holder = a fresh token, expiry = ``reservation_seconds``) and passes
    the slot and token in the invocation; the worker *acquires* it (same token, expiry = lock
    lifetime), heartbeats it while it runs and *releases* it when it returns. So a dispatched
    worker counts against capacity from the moment it is dispatched until it returns, or until
    its reservation or heartbeat lapses (it never started, or died). A worker whose slot was
    taken over does not start. Slots carry ``status = status_shard = "worker-slot"`` (one index
    partition, not sharded) and ``due_at`` = when they are free again, so finding free slots is
    one query on the status index, like finding tasks.

``lease#coordinator`` -- single flight of the coordinator
    A scheduled run that overlaps the previous one, or a second coordinator, waits for the lease
    instead of counting the same free slots twice.

``slot#runner-NNNN`` -- container runner slots
    The same accounting for container runners (``Settings.max_runners`` of them, in their own
    index partition ``runner-slot``): the coordinator reserves one before RunTask, the runner
    acquires it when it starts and keeps it while it runs (:data:`RUNNERS`).

Every write is conditional on the holder (or on the expiry having passed), so two parties can
never both believe they hold the same lease.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta
from typing import Any

from pynamodb.expressions.condition import Condition

from coworker.data import layout, writes
from coworker.data.layout import RUNNER_SLOT_PREFIX, RUNNER_SLOT_STATUS, SLOT_KEY_PREFIX, SLOT_STATUS
from coworker.data.models import LeaseModel, LeaseState, utcnow


@dataclasses.dataclass(frozen=True)
class SlotPool:
    """A kind of slot: its items' key prefix and their index partition."""

    prefix: str
    status: str


WORKERS = SlotPool(SLOT_KEY_PREFIX, SLOT_STATUS)
RUNNERS = SlotPool(RUNNER_SLOT_PREFIX, RUNNER_SLOT_STATUS)


def new_token() -> str:
    return uuid.uuid4().hex


def slot_key(number: int, pool: SlotPool = WORKERS) -> str:
    return f"{pool.prefix}{number:04d}"


def slot_number(key: str) -> int:
    """The number of a worker or runner slot, from its key."""
    prefix = RUNNERS.prefix if key.startswith(RUNNERS.prefix) else WORKERS.prefix
    return int(key[len(prefix):])


def _update(key: str, actions: list[Any], condition: Condition) -> bool:
    return writes.update(LeaseModel(key), actions, condition, f"update lease {key!r}")


def take(key: str, holder: str, seconds: float, state: str, now: datetime | None = None) -> bool:
    """Take the lease ``key`` for ``holder`` if it is free, expired or already ``holder``'s."""
    now = now or utcnow()
    condition = (LeaseModel.key.does_not_exist() | (LeaseModel.due_at <= now)
                 | (LeaseModel.holder == holder))
    actions = [LeaseModel.holder.set(holder), LeaseModel.state.set(state),
               LeaseModel.due_at.set(now + timedelta(seconds=seconds)), LeaseModel.updated_at.set(now)]
    return _update(key, actions, condition)


def extend(key: str, holder: str, seconds: float, state: str | None = None,
           now: datetime | None = None) -> bool:
    """Push the expiry of a lease that ``holder`` still holds; ``False`` if it is not theirs."""
    now = now or utcnow()
    actions = [LeaseModel.due_at.set(now + timedelta(seconds=seconds)), LeaseModel.updated_at.set(now)]
    if state is not None:
        actions.append(LeaseModel.state.set(state))
    return _update(key, actions, LeaseModel.holder == holder)


def release(key: str, holder: str, now: datetime | None = None) -> bool:
    """Free a lease that ``holder`` holds (it is free again at once)."""
    now = now or utcnow()
    actions = [LeaseModel.holder.remove(), LeaseModel.state.set(LeaseState.FREE),
               LeaseModel.due_at.set(now), LeaseModel.updated_at.set(now)]
    return _update(key, actions, LeaseModel.holder == holder)


# -- worker slots --------------------------------------------------------------------------------


def ensure_slots(count: int, now: datetime | None = None, pool: SlotPool = WORKERS) -> int:
    """Create the slots ``0..count-1`` that do not exist yet (free); returns how many were made.

    One BatchGetItem per 100 slots, then the missing slots put together: one transaction per 100,
    each put only if its key is new. When another coordinator made one of them meanwhile, that
    transaction writes nothing and its slots are put one by one instead. A slot made by a release
    before the sharded index (no ``status_shard``) gets it here, keeping its holder.
    """
    now = now or utcnow()
    wanted = [slot_key(number, pool) for number in range(count)]
    existing = {item.key: item for item in LeaseModel.batch_get(
        wanted, attributes_to_get=[layout.PARTITION_KEY, layout.STATUS_INDEX_PARTITION_KEY])}
    for key, item in existing.items():
        if item.status_shard is None:
            _update(key, [LeaseModel.status_shard.set(pool.status)], LeaseModel.key.exists())
    missing = [LeaseModel(key, status=pool.status, status_shard=pool.status, due_at=now,
                          state=LeaseState.FREE, updated_at=now) for key in wanted if key not in existing]
    created = 0
    for start in range(0, len(missing), writes.MAX_TRANSACTION_ITEMS):
        chunk = missing[start:start + writes.MAX_TRANSACTION_ITEMS]
        if len(chunk) > 1 and writes.put_all_if_new(chunk, f"{len(chunk)} {pool.status} slots"):
            created += len(chunk)
            continue
        created += sum(writes.put_if_new(slot, f"slot {slot.key!r}") for slot in chunk)
    return created


def retire_extra_slots(count: int, now: datetime | None = None, pool: SlotPool = WORKERS) -> int:
    """Delete free slots numbered ``count`` or more (left from a larger ``max_concurrency``).

    A held one is left to its worker; it is deleted by a later call once released or expired.
    """
    now = now or utcnow()
    retired = 0
    for item in LeaseModel.slot_index.query(pool.status, LeaseModel.due_at <= now):
        if slot_number(item.key) < count:
            continue
        retired += writes.delete_if(LeaseModel(item.key), LeaseModel.due_at <= now, f"slot {item.key!r}")
    return retired


def free_slots(count: int, want: int, now: datetime | None = None, pool: SlotPool = WORKERS) -> list[str]:
    """Up to ``want`` slots below ``count`` that are free or expired, longest free first.

    One query on the status index, a page of ``count`` entries (more pages only while slots left
    over from a larger ``max_concurrency`` fill it). The index is eventually consistent: a slot
    listed here may have just been taken, which :func:`reserve` finds out.
    """
    if want <= 0:
        return []
    now = now or utcnow()
    found: list[str] = []
    for item in LeaseModel.slot_index.query(pool.status, LeaseModel.due_at <= now, page_size=count):
        if slot_number(item.key) < count:
            found.append(item.key)
            if len(found) >= want:
                break
    return found


def count_busy_slots(count: int, now: datetime | None = None, pool: SlotPool = WORKERS) -> int:
    """Slots below ``count`` that are reserved or held now (paginates: exact at any size)."""
    now = now or utcnow()
    return sum(1 for item in LeaseModel.slot_index.query(pool.status, LeaseModel.due_at > now)
               if slot_number(item.key) < count)


def reserve(slot: str, token: str, seconds: float, now: datetime | None = None) -> bool:
    """Reserve a free (or lapsed) slot for a worker about to be dispatched with ``token``."""
    now = now or utcnow()
    condition = LeaseModel.key.exists() & (LeaseModel.due_at <= now)
    actions = [LeaseModel.holder.set(token), LeaseModel.state.set(LeaseState.RESERVED),
               LeaseModel.due_at.set(now + timedelta(seconds=seconds)), LeaseModel.updated_at.set(now)]
    return _update(slot, actions, condition)


def acquire(slot: str, token: str, seconds: float, now: datetime | None = None) -> bool:
    """The dispatched worker turns its reservation into a running lease (``False``: taken over)."""
    return extend(slot, token, seconds, state=LeaseState.RUNNING, now=now)

