"""Every write to the task table goes through here: conditional puts, updates and deletes of one
item, and transactions.

Each helper turns DynamoDB's answers into what the engine acts on, in one place:

* a condition that does not hold -> ``False`` (or the transaction's cancellation reasons);
* an item that would pass DynamoDB's 400 KB limit -> :class:`RecordTooLargeError`;
* anything else (throttling past the retries, an outage, a denied permission, and a request that
  got no answer at all: a connection closed or timed out, an endpoint out of reach) ->
  :class:`StorageError`, raised from the pynamodb error so its cause is kept.

A request with no answer may still have landed: a caller that must know reads the item again.

Callers build conditions and actions from the models' attributes (:mod:`coworker.data.models`).
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar, cast

from pynamodb.constants import NONE
from pynamodb.exceptions import DeleteError, PutError, PynamoDBException, TransactWriteError, UpdateError
from pynamodb.expressions.condition import Condition
from pynamodb.models import Model
from pynamodb.transactions import TransactWrite

from coworker.data.connection import transaction_connection
from coworker.data.models import TaskModel
from coworker.errors import GuardFailedError, RecordTooLargeError, StorageError

# DynamoDB's error code for a condition that did not hold (single-item writes) ...
CONDITION_FAILED = "ConditionalCheckFailedException"
# ... and the cancellation reason of a transaction item whose condition did not hold.
TRANSACTION_CONDITION_FAILED = "ConditionalCheckFailed"
_TOO_LARGE_CODE = "ValidationException"
_TOO_LARGE_TEXT = "maximum allowed size"
# DynamoDB limits of one TransactWriteItems call: 100 actions and 4 MB in all.
MAX_TRANSACTION_ITEMS = 100
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024
# Leave room for the guard and request overhead.
PUT_CHUNK_BYTES = MAX_TRANSACTION_BYTES - 256 * 1024
# New tasks that fit in one transaction next to a task's update.
FOLD_ROOM = MAX_TRANSACTION_ITEMS - 1
CONFLICT_ATTEMPTS = 10
# An API request that makes many writes starts none later than this after it began, and answers
# by the second figure with what it knows, rather than be cut off with no answer at API Gateway's
# 29 s (start-up included) when writes are slow.
REQUEST_START_SECONDS = 15
REQUEST_ANSWER_SECONDS = 20
_RETRIED_REASONS = frozenset({"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"})


def _too_large(code: str | None, message: str | None) -> bool:
    """DynamoDB refused a write because an item would pass its 400 KB limit."""
    return code in (_TOO_LARGE_CODE, None) and _TOO_LARGE_TEXT in (message or "")


def _answer(exc: PynamoDBException) -> dict[str, Any]:
    """DynamoDB's error answer behind ``exc``, or ``{}`` when there was none: a request that failed
    on the wire (botocore's ConnectionClosedError, ReadTimeoutError, EndpointConnectionError) has
    no answer, and some of those carry ``response = None``, on which pynamodb's own
    ``cause_response_code`` raises AttributeError."""
    response = getattr(exc.cause, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return error if isinstance(error, dict) else {}


def error_code(exc: PynamoDBException) -> str | None:
    """DynamoDB's error code behind ``exc`` (``ConditionalCheckFailedException`` ...), or ``None``
    for a request that got no answer."""
    return _answer(exc).get("Code")


def error_message(exc: PynamoDBException) -> str:
    """DynamoDB's own words for ``exc``, else what went wrong on the wire."""
    return _answer(exc).get("Message") or str(exc.cause or exc)


def _refused(exc: PutError | UpdateError | DeleteError, what: str) -> StorageError:
    """The error to raise for a refusal that is not a failed condition."""
    if _too_large(error_code(exc), _answer(exc).get("Message")):
        return RecordTooLargeError(f"could not {what}: the item would pass DynamoDB's 400 KB limit")
    return StorageError(f"could not {what}: {error_message(exc)}")


def put_if_new(item: Model, what: str) -> bool:
    """One conditional PutItem of ``item``; ``False`` when an item with its key exists (left
    untouched). ``what`` completes "could not ..." in an error's message."""
    try:
        item.save(condition=type(item)._hash_key_attribute().does_not_exist())
    except PutError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return False
        raise _refused(exc, f"put {what}") from exc
    return True


def update(item: Model, actions: Sequence[Any], condition: Condition | None, what: str, *,
           refresh: bool = True) -> bool:
    """One UpdateItem on ``item``; ``False`` (nothing written) when ``condition`` does not hold.

    With ``refresh`` the item's attributes are refreshed from the written item; without, nothing
    is returned (the cheaper request a worker makes several times per task). ``what`` completes
    "could not ..." in an error's message, e.g. ``"claim task 'k'"``.
    """
    try:
        if refresh:
            item.update(actions=list(actions), condition=condition)
        else:
            # Every model of the table is keyed by ``key``.
            type(item)._get_connection().update_item(getattr(item, "key"), actions=list(actions),  # noqa: B009
                                                     condition=condition, return_values=NONE)
    except UpdateError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return False
        raise _refused(exc, what) from exc
    return True


def delete_if(item: Model, condition: Condition, what: str) -> bool:
    """One conditional DeleteItem; ``False`` when ``condition`` does not hold."""
    try:
        item.delete(condition=condition)
    except DeleteError as exc:
        if error_code(exc) == CONDITION_FAILED:
            return False
        raise _refused(exc, f"delete {what}") from exc
    return True


def _reasons(exc: TransactWriteError) -> list[str | None]:
    return [reason.code if reason else None for reason in (exc.cancellation_reasons or [])]


def transact(build: Callable[[TransactWrite], None], what: str) -> list[str | None] | None:
    """Run one transaction, retrying conflicts with jittered backoff.

    Returns ``None`` on success, or the per-item cancellation reasons when a condition failed
    (compare them with :data:`TRANSACTION_CONDITION_FAILED`).
    """
    for attempt in range(CONFLICT_ATTEMPTS):
        # One token per attempt: botocore's own retries of this attempt (network errors) reuse
        # it, so an attempt that did commit is not applied twice.
        try:
            token = str(uuid.uuid4())
            with TransactWrite(connection=transaction_connection(), client_request_token=token) as transaction:
                build(transaction)
        except TransactWriteError as exc:
            reasons = _reasons(exc)
            if TRANSACTION_CONDITION_FAILED in reasons:
                return reasons
            texts = [_answer(exc).get("Message") or "", *(r.message or "" for r in exc.cancellation_reasons or [] if r)]
            if any(_too_large(None, text) for text in texts):
                raise RecordTooLargeError(f"could not {what}: an item would pass DynamoDB's 400 KB limit") from exc
            if any(code in _RETRIED_REASONS for code in reasons) and attempt < CONFLICT_ATTEMPTS - 1:
                time.sleep(random.uniform(0, min(1.0, 0.02 * 2 ** attempt)))
                continue
            raise StorageError(f"could not {what}: {error_message(exc)}") from exc
        return None
    raise StorageError(f"could not {what}: too many transaction conflicts")  # pragma: no cover


def put_all_if_new(items: Sequence[Model], what: str) -> bool:
    """Put ``items`` (at most :data:`MAX_TRANSACTION_ITEMS`) in one transaction, each only if its
    key is new; ``False``, with nothing written, when any of the keys exists already."""

    def build(transaction: TransactWrite) -> None:
        for item in items:
            transaction.save(item, condition=type(item)._hash_key_attribute().does_not_exist())

    return transact(build, f"put {what}") is None


def update_task_and_put(task: TaskModel, actions: Sequence[Any], condition: Condition,
                        new_tasks: Sequence[TaskModel]) -> bool:
    """Apply a conditional task update and create ``new_tasks`` (each only if its key is new), in
    one transaction; ``False`` (nothing written) when ``condition`` does not hold.

    New tasks may carry the updated task's batch id or none; at most :data:`FOLD_ROOM` fit.
    """
    if any(new.batch_id not in (None, task.batch_id) for new in new_tasks):
        raise ValueError("new tasks may only join the updated task's batch")
    pending = list(range(len(new_tasks)))
    while True:
        def build(transaction: TransactWrite, pending: list[int] = pending) -> None:
            for index in pending:
                transaction.save(new_tasks[index], condition=TaskModel.key.does_not_exist())
            transaction.update(task, actions=list(actions), condition=condition)

        reasons = transact(build, f"update task {task.key!r} with {len(pending)} new tasks")
        if reasons is None:
            return True
        # Puts come first (in order), then the task's update.
        if reasons[len(pending)] == TRANSACTION_CONDITION_FAILED:
            return False
        pending = [index for index, code in zip(pending, reasons, strict=False)
                   if code != TRANSACTION_CONDITION_FAILED]


def put_guarded(tasks: Sequence[TaskModel], guard_key: str, guard: Condition) -> list[bool]:
    """Create ``tasks`` only while ``guard`` holds on the item ``guard_key`` (a worker's claim).

    Each chunk is one transaction: the puts (each only if its key is new) and a check of
    ``guard``. Raises :class:`GuardFailedError` when the guard fails; chunks written before stay
    (their keys make a repeat idempotent). Returns, per task, whether it was created.
    """
    created = [False] * len(tasks)
    chunk: list[int] = []
    size = 0
    for index, task in enumerate(tasks):
        size_of_task = item_size(task)
        if chunk and (len(chunk) >= FOLD_ROOM or size + size_of_task > PUT_CHUNK_BYTES):
            _put_chunk(tasks, chunk, created, guard_key, guard)
            chunk, size = [], 0
        chunk.append(index)
        size += size_of_task
    if chunk:
        _put_chunk(tasks, chunk, created, guard_key, guard)
    return created


def item_size(task: TaskModel) -> int:
    """Attribute names plus values: a close upper bound of DynamoDB's own item size."""
    serialized = task.serialize()
    return sum(len(name.encode()) + len(repr(value).encode()) for name, value in serialized.items())


def _put_chunk(tasks: Sequence[TaskModel], indexes: list[int], created: list[bool], guard_key: str,
               guard: Condition) -> None:
    """One chunk of a guarded put; :class:`GuardFailedError` (nothing of it written) when the
    guard failed."""
    pending = list(indexes)
    while pending:
        def build(transaction: TransactWrite, pending: list[int] = pending) -> None:
            for index in pending:
                transaction.save(tasks[index], condition=TaskModel.key.does_not_exist())
            transaction.condition_check(TaskModel, guard_key, condition=guard)

        reasons = transact(build, f"put {len(pending)} tasks")
        if reasons is None:
            for index in pending:
                created[index] = True
            return
        # pynamodb sends condition checks first, then puts (in order).
        if reasons[0] == TRANSACTION_CONDITION_FAILED:
            raise GuardFailedError(f"the condition on {guard_key!r} no longer holds")
        # Drop the keys that exist and try again.
        pending = [index for index, code in zip(pending, reasons[1:], strict=False)
                   if code != TRANSACTION_CONDITION_FAILED]


Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclasses.dataclass(frozen=True)
class Window:
    """How long one request may spend on its writes, as ``time.monotonic()`` values: no write
    starts after ``start_by``, and the request answers by ``answer_by``."""

    start_by: float
    answer_by: float

    @classmethod
    def of_request(cls) -> Window:
        """The window of an API request that begins now (see REQUEST_START_SECONDS)."""
        now = time.monotonic()
        return cls(now + REQUEST_START_SECONDS, now + REQUEST_ANSWER_SECONDS)


def each_within(write: Callable[[Item], Result], items: Sequence[Item], threads: int,
                window: Window | None = None) -> tuple[list[Result | None], int]:
    """``write`` each of ``items``, ``threads`` at a time: the results in order, and how many items
    were not reached (``None`` in the results). Without a ``window`` every item is written.

    With one, an item not started by ``window.start_by`` is skipped, and at ``window.answer_by``
    the writes still under way are left to land, or not, on their own: the caller answers with
    what it knows, and a repeat of its (conditional, idempotent) writes finishes the rest. The
    first error a write raised is raised.
    """
    if not items:
        return [], 0
    if window is None:
        with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="coworker-write") as pool:
            return list(pool.map(write, items)), 0
    skipped = object()

    def within(item: Item) -> Result | object:
        return skipped if time.monotonic() > window.start_by else write(item)

    pool = ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="coworker-write")
    futures = [pool.submit(within, item) for item in items]
    wait(futures, timeout=max(0.0, window.answer_by - time.monotonic()))
    for future in futures:
        future.cancel()  # not started yet: dropped (one under way runs on)
    pool.shutdown(wait=False)
    results: list[Result | None] = []
    unreached = 0
    for future in futures:
        outcome = future.result() if future.done() and not future.cancelled() else skipped
        if outcome is skipped:
            results.append(None)
            unreached += 1
        else:
            results.append(cast(Result, outcome))
    return results, unreached
