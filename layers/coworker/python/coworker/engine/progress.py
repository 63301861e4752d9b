"""Batch progress counted from the table's stream, exactly once per transition.

Every write to the task table appears in its DynamoDB stream (``NEW_AND_OLD_IMAGES``). The
coordinator follows the stream beside its ticks (:class:`CountingLoop`: a pass of :func:`follow`
every tick, on a thread of its own, so that a slow counter write never holds dispatch) and turns
each record of a task that has a ``batch_id`` into a change of its batch's counts::

    count(image) = total 1, finished 1 if status is finished, ignored 1 if status is ignored
    change       = count(new image) - count(old image)

so a put adds to ``total``, a finish to ``finished``, an ignore to ``ignored``, a redrive of an
ignored task takes one back, and a write that does not change the status changes nothing. A
record never depends on another, so the order in which shards are read does not matter. A
removal (TTL of a finished task) changes nothing: the batch keeps counting what it ran.

**Exactly once.** The changes one stream shard makes to one batch go to that pair's own counter
item, ``batch#<id>#<shard id>``, which keeps the sequence number of the last record it counted
(``read_through``). Records are read in order within a shard, and a counter is only moved by
records past its ``read_through``, with the condition that ``read_through`` is still what was
read. A follower that dies before saving its place (the ``stream#<shard id>`` checkpoint) reads
the same records again and counts none of them twice; two followers at once cannot both count
one. The batch's head item lists its counter items (``counters``), so progress is one consistent
read of the head and one BatchGetItem of its counters.

**Why not a transaction per task.** A transactional write costs twice a plain one: counting in
the same transaction as each put and each terminal write made a batch task cost about 11.6 write
units against 7.1 for a single task. Following the stream, a batch task's own writes are the
plain ones a single task makes; the counters cost one write per batch per shard per tick, shared
by every task the tick counted. No item is hot however wide the batch: each counter item takes
at most one write per tick.

**What it costs in freshness.** Counts lag the tasks by up to one coordinator tick (plus the
stream's own delay, typically well under a second on AWS). A failure threshold is checked when
the follower counts the failures, so a batch stops up to a tick after the failure that passed it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from pynamodb.exceptions import PynamoDBException

from coworker.config import Settings
from coworker.data import layout, writes
from coworker.data.layout import COUNTED_THROUGH_KEY, STREAM_KEY_PREFIX
from coworker.data.models import BatchModel, ErrorKind, StreamCheckpointModel, TaskModel, utcnow
from coworker.engine import batches, events
from coworker.errors import StorageError
from coworker.observability import MetricName, logger, metrics

CHECKPOINT_PREFIX = STREAM_KEY_PREFIX
# GetRecords calls per shard and tick (each up to 1,000 records): bounds a tick's work when the
# follower is far behind; the next tick goes on where this one stopped.
CALLS_PER_TICK = 20
RECORDS_PER_CALL = 1000
# A page shorter than this means the follower has caught up with the writers: the pass moves on
# rather than chase records written while it reads (and spend the shard's ~5 reads a second).
CAUGHT_UP_RECORDS = 100
# A checkpoint is saved after records of a batch were counted, or when the shard ended, or at
# most this often otherwise (the follower's own writes are in the stream too).
IDLE_CHECKPOINT_SECONDS = 60
# Stream records live 24 h; a checkpoint of a shard that is gone is deleted after two days.
CHECKPOINT_DAYS = 2
COUNTER_RETRIES = 5


@dataclasses.dataclass(frozen=True)
class Change:
    """What one stream record does to its batch's counts."""

    batch_id: str
    sequence: int
    at: datetime | None = None  # when the write was made (the record's time, to the second)
    total: int = 0
    finished: int = 0
    ignored: int = 0
    failure: bool = False  # a task ignored for failing (not cancelled): checks the threshold


@dataclasses.dataclass
class FollowReport:
    """What one :func:`follow` pass read and counted."""

    records: int = 0
    changes: int = 0
    batches: int = 0
    behind: bool = False  # stopped at the call budget with records left to read
    # The write time of the oldest record the pass read (each shard's first), and how far behind
    # the writes the follower's counts were when it ended (see StreamFollower._lag).
    oldest_record_at: datetime | None = None
    lag_seconds: float = 0.0
    events: int = 0  # Task Ignored events of the records read


def _count(image: dict[str, Any] | None) -> tuple[int, int, int]:
    if not image or layout.STATUS_ATTRIBUTE not in image:
        return 0, 0, 0
    status = image[layout.STATUS_ATTRIBUTE].get("S")
    return 1, int(status == "finished"), int(status == "ignored")


def _last_error_kind(image: dict[str, Any]) -> str | None:
    errors = image.get("errors", {}).get("L") or []
    return errors[-1].get("M", {}).get("kind", {}).get("S") if errors else None


def change_of(record: dict[str, Any]) -> Change | None:
    """The batch change of one stream record (as GetRecords or a Lambda event gives it), or
    ``None`` when it changes no batch's counts."""
    if record.get("eventName") == "REMOVE":
        return None
    body = record.get("dynamodb", {})
    old, new = body.get("OldImage"), body.get("NewImage")
    batch_id = (new or {}).get("batch_id", {}).get("S")
    if not batch_id:
        return None
    before, after = _count(old), _count(new)
    total, finished, ignored = (a - b for a, b in zip(after, before, strict=True))
    if not (total or finished or ignored):
        return None
    failure = ignored > 0 and _last_error_kind(new) != ErrorKind.CANCELLED.value
    return Change(batch_id, int(body["SequenceNumber"]), _record_time(body), total, finished, ignored, failure)


def _record_time(body: dict[str, Any]) -> datetime | None:
    at = body.get("ApproximateCreationDateTime")
    if isinstance(at, (int, float)):  # as a Lambda event gives it: epoch seconds
        return datetime.fromtimestamp(at, UTC)
    return at


def settles_at(record: dict[str, Any]) -> datetime | None:
    """For a record of a batch's task or head: the time the counts must be known through before
    that batch can read done (the write's time, or the promise of a put request under way)."""
    body = record.get("dynamodb", {})
    image = body.get("NewImage") or body.get("OldImage") or {}
    key = image.get("key", {}).get("S", "")
    if not (image.get("batch_id") or batches.is_batch_key(key)):
        return None
    times = [_record_time(body)]
    if int(image.get("puts_in_flight", {}).get("N", "0")) > 0:
        times.append(_parse_time(image.get("puts_until", {}).get("S")))
    known = [at for at in times if at is not None]
    return max(known) if known else None


def _parse_time(text: str | None) -> datetime | None:
    return BatchModel.puts_until.deserialize(text) if text else None


def counter_key(batch_id: str, shard_id: str) -> str:
    """The counter item of what stream shard ``shard_id`` counted for a batch."""
    return f"{batches.batch_key(batch_id)}#{shard_id}"


@dataclasses.dataclass(frozen=True)
class Applied:
    """What one :func:`apply` counted."""

    changes: int  # changes new to their counters, now counted
    complete: bool = True  # False: it stopped at its deadline with batches left to count


def apply(shard_id: str, changes: Iterable[Change], now: datetime | None = None,
          deadline: float = math.inf) -> Applied:
    """Move the counters of the batches ``changes`` (read in order from one shard) touch,
    skipping what each counter has counted already.

    Once ``deadline`` (``time.monotonic()``) has passed it starts no other batch's write (it
    always makes the first, so that every call counts something): the batches left are counted
    when their records are read again, and what was counted is skipped then."""
    now = now or utcnow()
    by_batch: dict[str, list[Change]] = defaultdict(list)
    for change in changes:
        by_batch[change.batch_id].append(change)
    if not by_batch:
        return Applied(0)
    keys = [counter_key(batch_id, shard_id) for batch_id in by_batch]
    try:
        known = {item.key: item for item in BatchModel.batch_get(keys, consistent_read=True)}
    except PynamoDBException as exc:
        raise StorageError(f"could not read batch counters: {exc}") from exc
    applied = 0
    complete = True
    failing: list[str] = []
    for number, (batch_id, batch_changes) in enumerate(by_batch.items()):
        if number and time.monotonic() >= deadline:
            complete = False
            break
        fresh = _count_into(batch_id, shard_id, batch_changes, known.get(counter_key(batch_id, shard_id)), now)
        applied += len(fresh)
        if any(change.failure for change in fresh):
            failing.append(batch_id)
    for batch_id in failing:
        try:
            batches.stop_if_failing(batch_id)
        except (StorageError, PynamoDBException):  # the next failure counted checks again
            logger.exception("could not check the batch's failure threshold", extra={"batch_id": batch_id})
    return Applied(applied, complete)


def _count_into(batch_id: str, shard_id: str, changes: list[Change], counter: BatchModel | None,
                now: datetime) -> list[Change]:
    """Add the changes past the counter's ``read_through`` to it (optimistically: on the
    condition that nobody counted in between); the changes it counted."""
    key = counter_key(batch_id, shard_id)
    for _ in range(COUNTER_RETRIES):
        read_through = int(counter.read_through) if counter is not None and counter.read_through else -1
        fresh = [change for change in changes if change.sequence > read_through]
        if not fresh:
            return []
        if counter is None:
            # List the counter on the head first: a crash after it leaves a listed counter that
            # does not exist yet, which reads as zero.
            BatchModel(batches.batch_key(batch_id)).update(actions=[
                BatchModel.counters.add({shard_id}), BatchModel.updated_at.set(now)])
        condition = (BatchModel.read_through.does_not_exist() if counter is None
                     else BatchModel.read_through == counter.read_through)
        actions = [BatchModel.read_through.set(str(fresh[-1].sequence)), BatchModel.updated_at.set(now)]
        changed_at = [c.at for c in fresh if c.at is not None]
        if counter is not None and counter.last_change_at is not None:
            changed_at.append(counter.last_change_at)
        if changed_at:
            actions.append(BatchModel.last_change_at.set(max(changed_at)))
        for name in ("total", "finished", "ignored"):
            amount = sum(getattr(change, name) for change in fresh)
            if amount:
                actions.append(getattr(BatchModel, name).add(amount))
        if writes.update(BatchModel(key), actions, condition, f"count into {key!r}"):
            return fresh
        counter = _read_counter(key)
    raise StorageError(f"could not count into {key!r}: it kept changing")


def _read_counter(key: str) -> BatchModel | None:
    try:
        return BatchModel.get(key, consistent_read=True)
    except BatchModel.DoesNotExist:
        return None


@dataclasses.dataclass
class _ShardPlace:
    iterator: str | None = None
    read_through: str | None = None
    ended: bool = False
    saved_at: float = 0.0


def records_as_sent(response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any) -> None:
    """botocore ``before-parse`` hook for GetRecords: take the records as DynamoDB sends them.

    botocore would otherwise walk every attribute of both images of every record through its
    shape parser, which cost about 0.6 ms of CPU per task (three records) on the coordinator,
    a fifth of what the worker's own client spends on it. The JSON as sent is the shape a Lambda
    stream event has (images as ``{"S": ...}`` maps, ``ApproximateCreationDateTime`` in epoch
    seconds), which :func:`change_of` and :func:`settles_at` read as they are. Errors are left to
    botocore, so its exceptions (expired iterator, trimmed data, throttling) are raised as before.
    """
    if response_dict.get("status_code", 500) >= 300:
        return
    customized_response_dict.update(json.loads(response_dict["body"]))
    response_dict["body"] = b"{}"  # nothing left for the shape parser to walk


class StreamFollower:
    """Follows the task table's stream (every shard), counting batch changes; keeps its place
    in memory between passes and in checkpoint items across processes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._client: Any = None
        self._stream_arn: str | None = None
        self._places: dict[str, _ShardPlace] = {}
        # The latest settling time of a batch record read, until the watermark passes it.
        self._unsettled: datetime | None = None
        self._watermark_saved_at = 0.0
        # When the last pass that read every shard to its end began: every write before it is
        # counted. And the last lag published (an idle follower publishes a zero once).
        self._caught_up_at: datetime | None = None
        self._lag_published = 0.0

    def _streams(self) -> Any:
        if self._client is None:
            import boto3

            client = boto3.client("dynamodbstreams", region_name=self.settings.region,
                                  endpoint_url=self.settings.dynamodb_endpoint)
            client.meta.events.register("before-parse.dynamodb-streams.GetRecords", records_as_sent)
            self._client = client
        return self._client

    def stream_arn(self) -> str | None:
        """The table's current stream, or ``None`` when it has none."""
        if self._stream_arn is None:
            description = TaskModel._get_connection().connection.describe_table(self.settings.table_name)
            if description.get("StreamSpecification", {}).get("StreamEnabled"):
                self._stream_arn = description.get("LatestStreamArn")
        return self._stream_arn

    def _shards(self, arn: str) -> list[str]:
        shards: list[str] = []
        request: dict[str, Any] = {"StreamArn": arn}
        while True:
            description = self._streams().describe_stream(**request)["StreamDescription"]
            shards += [shard["ShardId"] for shard in description.get("Shards", [])]
            last = description.get("LastEvaluatedShardId")
            if not last:
                return shards
            request["ExclusiveStartShardId"] = last

    def follow(self, now: datetime | None = None, budget_seconds: float | None = None) -> FollowReport:
        """Read what is new in every shard (up to CALLS_PER_TICK calls each, and no new read
        once ``budget_seconds`` are spent) and count it."""
        report = FollowReport()
        deadline = time.monotonic() + budget_seconds if budget_seconds is not None else math.inf
        with self._lock:
            started = utcnow()
            caught_up = False
            try:
                arn = self.stream_arn()
                if arn is None:
                    logger.error("the task table has no stream: batch progress is not counted",
                                 extra={"table": self.settings.table_name})
                    return report
                for shard_id in self._shards(arn):
                    self._follow_shard(arn, shard_id, report, now or utcnow(), deadline)
                if not report.behind:
                    self._advance_watermark(started - timedelta(seconds=self.settings.effective_stream_lag_seconds))
                    caught_up = True
            finally:  # a pass that fails is behind too: its lag grows until one catches up
                self._lag(report, started, caught_up)
        return report

    def _lag(self, report: FollowReport, started: datetime, caught_up: bool) -> None:
        """Publish how far behind the writes the counts are (``StreamFollowerLag``, seconds), what
        batch progress, callbacks and Task Ignored events wait on:

        * a pass that read every shard to its end: the age of the oldest record it read (a
          second or two when keeping up; the backlog's age once, after catching up), 0 if none;
        * a pass cut short or failed: the time since the last pass that caught up began (every
          write before it is counted), else since the oldest record read, else since it began.

        Published by a pass that counted a batch change or read a Task Ignored event, by one cut
        short or failed, and once more (0) by the first pass with nothing to count after them: a
        follower reading only writes nobody waits on (its own checkpoints, tasks outside batches)
        publishes nothing, as an idle coordinator publishes only its ticks."""
        now = utcnow()
        if caught_up:
            since = report.oldest_record_at or now
            self._caught_up_at = started
        else:
            since = self._caught_up_at or report.oldest_record_at or started
        report.lag_seconds = max(0.0, (now - since).total_seconds())
        waited_on = not caught_up or report.changes or report.events
        if not waited_on:
            report.lag_seconds = 0.0
        if waited_on or self._lag_published > 0:
            metrics.add_metric(name=MetricName.STREAM_FOLLOWER_LAG, unit="Seconds", value=report.lag_seconds)
            self._lag_published = report.lag_seconds

    def _advance_watermark(self, counted_through: datetime) -> None:
        """Every shard was read to its end after ``counted_through`` + the stream's lag: every
        write made before it is counted. Saved while a batch record read is not yet covered,
        and at least every IDLE_CHECKPOINT_SECONDS (a follower that starts again does not see
        the records its predecessor read)."""
        idle = time.monotonic() - self._watermark_saved_at >= IDLE_CHECKPOINT_SECONDS
        if self._unsettled is None and not idle:
            return
        StreamCheckpointModel(COUNTED_THROUGH_KEY, counted_through=counted_through).save()
        self._watermark_saved_at = time.monotonic()
        if self._unsettled is not None and counted_through >= self._unsettled:
            self._unsettled = None

    def _place(self, shard_id: str) -> _ShardPlace:
        place = self._places.get(shard_id)
        if place is None:
            try:
                saved = StreamCheckpointModel.get(CHECKPOINT_PREFIX + shard_id, consistent_read=True)
                place = _ShardPlace(read_through=saved.read_through, ended=bool(saved.ended), saved_at=time.monotonic())
            except StreamCheckpointModel.DoesNotExist:
                place = _ShardPlace()
            self._places[shard_id] = place
        return place

    def _iterator(self, arn: str, shard_id: str, place: _ShardPlace) -> str | None:
        if place.iterator is None:
            request = {"StreamArn": arn, "ShardId": shard_id}
            if place.read_through:
                request |= {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "SequenceNumber": place.read_through}
            else:
                request |= {"ShardIteratorType": "TRIM_HORIZON"}
            try:
                place.iterator = self._streams().get_shard_iterator(**request)["ShardIterator"]
            except self._streams().exceptions.TrimmedDataAccessException:
                logger.error("the stream trimmed records the follower had not read: some batch counts "
                             "may be short", extra={"shard": shard_id})
                request = {"StreamArn": arn, "ShardId": shard_id, "ShardIteratorType": "TRIM_HORIZON"}
                place.iterator = self._streams().get_shard_iterator(**request)["ShardIterator"]
        return place.iterator

    def _follow_shard(self, arn: str, shard_id: str, report: FollowReport, now: datetime,
                      deadline: float = math.inf) -> None:
        place = self._place(shard_id)
        if place.ended:
            return
        changes: list[Change] = []
        ignored: list[events.Event] = []
        publisher = events.publisher(self.settings)
        last_sequence = place.read_through
        for _ in range(CALLS_PER_TICK):
            if time.monotonic() > deadline:
                report.behind = True  # out of time: the next pass goes on from here
                break
            iterator = self._iterator(arn, shard_id, place)
            try:
                answer = self._streams().get_records(ShardIterator=iterator, Limit=RECORDS_PER_CALL)
            except (self._streams().exceptions.ExpiredIteratorException,
                    self._streams().exceptions.TrimmedDataAccessException):
                place.iterator = None  # read again from the last place counted
                continue
            except self._streams().exceptions.LimitExceededException:
                report.behind = True  # a shard takes about 5 reads a second: go on next pass
                break
            records = answer.get("Records", [])
            report.records += len(records)
            first_at = _record_time(records[0]["dynamodb"]) if records else None
            if first_at is not None and (report.oldest_record_at is None or first_at < report.oldest_record_at):
                report.oldest_record_at = first_at  # a shard's records come in order: its first is its oldest
            for record in records:
                last_sequence = record["dynamodb"]["SequenceNumber"]
                change = change_of(record)
                if change is not None:
                    changes.append(change)
                if publisher.enabled:
                    event = events.task_ignored(record, self.settings.table_name)
                    if event is not None:
                        ignored.append(event)
                settles = settles_at(record)
                if settles is not None and (self._unsettled is None or settles > self._unsettled):
                    self._unsettled = settles
            place.iterator = answer.get("NextShardIterator")
            if place.iterator is None:
                place.ended = True
                break
            if len(records) < CAUGHT_UP_RECORDS:  # caught up, save for what is being written now
                break
        else:
            report.behind = True
        if changes:
            try:
                applied = apply(shard_id, changes, now, deadline)
            except Exception:
                place.iterator, place.ended = None, False  # not counted: the next pass reads them again
                raise
            report.changes += applied.changes
            report.batches += len({change.batch_id for change in changes})
            if not applied.complete:
                # Out of time with batches left: the next pass reads these records again from the
                # saved place (each counter skips what it counted), and publishes their events then.
                place.iterator, place.ended = None, False
                report.behind = True
                return
        report.events += len(ignored)
        self._publish(publisher, ignored)
        advanced = last_sequence != place.read_through
        place.read_through = last_sequence
        idle_for = time.monotonic() - place.saved_at
        if changes or ignored or place.ended or (advanced and idle_for >= IDLE_CHECKPOINT_SECONDS):
            self._save(shard_id, place, now)

    @staticmethod
    def _publish(publisher: events.Publisher, ignored: list[events.Event]) -> None:
        """Send the Task Ignored events of records read. One that cannot be sent after retries
        is logged with its event and counted (EventsDropped), not retried by holding the stream
        back: batch counting must not wait on EventBridge."""
        try:
            publisher.publish(ignored)
        except StorageError:
            logger.exception("could not publish task events; dropped",
                             extra={"events": [event.detail for event in ignored]})
            metrics.add_metric(name=MetricName.EVENTS_DROPPED, unit="Count", value=len(ignored))

    def _save(self, shard_id: str, place: _ShardPlace, now: datetime) -> None:
        StreamCheckpointModel(CHECKPOINT_PREFIX + shard_id, read_through=place.read_through, ended=place.ended,
                              delete_after_epoch=now + timedelta(days=CHECKPOINT_DAYS)).save()
        place.saved_at = time.monotonic()


_followers: dict[tuple[str | None, str], StreamFollower] = {}
_followers_lock = threading.Lock()


def follower(settings: Settings) -> StreamFollower:
    """This process's follower of the configured table's stream."""
    with _followers_lock:
        cache_key = (settings.dynamodb_endpoint, settings.table_name)
        if cache_key not in _followers:
            _followers[cache_key] = StreamFollower(settings)
        _followers[cache_key].settings = settings  # the latest (e.g. a new stream lag)
        return _followers[cache_key]


def follow(settings: Settings, now: datetime | None = None, budget_seconds: float | None = None
           ) -> FollowReport:
    """One pass of this process's follower (the coordinator calls it every tick)."""
    return follower(settings).follow(now, budget_seconds)


def catch_up(settings: Settings, passes: int = 100) -> FollowReport:
    """Follow until nothing is left to read (tests, benchmarks and the local test kit's drain)."""
    total = FollowReport()
    for _ in range(passes):
        report = follow(settings)
        total.records += report.records
        total.changes += report.changes
        total.batches += report.batches
        if not report.behind:
            break
    return total


class CountingLoop:
    """Batch counting apart from the coordinator's tick: passes of this process's follower on a
    thread of their own, one every ``interval`` seconds (at once after one that overran), each
    starting no new read or counter write after ``budget_seconds``.

    The tick never waits for it: a counter write that takes seconds (a throttled table) holds
    only this thread, while the tick goes on handing out work. A pass cut short by its budget
    goes on from the saved place at the next; counts stay exactly once (see :func:`apply`).
    """

    def __init__(self, settings: Settings, interval: float, budget_seconds: float) -> None:
        self._settings = settings
        self._interval = interval
        self._budget = budget_seconds
        self._cond = threading.Condition()
        self._stopping = False
        self._asked = False  # a pass is wanted now (see quiet)
        self._counted = 0  # changes counted since the last take
        # The last pass that ended: when it began (monotonic), and whether it counted nothing and
        # read every shard to its end.
        self._last: tuple[float, bool] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> CountingLoop:
        self._thread = threading.Thread(target=self._run, name="batch-counting", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait: float) -> None:
        """Start no other pass; wait up to ``wait`` seconds for the one under way (a write held
        longer than that finishes on its own: the counters' conditions keep it exactly once)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=wait)

    def take(self) -> int:
        """The changes counted since the last call."""
        with self._cond:
            counted, self._counted = self._counted, 0
            return counted

    def quiet(self, since: float, wait: float) -> bool:
        """Whether a pass begun at or after ``since`` (``time.monotonic()``) counted nothing and
        read every shard to its end: asks for one at once and waits up to ``wait`` seconds for it
        (``False`` if none ended by then)."""
        until = time.monotonic() + wait
        with self._cond:
            self._asked = True
            self._cond.notify_all()
            while self._last is None or self._last[0] < since:
                left = until - time.monotonic()
                if left <= 0 or self._stopping:
                    return False
                self._cond.wait(left)
            return self._last[1]

    def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            with self._cond:
                while not (self._stopping or self._asked) and time.monotonic() < next_at:
                    self._cond.wait(next_at - time.monotonic())
                if self._stopping:
                    return
                self._asked = False
            began = time.monotonic()
            try:
                report: FollowReport | None = follow(self._settings, budget_seconds=self._budget)
            except Exception:  # noqa: BLE001 - the next pass reads the same records again
                logger.exception("could not count batch progress from the stream")
                report = None
            with self._cond:
                self._counted += report.changes if report is not None else 0
                self._last = (began, report is not None and report.changes == 0 and not report.behind)
                self._cond.notify_all()
            next_at = max(began + self._interval, next_at + self._interval)
