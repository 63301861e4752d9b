"""Concurrency limits: at most N tasks of one *group* run at once, across the whole fleet.

A task belongs to up to two groups:

* its **concurrency key**, ``key:<concurrency_key>``, with the limit the task carries (a crawled
  domain, a tenant: ``concurrency_limit`` of them at once, 1 when not given);
* its **type**, ``type:<type>``, when the type has a limit (set live in the control record,
  :func:`coworker.engine.control.set_limit`).

A task in no group (no key, no type limit) pays nothing: no read, no write, no condition.

Each group has a *gate*, one item ``gate#<group>`` in the task table. Its map ``holders`` has one
entry per attempt that holds a place: a short token of (task key, fencing token) -> the moment
(epoch ms) its lease ends, which is the attempt's lock expiry, extended with the lock.

**Entering** (after the claim, before the handler; :func:`enter`):

1. One UpdateItem adds this attempt under the condition ``size(holders) < limit``. Entries of
   dead holders count too, so this can refuse a place that is free, never grant one that is not.
2. Refused: one consistent read. Entries whose lease has ended (their worker died) are removed
   in the UpdateItem that adds this one, under the condition that each still carries the
   expiry read and that the map is smaller than ``limit`` + those removed. So a dead holder's
   place comes back when its lock expires, and the count stays exact under any concurrency.
3. Still full: the task is **blocked**. One transaction gives its claim back (the attempt does
   not count, the task keeps its status) and moves its index entry to the partition
   ``blocked#<group>``, out of the queue, so the coordinator and the self-feeding workers never
   wade through it and tasks of other groups start at once; the transaction holds only if the
   gate is still full (a place freed in between makes it fail, and the task tries again). The
   gate joins the index partition ``gates#waiting`` in the same transaction.

**Leaving** (:func:`leave`, in the worker's ``finally``: finished, failed, lost, timed out):
one UpdateItem removes the entry; when the gate has waiters, the oldest blocked task goes back
to its status queue, at its head, and the leaving worker runs it next.

**The sweep** (each coordinator tick, :func:`sweep`) covers what no release announces: a dead
holder's place, and a task blocked just as the index showed the partition empty. It reads the
gates with waiters (a few per tick, the longest unswept first) and wakes as many blocked tasks as
each has free places; a gate that has blocked nobody for ``QUIET_SECONDS`` and has nobody left
waiting leaves ``gates#waiting``.

**Cost** in write units (items under 1 KB; the gate grows by about 30 bytes per place held):
a keyed attempt that gets its place pays 1 to enter, 1 to leave and 1 per heartbeat on top of
the task's own writes; a task that finds its group full pays, each time it is turned away, its
claim again (3 with the index move), the refused entry (1), the two-item transaction (4, and 2
for the index move) and its waking (3), and one consistent read (docs/operations.md has the
measured figures).
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pynamodb.exceptions import DoesNotExist
from pynamodb.expressions.condition import Condition, size
from pynamodb.transactions import TransactWrite

from coworker.config import Settings
from coworker.data import index, writes
from coworker.data.layout import BLOCKED_PREFIX, GATE_PREFIX, WAITING_GATES
from coworker.data.models import GateModel, TaskModel, utcnow
from coworker.engine.lifecycle import Claim, fenced, give_back_actions, head_of_queue, lock_expiry, release_unstarted
from coworker.observability import logger

KEY_GROUP = "key:"
TYPE_GROUP = "type:"
# A gate leaves gates#waiting only when it has blocked nobody for this long (the index is
# eventually consistent: a task blocked a moment ago may not show yet).
QUIET_SECONDS = 30.0
# Gates the sweep looks at per tick, and blocked tasks it wakes per gate.
SWEEP_GATES = 25
WAKE_BUDGET = 100
# Groups with waiters whose blocked tasks the backlog measure counts.
COUNTED_GATES = 25
# A gate is swept again at the earliest this long after its last sweep.
SWEEP_INTERVAL_SECONDS = 5.0
# Reads and conditional writes one entry tries while the gate changes under it.
RACE_RETRIES = 5


@dataclasses.dataclass(frozen=True)
class Group:
    """A set of tasks of which at most ``limit`` run at once."""

    name: str  # "key:<concurrency key>" or "type:<type>"
    limit: int

    @property
    def gate_key(self) -> str:
        return GATE_PREFIX + self.name

    @property
    def blocked_partition(self) -> str:
        return BLOCKED_PREFIX + self.name


class Entry(str, enum.Enum):
    """What :func:`enter` did with a claimed task."""

    ENTERED = "entered"  # it holds a place in every group: run it
    BLOCKED = "blocked"  # a group was full: the task waits, out of the queue, until a place frees
    GIVEN_BACK = "given_back"  # the gate kept changing: the task is due again, at the head of the queue
    LOST = "lost"  # the claim was no longer this worker's (cancelled meanwhile): nothing to do


def groups_of(task: TaskModel, type_limits: Mapping[str, int]) -> tuple[Group, ...]:
    """The groups ``task`` belongs to: its type's (if limited), then its concurrency key's."""
    groups = []
    if task.task_type in type_limits:
        groups.append(Group(TYPE_GROUP + task.task_type, int(type_limits[task.task_type])))
    if task.concurrency_key:
        groups.append(Group(KEY_GROUP + task.concurrency_key, int(task.concurrency_limit or 1)))
    return tuple(groups)


def holder_token(claim: Claim) -> str:
    """A short token unique to one attempt of one task: its entry in the gates' maps."""
    digest = hashlib.blake2b(f"{claim.key}\0{claim.fencing_token}".encode(), digest_size=12).digest()
    return base64.urlsafe_b64encode(digest).decode()


def _epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _update(key: str, actions: list[Any], condition: Condition | None) -> GateModel | None:
    """One UpdateItem on gate ``key``; the gate as written, or ``None`` when ``condition`` does
    not hold."""
    gate = GateModel(key)
    return gate if writes.update(gate, actions, condition, f"update gate {key!r}") else None


def _take(group: Group, token: str, lease_end: int, now: datetime) -> tuple[bool, bool]:
    """Take a place in ``group``: ``(taken, full)``; ``(False, False)`` when the gate kept
    changing under the reader."""
    take = [GateModel.holders[token].set(lease_end), GateModel.limit.set(group.limit)]
    if _update(group.gate_key, take, GateModel.holders.exists() & (size(GateModel.holders) < group.limit)):
        return True, False
    for _ in range(RACE_RETRIES):
        try:
            current = GateModel.get(group.gate_key, consistent_read=True)
        except DoesNotExist:
            if _create(group, token, lease_end):
                return True, False
            continue
        holders = current.holders.as_dict() if current.holders is not None else {}
        if token in holders:
            return True, False  # a retried request that did commit
        now_ms = _epoch_ms(now)
        ended = {holder: end for holder, end in holders.items() if int(end) <= now_ms}
        if len(holders) - len(ended) >= group.limit:
            return False, True
        # Dead holders' entries go in the write that adds this one, each only if unchanged.
        condition = size(GateModel.holders) < group.limit + len(ended)
        for holder, end in ended.items():
            condition &= GateModel.holders[holder] == end
        actions = [*(GateModel.holders[holder].remove() for holder in ended), *take]
        if _update(group.gate_key, actions, condition) is not None:
            return True, False
    return False, False


def _create(group: Group, token: str, lease_end: int) -> bool:
    """Make ``group``'s gate with this one entry; ``False`` if another writer made it first."""
    gate = GateModel(group.gate_key, holders={token: lease_end}, limit=group.limit)
    return writes.put_if_new(gate, f"gate {group.gate_key!r}")


def enter(claim: Claim, groups: Sequence[Group], now: datetime | None = None,
          lease_until: datetime | None = None) -> Entry:
    """Take a place in each of ``groups`` for a claimed task, or give the task back.

    All or nothing: a task that finds one group full gives back the places it took in the
    others, then is blocked on the full one (see the module's docstring). Each place is leased
    until ``lease_until`` (default: the claim's lock expiry; the worker passes the lock's expiry
    as its heartbeat keeps it, which may be later than the claim's).
    """
    now = now or utcnow()
    token, lease_end = holder_token(claim), _epoch_ms(lease_until or claim.task.lock_expires_at)
    for _ in range(RACE_RETRIES):
        taken: list[Group] = []
        for group in groups:
            took, full = _take(group, token, lease_end, now)
            if not took:
                break
            taken.append(group)
        else:
            return Entry.ENTERED
        _leave(token, taken)
        if not full:
            break
        outcome = _block(claim, group, now)
        if outcome is not None:
            return outcome
        # A place freed between the read and the block: try again.
    # Given back where it stood in the queue (as a blocked task is woken), not behind newer work.
    given_back = release_unstarted(claim, now, due=head_of_queue(claim.task, now))
    return Entry.GIVEN_BACK if given_back else Entry.LOST


def _block(claim: Claim, group: Group, now: datetime) -> Entry | None:
    """Give the claim back and move the task to ``group``'s blocked partition, if the gate is
    still full; ``None`` when a place has freed meanwhile (try again).

    The gate's ``gates#waiting`` mark is set in the same transaction, under that condition, so a
    holder that leaves after it sees the mark and wakes a waiter, and one that left before made
    the gate not full and the transaction fail: no release goes unnoticed.
    """
    actions = give_back_actions(claim, now, partition=group.blocked_partition)
    full = size(GateModel.holders) >= group.limit

    def build(transaction: TransactWrite) -> None:
        transaction.update(TaskModel(claim.key), actions=actions, condition=fenced(claim))
        transaction.update(GateModel(group.gate_key), condition=full, actions=[
            GateModel.status_shard.set(WAITING_GATES), GateModel.due_at.set(GateModel.due_at | now),
            GateModel.blocked_at.set(now)])

    reasons = writes.transact(build, f"block task {claim.key!r} on {group.name!r}")
    if reasons is None:
        return Entry.BLOCKED
    if reasons[0] == writes.TRANSACTION_CONDITION_FAILED:
        return Entry.LOST  # the claim is no longer this worker's (cancelled meanwhile)
    return None


def _leave(token: str, groups: Sequence[Group]) -> list[str]:
    """Give back this holder's places; for each gate with waiters, wake the oldest one. Returns
    the keys woken."""
    woken: list[str] = []
    now = utcnow()
    for group in groups:
        gate = _update(group.gate_key, [GateModel.holders[token].remove()], GateModel.holders[token].exists())
        if gate is None:
            continue
        _prune(gate, now)  # the gate as written: places of dead holders go with this one
        if gate.status_shard == WAITING_GATES:
            woken += wake(group, 1)
    return woken


def _prune(gate: GateModel, now: datetime) -> int:
    """Remove the places whose lease has ended (their holders died without leaving), each on the
    condition that it still carries the end read: a place comes back when its holder's lock
    expires even if no task finds the gate full. Returns how many went."""
    holders = gate.holders.as_dict() if gate.holders is not None else {}
    now_ms = _epoch_ms(now)
    ended = {holder: end for holder, end in holders.items() if int(end) <= now_ms}
    if not ended:
        return 0
    condition: Condition | None = None
    for holder, end in ended.items():
        unchanged = GateModel.holders[holder] == end
        condition = unchanged if condition is None else condition & unchanged
    removed = _update(gate.key, [GateModel.holders[holder].remove() for holder in ended], condition)
    return len(ended) if removed is not None else 0


def leave(claim: Claim) -> list[str]:
    """Give back the places ``claim`` holds (whatever its outcome) and return the keys of the
    blocked tasks this woke (the worker may run them next: the place it freed is theirs to
    take). Never raises: a place not given back returns when its lease ends."""
    if not claim.groups:
        return []
    try:
        return _leave(holder_token(claim), claim.groups)
    except Exception:  # noqa: BLE001 - the lease then ends with the lock
        logger.exception("could not give back a concurrency place", extra={"task_key": claim.key})
        return []


def extend(claim: Claim, settings: Settings, now: datetime) -> bool:
    """Heartbeat: push this attempt's leases in its gates to the lock's new expiry (call it
    before extending the lock, with the same ``now``); ``False`` when an entry is gone (it
    ended and another task took the place). Like the lock, a lease only moves forward: an
    extension that lands after a later one is refused, and one consistent read of the gate
    tells that apart from a lost place."""
    token, lease_end = holder_token(claim), _epoch_ms(lock_expiry(settings, now))
    for group in claim.groups:
        entry = GateModel.holders[token]
        if _update(group.gate_key, [entry.set(lease_end)], entry < lease_end) is not None:
            continue
        gate = read_gate(group.name)
        holders = gate.holders.as_dict() if gate is not None and gate.holders is not None else {}
        if token not in holders:
            return False
    return True


def wake(group: Group, count: int) -> list[str]:
    """Put up to ``count`` of ``group``'s blocked tasks, oldest first, back in their status's
    queue; the keys moved. Only the index partition changes: ``due_at`` was set when the task was
    blocked to where it stood in the queue (:func:`coworker.engine.lifecycle.head_of_queue`, its
    creation less its priority), so a woken task is due at once and ahead of work put since."""
    woken: list[str] = []
    for task in TaskModel.status_index.query(group.blocked_partition, limit=count):
        back = [TaskModel.status_shard.set(TaskModel.shard_value_of(task.key, task.status))]
        if not writes.update(TaskModel(task.key), back, TaskModel.status_shard == group.blocked_partition,
                             f"wake task {task.key!r}"):
            continue  # cancelled or woken by someone else meanwhile
        woken.append(task.key)
        if len(woken) >= count:
            break
    return woken


def occupancy(group_name: str, cap: int) -> tuple[int, int]:
    """``(places held now, tasks blocked)`` of a group; blocked counted up to about ``cap``."""
    gate = read_gate(group_name)
    running = holding(gate, utcnow()) if gate is not None else 0
    blocked_count, _ = index.count_partitions([BLOCKED_PREFIX + group_name], cap)
    return running, blocked_count


def count_blocked(cap: int) -> tuple[int, bool]:
    """Tasks waiting for a place, in the first COUNTED_GATES groups with waiters, each counted up
    to its share of ``cap``: ``(count, capped)``; capped also when more groups have waiters."""
    names = [gate.key[len(GATE_PREFIX):]
             for gate in GateModel.waiting_index.query(WAITING_GATES, limit=COUNTED_GATES + 1)]
    if not names:
        return 0, False
    count, capped = index.count_partitions([BLOCKED_PREFIX + name for name in names[:COUNTED_GATES]], cap)
    return count, capped or len(names) > COUNTED_GATES


def holding(gate: GateModel, now: datetime) -> int:
    """Places of ``gate`` held by live leases at ``now``."""
    holders = gate.holders.as_dict() if gate.holders is not None else {}
    now_ms = _epoch_ms(now)
    return sum(1 for end in holders.values() if int(end) > now_ms)


def read_gate(group_name: str) -> GateModel | None:
    try:
        return GateModel.get(GATE_PREFIX + group_name, consistent_read=True)
    except DoesNotExist:
        return None


def sweep(type_limits: Mapping[str, int], now: datetime | None = None) -> int:
    """Wake the blocked tasks of gates with free places that no release announced (a dead
    holder's lease ended; a task blocked just as its partition was read empty). Looks at up to
    SWEEP_GATES gates not swept for SWEEP_INTERVAL_SECONDS; returns the tasks woken."""
    now = now or utcnow()
    woken = 0
    swept_before = now - timedelta(seconds=SWEEP_INTERVAL_SECONDS)
    for entry in GateModel.waiting_index.query(WAITING_GATES, GateModel.due_at <= swept_before,
                                                limit=SWEEP_GATES):
        woken += _sweep_gate(entry.key, type_limits, now)
    return woken


def _sweep_gate(key: str, type_limits: Mapping[str, int], now: datetime) -> int:
    try:
        gate = GateModel.get(key, consistent_read=True)
    except DoesNotExist:
        return 0
    name = key[len(GATE_PREFIX):]
    if name.startswith(TYPE_GROUP):
        # A type whose limit was lifted lets its blocked tasks go, WAKE_BUDGET per sweep.
        limit = int(type_limits.get(name[len(TYPE_GROUP):], WAKE_BUDGET))
    else:
        limit = int(gate.limit or 1)
    group = Group(name, limit)
    _prune(gate, now)
    free = min(WAKE_BUDGET, max(0, limit - holding(gate, now)))
    woken = len(wake(group, free)) if free else 0
    quiet = gate.blocked_at is None or gate.blocked_at <= now - timedelta(seconds=QUIET_SECONDS)
    if free and woken == 0 and quiet:
        # Nobody left waiting: out of gates#waiting, unless it blocked someone meanwhile.
        seen = (GateModel.blocked_at == gate.blocked_at) if gate.blocked_at else GateModel.blocked_at.does_not_exist()
        _update(key, [GateModel.status_shard.remove(), GateModel.due_at.remove()], seen)
    else:
        _update(key, [GateModel.due_at.set(now)], GateModel.status_shard == WAITING_GATES)
    return woken
