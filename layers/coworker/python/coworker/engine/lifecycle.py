"""The task lifecycle: every state change is one conditional write on the task's item.

::

    put ──► todo ──claim──► processing ──complete──► finished
                ▲              │  │
      retry     │    fail <ceil│  │fail at ceiling / not retryable, cancel, lost at ceiling
    (backoff) failed ◄─────────┘  └──────────────────────────────► ignored

Lock and fencing timeline (``A``, ``B`` are workers; ``n`` is the attempt number)::

    t0  A claims: status=processing, lock_owner=A, attempts=n, due_at=lock_expires_at=t0+L
        (A's heartbeats push lock_expires_at on, and due_at, the index key, past it: see extend_lock)
    t1  A dies (or stalls) ............................................
    t0+L  lock expired; once due_at has passed too (at most L/2 later), the coordinator sees
          processing & due_at <= now and dispatches again
    t2  B claims: condition "open & due_at <= now & attempts < max" holds; attempts=n+1, owner=B
    t3  A wakes and tries to record: condition "status=processing & owner=A & attempts=n" fails
        -> A is told LOST and logs it; B's attempt is untouched.

The fencing token is (owner, attempt, generation). Attempts grow with every claim, and a redrive
(:func:`retry`) resets them to 0 but moves the task to a new ``generation``: so a redriven task's
new attempt 1 can never be mistaken for an old attempt 1 still running, even one whose worker
reused an owner id.
"""

from __future__ import annotations

import dataclasses
import enum
import random
import traceback as tb
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from pynamodb.exceptions import DoesNotExist, PynamoDBException
from pynamodb.expressions.condition import Condition

from coworker.config import Settings
from coworker.data import writes
from coworker.data.layout import BLOCKED_PREFIX, HELD_PREFIX
from coworker.data.models import ErrorKind, ErrorRecord, TaskModel, TaskStatus, utcnow
from coworker.engine import offload
from coworker.engine.tasks import TaskSpec
from coworker.errors import GuardFailedError, PayloadTooLargeError, RecordTooLargeError, StorageError, TaskNotFoundError

MAX_MESSAGE_CHARS = 1000
MAX_TRACEBACK_CHARS = 2000


def stage_payloads(specs: Sequence[TaskSpec], settings: Settings) -> list[TaskSpec]:
    """Check every payload's size (raises ``PayloadTooLargeError`` naming the task, before anything
    is written), then move the large ones to the object store; returns the specs to put."""
    store = offload.store_for(settings)
    for number, spec in enumerate(specs, start=1):
        try:
            offload.check_payload(spec.payload, settings, store is not None)
        except PayloadTooLargeError as exc:
            where = f"task {number} (key {spec.key!r})" if len(specs) > 1 else f"task {spec.key!r}"
            raise PayloadTooLargeError(f"{where}: {exc}") from None
    staged = []
    for spec in specs:
        payload, ref = offload.stage_payload(spec.payload, settings, store, key=spec.key)
        staged.append(dataclasses.replace(spec, payload=payload, payload_ref=ref.to_dict()) if ref else spec)
    return staged


class RecordOutcome(str, enum.Enum):
    """What happened to a worker's attempt to record its result."""

    FINISHED = "finished"
    FAILED = "failed"  # will be retried after a backoff
    IGNORED = "ignored"  # ceiling reached or not retryable
    LOST = "lost"  # the claim was no longer ours: nothing was written


@dataclasses.dataclass(frozen=True)
class Claim:
    """A task held by one worker. ``owner``, ``attempt`` and ``generation`` are the fencing token."""

    task: TaskModel
    owner: str
    attempt: int
    # The concurrency groups whose places this attempt holds (see :mod:`coworker.engine.gates`).
    groups: tuple[Any, ...] = ()

    @property
    def key(self) -> str:
        return self.task.key

    @property
    def generation(self) -> int:
        """How many times the task had been redriven when it was claimed."""
        return int(self.task.generation or 0)

    @property
    def fencing_token(self) -> str:
        """``<owner>:<attempt>``, and ``.r<generation>`` after a redrive: unique per attempt."""
        suffix = f".r{self.generation}" if self.generation else ""
        return f"{self.owner}:{self.attempt}{suffix}"

    @property
    def took_over_lost_attempt(self) -> bool:
        """True when this claim took the task from a worker whose lock had expired."""
        return self.task.claimed_from == TaskStatus.PROCESSING.value


def backoff_delay(attempt: int, settings: Settings, rng: random.Random | None = None) -> float:
    """Seconds to wait before retrying after failed attempt ``attempt`` (1-based).

    Exponential growth capped at ``backoff_max_seconds``, with full jitter so that a burst of
    failures does not come back as a burst of retries.
    """
    ceiling = min(settings.backoff_max_seconds, settings.backoff_base_seconds * 2 ** (attempt - 1))
    return (rng or random).uniform(ceiling / 2, ceiling)


def error_record(
    attempt: int, kind: ErrorKind, message: str, at: datetime, traceback: str | None = None
) -> ErrorRecord:
    """An error history entry, trimmed to sizes that keep the item small."""
    return ErrorRecord(
        attempt=attempt,
        at=at,
        kind=kind.value,
        message=message[:MAX_MESSAGE_CHARS] or kind.value,
        traceback=traceback[-MAX_TRACEBACK_CHARS:] if traceback else None,
    )


def error_from_exception(attempt: int, kind: ErrorKind, exc: BaseException, at: datetime) -> ErrorRecord:
    """An error history entry describing ``exc``."""
    text = "".join(tb.format_exception(type(exc), exc, exc.__traceback__))
    return error_record(attempt, kind, f"{type(exc).__name__}: {exc}", at, text)


def first_due_at(spec: TaskSpec, now: datetime) -> datetime:
    """When a new task first becomes due.

    ``run_at`` defers it. ``priority`` P (seconds) places a task with no ``run_at`` in the
    oldest-first queue as if it had been put P seconds earlier (negative: later, so it also
    waits that long), so priority
    costs no extra index: a task with priority 3600 goes ahead of an hour of backlog.
    """
    if spec.run_at:
        return max(spec.run_at, now)
    return now - timedelta(seconds=spec.priority or 0)


def new_task(spec: TaskSpec, settings: Settings, now: datetime) -> TaskModel:
    """The item a put creates for ``spec`` (not yet written)."""
    return TaskModel(
        spec.key,
        task_type=spec.type,
        payload=spec.payload,
        payload_ref=spec.payload_ref,
        status=TaskStatus.TODO.value,
        due_at=first_due_at(spec, now),
        created_at=now,
        updated_at=now,
        attempts=0,
        max_attempts=spec.max_attempts or settings.max_attempts,
        batch_id=spec.batch_id,
        priority=spec.priority,
        parent=spec.parent,
        concurrency_key=spec.concurrency_key,
        concurrency_limit=(spec.concurrency_limit or 1) if spec.concurrency_key else None,
        rate_key=spec.rate_key,
        rate_limit=spec.rate_limit if spec.rate_key else None,
        rate_interval_seconds=(spec.rate_interval_seconds or 1.0) if spec.rate_key and spec.rate_limit else None,
        timeout_seconds=spec.timeout_seconds,
    )


def get_task(key: str, consistent: bool = True) -> TaskModel:
    """Read one task, or raise :class:`TaskNotFoundError`."""
    try:
        return TaskModel.get(key, consistent_read=consistent)
    except DoesNotExist as exc:
        raise TaskNotFoundError(f"no task with key {key!r}") from exc


def claim(key: str, owner: str, settings: Settings, now: datetime | None = None,
          paused: Collection[str] = (), stopped_batches: Collection[str] = (),
          time_left: float | None = None, too_long_types: Collection[str] = (),
          excluded_types: Collection[str] = ()) -> Claim | None:
    """Take the task for ``owner`` with one conditional UpdateItem; ``None`` if not claimable.

    Claimable: todo or failed and due, or processing with an expired lock, and below the
    attempt ceiling; not held (parked while its type is paused) or blocked (waiting for a place
    in its concurrency group), not of a ``paused`` type and
    not of a batch in ``stopped_batches``; with ``time_left`` (seconds the claimer has for a
    handler), not a task whose own time limit is longer, nor one without a limit of its own whose
    type is in ``too_long_types``; never one whose type is in ``excluded_types`` (another
    runner's). Of any number of concurrent claimers exactly one succeeds.
    """
    now = now or utcnow()
    expires = lock_expiry(settings, now)
    claimable = (
        TaskModel.status.is_in(*(s.value for s in TaskStatus.open()))
        & (TaskModel.due_at <= now)
        & (TaskModel.attempts < TaskModel.max_attempts)
        & ~TaskModel.status_shard.startswith(HELD_PREFIX)
        & ~TaskModel.status_shard.startswith(BLOCKED_PREFIX)
    )
    if paused:
        claimable &= ~TaskModel.task_type.is_in(*sorted(paused))
    if stopped_batches:
        claimable &= ~TaskModel.batch_id.is_in(*sorted(stopped_batches))
    if excluded_types:
        claimable &= ~TaskModel.task_type.is_in(*sorted(excluded_types))
    if time_left is not None:
        no_limit_of_its_own = TaskModel.timeout_seconds.does_not_exist()
        if too_long_types:
            no_limit_of_its_own &= ~TaskModel.task_type.is_in(*sorted(too_long_types))
        claimable &= no_limit_of_its_own | (TaskModel.timeout_seconds <= time_left)
    task = TaskModel(key)
    actions = [
        TaskModel.claimed_from.set(TaskModel.status),  # right-hand side reads the old value
        *TaskModel.status_actions(key, TaskStatus.PROCESSING.value),
        TaskModel.lock_owner.set(owner),
        TaskModel.lock_expires_at.set(expires),
        TaskModel.due_at.set(expires),
        TaskModel.attempts.add(1),
        TaskModel.started_at.set(now),  # the attempt's start, in the same write: no extra request
        TaskModel.updated_at.set(now),
    ]
    try:
        if not writes.update(task, actions, claimable, f"claim task {key!r}"):
            return None
    except RecordTooLargeError:
        # Not even the lock fits: end the task rather than have it handed out for ever.
        _end_too_large(TaskModel(key), claimable, None, now)
        return None
    return Claim(task=task, owner=owner, attempt=int(task.attempts))


def landed_claim(key: str, owner: str, claimed_at: datetime) -> Claim | None:
    """After a claim write that got no answer (a connection closed or timed out): the claim, if it
    landed, else ``None``. One consistent read: the claim landed when the task is processing under
    ``owner`` with the start that claim wrote (``claimed_at``, the ``now`` it was sent with; the
    same owner's other claims of the key wrote other starts). Raises :class:`StorageError` when
    the read fails too (then nothing is known: the lock, if it was taken, lapses)."""
    try:
        task = TaskModel.get(key, consistent_read=True)
    except DoesNotExist:
        return None
    except PynamoDBException as exc:
        raise StorageError(f"could not read task {key!r}: {writes.error_message(exc)}") from exc
    if task.status != TaskStatus.PROCESSING.value or task.lock_owner != owner or task.started_at != claimed_at:
        return None
    return Claim(task=task, owner=owner, attempt=int(task.attempts))


def release_unstarted(claim: Claim, now: datetime | None = None, due: datetime | None = None,
                      also: Sequence[Any] = ()) -> bool:
    """Give back a claim whose handler never started (the worker had no time left, or its rate
    group had no token): the task returns to the status it was claimed from, due now (or at
    ``due``), and the attempt does not count; ``also`` are more update actions for the same
    write. Fenced; ``False`` when the claim was no longer this worker's."""
    now = now or utcnow()
    return _write(TaskModel(claim.key), [*give_back_actions(claim, now, due=due), *also], fenced(claim), "release")


def give_back_actions(claim: Claim, now: datetime, partition: str | None = None,
                      due: datetime | None = None) -> list[Any]:
    """Update actions that return an unstarted claim: the status it was claimed from, due now
    (or at ``due``), lock removed, the attempt not counted (write them under :func:`fenced`).

    ``started_at`` is left as the claim wrote it: it says when the task was last claimed. The
    start of the attempt before was already overwritten by this claim, so removing it would not
    bring that back; a finished task's start is always its finishing attempt's (its claim is the
    last), and a given-back task shows when it was last taken.

    ``partition`` puts its index entry there instead of in its status's queue (a task blocked
    on its concurrency group), due as of its creation (less its priority): blocked tasks wait
    oldest first, and one put back goes to the head of the queue, not behind newer work.
    """
    status = claim.task.claimed_from or TaskStatus.TODO.value
    due = due or now
    if partition is not None:
        due = head_of_queue(claim.task, now)
    return [
        TaskModel.status.set(status),
        TaskModel.status_shard.set(partition or TaskModel.shard_value_of(claim.key, status)),
        TaskModel.due_at.set(due),
        TaskModel.attempts.add(-1),
        *release_lock_actions(now),
    ]


def head_of_queue(task: TaskModel, now: datetime) -> datetime:
    """The due time that puts ``task`` back where it stood in the oldest-first queue: its creation
    less its priority (never later than ``now``), ahead of work put since."""
    return min(now, task.created_at - timedelta(seconds=int(task.priority or 0)))


def fenced(claim: Claim) -> Condition:
    """Condition that holds only while ``claim`` is still the task's current attempt."""
    generation = (
        TaskModel.generation == claim.generation if claim.generation
        else TaskModel.generation.does_not_exist() | (TaskModel.generation == 0)
    )
    return (
        (TaskModel.status == TaskStatus.PROCESSING.value)
        & (TaskModel.lock_owner == claim.owner)
        & (TaskModel.attempts == claim.attempt)
        & generation
    )


def lock_expiry(settings: Settings, now: datetime) -> datetime:
    """When a lock taken or extended at ``now`` expires."""
    return now + timedelta(seconds=settings.effective_lock_seconds)


@dataclasses.dataclass(frozen=True)
class LockExtension:
    """What a lock extension found: whether the claim is still this attempt's (its truth value),
    and the index due time the write set, when it moved the index entry (``None`` otherwise)."""

    held: bool
    listed_until: datetime | None = None

    def __bool__(self) -> bool:
        return self.held


def listing_horizon(settings: Settings) -> timedelta:
    """How far past a running task's lock its index entry is moved when it must move: half a lock
    lifetime (see :func:`extend_lock`), so that a dead worker's task is found within 1.5 lock
    lifetimes of its last heartbeat, well within the 2 x ``lock_seconds`` promised."""
    return timedelta(seconds=settings.effective_lock_seconds / 2)


def extend_lock(claim: Claim, settings: Settings, now: datetime | None = None,
                listed_until: datetime | None = None) -> LockExtension:
    """Heartbeat: push the lock of a running attempt to ``now`` + ``lock_seconds``.

    The lock (``lock_expires_at``) moves with every extension; the task's index entry (``due_at``,
    the index's sort key) only when the new lock would pass it (``listed_until``, the due time this
    worker last wrote: the claim's expiry at first; ``None``, not known: move it), and then to the
    lock plus :func:`listing_horizon`. Moving an index key is a delete and a put in the index, so
    an extension that leaves it costs 1 write unit instead of 3, and every other one moves it (at
    the defaults). ``due_at >= lock_expires_at`` holds after every write, so a reader of the index
    never meets a live lock as due, and a claim's ``due_at <= now`` still implies an expired lock;
    a lost task shows as due at most half a lock lifetime after its lock lapsed.

    Fenced like a result: false when the claim was taken over, cancelled or already recorded,
    which tells the worker that its attempt no longer counts. A lock only moves forward: when
    writes are slow, an extension sent earlier may land after one sent later, and must not pull
    the expiry back; refused for that reason, it is held after one consistent read that finds
    the claim still this attempt's (and moved nothing).
    """
    expires = lock_expiry(settings, now or utcnow())
    actions = [TaskModel.lock_expires_at.set(expires)]
    relisted = None
    if listed_until is None or listed_until < expires:
        relisted = expires + listing_horizon(settings)
        actions.append(TaskModel.due_at.set(relisted))
    # A fresh item object: the worker thread may be reading ``claim.task`` at this moment.
    forward = fenced(claim) & (TaskModel.lock_expires_at < expires)
    if _write(TaskModel(claim.key), actions, forward, "extend the lock of"):
        return LockExtension(True, relisted)
    return LockExtension(holds(claim))


def holds(claim: Claim) -> bool:
    """Whether ``claim`` is still the task's current attempt (one consistent read)."""
    try:
        task = TaskModel.get(claim.key, consistent_read=True, attributes_to_get=[
            "status", "lock_owner", "attempts", "generation"])
    except DoesNotExist:
        return False
    return (task.status == TaskStatus.PROCESSING.value and task.lock_owner == claim.owner
            and int(task.attempts or 0) == claim.attempt and int(task.generation or 0) == claim.generation)


def kept_history(entries: Sequence[ErrorRecord], settings: Settings) -> list[ErrorRecord]:
    """The error history a write keeps: the last ``error_history`` entries, and of their
    tracebacks only the newest one (older entries keep their messages).

    Every write of a task (each claim, heartbeat and result) is billed by the size of its record:
    up to 2 KB of traceback per failed attempt would make each later write of a failing task cost
    more, the more it had failed. Copies: the entries given are not changed.
    """
    kept = list(entries)[-settings.error_history:]
    newest = max((n for n, entry in enumerate(kept) if entry.traceback), default=None)
    return [entry if n == newest or not entry.traceback else
            ErrorRecord(attempt=entry.attempt, at=entry.at, kind=entry.kind, message=entry.message)
            for n, entry in enumerate(kept)]


def note_lapse(claim: Claim, reason: str, now: datetime | None = None) -> bool:
    """Leave on the task, while ``claim`` is still its attempt, why its live worker cannot keep
    the lock (``reason``): whoever takes the task over when the lock lapses records the attempt as
    lost with that reason, not as a worker that died. Fenced; ``False`` when the claim was no
    longer this attempt's. (One write unit; only ever sent when extensions do not land in time.)"""
    actions = [TaskModel.lapse_attempt.set(claim.attempt), TaskModel.lapse_reason.set(reason[:MAX_MESSAGE_CHARS]),
               TaskModel.updated_at.set(now or utcnow())]
    return _write(TaskModel(claim.key), actions, fenced(claim), "note the lapse of")


def worker_lost_message(task: TaskModel, attempt: int, what: str) -> str:
    """The message of attempt ``attempt``'s worker_lost entry: ``what`` (the lock expired ...),
    and why, as its worker noted it (:func:`note_lapse`); with no note, nothing was heard from the
    worker (it stopped, or none of its writes landed)."""
    if task.lapse_attempt is not None and int(task.lapse_attempt) == attempt and task.lapse_reason:
        return f"{what}; its worker was alive: {task.lapse_reason}"
    return f"{what}; no word from its worker (it stopped, or none of its writes landed in time)"


def _history(claim: Claim, settings: Settings, now: datetime, new: list[ErrorRecord]) -> list[ErrorRecord]:
    entries = list(claim.task.errors or [])
    if claim.took_over_lost_attempt:
        message = worker_lost_message(claim.task, claim.attempt - 1, "the worker's lock expired before it recorded "
                                                                     "a result")
        entries.append(error_record(claim.attempt - 1, ErrorKind.WORKER_LOST, message, now))
    entries.extend(new)
    return kept_history(entries, settings)


def release_lock_actions(now: datetime) -> list[Any]:
    return [
        TaskModel.lock_owner.remove(),
        TaskModel.lock_expires_at.remove(),
        TaskModel.claimed_from.remove(),
        TaskModel.lapse_attempt.remove(),
        TaskModel.lapse_reason.remove(),
        TaskModel.updated_at.set(now),
    ]


def _write(task: TaskModel, actions: list[Any], condition: Condition, doing: str, *, refresh: bool = False) -> bool:
    """One state change of ``task``, a single conditional UpdateItem; ``False`` (nothing written)
    when ``condition`` does not hold. (A task of a batch is written the same way: its batch counts
    it from the table's stream.) With ``refresh``, ``task`` is updated from the written item;
    without, nothing is returned (the cheaper request a worker makes twice per task). ``doing``
    names the change in an error's message: "could not <doing> task 'k'".
    """
    return writes.update(task, actions, condition, f"{doing} task {task.key!r}", refresh=refresh)


def _end_too_large(task: TaskModel, condition: Condition, kept: ErrorRecord | None, now: datetime) -> bool:
    """End a task whose record cannot take the write it needs: ``ignored`` with a
    ``record_too_large`` error, its result and older history dropped (the entry ``kept`` stays,
    without its traceback), so that it never loops on a write DynamoDB refuses. If even that does
    not fit, the payload goes too (the error says so). Under ``condition`` (the caller's own);
    ``False`` when it does not hold."""
    attempt = int(kept.attempt) if kept is not None else 0
    history = [error_record(attempt, ErrorKind(kept.kind), kept.message, kept.at)] if kept else []
    dropped = "its result and older error history were dropped"
    for drop_payload in (False, True):
        if drop_payload:
            dropped = "its payload, result and older error history were dropped"
        note = error_record(attempt, ErrorKind.RECORD_TOO_LARGE,
                            f"the task's record would pass DynamoDB's 400 KB item limit, so it was ended: "
                            f"{dropped} (make the payload smaller, or let large payloads go to the object "
                            "store)", now)
        actions = [
            *TaskModel.status_actions(task.key, TaskStatus.IGNORED.value),
            TaskModel.due_at.set(now),
            TaskModel.errors.set([*history, note]),
            TaskModel.result.remove(),
            *release_lock_actions(now),
        ]
        if drop_payload:
            actions.append(TaskModel.payload.remove())
        try:
            return _write(task, actions, condition, "end (record too large)")
        except RecordTooLargeError:
            if drop_payload:
                raise
    return False  # pragma: no cover - the loop returns or raises


def _fenced_update(claim: Claim, actions: list, outcome: RecordOutcome) -> RecordOutcome:
    if not _write(claim.task, actions, fenced(claim), "record"):
        return RecordOutcome.LOST
    return outcome


def _follow_up_tasks(claim: Claim, follow_ups: Sequence[TaskSpec], settings: Settings,
                     now: datetime) -> list[TaskModel]:
    """The items of an attempt's follow-ups: each key once (the task's own key always exists),
    large payloads moved to the object store."""
    specs = []
    seen = {claim.key}
    for follow_up in follow_ups:
        if follow_up.key in seen:
            continue
        seen.add(follow_up.key)
        specs.append(follow_up)
    return [new_task(spec, settings, now) for spec in stage_payloads(specs, settings)]


def _split_for_fold(tasks: list[TaskModel]) -> tuple[list[TaskModel], list[TaskModel]]:
    """``(put before, put with the completion)``: as many as fit in the completion's transaction."""
    room, budget = writes.FOLD_ROOM, writes.PUT_CHUNK_BYTES
    folded: list[TaskModel] = []
    for task in reversed(tasks):
        size = writes.item_size(task)
        if len(folded) >= room or size > budget:
            break
        folded.append(task)
        budget -= size
    folded.reverse()
    return tasks[:len(tasks) - len(folded)], folded


def complete(claim: Claim, settings: Settings, result: Any = None, now: datetime | None = None,
             result_ref: dict[str, Any] | None = None, follow_ups: Sequence[TaskSpec] = ()) -> RecordOutcome:
    """Record success: finished, lock removed, task leaves the status index.

    ``result`` is kept on the record; ``result_ref`` points at a result in the result store.
    ``follow_ups`` (asked for by the handler) are put with the completion, in the same
    transaction as far as DynamoDB's limits allow (99 tasks, 4 MB); more are put first, in
    transactions that check the claim, so a stale attempt adds nothing. Each is put only if its
    key is new: if the worker dies after those first puts, the retry asks for the same keys.
    Raises ``PayloadTooLargeError`` for a follow-up payload no store takes.
    """
    now = now or utcnow()
    actions = [
        *TaskModel.status_actions(claim.key, TaskStatus.FINISHED.value),
        TaskModel.due_at.remove(),
        TaskModel.finished_at.set(now),
        *release_lock_actions(now),
    ]
    if result is not None:
        actions.append(TaskModel.result.set(result))
    if result_ref is not None:
        actions.append(TaskModel.result_ref.set(result_ref))
    if claim.took_over_lost_attempt:
        actions.append(TaskModel.errors.set(_history(claim, settings, now, [])))
    if settings.retention_days:
        actions.append(TaskModel.delete_after_epoch.set(now + timedelta(days=settings.retention_days)))
    if not follow_ups:
        return _fenced_update(claim, actions, RecordOutcome.FINISHED)
    before, folded = _split_for_fold(_follow_up_tasks(claim, follow_ups, settings, now))
    try:
        for batch_id in dict.fromkeys(task.batch_id for task in before):
            writes.put_guarded([t for t in before if t.batch_id == batch_id], claim.key, fenced(claim))
    except GuardFailedError:
        return RecordOutcome.LOST
    if not writes.update_task_and_put(claim.task, actions, fenced(claim), folded):
        return RecordOutcome.LOST
    return RecordOutcome.FINISHED


def fail(
    claim: Claim,
    settings: Settings,
    error: ErrorRecord,
    retryable: bool = True,
    now: datetime | None = None,
) -> RecordOutcome:
    """Record a failed attempt: failed with a backoff below the ceiling, else ignored."""
    now = now or utcnow()
    give_up = not retryable or claim.attempt >= int(claim.task.max_attempts)
    if give_up:
        status, due_at, outcome = TaskStatus.IGNORED, now, RecordOutcome.IGNORED
    else:
        delay = backoff_delay(claim.attempt, settings)
        status, due_at, outcome = TaskStatus.FAILED, now + timedelta(seconds=delay), RecordOutcome.FAILED
    actions = [
        *TaskModel.status_actions(claim.key, status.value),
        TaskModel.due_at.set(due_at),
        TaskModel.errors.set(_history(claim, settings, now, [error])),
        *release_lock_actions(now),
    ]
    try:
        return _fenced_update(claim, actions, outcome)
    except RecordTooLargeError:
        ended = _end_too_large(claim.task, fenced(claim), error, now)
        return RecordOutcome.IGNORED if ended else RecordOutcome.LOST


# A read-then-write is tried again this often when the record changed between the two.
RACE_RETRIES = 5


def _write_with_error(task: TaskModel, entry: ErrorRecord | Callable[[TaskModel], ErrorRecord], settings: Settings,
                      actions: list[Any], condition: Condition, what: str, refresh: bool = False) -> bool:
    """A state change that adds ``entry`` to the task's error history, kept at the last
    ``error_history`` entries like every other writer of it (``entry`` may be made from the
    record as read: its errors, attempts and ``updated_at``).

    Reads the history (consistent), writes the trimmed list under ``condition`` and on the
    record being unchanged since the read (``updated_at``); if the record changed in between,
    reads again. ``False`` when ``condition`` does not hold (or the task does not exist).
    """
    for _ in range(RACE_RETRIES):
        try:
            current = TaskModel.get(task.key, consistent_read=True,
                                    attributes_to_get=["errors", "updated_at", "attempts", "lapse_attempt",
                                                       "lapse_reason"])
        except DoesNotExist:
            return False
        added = entry(current) if callable(entry) else entry
        history = kept_history([*(current.errors or []), added], settings)
        unchanged = TaskModel.updated_at == current.updated_at
        try:
            if _write(task, [*actions, TaskModel.errors.set(history)], condition & unchanged, what, refresh=refresh):
                return True
        except RecordTooLargeError:
            if _end_too_large(task, condition & unchanged, added, utcnow()):
                if refresh:
                    task.refresh(consistent_read=True)
                return True
        try:
            after = TaskModel.get(task.key, consistent_read=True, attributes_to_get=["updated_at"])
        except DoesNotExist:
            return False
        if after.updated_at == current.updated_at:
            return False  # nothing changed in between: the condition itself does not hold
    raise StorageError(f"could not {what} task {task.key!r}: it kept changing")


def reap_lost(key: str, attempt: int, settings: Settings, now: datetime | None = None) -> bool:
    """Ignore a task whose worker was lost on its last allowed attempt.

    Conditional on the task still being that expired attempt, so it races safely with anything else.
    Returns whether this call changed the task.
    """
    now = now or utcnow()

    def lost(current: TaskModel) -> ErrorRecord:
        message = worker_lost_message(current, attempt, "the worker's lock expired on the last allowed attempt")
        return error_record(attempt, ErrorKind.WORKER_LOST, message, now)

    actions = [
        *TaskModel.status_actions(key, TaskStatus.IGNORED.value),
        TaskModel.due_at.set(now),
        *release_lock_actions(now),
    ]
    condition = (
        (TaskModel.status == TaskStatus.PROCESSING.value)
        & (TaskModel.attempts == attempt)
        & (TaskModel.attempts >= TaskModel.max_attempts)
        & (TaskModel.due_at <= now)
    )
    return _write_with_error(TaskModel(key), lost, settings, actions, condition, "reap")


REDRIVABLE = (TaskStatus.FAILED.value, TaskStatus.IGNORED.value)


def retry(key: str, settings: Settings, reason: str = "on request", now: datetime | None = None
          ) -> TaskModel | None:
    """Redrive a failed or ignored task: todo now, attempts reset (in a new generation, so the
    fencing token of the next attempts is new too), history kept with a ``redriven`` entry that
    marks where the attempts start again (numbered with the attempts before; ``reason`` follows
    the kind when read). Returns the updated task, or ``None`` if it is not failed or ignored.
    """
    now = now or utcnow()
    task = TaskModel(key)

    def entry(current: TaskModel) -> ErrorRecord:
        return error_record(int(current.attempts or 0), ErrorKind.REDRIVEN, reason, now)

    actions = [
        *TaskModel.status_actions(key, TaskStatus.TODO.value),
        TaskModel.due_at.set(now),
        TaskModel.attempts.set(0),
        TaskModel.generation.add(1),
        TaskModel.updated_at.set(now),  # every writer moves it: the history's writers detect a race by it
    ]
    changed = _write_with_error(task, entry, settings, actions, TaskModel.status.is_in(*REDRIVABLE), "retry",
                                refresh=True)
    return task if changed else None


def cancel(key: str, settings: Settings, reason: str = "on request", now: datetime | None = None
           ) -> TaskModel | None:
    """Stop handing out a task that is not finished: it becomes ignored with a ``cancelled`` error
    (``reason`` follows the kind when read: "cancelled through the API"), numbered with the
    task's latest attempt (the one running, if any; 0 if it never ran).

    A worker still running it loses its fencing condition, so its late result cannot hide the
    cancellation. Returns the updated task, or ``None`` if it was already finished or ignored.
    """
    now = now or utcnow()
    task = TaskModel(key)

    def entry(current: TaskModel) -> ErrorRecord:
        return error_record(int(current.attempts or 0), ErrorKind.CANCELLED, reason, now)

    actions = [
        *TaskModel.status_actions(key, TaskStatus.IGNORED.value),
        TaskModel.due_at.set(now),
        *release_lock_actions(now),
    ]
    condition = TaskModel.status.is_in(*(s.value for s in TaskStatus.open()))
    changed = _write_with_error(task, entry, settings, actions, condition, "cancel", refresh=True)
    return task if changed else None
