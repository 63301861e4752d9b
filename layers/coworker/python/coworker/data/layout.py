"""The table layout, in one place: imported by the pynamodb models, the CDK construct,
the local runtime and the tests, so the definitions cannot drift apart.

Tasks (one item per task)::

    key (S, partition key)                       the task's unique key
    status (S)       todo | processing | failed | finished | ignored
    due_at (S)       ISO-8601 UTC; when the coordinator should next look at the task:
                     todo -> run-at time, failed -> retry time, processing -> lock expiry,
                     ignored -> when it was ignored; absent once finished.

    status_shard (S) ``<status>#<n>``: the status and the key's shard, ``n = crc32(key) % S``
                     (S = ``COWORKER_STATUS_SHARDS``); worker slots use ``worker-slot``.

    GSI ``status-shard-due`` : partition ``status_shard``, sort ``due_at``, INCLUDE projection.

Each status is spread over S partition key values so that no index partition takes more than
1/S of a status's writes: DynamoDB gives one partition key value about 1,000 write units per
second, and every task writes ``todo`` twice and ``processing`` twice. Readers query the S
shards of a status in parallel and merge them by ``due_at``, so "oldest first" still holds.

The index is sparse: a finished task drops ``due_at`` and leaves the index (one index write
instead of the two a key change costs), so the index holds only live and ignored tasks and
the coordinator's queries never wade through finished work.

Coworker's own items live in the same table, under reserved key prefixes (a task key may not
start with any of them; :func:`reserved_prefix`)::

    batch#<id>, batch#<id>#<shard>   a batch's head and its stream counters  (engine.batches)
    control#types                    paused types, type limits, stopped batches (engine.control)
    control#cursor-secret            the key that signs listing cursors       (api.cursors)
    slot#NNNN                        worker slots: capacity accounting       (engine.slots)
    lease#coordinator                the coordinator's single-flight lease   (engine.slots)
    gate#<group>                     a concurrency group's places            (engine.gates)
    gate#rate:<group>                a rate group's recent starts            (engine.rates)
    gate#rate-log:<group>#<version>  older starts of a rate group above 100  (engine.rates)
    schedule#<name>                  a recurring schedule                    (engine.schedules)
    stream#<shard>, stream#counted-through   the stream follower's place     (engine.progress)

Index partitions other than ``<status>#<n>``: ``worker-slot`` (slots), ``held#<type>#<n>``
(tasks of a paused type), ``blocked#<group>`` (tasks waiting for a place in a concurrency
group), ``gates#waiting`` (gates with blocked tasks), ``schedules`` and ``schedules#paused``
(recurring schedules, by next occurrence), ``batches#watched`` (batch heads with callbacks or
events still to fire, by when they were last looked at).
"""

from __future__ import annotations

import math
import zlib
from typing import Any, Final

DEFAULT_TABLE_NAME: Final = "coworker-tasks"

PARTITION_KEY: Final = "key"
STATUS_INDEX_NAME: Final = "status-shard-due"
STATUS_INDEX_PARTITION_KEY: Final = "status_shard"
# The plain status, as people read and filter it (not an index key).
STATUS_ATTRIBUTE: Final = "status"
# The index of releases before sharding: partition ``status``. Kept only while migrating.
LEGACY_STATUS_INDEX_NAME: Final = "status-due"
DEFAULT_STATUS_SHARDS: Final = 4
MAX_STATUS_SHARDS: Final = 100
STATUS_INDEX_SORT_KEY: Final = "due_at"
# Non-key attributes copied into the index: enough for listings, and for the coordinator to
# tell from the index alone which lost tasks are at their attempt ceiling (attempts,
# max_attempts). Reaping one does read the table: one consistent read of the task's errors,
# updated_at and attempts (again if the record changed in between; lifecycle.reap_lost), since
# its worker_lost entry joins a history kept at the last ``error_history`` entries, which the
# writer must see to trim.
STATUS_INDEX_PROJECTED: Final = (
    STATUS_ATTRIBUTE, "type", "attempts", "max_attempts", "updated_at", "batch_id", "lock_owner",
)
TTL_ATTRIBUTE: Final = "delete_after_epoch"
# -- item kinds: key prefixes of Coworker's own items ------------------------------------------
BATCH_KEY_PREFIX: Final = "batch#"
CONTROL_KEY_PREFIX: Final = "control#"
CONTROL_KEY: Final = CONTROL_KEY_PREFIX + "types"
CURSOR_SECRET_KEY: Final = CONTROL_KEY_PREFIX + "cursor-secret"
CURSOR_STATE_PREFIX: Final = CONTROL_KEY_PREFIX + "cursor#"  # listing states too long for a cursor
DURATIONS_PREFIX: Final = CONTROL_KEY_PREFIX + "durations#"  # a task type's observed run times
SLOT_KEY_PREFIX: Final = "slot#"
LEASE_KEY_PREFIX: Final = "lease#"
COORDINATOR_LEASE: Final = LEASE_KEY_PREFIX + "coordinator"
STREAM_KEY_PREFIX: Final = "stream#"
# The stream follower's watermark: every write made before its ``counted_through`` has been counted.
COUNTED_THROUGH_KEY: Final = STREAM_KEY_PREFIX + "counted-through"
# Concurrency gates (``gate#<group>`` items).
GATE_PREFIX: Final = "gate#"
# Rate groups' start logs (``gate#rate:<group>`` items: under the gates' reserved prefix).
RATE_GATE_PREFIX: Final = GATE_PREFIX + "rate:"
# Sealed chunks of a long start log (``gate#rate-log:<group>#<version>``): no concurrency group
# (``key:``/``type:``) nor start log (``rate:``) has a key that starts so.
RATE_CHUNK_PREFIX: Final = GATE_PREFIX + "rate-log:"
# Recurring schedules (``schedule#<name>`` items).
SCHEDULE_KEY_PREFIX: Final = "schedule#"
RESERVED_KEY_PREFIXES: Final = (BATCH_KEY_PREFIX, CONTROL_KEY_PREFIX, SLOT_KEY_PREFIX, LEASE_KEY_PREFIX,
                                STREAM_KEY_PREFIX, GATE_PREFIX, SCHEDULE_KEY_PREFIX)

# -- index partitions besides the tasks' status shards -----------------------------------------
# Worker slots: one partition, not sharded (not a task status, so task listings never see it).
SLOT_STATUS: Final = "worker-slot"
# Container runner slots (``slot#runner-NNNN``): their own partition, as worker slots have.
RUNNER_SLOT_PREFIX: Final = SLOT_KEY_PREFIX + "runner-"
RUNNER_SLOT_STATUS: Final = "runner-slot"
# Index partitions ``held#<type>#<shard>``: tasks of a paused type, parked out of the queue.
HELD_PREFIX: Final = "held#"
# Index partitions ``blocked#<group>``: tasks waiting for a place in their concurrency group.
BLOCKED_PREFIX: Final = "blocked#"
# The index partition of gates with blocked tasks.
WAITING_GATES: Final = "gates#waiting"
# Index partitions of schedules: active ones by next occurrence, paused ones by when paused.
SCHEDULES_PARTITION: Final = "schedules"
SCHEDULES_PAUSED_PARTITION: Final = "schedules#paused"
# The index partition of batches whose callbacks or events may still fire (engine.callbacks).
WATCHED_BATCHES_PARTITION: Final = "batches#watched"
# The table's stream: the coordinator counts batch progress from it (see coworker.engine.progress).
STREAM_SPECIFICATION: Final = {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}


def shard_of(key: str, shards: int) -> int:
    """The shard of a key among ``shards``: a stable hash, so every writer and reader agrees.

    It places a task in its status's index shard, and a self-feeding worker's *stripe* is the
    same hash over the worker slots (engine.feeder; see :func:`stripe_shards`)."""
    return zlib.crc32(key.encode()) % shards


def stripe_shards(stripe: int, stripes: int, shards: int) -> list[int]:
    """The index shards (of ``shards``) that hold the keys of ``stripe`` (of ``stripes``), ascending.

    A key's stripe and its shard are its hash modulo ``stripes`` and ``shards``, both fixed by
    the hash modulo ``lcm(stripes, shards)``: so a stripe's keys lie in one shard when the shards
    divide the stripes (12 worker slots over 4 shards), in ``shards / stripes`` when the stripes
    divide the shards, and in ``shards / gcd`` in general. A worker reads only those for its own work.
    """
    return sorted({residue % shards for residue in range(stripe % stripes, math.lcm(stripes, shards), stripes)})


def rate_chunk_key(group: str, version: int) -> str:
    """The key of the chunk of rate group ``group``'s start log sealed by its head's ``version``
    (the text after the last ``#`` is the version: a group name with a ``#`` is still told apart)."""
    return f"{RATE_CHUNK_PREFIX}{group}#{version}"


def reserved_prefix(key: str) -> str | None:
    """The reserved prefix ``key`` starts with (an item of Coworker's own, not a task), or ``None``."""
    return next((prefix for prefix in RESERVED_KEY_PREFIXES if key.startswith(prefix)), None)


def shard_value(status: str, shard: int) -> str:
    """The index partition key value of one shard of a status: ``todo#3``."""
    return f"{status}#{shard}"


def shard_values(status: str, shards: int) -> list[str]:
    """Every index partition key value of a status, shard 0 first."""
    return [shard_value(status, shard) for shard in range(shards)]


def key_schema(legacy_index: bool = False) -> dict[str, str]:
    """Attribute name -> DynamoDB type for every key attribute of the table and its indexes."""
    keys = {PARTITION_KEY: "S", STATUS_INDEX_PARTITION_KEY: "S", STATUS_INDEX_SORT_KEY: "S"}
    if legacy_index:
        keys[STATUS_ATTRIBUTE] = "S"
    return keys


def _index(name: str, partition_key: str) -> dict[str, Any]:
    return {
        "IndexName": name,
        "KeySchema": [
            {"AttributeName": partition_key, "KeyType": "HASH"},
            {"AttributeName": STATUS_INDEX_SORT_KEY, "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": list(STATUS_INDEX_PROJECTED)},
    }


def create_table_request(table_name: str = DEFAULT_TABLE_NAME, legacy_index: bool = False) -> dict[str, Any]:
    """A CreateTable request for this layout (on-demand), as boto3 takes it.

    Used by the local runtime and the tests; the CDK construct builds the same table from the
    same constants. ``legacy_index`` adds the pre-sharding ``status-due`` index (to test the
    migration of a table made by an earlier release).
    """
    indexes = [_index(STATUS_INDEX_NAME, STATUS_INDEX_PARTITION_KEY)]
    if legacy_index:
        indexes.append(_index(LEGACY_STATUS_INDEX_NAME, STATUS_ATTRIBUTE))
    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": kind} for name, kind in key_schema(legacy_index).items()
        ],
        "KeySchema": [{"AttributeName": PARTITION_KEY, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": indexes,
        "StreamSpecification": STREAM_SPECIFICATION,
    }
