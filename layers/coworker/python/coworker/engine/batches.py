"""Batches: progress counters that stay right without scanning or transactions.

A batch lives in the task table as a head item and its counter items::

    batch#<id>              created_at, the failure threshold, failed_at, ``counters`` (the
                            stream shards that counted for it), and its put requests: under
                            way (``puts_in_flight``, promised to end by ``puts_until``) and
                            when the last ended (``puts_closed_at``)
    batch#<id>#<shard id>   total, finished, ignored: what one stream shard counted,
                            ``read_through`` (its last record counted) and ``last_change_at``

    callbacks, fired, and its place in the ``batches#watched`` index partition while callbacks or
                            events may still fire (see :mod:`coworker.engine.callbacks`); and
                            ``completed_at``, once its completion fired

    total     tasks created for the batch (a re-submitted task that already exists is not counted)
    finished  tasks of the batch that reached ``finished``
    ignored   tasks of the batch that are ``ignored`` now (a redrive takes one back)

    open = total - finished - ignored
    done = open == 0, once the follower has counted every write made before the batch's last
           put request ended and before the last change it counted (``counted_through``), and
           the total counted has reached the tasks its put requests recorded creating
           (``tasks_created`` on the head, added by the write that ends each request)

The counts come from the table's stream (see :mod:`coworker.engine.progress`): a task of a batch is put
and moved with the same plain writes as any task, and the coordinator counts each transition
exactly once. They lag the tasks by up to one coordinator tick; the rule for ``done`` keeps a
batch whose puts are not all counted yet from reading done early. Progress is one consistent
read of the head, one BatchGetItem of its counters and one read of the follower's watermark.
Batches made by releases before the stream kept ``total`` on the head and outcomes in
``batch#<id>#0..7``: those are still read and summed.

**A completed batch takes no new tasks.** Once a watched batch's completion has fired (its
``complete`` callback put, its ``Batch Completed`` event sent: both carry its final counts), a
put request naming it is refused (:class:`BatchCompletedError`, 409) and writes nothing; a
re-send whose tasks all exist already is answered as before (they exist). The coordinator
records ``completed_at`` before it fires, on the condition that no put request opened since it
read the batch done (:func:`close`), and a put request opens only on the condition that it is
not set: one of the two wins, so no task joins a batch after its final counts were given out.
Follow-ups (``inherit_batch``) cannot come after completion: they are written before, or with,
their parent's end, and the parent is one of the batch's open tasks. A redrive of a completed
batch's ignored tasks is allowed (its total does not change): they run again, ``complete`` does
not fire a second time, and ``success`` fires if they all end finished.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pynamodb.exceptions import DoesNotExist, PynamoDBException
from pynamodb.expressions.condition import Condition
from pynamodb.transactions import TransactWrite

from coworker.data import writes
from coworker.data.layout import BATCH_KEY_PREFIX, COUNTED_THROUGH_KEY, WATCHED_BATCHES_PARTITION
from coworker.data.models import BatchModel, StreamCheckpointModel, TaskModel, iso_utc, utcnow
from coworker.engine import control
from coworker.engine.tasks import NewTask
from coworker.errors import (
    BatchCompletedError,
    BatchFailedError,
    BatchNotFoundError,
    PartialPutError,
    StorageError,
)
from coworker.observability import logger

# Outcome counter items of batches made before counting moved to the stream (read, never written).
LEGACY_COUNTER_SHARDS = 8
# Tasks of a batch put at once (each a conditional PutItem).
PUT_THREADS = 16
# A put request promises to end its puts within this long of opening the batch (API Gateway
# gives a request 29 s): until it closes, or this has passed, the batch cannot read done.
PUT_WINDOW_SECONDS = 30


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
    # The counts are final through ``settled_at`` (its last put and last counted change) once
    # the stream follower has counted every write made before it (``counted_through``).
    settled_at: datetime | None = None
    counted_through: datetime | None = None
    # Tasks its ended put requests created, as they recorded it: a total counted below it is not
    # final, whatever the watermark says.
    tasks_created: int = 0
    callbacks: tuple[str, ...] = ()  # the events it has callback tasks for
    fired: tuple[str, ...] = ()  # the events that happened and were handled
    completed_at: datetime | None = None  # when its completion fired: it takes no new tasks since

    @property
    def open(self) -> int:
        """Tasks not yet finished or ignored: todo, processing or failed."""
        return self.total - self.finished - self.ignored

    @property
    def settled(self) -> bool:
        """No write to the batch is left to count (else ``open`` may still grow)."""
        return self.settled_at is None or (self.counted_through is not None
                                           and self.counted_through >= self.settled_at)

    @property
    def done(self) -> bool:
        return self.open <= 0 and self.settled and self.total >= self.tasks_created

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
            "counted_through": iso(self.counted_through),
            "callbacks": list(self.callbacks),
            "fired": list(self.fired),
            "completed_at": iso(self.completed_at),
        }


def batch_key(batch_id: str) -> str:
    """The table key of a batch's counter item."""
    return BATCH_KEY_PREFIX + batch_id


def is_batch_key(key: str) -> bool:
    """True for keys reserved for batch items (task keys may not start with ``batch#``)."""
    return key.startswith(BATCH_KEY_PREFIX)


def put_tasks(tasks: Sequence[TaskModel], batch_id: str, now: datetime | None = None,
              tolerance: Tolerance | None = None, callbacks: Mapping[str, NewTask] | None = None,
              watch: bool = False) -> list[bool]:
    """Create ``tasks`` (all with ``batch_id``), each only if its key is new; returns, per task,
    whether it was created (``False``: a task with that key existed and was left untouched).

    First the batch's head item is created or touched (one write; a ``tolerance`` is kept from the
    first put on), refusing with :class:`BatchFailedError` if the batch stopped at its threshold; it
    also records the request as under way, promising its puts within PUT_WINDOW_SECONDS.
    ``callbacks`` (event -> task; the latest put that names any sets them) and ``watch`` (events are
    published) put the batch in the watched partition, where the coordinator fires them
    (:mod:`coworker.engine.callbacks`). Then each task is one conditional PutItem, PUT_THREADS at a
    time: the plain write a single task makes, since the batch's ``total`` is counted from the
    stream. Last, the head records the request as ended (one write), so the batch can read done once
    the counts pass it. A batch that stops while its tasks are being put may take a few of them;
    they are cancelled with its other open tasks.

    When writes are slow, the puts keep to a request's window (:class:`coworker.data.writes.Window`,
    which also keeps the promise): puts not started by its start limit are skipped, and those still
    under way at its end are left to land or not (the batch is then not closed: its promise stands
    in); :class:`PartialPutError` names the tasks known stored. Putting the same tasks again stores
    the rest, and finds those that landed meanwhile existing. Each call puts them in an order of
    its own: in a fixed one, every re-send would spend its window on the tasks an earlier one
    stored, and never reach the rest.
    """
    window = writes.Window.of_request()  # opening the batch is one of its writes
    now = now or utcnow()
    for task in tasks:
        if task.batch_id != batch_id:
            raise ValueError(f"task {task.key!r} does not carry batch id {batch_id!r}")
    try:
        _open(batch_id, now, tolerance, watch_actions(callbacks, watch, now))
    except BatchCompletedError:
        if _all_exist(tasks):
            return [False] * len(tasks)  # a re-send of what it holds: answered as before, nothing written
        raise
    failures: list[StorageError] = []

    def put(task: TaskModel) -> bool:
        try:
            return _put_if_new(task)
        except StorageError as exc:
            failures.append(exc)
            return False

    outcomes: list[bool | None] = []
    unreached = 0
    order = random.sample(range(len(tasks)), len(tasks))
    try:
        in_order, unreached = writes.each_within(put, [tasks[n] for n in order], PUT_THREADS, window)
        outcomes = [None] * len(tasks)
        for position, number in enumerate(order):
            outcomes[number] = in_order[position]
    finally:
        created = [bool(outcome) for outcome in outcomes] or [False] * len(tasks)
        stored = [task.key for task, made in zip(tasks, created, strict=True) if made]
        if not unreached:
            _close(batch_id, len(stored))
    if failures or unreached:
        reason = ("the batch's puts took too long (writes are slow)" if unreached
                  else "DynamoDB refused or failed some puts")
        first = str(failures[0]) if failures else reason
        raise PartialPutError(f"{first}; {len(stored)} of {len(tasks)} tasks were stored", stored,
                              f"{reason}; {len(stored)} of {len(tasks)} tasks were stored")
    return created


def _all_exist(tasks: Sequence[TaskModel]) -> bool:
    """Whether every one of ``tasks`` exists already (BatchGetItem, 100 keys a call)."""
    keys = list(dict.fromkeys(task.key for task in tasks))
    try:
        found = {item.key for start in range(0, len(keys), 100)
                 for item in TaskModel.batch_get(keys[start:start + 100], attributes_to_get=["key"])}
    except PynamoDBException as exc:
        raise StorageError(f"could not read the batch's tasks: {exc}") from exc
    return found >= set(keys)


def _put_if_new(task: TaskModel) -> bool:
    return writes.put_if_new(task, f"task {task.key!r}")


def watch_actions(callbacks: Mapping[str, NewTask] | None, watch: bool, now: datetime) -> list[Any]:
    """Update actions that set a batch's ``callbacks`` (``{}`` when only events are wanted and
    none were named) and put its head in the watched partition; none when neither is asked for."""
    if not callbacks and not watch:
        return []
    spec = {event: task.model_dump(mode="json", exclude_none=True) for event, task in (callbacks or {}).items()}
    return [BatchModel.callbacks.set(spec) if spec else BatchModel.callbacks.set(BatchModel.callbacks | spec),
            *rewatch_actions(now)]


def rewatch_actions(now: datetime) -> list[Any]:
    """Update actions that put a batch's head (back) in the watched partition."""
    return [BatchModel.status_shard.set(WATCHED_BATCHES_PARTITION), BatchModel.due_at.set(now)]


def _open(batch_id: str, now: datetime, tolerance: Tolerance | None, watch: Sequence[Any] = ()) -> None:
    """Create or touch the batch's head item and record a put request under way;
    :class:`BatchFailedError` if the batch stopped."""
    actions = [BatchModel.created_at.set(BatchModel.created_at | now), BatchModel.updated_at.set(now),
               BatchModel.puts_in_flight.add(1),
               BatchModel.puts_until.set(utcnow() + timedelta(seconds=PUT_WINDOW_SECONDS))]
    if tolerance is not None and tolerance.percent is not None:
        actions.append(BatchModel.tolerated_failure_percent.set(
            BatchModel.tolerated_failure_percent | tolerance.percent))
    if tolerance is not None and tolerance.count is not None:
        actions.append(BatchModel.tolerated_failure_count.set(
            BatchModel.tolerated_failure_count | tolerance.count))
    actions += watch
    open_to_puts = BatchModel.failed_at.does_not_exist() & BatchModel.completed_at.does_not_exist()
    if writes.update(BatchModel(batch_key(batch_id)), actions, open_to_puts, f"open batch {batch_id!r}"):
        return
    head = _head(batch_id)
    if head is not None and head.completed_at is not None:
        raise BatchCompletedError(
            f"batch {batch_id!r} completed at {iso_utc(head.completed_at)} (its completion callback or event "
            "gave its final counts), so it takes no new tasks: put them in a new batch (another batch_id)")
    reason = head.failure_reason if head is not None and head.failure_reason else "unknown"
    raise BatchFailedError(f"batch {batch_id!r} stopped at its failure threshold ({reason}); "
                           "it takes no new tasks until it is redriven (POST /batches/{id}/retry)")


def _close(batch_id: str, created: int) -> None:
    """Record that a put request ended (its puts are all made or refused), and how many tasks
    it created: the counted total must reach them before the batch reads done. If this write
    fails, the request's promise (PUT_WINDOW_SECONDS) stands in for it: ``done`` comes later, not
    wrong. Like :func:`settle`, it only ever moves ``puts_closed_at`` later: a redrive settled as
    of when its writes may still land is not pulled back by a put that ends before then."""
    head, now = BatchModel(batch_key(batch_id)), utcnow()
    ended = [BatchModel.puts_in_flight.add(-1), BatchModel.tasks_created.add(created)]
    try:
        if not writes.update(head, [*ended, BatchModel.puts_closed_at.set(now)], _settled_before(now),
                             f"close the puts of batch {batch_id!r}", refresh=False):
            writes.update(head, ended, None, f"close the puts of batch {batch_id!r}", refresh=False)
    except (PynamoDBException, StorageError):
        logger.exception("could not record the end of a batch's puts", extra={"batch_id": batch_id})


def _settled_before(when: datetime) -> Condition:
    """The batch's settle time (``puts_closed_at``) is unset or before ``when``: the condition of
    every write that sets it, so that it only ever moves later."""
    return BatchModel.puts_closed_at.does_not_exist() | (BatchModel.puts_closed_at < when)


def settle(batch_id: str, at: datetime | None = None) -> None:
    """Record a change to the batch's tasks that the counts must pass before it reads done (a
    redrive of its ignored tasks), made by now or, for writes still under way, by ``at``; a
    batch with callbacks that had left the watched partition goes back to it (a callback not yet
    fired may fire after the redrive)."""
    head, when = BatchModel(batch_key(batch_id)), at or utcnow()
    try:
        # Only ever later: a redrive settled as of when it may land is not undone by a quicker one.
        if not writes.update(head, [BatchModel.puts_closed_at.set(when)],
                             BatchModel.key.exists() & _settled_before(when), f"settle batch {batch_id!r}"):
            head = BatchModel.get(head.key, consistent_read=True)  # settled later already (or no batch)
        if head.callbacks is not None and head.status_shard is None:
            head.update(actions=rewatch_actions(utcnow()), condition=BatchModel.callbacks.exists())
    except (PynamoDBException, StorageError):
        logger.exception("could not record a redrive on the batch", extra={"batch_id": batch_id})


def _head(batch_id: str) -> BatchModel | None:
    try:
        return BatchModel.get(batch_key(batch_id), consistent_read=True,
                              attributes_to_get=["failure_reason", "completed_at"])
    except DoesNotExist:
        return None
    except PynamoDBException as exc:
        raise StorageError(f"could not read batch {batch_id!r}: {exc}") from exc


def close(head: BatchModel, batch_id: str, now: datetime) -> datetime | None:
    """Record that the batch completed (``completed_at``), before its completion fires, on the
    condition that no put request opened or ended, and no redrive or stop came, since ``head`` was
    read (done): from then on it takes no new tasks. When it completed (now or before), or
    ``None`` if something came since the read (its counts are not final)."""
    if head.completed_at is not None:
        return head.completed_at
    if writes.update(head, [BatchModel.completed_at.set(now)],
                     unchanged_since(head) & BatchModel.completed_at.does_not_exist(),
                     f"close batch {batch_id!r}", refresh=False):
        head.completed_at = now
        return now
    return None


def unchanged_since(head: BatchModel) -> Condition:
    """Nothing that could make the batch run again (a put request, a redrive, a stop) came since
    ``head`` was read (done).

    A put request that never recorded its end (its process was killed, or its puts were cut at
    its window: :func:`put_tasks`) leaves ``puts_in_flight`` above 0 for good; its promise
    (``puts_until``) stands in for its end, which the batch's ``done`` has already waited for.
    Then the condition is that no request opened or ended since the read (the count and the
    promise as read): a leftover count no longer holds the batch's completion back for ever."""
    unchanged = (BatchModel.puts_closed_at == head.puts_closed_at if head.puts_closed_at is not None
                 else BatchModel.puts_closed_at.does_not_exist())
    unchanged &= (BatchModel.failed_at == head.failed_at if head.failed_at is not None
                  else BatchModel.failed_at.does_not_exist())
    in_flight = int(head.puts_in_flight or 0)
    if in_flight > 0 and head.puts_until is not None:
        return unchanged & (BatchModel.puts_in_flight == in_flight) & (BatchModel.puts_until == head.puts_until)
    return unchanged & (BatchModel.puts_in_flight.does_not_exist() | (BatchModel.puts_in_flight <= 0))


def stop_if_failing(batch_id: str) -> bool:
    """Stop the batch if more of its tasks are ignored than it tolerates; ``True`` for the one
    call that stopped it.

    Called by the stream follower (:mod:`coworker.engine.progress`) when the changes it counted
    include a task of the batch ignored for failing (not a cancel). Costs one
    consistent read of the batch's head item when the batch has no threshold, plus the batch's
    progress (:func:`get_batch`) when it has one. Stopping is one transaction: the head item gets
    ``failed_at`` and the reason (on the condition that it had none: exactly once) and the batch
    joins the control record's stopped batches, whose open tasks are then cancelled as the
    coordinator meets them, and not claimed meanwhile. ``failed_at`` is when that write is made
    (not when the pass that counted the failure began), so no reader sees the batch running after
    its recorded failure.
    """
    try:
        head = BatchModel.get(batch_key(batch_id), consistent_read=True, attributes_to_get=[
            "tolerated_failure_percent", "tolerated_failure_count", "failed_at", "callbacks"])
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
        now = utcnow()  # each attempt of the transaction records its own moment
        # A batch with callbacks or events is watched again: its "stopped" fires.
        watch = rewatch_actions(now) if head.callbacks is not None else []
        transaction.update(BatchModel(batch_key(batch_id)), actions=[
            BatchModel.failed_at.set(now), BatchModel.failure_reason.set(reason), BatchModel.updated_at.set(now),
            *watch], condition=BatchModel.failed_at.does_not_exist())
        control.stop_batch_actions(transaction, batch_id, now)

    if writes.transact(build, f"stop batch {batch_id!r}") is not None:
        return False  # another worker stopped it first
    logger.warning("batch stopped at its failure threshold", extra={"batch_id": batch_id, "reason": reason})
    return True


def reopen(batch_id: str, now: datetime | None = None) -> bool:
    """Clear a stopped batch's failure (before its redrive): it takes tasks and runs them again.
    ``False`` if it had not stopped."""
    now = now or utcnow()

    def build(transaction: TransactWrite) -> None:
        transaction.update(BatchModel(batch_key(batch_id)), actions=[
            BatchModel.failed_at.remove(), BatchModel.failure_reason.remove(), BatchModel.updated_at.set(now)],
            condition=BatchModel.failed_at.exists())
        control.reopen_batch_actions(transaction, batch_id, now)

    return writes.transact(build, f"reopen batch {batch_id!r}") is None


def _tolerance_of(head: BatchModel) -> Tolerance:
    percent = head.tolerated_failure_percent
    count = head.tolerated_failure_count
    return Tolerance(percent=float(percent) if percent is not None else None,
                     count=int(count) if count is not None else None)


def get_batch(batch_id: str) -> BatchProgress:
    """The batch's counts (its head and counter items, read strongly consistent, and the
    follower's watermark for ``done``), or :class:`BatchNotFoundError`. They include what the
    coordinator has counted from the stream: up to a tick behind the tasks."""
    return read_batch(batch_id)[1]


def read_batch(batch_id: str, watermark: Callable[[], datetime | None] | None = None
               ) -> tuple[BatchModel, BatchProgress]:
    """The batch's head item as read, and its counts (see :func:`get_batch`). ``watermark``
    gives the follower's watermark (default: :func:`counted_through`, read each call); a pass
    over many batches reads it once."""
    base = batch_key(batch_id)
    try:
        head = BatchModel.get(base, consistent_read=True)
    except DoesNotExist as exc:
        raise BatchNotFoundError(f"no batch with id {batch_id!r}") from exc
    except PynamoDBException as exc:
        raise StorageError(f"could not read batch {batch_id!r}: {exc}") from exc
    keys = [f"{base}#{shard}" for shard in sorted(head.counters or ())]
    if int(head.total or 0):  # made before the stream counted: outcomes in its legacy items
        keys += [f"{base}#{shard}" for shard in range(LEGACY_COUNTER_SHARDS)]
    try:
        items = [head, *BatchModel.batch_get(keys, consistent_read=True)] if keys else [head]
    except PynamoDBException as exc:
        raise StorageError(f"could not read batch {batch_id!r}: {exc}") from exc
    updated = [item.updated_at for item in items if item.updated_at is not None]
    progress = BatchProgress(
        batch_id=batch_id,
        total=sum(int(item.total or 0) for item in items),
        finished=sum(int(item.finished or 0) for item in items),
        ignored=sum(int(item.ignored or 0) for item in items),
        created_at=head.created_at,
        updated_at=max(updated) if updated else None,
        tolerance=_tolerance_of(head),
        failed_at=head.failed_at,
        failure_reason=head.failure_reason,
        settled_at=_settles_at(items),
        tasks_created=int(head.tasks_created or 0),
        callbacks=tuple(sorted((head.callbacks or {}).keys())),
        fired=tuple(sorted(head.fired or ())),
        completed_at=head.completed_at,
    )
    if progress.settled_at is None:
        return head, progress  # a batch counted before the stream: its counts are exact as they are
    return head, dataclasses.replace(progress, counted_through=(watermark or counted_through)())


def _settles_at(items: list[BatchModel]) -> datetime | None:
    """The latest of: the batch's last put request's end (or promise, while one is under way),
    and the last change each counter counted."""
    head, counters = items[0], items[1:]
    times = [head.puts_until if int(head.puts_in_flight or 0) > 0 else head.puts_closed_at]
    times += [counter.last_change_at for counter in counters]
    known = [at for at in times if at is not None]
    return max(known) if known else None


def counted_through() -> datetime | None:
    """The stream follower's watermark (an eventually consistent read: an older value only makes
    ``done`` come later)."""
    try:
        return StreamCheckpointModel.get(COUNTED_THROUGH_KEY).counted_through
    except DoesNotExist:
        return None
    except PynamoDBException as exc:
        raise StorageError(f"could not read how far batches are counted: {exc}") from exc
