"""The pynamodb model of a task, built from :mod:`coworker.schema`.

This is the only module (with :mod:`coworker.lifecycle` and :mod:`coworker.queries`) that
talks to DynamoDB. Call :func:`bind` once per process to point the model at a table and endpoint.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from pynamodb.attributes import (
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
from pynamodb.exceptions import PutError, UpdateError
from pynamodb.indexes import GlobalSecondaryIndex, IncludeProjection
from pynamodb.models import Model

from coworker import schema
from coworker.config import Settings
from coworker.errors import StorageError


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
    """Why an attempt did not finish."""

    BUSINESS = "business"  # the handler raised TaskFailedError
    SYSTEM = "system"  # any other exception
    TIMEOUT = "timeout"  # the worker ran out of time and released the lock
    WORKER_LOST = "worker_lost"  # the lock expired: the worker died without recording anything
    UNKNOWN_TYPE = "unknown_type"  # no handler registered for the task type
    CANCELLED = "cancelled"  # cancelled through the API
    RECORD_TOO_LARGE = "record_too_large"  # the record hit DynamoDB's 400 KB item limit: ended


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso_utc(value: datetime | None) -> str | None:
    """ISO-8601 UTC with a ``Z``, as the API and dashboard show times."""
    return value.isoformat().replace("+00:00", "Z") if value else None


CONDITION_FAILED = "ConditionalCheckFailedException"


class ErrorRecord(MapAttribute):
    """One failed attempt, as kept in a task's error history."""

    attempt = NumberAttribute()
    at = UTCDateTimeAttribute()
    kind = UnicodeAttribute()
    message = UnicodeAttribute()
    traceback = UnicodeAttribute(null=True)


class StatusIndex(GlobalSecondaryIndex["TaskModel"]):
    """Sparse index of live and ignored tasks by status shard, oldest ``due_at`` first
    (read it through :mod:`coworker.queries`, which merges the shards)."""

    class Meta:
        index_name = schema.STATUS_INDEX_NAME
        projection = IncludeProjection(list(schema.STATUS_INDEX_PROJECTED))

    status_shard = UnicodeAttribute(hash_key=True)
    due_at = UTCDateTimeAttribute(range_key=True)


class _Layout:
    """How this process spreads statuses over index shards (set by :func:`bind`)."""

    shards: int = schema.DEFAULT_STATUS_SHARDS


def status_shards() -> int:
    """Index shards per status in the bound table (``COWORKER_STATUS_SHARDS``)."""
    return _Layout.shards


class TaskModel(Model):
    """One task. Attribute names are the ones a person sees in the DynamoDB console."""

    class Meta:
        table_name = schema.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=schema.PARTITION_KEY)
    task_type = UnicodeAttribute(attr_name="type")
    payload = JSONAttribute(null=True)
    # A payload too large for the record: {"uri", "bytes", "sha256"} in the object store.
    payload_ref = JSONAttribute(null=True)
    status = UnicodeAttribute(attr_name=schema.STATUS_ATTRIBUTE)
    # "<status>#<shard>", the index partition key: always written with ``status``
    # (see :meth:`status_actions`).
    status_shard = UnicodeAttribute(null=True, attr_name=schema.STATUS_INDEX_PARTITION_KEY)
    due_at = UTCDateTimeAttribute(null=True, attr_name=schema.STATUS_INDEX_SORT_KEY)
    created_at = UTCDateTimeAttribute()
    updated_at = UTCDateTimeAttribute()
    finished_at = UTCDateTimeAttribute(null=True)
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
    delete_after_epoch = TTLAttribute(null=True, attr_name=schema.TTL_ATTRIBUTE)

    status_index = StatusIndex()

    @classmethod
    def shard_value_of(cls, key: str, status: str) -> str:
        """The index partition key value of task ``key`` in ``status``."""
        return schema.shard_value(status, schema.shard_of(key, _Layout.shards))

    def serialize(self, null_check: bool = True) -> dict[str, dict[str, Any]]:
        """The item as DynamoDB stores it, ``status_shard`` always following ``status`` (every
        put, batch write and transaction goes through here)."""
        if self.status is not None:
            self.status_shard = self.shard_value_of(self.key, self.status)
        return super().serialize(null_check=null_check)

    @classmethod
    def status_actions(cls, key: str, status: str) -> list:
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
            "finished_at": iso(self.finished_at),
            "lock_owner": self.lock_owner,
            "lock_expires_at": iso(self.lock_expires_at),
            "batch_id": self.batch_id,
            "parent": self.parent,
            "priority": int(self.priority) if self.priority is not None else None,
            "concurrency_key": self.concurrency_key,
            "concurrency_limit": int(self.concurrency_limit) if self.concurrency_limit is not None else None,
            "blocked": bool(self.status_shard and self.status_shard.startswith(schema.BLOCKED_PREFIX)),
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


class BatchModel(Model):
    """One batch, kept in the task table: its head ``batch#<id>`` and its counter items
    ``batch#<id>#<stream shard id>`` (see :mod:`coworker.batches` and :mod:`coworker.progress`).

    It has no ``status`` or ``due_at``, so it never enters the status index; the counters are
    moved by the coordinator as it reads the table's stream.
    """

    class Meta:
        table_name = schema.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=schema.PARTITION_KEY)
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
    # On a counter item: the sequence number of the last stream record it counted, and the
    # latest time of a change it counted.
    read_through = UnicodeAttribute(null=True)
    last_change_at = UTCDateTimeAttribute(null=True)


STREAM_KEY_PREFIX = "stream#"
# The follower's watermark: every write made before its ``counted_through`` has been counted.
COUNTED_THROUGH_KEY = STREAM_KEY_PREFIX + "counted-through"


class StreamCheckpointModel(Model):
    """How far the stream follower has read one stream shard (``stream#<shard id>``), and how far
    it has counted every shard (``stream#counted-through``); see :mod:`coworker.progress`."""

    class Meta:
        table_name = schema.DEFAULT_TABLE_NAME
        region = "us-east-1"

    key = UnicodeAttribute(hash_key=True, attr_name=schema.PARTITION_KEY)
    read_through = UnicodeAttribute(null=True)
    ended = BooleanAttribute(default=False)
    counted_through = UTCDateTimeAttribute(null=True)
    delete_after_epoch = TTLAttribute(null=True, attr_name=schema.TTL_ATTRIBUTE)


def put_if_new(item: Model, what: str) -> bool:
    """One conditional PutItem of ``item``; ``False`` when an item with its key exists (left
    untouched). Any other refusal is a :class:`StorageError`."""
    try:
        item.save(condition=type(item)._hash_key_attribute().does_not_exist())
    except PutError as exc:
        if exc.cause_response_code == CONDITION_FAILED:
            return False
        raise StorageError(f"could not put {what}: {exc.cause_response_message}") from exc
    return True


def conditional_update(item: Model, actions: list, condition: Any, what: str) -> bool:
    """One UpdateItem on ``item`` (its attributes refreshed from the written item); ``False``
    when ``condition`` does not hold. Any other refusal is a :class:`StorageError`."""
    try:
        item.update(actions=actions, condition=condition)
    except UpdateError as exc:
        if exc.cause_response_code == CONDITION_FAILED:
            return False
        raise StorageError(f"could not update {what}: {exc.cause_response_message}") from exc
    return True


# (table, region, endpoint) the models are bound to: see bind.
_bound_to: tuple[str, str, str | None] | None = None


def bind(settings: Settings) -> None:
    """Point the models at the configured table, region and endpoint (once per process).

    Binding again to the same table, region and endpoint keeps the connections already built.
    """
    global _bound_to
    _Layout.shards = settings.status_shards
    target = (settings.table_name, settings.region, settings.dynamodb_endpoint)
    if target == _bound_to:
        return
    for model_class in _models():
        meta = model_class.Meta
        meta.table_name, meta.region, meta.host = target
        # Tasks carry their own conflict handling (conditions); plain retries are for throttling.
        meta.max_retry_attempts = 5
        meta.max_pool_connections = 64  # workers run a batch's tasks in parallel threads
        model_class._connection = None  # drop a connection made for another table or endpoint
    _bound_to = target


def build_clients() -> None:
    """Create one botocore client now, in the calling thread, and share it between the models.

    pynamodb gives every model a connection of its own and creates its client lazily and without
    a lock, so the threads of a worker batch that all start on a cold process would each build
    one (about 0.15 s of CPU apiece), and each model would hold its own copy of botocore's
    service model (about 30,000 objects that every full garbage collection walks). Built once
    here, before any thread starts, one client serves every model (they share table, region,
    endpoint and settings; botocore clients are thread-safe). No request is sent.
    """
    models = _models()
    client = models[0]._get_connection().connection.client
    for model_class in models[1:]:
        share_client(model_class._get_connection().connection, client)


def shared_client() -> Any:
    """The botocore client the models share (built by :func:`build_clients` if need be)."""
    return TaskModel._get_connection().connection.client


def share_client(connection: Any, client: Any | None = None) -> None:
    """Make pynamodb ``connection`` send its requests through the models' shared client.

    pynamodb has no public way to hand a connection a client: it keeps the one it builds in
    ``_client`` and builds one only while that is empty.
    """
    connection._client = client or shared_client()


def _models() -> tuple[type[Model], ...]:
    from coworker.concurrency import GateModel  # these modules build on this one
    from coworker.control import ControlModel
    from coworker.leases import LeaseModel

    return (TaskModel, BatchModel, LeaseModel, ControlModel, GateModel, StreamCheckpointModel)
