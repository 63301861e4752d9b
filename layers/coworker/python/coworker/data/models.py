"""Every pynamodb model of the task table, built from :mod:`coworker.data.layout`.

Tasks, batches, stream checkpoints, leases (worker slots and the coordinator's), the control
record and concurrency gates all live in one table; each kind has its model here, and
:func:`coworker.data.connection.bind` points them all at a table and endpoint once per process.
Engine modules compose conditions and update actions from these models' attributes and send
them through :mod:`coworker.data.writes` (writes) or :mod:`coworker.data.index` (index reads).
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from pynamodb.attributes import (
    BinaryAttribute,
    BooleanAttribute,
    JSONAttribute,
    ListAttribute,
    MapAttribute,
    NumberAttribute,
    TTLAttribute,
    UnicodeAttribute,
    UnicodeSetAttribute,
    UTCDateTimeAttribute,
)
from pynamodb.indexes import GlobalSecondaryIndex, IncludeProjection, KeysOnlyProjection
from pynamodb.models import Model

from coworker.data import layout


class TaskStatus(str, enum.Enum):
    """Lifecycle states, stored as these plain words so the console reads naturally."""

    TODO = "todo"
    PROCESSING = "processing"
    FAILED = "failed"
    FINISHED = "finished"
    IGNORED = "ignored"

    @classmethod
    def open(cls) -> tuple[TaskStatus, ...]:
        """States from which a task may still run."""
        return (cls.TODO, cls.FAILED, cls.PROCESSING)


class ErrorKind(str, enum.Enum):
    """Why an attempt did not finish; and ``redriven``, which marks in the same history where a
    task was run again from its first attempt."""

    BUSINESS = "business"  # the handler raised TaskFailedError
    SYSTEM = "system"  # any other exception
    TIMEOUT = "timeout"  # the worker ran out of time and released the lock
    WORKER_LOST = "worker_lost"  # the lock expired before a result: its worker died, or could not keep it
    UNKNOWN_TYPE = "unknown_type"  # no handler registered for the task type
    CANCELLED = "cancelled"  # cancelled through the API
    RECORD_TOO_LARGE = "record_too_large"  # the record hit DynamoDB's 400 KB item limit: ended
    REDRIVEN = "redriven"  # not an error: run again from attempt 1 (the entry has the attempts before)


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso_utc(value: datetime | None) -> str | None:
    """ISO-8601 UTC with a ``Z``, as the API and dashboard show times."""
    return value.isoformat().replace("+00:00", "Z") if value else None


class ErrorRecord(MapAttribute):
    """One failed attempt, as kept in a task's error history."""

    attempt = NumberAttribute()
    at = UTCDateTimeAttribute()
    kind = UnicodeAttribute()
    message = UnicodeAttribute()
    traceback = UnicodeAttribute(null=True)


class StatusIndex(GlobalSecondaryIndex["TaskModel"]):
    """Sparse index of live and ignored tasks by status shard, oldest ``due_at`` first
    (read it through :mod:`coworker.data.index`, which merges the shards)."""

    class Meta:
        index_name = layout.STATUS_INDEX_NAME
        projection = IncludeProjection(list(layout.STATUS_INDEX_PROJECTED))

    status_shard = UnicodeAttribute(hash_key=True)
    due_at = UTCDateTimeAttribute(range_key=True)


class _Layout:
    """How this process spreads statuses over index shards (set by ``connection.bind``)."""

    shards: int = layout.DEFAULT_STATUS_SHARDS


def status_shards() -> int:
    """Index shards per status in the bound table (``COWORKER_STATUS_SHARDS``)."""
    return _Layout.shards


def set_status_shards(shards: int) -> None:
    """Spread statuses over ``shards`` index partitions in this process (``connection.bind``)."""
    _Layout.shards = shards


class TaskModel(Model):
    """One task. Attribute names are the ones a person sees in the DynamoDB console."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    task_type = UnicodeAttribute(attr_name="type")
    payload = JSONAttribute(null=True)
    # A payload too large for the record: {"uri", "bytes", "sha256"} in the object store.
    payload_ref = JSONAttribute(null=True)
    status = UnicodeAttribute(attr_name=layout.STATUS_ATTRIBUTE)
    # "<status>#<shard>", the index partition key: always written with ``status``
    # (see :meth:`status_actions`).
    status_shard = UnicodeAttribute(null=True, attr_name=layout.STATUS_INDEX_PARTITION_KEY)
    due_at = UTCDateTimeAttribute(null=True, attr_name=layout.STATUS_INDEX_SORT_KEY)
    created_at = UTCDateTimeAttribute()
    updated_at = UTCDateTimeAttribute()
    finished_at = UTCDateTimeAttribute(null=True)
    # When the task was last claimed: the start of its latest attempt, written by the claim's own
    # UpdateItem (engine.lifecycle.claim). A claim given back unstarted leaves it (see
    # give_back_actions), so a finished task's is its finishing attempt's start.
    started_at = UTCDateTimeAttribute(null=True)
    attempts = NumberAttribute(default=0)
    # Redrives so far: part of the fencing token, since a redrive resets the attempts.
    generation = NumberAttribute(null=True)
    max_attempts = NumberAttribute()
    lock_owner = UnicodeAttribute(null=True)
    lock_expires_at = UTCDateTimeAttribute(null=True)
    # The status the last claim took the task from: "processing" means it took over a lost attempt.
    claimed_from = UnicodeAttribute(null=True)
    errors = ListAttribute(of=ErrorRecord, null=True)
    result = JSONAttribute(null=True)
    # A result too large for the record: {"uri", "bytes", "sha256"} in the result store.
    result_ref = JSONAttribute(null=True)
    batch_id = UnicodeAttribute(null=True)
    priority = NumberAttribute(null=True)
    # The task whose handler spawned this one (a follow-up), if any.
    parent = UnicodeAttribute(null=True)
    # At most concurrency_limit tasks with the same concurrency_key run at once (fleet-wide).
    concurrency_key = UnicodeAttribute(null=True)
    concurrency_limit = NumberAttribute(null=True)
    # Starts of tasks with the same rate_key are limited to rate_limit per rate_interval_seconds
    # (fleet-wide, see engine.rates); a limit set for the key in the control record wins.
    rate_key = UnicodeAttribute(null=True)
    rate_limit = NumberAttribute(null=True)
    rate_interval_seconds = NumberAttribute(null=True)
    # The start (epoch ms) its rate group last booked for it: it keeps its place in line.
    rate_booked_at = NumberAttribute(null=True)
    # The rate group that booked it (a task in two groups waits on the one that turned it away): a
    # change of that group's limit moves it (see engine.rates.rebook).
    rate_booked_by = UnicodeAttribute(null=True)
    # Its own time limit in seconds (else its type's declared one): see coworker.engine.timing.
    timeout_seconds = NumberAttribute(null=True)
    # What a live worker wrote when it found it could not keep the lock of attempt
    # ``lapse_attempt`` (why, and what the attempt was doing): the worker_lost entry of whoever
    # takes the task over says so, instead of a dead worker (see engine.lifecycle.note_lapse).
    lapse_attempt = NumberAttribute(null=True)
    lapse_reason = UnicodeAttribute(null=True)
    delete_after_epoch = TTLAttribute(null=True, attr_name=layout.TTL_ATTRIBUTE)

    status_index = StatusIndex()

    @classmethod
    def shard_value_of(cls, key: str, status: str) -> str:
        """The index partition key value of task ``key`` in ``status``."""
        return layout.shard_value(status, layout.shard_of(key, _Layout.shards))

    def serialize(self, null_check: bool = True) -> dict[str, dict[str, Any]]:
        """The item as DynamoDB stores it, ``status_shard`` always following ``status`` (every
        put, batch write and transaction goes through here)."""
        if self.status is not None:
            self.status_shard = self.shard_value_of(self.key, self.status)
        return super().serialize(null_check=null_check)

    @classmethod
    def status_actions(cls, key: str, status: str) -> list[Any]:
        """Update actions that move task ``key`` to ``status``: the status and its index shard."""
        return [cls.status.set(status), cls.status_shard.set(cls.shard_value_of(key, status))]

    def to_dict(self) -> dict[str, Any]:
        """The task as plain JSON-ready values (times as ISO-8601 UTC strings)."""
        iso = iso_utc
        return {
            "key": self.key,
            "type": self.task_type,
            "status": self.status,
            "payload": self.payload,
            "payload_ref": self.payload_ref,
            "attempts": int(self.attempts or 0),
            "max_attempts": int(self.max_attempts),
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "due_at": iso(self.due_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "lock_owner": self.lock_owner,
            "lock_expires_at": iso(self.lock_expires_at),
            "batch_id": self.batch_id,
            "parent": self.parent,
            "priority": int(self.priority) if self.priority is not None else None,
            "concurrency_key": self.concurrency_key,
            "concurrency_limit": int(self.concurrency_limit) if self.concurrency_limit is not None else None,
            "blocked": bool(self.status_shard and self.status_shard.startswith(layout.BLOCKED_PREFIX)),
            "rate_key": self.rate_key,
            "rate_limit": int(self.rate_limit) if self.rate_limit is not None else None,
            "rate_interval_seconds": (float(self.rate_interval_seconds)
                                      if self.rate_interval_seconds is not None else None),
            "timeout_seconds": float(self.timeout_seconds) if self.timeout_seconds is not None else None,
            "result": self.result,
            "result_ref": self.result_ref,
            "errors": [
                {
                    "attempt": int(e.attempt),
                    "at": iso(e.at),
                    "kind": e.kind,
                    "message": e.message,
                    "traceback": e.traceback,
                }
                for e in (self.errors or [])
            ],
        }


class WatchedBatchIndex(GlobalSecondaryIndex["BatchModel"]):
    """The tasks' status index, read for the ``batches#watched`` partition only."""

    class Meta:
        index_name = layout.STATUS_INDEX_NAME
        projection = KeysOnlyProjection()

    status_shard = UnicodeAttribute(hash_key=True)
    due_at = UTCDateTimeAttribute(range_key=True)


class BatchModel(Model):
    """One batch, kept in the task table: its head ``batch#<id>`` and its counter items
    ``batch#<id>#<stream shard id>`` (see :mod:`coworker.engine.batches` and
    :mod:`coworker.engine.progress`).

    It has no ``status``, so it is never counted as a task; the counters are moved by the
    coordinator as it reads the table's stream. A head with callbacks or events still to fire
    sits in the index partition ``batches#watched`` (:mod:`coworker.engine.callbacks`).
    """

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    total = NumberAttribute(default=0)
    finished = NumberAttribute(default=0)
    ignored = NumberAttribute(default=0)
    created_at = UTCDateTimeAttribute(null=True)
    updated_at = UTCDateTimeAttribute(null=True)
    # Failure threshold (on the head item only): the batch stops once more of its tasks are
    # ignored than it tolerates; failed_at and failure_reason say when and why.
    tolerated_failure_percent = NumberAttribute(null=True)
    tolerated_failure_count = NumberAttribute(null=True)
    failed_at = UTCDateTimeAttribute(null=True)
    failure_reason = UnicodeAttribute(null=True)
    # On the head: the stream shards that counted for the batch (its counter items).
    counters = UnicodeSetAttribute(null=True)
    # On the head: put requests under way (each promises to end its puts by puts_until), and
    # when the last one ended. The counts are settled once counted past both.
    puts_in_flight = NumberAttribute(null=True)
    puts_until = UTCDateTimeAttribute(null=True)
    puts_closed_at = UTCDateTimeAttribute(null=True)
    # On the head: tasks its ended put requests created (the counted total reaches it before done).
    tasks_created = NumberAttribute(null=True)
    # On a counter item: the sequence number of the last stream record it counted, and the
    # latest time of a change it counted.
    read_through = UnicodeAttribute(null=True)
    last_change_at = UTCDateTimeAttribute(null=True)
    # On the head, for callbacks and events (engine.callbacks): the callback tasks by event
    # (``{}`` when only events are wanted), the events handled, and while some may still fire,
    # its place in the ``batches#watched`` index partition.
    callbacks = JSONAttribute(null=True)
    fired = UnicodeSetAttribute(null=True)
    # On the head: when its completion fired (complete callback, Batch Completed event); from then
    # on it takes no new tasks (engine.batches).
    completed_at = UTCDateTimeAttribute(null=True)
    status_shard = UnicodeAttribute(null=True, attr_name=layout.STATUS_INDEX_PARTITION_KEY)
    due_at = UTCDateTimeAttribute(null=True, attr_name=layout.STATUS_INDEX_SORT_KEY)

    watched_index = WatchedBatchIndex()


class StreamCheckpointModel(Model):
    """How far the stream follower has read one stream shard (``stream#<shard id>``), and how far
    it has counted every shard (``stream#counted-through``); see :mod:`coworker.engine.progress`."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    read_through = UnicodeAttribute(null=True)
    ended = BooleanAttribute(default=False)
    counted_through = UTCDateTimeAttribute(null=True)
    delete_after_epoch = TTLAttribute(null=True, attr_name=layout.TTL_ATTRIBUTE)


class LeaseState:
    """What a lease item is held for (``slot#NNNN`` and ``lease#coordinator``)."""

    FREE = "free"
    RESERVED = "reserved"
    RUNNING = "running"
    HELD = "held"


class SlotIndex(GlobalSecondaryIndex["LeaseModel"]):
    """The tasks' status index, read for the ``worker-slot`` partition only."""

    class Meta:
        index_name = layout.STATUS_INDEX_NAME
        projection = KeysOnlyProjection()

    status_shard = UnicodeAttribute(hash_key=True)
    due_at = UTCDateTimeAttribute(range_key=True)


class LeaseModel(Model):
    """A lease item (see :mod:`coworker.engine.slots`): ``holder`` has it until ``due_at``
    (absent holder: free)."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    status = UnicodeAttribute(null=True, attr_name=layout.STATUS_ATTRIBUTE)
    status_shard = UnicodeAttribute(null=True, attr_name=layout.STATUS_INDEX_PARTITION_KEY)
    due_at = UTCDateTimeAttribute(attr_name=layout.STATUS_INDEX_SORT_KEY)
    holder = UnicodeAttribute(null=True)
    state = UnicodeAttribute(default=LeaseState.FREE)
    updated_at = UTCDateTimeAttribute()

    slot_index = SlotIndex()


class ControlModel(Model):
    """The control record ``control#types`` (see :mod:`coworker.engine.control`)."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    paused = UnicodeSetAttribute(null=True)
    held_types = UnicodeSetAttribute(null=True)  # types whose tasks may be parked
    stopped_batches = UnicodeSetAttribute(null=True)  # batches stopped at their failure threshold
    limits: MapAttribute[str, Any] = MapAttribute(null=True)  # task type -> most of its tasks running at once
    # rate group ("type:<type>" or "key:<rate key>") -> {"limit": N, "interval_ms": I} (engine.rates)
    rate_limits: MapAttribute[str, Any] = MapAttribute(null=True)
    # The most index shards per status the table may hold items in, and when the coordinator
    # first saw the count lowered below it (see engine.reshard).
    status_shards = NumberAttribute(null=True)
    shards_lowered_at = UTCDateTimeAttribute(null=True)
    version = NumberAttribute(default=0)
    updated_at = UTCDateTimeAttribute(null=True)


class DurationsModel(Model):
    """A task type's observed handler run times, ``control#durations#<type>``: counts in buckets
    of a log scale (see :mod:`coworker.engine.durations`), written whole under ``version``."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    counts = ListAttribute(of=NumberAttribute, null=True)
    version = NumberAttribute(default=0)
    updated_at = UTCDateTimeAttribute(null=True)


class SecretModel(Model):
    """A secret of the deployment kept in its table (``control#cursor-secret``): readable only by
    those who may read the tasks themselves."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    value = UnicodeAttribute()
    created_at = UTCDateTimeAttribute()


class CursorStateModel(Model):
    """The read state of a listing cursor too long to hand out whole (``control#cursor#<digest>``,
    named by its content): the cursor then names it. Deleted by TTL a day after it was last made."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    state = BinaryAttribute(legacy_encoding=False)
    delete_after_epoch = TTLAttribute(attr_name=layout.TTL_ATTRIBUTE)


class GateIndex(GlobalSecondaryIndex["GateModel"]):
    """The tasks' status index, read for the ``gates#waiting`` partition only."""

    class Meta:
        index_name = layout.STATUS_INDEX_NAME
        projection = KeysOnlyProjection()

    status_shard = UnicodeAttribute(hash_key=True)
    due_at = UTCDateTimeAttribute(range_key=True)


class GateModel(Model):
    """The gate of one concurrency group (see :mod:`coworker.engine.gates`)."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    holders: MapAttribute[str, Any] = MapAttribute(null=True)  # holder token -> lease end (epoch ms)
    limit = NumberAttribute(null=True)  # the limit its last holder entered under
    # "gates#waiting" while tasks may be blocked on it; due_at: when it was last swept.
    status_shard = UnicodeAttribute(null=True, attr_name=layout.STATUS_INDEX_PARTITION_KEY)
    due_at = UTCDateTimeAttribute(null=True, attr_name=layout.STATUS_INDEX_SORT_KEY)
    blocked_at = UTCDateTimeAttribute(null=True)  # the last time it blocked a task

    waiting_index = GateIndex()


class RateGateModel(Model):
    """The start log of one rate group, ``gate#rate:<group>`` (see :mod:`coworker.engine.rates`)."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    # The group's last starts (epoch ms, non-decreasing), at most its limit of them.
    starts: ListAttribute[int] = ListAttribute(of=NumberAttribute, null=True)  # type: ignore[arg-type]  # the stubs want the element's type
    version = NumberAttribute(null=True)  # one more on every change of ``starts``
    limit = NumberAttribute(null=True)  # what the last start's task carried (none under a limit set)
    interval_ms = NumberAttribute(null=True)
    # Tasks turned away are given a start time from here on, spaced interval / limit apart.
    booked_until = NumberAttribute(null=True)
    # Above engine.rates.HEAD_STARTS starts per interval, the head keeps only its newest starts:
    # the older ones are sealed in chunk items (:class:`RateChunkModel`), named here by the
    # version whose write sealed each, oldest first. Absent: ``starts`` is the whole log.
    chunks: ListAttribute[int] = ListAttribute(of=NumberAttribute, null=True)  # type: ignore[arg-type]  # as starts


class RateChunkModel(Model):
    """Older starts of a rate group's log, ``gate#rate-log:<group>#<version>``, sealed by the write of
    the head's ``version`` (see :mod:`coworker.engine.rates`): written once, never changed, and
    deleted by TTL once its starts are older than any interval."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    starts: ListAttribute[int] = ListAttribute(of=NumberAttribute)  # type: ignore[arg-type]  # as above
    delete_after_epoch = TTLAttribute(attr_name=layout.TTL_ATTRIBUTE)


class ScheduleIndex(GlobalSecondaryIndex["ScheduleModel"]):
    """The tasks' status index, read for the ``schedules`` partitions only."""

    class Meta:
        index_name = layout.STATUS_INDEX_NAME
        projection = KeysOnlyProjection()

    status_shard = UnicodeAttribute(hash_key=True)
    due_at = UTCDateTimeAttribute(range_key=True)


class ScheduleModel(Model):
    """A recurring schedule ``schedule#<name>`` (see :mod:`coworker.engine.schedules`)."""

    class Meta:
        table_name = layout.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=layout.PARTITION_KEY)
    name = UnicodeAttribute()
    expression = UnicodeAttribute()
    timezone = UnicodeAttribute()
    missed = UnicodeAttribute()
    template = UnicodeAttribute()  # the task each occurrence puts, as JSON (no key)
    anchor_at = UTCDateTimeAttribute()  # a rate's occurrences count from here
    # "schedules" (active, due_at = next occurrence) or "schedules#paused" (due_at = when paused)
    status_shard = UnicodeAttribute(attr_name=layout.STATUS_INDEX_PARTITION_KEY)
    due_at = UTCDateTimeAttribute(attr_name=layout.STATUS_INDEX_SORT_KEY)
    last_run_at = UTCDateTimeAttribute(null=True)
    last_task_key = UnicodeAttribute(null=True)
    skipped = NumberAttribute(default=0)  # occurrences missed under missed="skip"
    created_at = UTCDateTimeAttribute()
    updated_at = UTCDateTimeAttribute()

    schedule_index = ScheduleIndex()


# Every model of the table: bound together (``connection.bind``), sharing one client.
ALL_MODELS: tuple[type[Model], ...] = (TaskModel, BatchModel, LeaseModel, ControlModel, GateModel,
                                       StreamCheckpointModel, SecretModel, CursorStateModel, ScheduleModel,
                                       RateGateModel, RateChunkModel, DurationsModel)
