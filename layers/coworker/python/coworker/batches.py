"""Batches: progress counters that stay right without scanning.

A batch's counters live in the task table, spread over ``1 + COUNTER_SHARDS`` items::

    batch#<id>       total (puts), created_at, and the counters of releases before sharding
    batch#<id>#<n>   finished, ignored (and total of follow-ups) of the tasks whose key hashes to n

    total     tasks created for the batch (a re-submitted task that already exists is not counted)
    finished  tasks of the batch that reached ``finished``
    ignored   tasks of the batch that are ``ignored`` now (a redrive takes one back)

    open = total - finished - ignored        done = (open == 0)

Progress is the sum of those items (one strongly consistent BatchGetItem). Every terminal
transition of a task that has a ``batch_id`` moves its shard's counter **in the same
transaction** as the task write (``TransactWriteItems``), so a crash between two writes cannot
lose a count; tasks without a batch keep their single ``UpdateItem``. Creating tasks adds to
``total`` in the same transaction as their puts, for the same reason.

Costs and limits: a transactional write costs twice a plain one. One item takes about 1,000
write units per second, and a counter update in a transaction costs 2: spread over 8 shard
items, one batch's tasks may finish at about 4,000 per second before a counter item runs hot
(one item took 500). Concurrent transactions on one item conflict (DynamoDB cancels one with
``TransactionConflict``); conflicts are retried here with jittered backoff.
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pynamodb.connection import Connection
from pynamodb.exceptions import DoesNotExist, PynamoDBException, TransactWriteError, UpdateError
from pynamodb.expressions.condition import Condition
from pynamodb.transactions import TransactWrite

from coworker import schema
from coworker.errors import CoworkerError, RecordTooLargeError, StorageError
from coworker.model import BatchModel, TaskModel, iso_utc, utcnow
from coworker.observability import logger

BATCH_KEY_PREFIX = "batch#"
# Items the outcome counters of one batch are spread over (a task's share: a hash of its key).
# Fixed: the sum of a batch's counters reads exactly these.
COUNTER_SHARDS = 8
# DynamoDB limits of one TransactWriteItems call: 100 actions and 4 MB in all.
MAX_TRANSACTION_ITEMS = 100
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024
# Leave room for the counter update and request overhead.
PUT_CHUNK_BYTES = MAX_TRANSACTION_BYTES - 256 * 1024
CONFLICT_ATTEMPTS = 10
_RETRIED_REASONS = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})
_CONDITION_FAILED = "ConditionalCheckFailed"


class BatchNotFoundError(CoworkerError):
    """No batch has the given id."""


@dataclasses.dataclass(frozen=True)
class BatchDelta:
    """How one task transition moves its batch's counters."""

    finished: int = 0
    ignored: int = 0
    failure: bool = False  # the task failed for good (not a cancel): counts toward the threshold


FINISHED = BatchDelta(finished=1)
IGNORED = BatchDelta(ignored=1, failure=True)  # attempt ceiling, not retryable, lost, too large
CANCELLED = BatchDelta(ignored=1)
UNIGNORED = BatchDelta(ignored=-1)  # redrive of an ignored task


class BatchFailedError(CoworkerError):
    """The batch stopped at its failure threshold: it takes no new tasks until it is redriven."""


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How many of a batch's tasks may end ignored before the batch stops (like Step Functions'
    ToleratedFailurePercentage / ToleratedFailureCount): stops once ``ignored`` passes either."""

    percent: float | None = None
    count: int | None = None

    def exceeded(self, ignored: int, total: int) -> str | None:
        """Why a batch with these counts must stop, or ``None``."""
        if self.count is not None and ignored > self.count:
            return f"{ignored} of {total} tasks ignored, more than the {self.count} tolerated"
        if self.percent is not None and total and 100 * ignored / total > self.percent:
            return (f"{ignored} of {total} tasks ignored ({100 * ignored / total:.1f}%), more than the "
                    f"{self.percent:g}% tolerated")
        return None


@dataclasses.dataclass(frozen=True)
class BatchProgress:
    """The counters of one batch, as read (strongly consistent) from its item."""

    batch_id: str
    total: int
    finished: int
    ignored: int
    created_at: datetime | None
    updated_at: datetime | None
    tolerance: Tolerance = Tolerance()
    failed_at: datetime | None = None
    failure_reason: str | None = None

    @property
    def open(self) -> int:
        """Tasks not yet finished or ignored: todo, processing or failed."""
        return self.total - self.finished - self.ignored

    @property
    def done(self) -> bool:
        return self.open <= 0

    @property
    def state(self) -> str:
        """``failed`` (stopped at its threshold), ``done`` or ``running``."""
        return "failed" if self.failed_at else "done" if self.done else "running"

    def to_dict(self) -> dict[str, Any]:
        iso = iso_utc
        return {
            "batch_id": self.batch_id,
            "total": self.total,
            "finished": self.finished,
            "ignored": self.ignored,
            "open": self.open,
            "done": self.done,
            "state": self.state,
            "failure_reason": self.failure_reason,
            "failed_at": iso(self.failed_at),
            "tolerated_failure_percent": self.tolerance.percent,
            "tolerated_failure_count": self.tolerance.count,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
        }


def batch_key(batch_id: str) -> str:
    """The table key of a batch's counter item."""
    return BATCH_KEY_PREFIX + batch_id


def counter_key(batch_id: str, task_key: str) -> str:
    """The counter item a task's outcomes move: one of the batch's ``COUNTER_SHARDS``."""
    return f"{batch_key(batch_id)}#{schema.shard_of(task_key, COUNTER_SHARDS)}"


def is_batch_key(key: str) -> bool:
    """True for keys reserved for batch items (task keys may not start with ``batch#``)."""
    return key.startswith(BATCH_KEY_PREFIX)


_connections: dict[tuple[str, str | None], Connection] = {}


def _connection() -> Connection:
    """A pynamodb connection for transactions, on the endpoint the models are bound to."""
    meta = TaskModel.Meta
    cache_key = (meta.region, meta.host)
    if cache_key not in _connections:
        _connections[cache_key] = Connection(region=meta.region, host=meta.host,
                                             max_retry_attempts=getattr(meta, "max_retry_attempts", None),
                                             max_pool_connections=getattr(meta, "max_pool_connections", None))
    return _connections[cache_key]


def build_client() -> None:
    """Create the transactions' connection and its botocore client now (see ``model.build_clients``)."""
    _ = _connection().client


def _counter_actions(delta: BatchDelta, now: datetime) -> list:
    actions: list = [BatchModel.updated_at.set(now)]
    if delta.finished:
        actions.append(BatchModel.finished.add(delta.finished))
    if delta.ignored:
        actions.append(BatchModel.ignored.add(delta.ignored))
    return actions


def _reasons(exc: TransactWriteError) -> list[str | None]:
    return [reason.code if reason else None for reason in (exc.cancellation_reasons or [])]


def transact(build: Callable[[TransactWrite], None], what: str) -> list[str | None] | None:
    """Run one transaction, retrying conflicts with jittered backoff.

    Returns ``None`` on success, or the per-item cancellation reasons when a condition failed.
    """
    for attempt in range(CONFLICT_ATTEMPTS):
        # One token per attempt: botocore's own retries of this attempt (network errors) reuse
        # it, so an attempt that did commit is not applied twice.
        try:
            token = str(uuid.uuid4())
            with TransactWrite(connection=_connection(), client_request_token=token) as transaction:
                build(transaction)
        except TransactWriteError as exc:
            reasons = _reasons(exc)
            if _CONDITION_FAILED in reasons:
                return reasons
            texts = [exc.cause_response_message or "", *(r.message or "" for r in exc.cancellation_reasons or [] if r)]
            if any("maximum allowed size" in text for text in texts):
                raise RecordTooLargeError(f"could not {what}: an item would pass DynamoDB's 400 KB limit") from exc
            if any(code in _RETRIED_REASONS for code in reasons) and attempt < CONFLICT_ATTEMPTS - 1:
                time.sleep(random.uniform(0, min(1.0, 0.02 * 2 ** attempt)))
                continue
            raise StorageError(f"could not {what}: {exc.cause_response_message}") from exc
        return None
    raise StorageError(f"could not {what}: too many transaction conflicts")  # pragma: no cover


def update_task(task: TaskModel, actions: list, condition: Condition, delta: BatchDelta,
                now: datetime | None = None, refresh: bool = False) -> bool:
    """Apply a conditional task update and move its batch's counters, in one transaction.

    Returns ``False`` (nothing written) when ``condition`` does not hold. The counter item is
    updated unconditionally, so a task whose batch item is missing still moves on. With
    ``refresh`` the task is re-read afterwards (a transaction returns no attributes).
    """
    if not task.batch_id:
        raise ValueError("update_task is for tasks that belong to a batch")
    now = now or utcnow()

    def build(transaction: TransactWrite) -> None:
        transaction.update(task, actions=actions, condition=condition)
        transaction.update(BatchModel(counter_key(task.batch_id, task.key)), actions=_counter_actions(delta, now))

    if transact(build, f"update task {task.key!r} of batch {task.batch_id!r}") is not None:
        return False
    if refresh:
        task.refresh(consistent_read=True)
    if delta.failure:
        try:
            stop_if_failing(task.batch_id, now)
        except (StorageError, PynamoDBException):  # the task's write stands; the next failure checks again
            logger.exception("could not check the batch's failure threshold", extra={"batch_id": task.batch_id})
    return True


def update_task_and_put(task: TaskModel, actions: list, condition: Condition, delta: BatchDelta | None,
                        new_tasks: Sequence[TaskModel], now: datetime | None = None) -> bool:
    """Apply a conditional task update and create ``new_tasks`` (each only if its key is new), in
    one transaction; ``False`` (nothing written) when ``condition`` does not hold.

    New tasks may carry the updated task's batch id (its ``total`` grows by those created, in the
    same counter update as ``delta``) or none. At most :func:`fold_room` new tasks fit.
    """
    now = now or utcnow()
    batch_id = task.batch_id
    if any(new.batch_id not in (None, batch_id) for new in new_tasks):
        raise ValueError("new tasks may only join the updated task's batch")
    pending = list(range(len(new_tasks)))
    while True:
        def build(transaction: TransactWrite, pending: list[int] = pending) -> None:
            for index in pending:
                transaction.save(new_tasks[index], condition=TaskModel.key.does_not_exist())
            transaction.update(task, actions=actions, condition=condition)
            joining = sum(1 for index in pending if new_tasks[index].batch_id)
            if batch_id and (delta is not None or joining):
                counters = _counter_actions(delta or BatchDelta(), now)
                if joining:
                    counters.append(BatchModel.total.add(joining))
                transaction.update(BatchModel(counter_key(batch_id, task.key)), actions=counters)

        reasons = transact(build, f"update task {task.key!r} with {len(pending)} new tasks")
        if reasons is None:
            return True
        # Puts come first (in order), then the task's update, then the counter's.
        if reasons[len(pending)] == _CONDITION_FAILED:
            return False
        pending = [index for index, code in zip(pending, reasons, strict=False) if code != _CONDITION_FAILED]


def fold_room(batch_id: str | None) -> int:
    """How many new tasks fit in one transaction next to a task's update and its batch counter."""
    return MAX_TRANSACTION_ITEMS - 1 - (1 if batch_id else 0)


def put_tasks(tasks: Sequence[TaskModel], batch_id: str, now: datetime | None = None,
              tolerance: Tolerance | None = None) -> list[bool]:
    """Create ``tasks`` (all with ``batch_id``) and add the created ones to the batch's total.

    Each chunk of puts and its ``total`` increment form one transaction, so the total counts
    exactly the tasks created, even across crashes and re-submissions. Returns, per task,
    whether it was created (``False``: a task with that key existed and was left untouched).
    A ``tolerance`` is kept by the batch from its first put on. A batch that stopped at its
    threshold takes nothing: :class:`BatchFailedError`.
    """
    now = now or utcnow()
    for task in tasks:
        if task.batch_id != batch_id:
            raise ValueError(f"task {task.key!r} does not carry batch id {batch_id!r}")
    created = [False] * len(tasks)
    try:
        written = _put_in_chunks(tasks, batch_id, now, progress=created, tolerance=tolerance)
    except StorageError as exc:
        stored = [task.key for task, made in zip(tasks, created, strict=True) if made]
        raise PartialPutError(f"{exc}; {len(stored)} of {len(tasks)} tasks were stored before it", stored) from exc
    assert written is not None  # no guard: never refused as a whole
    if not any(created):
        _touch(batch_id, now)  # every task existed: make sure the batch itself does
    return created


class PartialPutError(StorageError):
    """Storage failed part-way through putting a batch: ``stored`` are the keys that went in
    (each with the batch's total), the others did not."""

    def __init__(self, message: str, stored: list[str]) -> None:
        super().__init__(message)
        self.stored = stored


class GuardFailedError(CoworkerError):
    """The guard of a guarded put no longer held: nothing of that chunk was written."""


def put_guarded(tasks: Sequence[TaskModel], guard_key: str, guard: Condition,
                now: datetime | None = None) -> list[bool]:
    """Create ``tasks`` only while ``guard`` holds on the item ``guard_key`` (a worker's claim).

    Each chunk is one transaction: the puts (each only if its key is new), the ``total`` of
    their batch (tasks may carry one batch id, or none), and a check of ``guard``. Raises
    :class:`GuardFailedError` when the guard fails; chunks written before stay (their keys make
    a repeat idempotent). Returns, per task, whether it was created.
    """
    now = now or utcnow()
    batch_ids = {task.batch_id for task in tasks}
    if len(batch_ids) > 1:
        raise ValueError("guarded puts take tasks of one batch (or none) at a time")
    created = _put_in_chunks(tasks, next(iter(batch_ids), None), now, (guard_key, guard))
    if created is None:
        raise GuardFailedError(f"the condition on {guard_key!r} no longer holds")
    return created


def _put_in_chunks(tasks: Sequence[TaskModel], batch_id: str | None, now: datetime,
                   guard: tuple[str, Condition] | None = None, progress: list[bool] | None = None,
                   tolerance: Tolerance | None = None) -> list[bool] | None:
    """Put ``tasks`` in transactions within DynamoDB's limits; ``None`` when the guard failed.

    ``progress`` (one flag per task) is filled in as chunks commit, so a caller that sees an
    exception knows exactly which tasks were stored before it."""
    created = progress if progress is not None else [False] * len(tasks)
    room = MAX_TRANSACTION_ITEMS - (1 if batch_id else 0) - (1 if guard else 0)
    chunk: list[int] = []
    size = 0
    for index, task in enumerate(tasks):
        size_of_task = item_size(task)
        if chunk and (len(chunk) >= room or size + size_of_task > PUT_CHUNK_BYTES):
            if not _put_chunk(tasks, chunk, batch_id, now, created, guard, tolerance):
                return None
            chunk, size = [], 0
        chunk.append(index)
        size += size_of_task
    if chunk and not _put_chunk(tasks, chunk, batch_id, now, created, guard, tolerance):
        return None
    return created


def item_size(task: TaskModel) -> int:
    """Attribute names plus values: a close upper bound of DynamoDB's own item size."""
    serialized = task.serialize()
    return sum(len(name.encode()) + len(repr(value).encode()) for name, value in serialized.items())


def _put_chunk(tasks: Sequence[TaskModel], indexes: list[int], batch_id: str | None, now: datetime,
               created: list[bool], guard: tuple[str, Condition] | None = None,
               tolerance: Tolerance | None = None) -> bool:
    """One chunk; ``False`` when the guard failed (nothing of the chunk written)."""
    pending = list(indexes)
    while pending:
        def build(transaction: TransactWrite, pending: list[int] = pending) -> None:
            for index in pending:
                transaction.save(tasks[index], condition=TaskModel.key.does_not_exist())
            if batch_id:
                actions = [
                    BatchModel.created_at.set(BatchModel.created_at | now),
                    BatchModel.updated_at.set(now),
                    BatchModel.total.add(len(pending)),
                ]
                if tolerance is not None and tolerance.percent is not None:
                    actions.append(BatchModel.tolerated_failure_percent.set(
                        BatchModel.tolerated_failure_percent | tolerance.percent))
                if tolerance is not None and tolerance.count is not None:
                    actions.append(BatchModel.tolerated_failure_count.set(
                        BatchModel.tolerated_failure_count | tolerance.count))
                # A stopped batch refuses new tasks from callers; a running task's follow-ups (the
                # guarded puts) still go in, and are cancelled like the batch's other open tasks.
                refuse = BatchModel.failed_at.does_not_exist() if guard is None else None
                transaction.update(BatchModel(batch_key(batch_id)), actions=actions, condition=refuse)
            if guard is not None:
                transaction.condition_check(TaskModel, guard[0], condition=guard[1])

        reasons = transact(build, f"put {len(pending)} tasks" + (f" of batch {batch_id!r}" if batch_id else ""))
        if reasons is None:
            for index in pending:
                created[index] = True
            return True
        # pynamodb sends condition checks first, then puts (in order), then updates.
        if guard is not None:
            if reasons[0] == _CONDITION_FAILED:
                return False
            reasons = reasons[1:]
        if batch_id and guard is None and reasons[len(pending)] == _CONDITION_FAILED:
            raise BatchFailedError(f"batch {batch_id!r} stopped at its failure threshold ({_reason(batch_id)}); "
                                   "it takes no new tasks until it is redriven (POST /batches/{id}/retry)")
        # Drop the keys that exist and try again.
        pending = [index for index, code in zip(pending, reasons, strict=False) if code != _CONDITION_FAILED]
    return True


def _reason(batch_id: str) -> str:
    try:
        head = BatchModel.get(batch_key(batch_id), consistent_read=True, attributes_to_get=["failure_reason"])
    except DoesNotExist:
        return "unknown"
    return head.failure_reason or "unknown"


def stop_if_failing(batch_id: str, now: datetime | None = None) -> bool:
    """Stop the batch if more of its tasks are ignored than it tolerates; ``True`` for the one
    call that stopped it.

    Called after each task of the batch that is ignored for failing (not for cancels). Costs one
    consistent read of the batch's head item when the batch has no threshold, plus the batch's
    progress (one BatchGetItem) when it has one. Stopping is one transaction: the head item gets
    ``failed_at`` and the reason (on the condition that it had none: exactly once) and the batch
    joins the control record's stopped batches, whose open tasks are then cancelled as the
    coordinator meets them, and not claimed meanwhile.
    """
    from coworker import control  # control builds on the task model; batches is lower

    now = now or utcnow()
    try:
        head = BatchModel.get(batch_key(batch_id), consistent_read=True, attributes_to_get=[
            "tolerated_failure_percent", "tolerated_failure_count", "failed_at"])
    except DoesNotExist:
        return False
    tolerance = _tolerance_of(head)
    if head.failed_at is not None or tolerance == Tolerance():
        return False
    progress = get_batch(batch_id)
    reason = tolerance.exceeded(progress.ignored, progress.total)
    if reason is None:
        return False

    def build(transaction: TransactWrite) -> None:
        transaction.update(BatchModel(batch_key(batch_id)), actions=[
            BatchModel.failed_at.set(now), BatchModel.failure_reason.set(reason), BatchModel.updated_at.set(now)],
            condition=BatchModel.failed_at.does_not_exist())
        control.stop_batch_actions(transaction, batch_id, now)

    if transact(build, f"stop batch {batch_id!r}") is not None:
        return False  # another worker stopped it first
    logger.warning("batch stopped at its failure threshold", extra={"batch_id": batch_id, "reason": reason})
    return True


def reopen(batch_id: str, now: datetime | None = None) -> bool:
    """Clear a stopped batch's failure (before its redrive): it takes tasks and runs them again.
    ``False`` if it had not stopped."""
    from coworker import control

    now = now or utcnow()

    def build(transaction: TransactWrite) -> None:
        transaction.update(BatchModel(batch_key(batch_id)), actions=[
            BatchModel.failed_at.remove(), BatchModel.failure_reason.remove(), BatchModel.updated_at.set(now)],
            condition=BatchModel.failed_at.exists())
        control.reopen_batch_actions(transaction, batch_id, now)

    return transact(build, f"reopen batch {batch_id!r}") is None


def _tolerance_of(head: BatchModel) -> Tolerance:
    percent = head.tolerated_failure_percent
    count = head.tolerated_failure_count
    return Tolerance(percent=float(percent) if percent is not None else None,
                     count=int(count) if count is not None else None)


def _touch(batch_id: str, now: datetime) -> None:
    try:
        BatchModel(batch_key(batch_id)).update(actions=[
            BatchModel.created_at.set(BatchModel.created_at | now),
            BatchModel.updated_at.set(now),
            BatchModel.total.add(0),
        ])
    except UpdateError as exc:
        raise StorageError(f"could not record batch {batch_id!r}: {exc.cause_response_message}") from exc


def get_batch(batch_id: str) -> BatchProgress:
    """The batch's counters, summed over its items (one strongly consistent BatchGetItem), or
    :class:`BatchNotFoundError`."""
    base = batch_key(batch_id)
    keys = [base, *(f"{base}#{shard}" for shard in range(COUNTER_SHARDS))]
    try:
        items = list(BatchModel.batch_get(keys, consistent_read=True))
    except PynamoDBException as exc:
        raise StorageError(f"could not read batch {batch_id!r}: {exc}") from exc
    head = next((item for item in items if item.key == base), None)
    if head is None:
        raise BatchNotFoundError(f"no batch with id {batch_id!r}")
    updated = [item.updated_at for item in items if item.updated_at is not None]
    return BatchProgress(
        batch_id=batch_id,
        total=sum(int(item.total or 0) for item in items),
        finished=sum(int(item.finished or 0) for item in items),
        ignored=sum(int(item.ignored or 0) for item in items),
        created_at=head.created_at,
        updated_at=max(updated) if updated else None,
        tolerance=_tolerance_of(head),
        failed_at=head.failed_at,
        failure_reason=head.failure_reason,
    )


def membership(key: str) -> tuple[str | None, str | None]:
    """``(batch_id, status)`` of a task (consistent read of two attributes); ``(None, None)`` if missing.

    Transitions called with a key only (cancel, retry, reaping) use it to learn whether the
    task's write must move a batch counter: ``batch_id`` never changes after the put.
    """
    try:
        task = TaskModel.get(key, consistent_read=True, attributes_to_get=["batch_id", "status"])
    except DoesNotExist:
        return None, None
    except PynamoDBException as exc:
        raise StorageError(f"could not read task {key!r}: {exc}") from exc
    return task.batch_id, task.status
