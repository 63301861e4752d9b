"""The bill: Coworker beside SQS + Lambda with a DynamoDB status table, and Step Functions
Distributed Map, each run as a competent team would run it, per million tasks by task length, and
what each design costs a month with nothing to do and with work all month. For tasks longer than
Lambda's 15 minutes, Coworker's container runner beside Distributed Map with ECS tasks and AWS
Batch, all on Fargate; and where the line between Lambda and Fargate lies.

    .venv/bin/python benchmarks/bill.py [--tasks 1000000] [--task-seconds 1] [--memory-mb 512]
                                        [--threads 10] [--concurrency 120] [--db moto]
                                        [--fargate-vcpu 1] [--fargate-memory-gb 2] [--no-public-ip]
                                        [--runner-threads 1]

What Coworker does is **measured** first, on the real engine and its embedded DynamoDB:
- write units per task of its own lifecycle (put, claim, finish), and per worker invocation
  (its slot's reserve, start and release), by DynamoDB Local's accounting and the documented rules
  (``benchmarks/cost.py``);
- claims lost to another worker with many invocations feeding themselves from one queue at once
  (each is a failed conditional write, billed at least one write unit);
- the write units of a running task's lock extensions, beat by beat (most move the lock alone;
  every other one moves its index entry too), and of one extension of its invocation's slot;
- the write units a task's own writes and a lock extension add with a larger payload on its
  record, and with the payload kept in the results bucket instead (a reference on the record);
- the log bytes the worker Lambda handler prints, per task and per invocation;
- one scheduled coordinator run with nothing to do (requests, units, log bytes, metrics) and one
  busy tick.
The rest is arithmetic on the prices and named assumptions of ``benchmarks/prices.py``.
``--concurrency`` and ``--threads`` default to the template's own (:mod:`coworker.capacity`: 120
tasks at once, 12 invocations of 10 threads); the options that reach 1,000 tasks/s are priced
beside it.
Every design runs ``--threads`` tasks at once per Lambda invocation (I/O-bound tasks); a
design's own limits decide what it can do (Express children end at 5 minutes, Lambda at 15). The
Fargate designs run one task at a time in each Fargate task of ``--fargate-vcpu`` and
``--fargate-memory-gb`` (Coworker's runner ``--runner-threads``), each with a public IPv4 address
as the stack's runner network gives it (``--no-public-ip``: private subnets).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import math
import os
import shlex
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ["POWERTOOLS_METRICS_DISABLED"] = "false"  # EMF lines are log bytes too: count them
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "Coworker")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "coworker")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "INFO")  # the deployed default
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

warnings.filterwarnings("ignore", "No application metrics to publish")  # an invocation that ran nothing
sys.path.insert(0, str(Path(__file__).resolve().parent))
import prices as p  # noqa: E402
from cost import RecordingInvoker, happy_path, write_shares  # noqa: E402
from coworker import capacity  # noqa: E402
from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.data import writes  # noqa: E402
from coworker.data.models import ErrorKind, LeaseModel, TaskModel, utcnow  # noqa: E402
from coworker.engine import dispatch, lifecycle, progress, slots, submit, timing  # noqa: E402
from coworker.engine.outcomes import TaskOutcome  # noqa: E402
from coworker.engine.tasks import TaskSpec  # noqa: E402
from coworker.observability import MetricName, logger, metrics  # noqa: E402
from coworker_local.capacity import CapacityMeter  # noqa: E402
from coworker_local.database import MOTO, create_table, dynamodb_client, start_database  # noqa: E402

TASK_LENGTHS = (0.05, 1.0, 60.0, 300.0)
CONTAINER_TASK_LENGTHS = (1800.0, 7200.0)  # longer than Lambda's 15 minutes: the Fargate designs alone
BILL_LENGTHS = (*TASK_LENGTHS, *CONTAINER_TASK_LENGTHS)
LAMBDA_NA = "n/a (longer than Lambda's 15 min)"
HEARTBEAT_SECONDS = Settings.model_fields["lock_seconds"].default / 3  # the deployed default
WORKER_TIMEOUT = Settings.model_fields["worker_timeout_seconds"].default
TIMEOUT_MARGIN = Settings.model_fields["timeout_margin_seconds"].default
MAX_ATTEMPTS = Settings.model_fields["max_attempts"].default
SUPERVISE_SECONDS = Settings.model_fields["supervise_seconds"].default
TICK_SECONDS = Settings.model_fields["tick_seconds"].default
RUNNER_THREADS = Settings.model_fields["runner_threads"].default
MOST_RUNNERS = next(rule.le for rule in Settings.model_fields["max_runners"].metadata if hasattr(rule, "le"))
# The container runner is priced at 1,000 tasks at once (maxRunners 1,000 of one thread), as a
# deployer running a million long tasks would set it: the template builds no runner without
# container types, and its maxRunners (4) would take years over such a job.
RUNNER_CONCURRENCY = 1_000
# The longest task Coworker's Lambda worker gives a time limit: 15 minutes less the margin and the
# invocation's start.
LAMBDA_LONGEST_TASK = timing.longest_limit(p.LAMBDA_MAX_SECONDS, TIMEOUT_MARGIN)
CUSTOM_METRICS = sorted(value for name, value in vars(MetricName).items() if name.isupper())


@dataclasses.dataclass(frozen=True)
class RunCost:
    """What one coordinator run (or tick) spends: requests, units, log bytes, metric names."""

    requests: int
    stream_reads: int  # GetRecords (DynamoDB Streams read requests)
    read_units: float
    write_units: float
    log_bytes: int
    metric_names: frozenset[str]


@dataclasses.dataclass(frozen=True)
class Tracked:
    """The writes of the one design that reaches about 5 write units a task (docs/cost.md, "What
    the per-task lock costs"; not built): the claim takes the task out of the status index, the
    finish writes no index, and a worker invocation's slot records the keys it is about to claim,
    one write per feed window, so that a lapsed slot says which tasks to take back. Measured write
    by write on the same database, with the engine's own put and a prototype of each other write."""

    own_write_units: dict[int, float]  # key length -> a task's put, claim (out of the index), finish (no index)
    write_ahead_units: dict[int, float]  # key length -> a task's share of its slot's key records
    slot_extension_units: dict[int, float]  # key length -> one slot heartbeat, its keys held
    fence_units: float  # recovery after a crash: one fence write a key the lapsed slot held
    window: int  # keys recorded per slot write


@dataclasses.dataclass(frozen=True)
class Measured:
    own_write_units: float  # per task: put, claim, finish
    invocation_write_units: float  # per worker invocation: its slot's reserve, start, release
    race_write_units: float  # per worker invocation: claims lost to another worker, many racing
    race_invocations: int  # racing at once
    race_tasks: int
    race_started: int  # invocations started in all
    batch_extra_write_units: float  # per task of a batch (its head and counters), 100 a request
    lock_beat_units: tuple[float, ...]  # a running task's first n lock extensions, n = 0, 1, ...
    slot_extension_units: float  # one heartbeat of a worker invocation
    read_units: float  # per task
    log_bytes_per_task: float
    log_bytes_per_invocation: float
    idle_run: RunCost
    busy_tick: RunCost
    # Payload size (bytes, as stored) -> write units that a record carrying it adds to the task's
    # own writes, and to each lock extension, over the measured small task; and the same for a
    # payload kept in the bucket (its reference on the record).
    payload_units: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)
    bucket_units: tuple[float, float] = (0.0, 0.0)
    # A task's whole life (put, claims, failures, finish) when its first n attempts fail with a
    # system error (a message and a traceback at their caps), n = 0, 1, ...
    retry_units: tuple[float, ...] = ()
    # The design that tracks running tasks per worker invocation (not built), its writes measured.
    tracked: Tracked | None = None

    def with_running_tracked_per_invocation(self, key_chars: int) -> Measured:
        """These measurements for the design that tracks running tasks per worker invocation
        (:class:`Tracked`), with task keys of ``key_chars`` characters."""
        assert self.tracked is not None
        return dataclasses.replace(
            self, own_write_units=self.tracked.own_write_units[key_chars] + self.tracked.write_ahead_units[key_chars],
            lock_beat_units=tuple(0.0 for _ in self.lock_beat_units),
            slot_extension_units=self.tracked.slot_extension_units[key_chars])

    def with_payload(self, size: int | None) -> Measured:
        """These measurements for tasks whose payload of ``size`` bytes is on the record
        (``None``: the small payload measured)."""
        if size is None:
            return self
        return self._adding(*self.payload_units[size])

    def with_payload_in_bucket(self) -> Measured:
        """These measurements for tasks whose payload is kept in the results bucket."""
        return self._adding(*self.bucket_units)

    def _adding(self, own: float, per_beat: float) -> Measured:
        return dataclasses.replace(
            self, own_write_units=self.own_write_units + own,
            lock_beat_units=tuple(units + beat * per_beat for beat, units in enumerate(self.lock_beat_units)))

    def lock_heartbeat_units(self, beats: int) -> float:
        """Write units of a running task's first ``beats`` lock extensions: measured, and past
        the last measured beat at the rate of the measured second half."""
        units = self.lock_beat_units
        last = len(units) - 1
        if beats <= last:
            return units[beats]
        half = last // 2
        return units[last] + (beats - last) * (units[last] - units[half]) / (last - half)


@contextlib.contextmanager
def _printed() -> Iterator[io.StringIO]:
    """What is printed inside: stdout (EMF lines) and the Powertools logger, whose handler holds
    the stream it was made with."""
    sink = io.StringIO()
    handler = logger.registered_handler
    stream = handler.setStream(sink)
    try:
        with contextlib.redirect_stdout(sink):
            yield sink
    finally:
        handler.setStream(stream)


# moto reports wrong capacity (0.5 for an UpdateItem, no index writes): there the rules bill alone.
_rules_only = False


def _billed(total) -> float:
    """Write units as DynamoDB reports them, with what it leaves out (a failed conditional write);
    by the documented rules on moto."""
    if _rules_only:
        return total.write_units
    return total.reported_write_units + total.unreported_write_units


def measure(db: str | None, tasks: int = 100, race_invocations: int = 20) -> Measured:
    global _rules_only
    server = start_database(db)
    _rules_only = server.name == MOTO
    try:
        single = happy_path(server.endpoint, tasks, 10)
        batched = happy_path(server.endpoint, tasks, 10, batch_id="bill")
        shares = write_shares(single)
        lock_units, slot_units = _heartbeat_units(server.endpoint, _longest_task_beats())
        race_units, race_tasks, race_started = _claim_races(server.endpoint, race_invocations)
        payload_units, bucket_units = _payload_units(server.endpoint, PAYLOAD_SIZES)
        retry_units = _retry_units(server.endpoint, RETRIED_FAILURES)
        tracked = _tracked_units(server.endpoint)
        per_task, per_invocation = _log_bytes(server.endpoint)
        idle_run, busy_tick = _coordinator(server.endpoint)
    finally:
        server.stop()
    finished = single["finished"]
    return Measured(
        own_write_units=shares["own"],
        invocation_write_units=shares["bookkeeping"] * finished / max(1, single["invocations"]),
        race_write_units=race_units, race_invocations=race_invocations, race_tasks=race_tasks,
        race_started=race_started,
        batch_extra_write_units=max(0.0, _billed(batched["total"]) / batched["finished"]
                                    - _billed(single["total"]) / finished),
        lock_beat_units=lock_units, slot_extension_units=slot_units,
        read_units=single["total"].read_units / finished,
        log_bytes_per_task=per_task, log_bytes_per_invocation=per_invocation,
        idle_run=idle_run, busy_tick=busy_tick, payload_units=payload_units, bucket_units=bucket_units,
        retry_units=retry_units, tracked=tracked)


def _settings(endpoint: str, name: str, **overrides) -> Settings:
    settings = Settings(table_name=f"bill-{name}-{uuid.uuid4().hex[:8]}", dynamodb_endpoint=endpoint,
                        dispatch_on_submit=False, **overrides)
    create_table(settings)
    configure(settings)
    slots.ensure_slots(settings.worker_slots)
    return settings


def _meter(settings: Settings) -> CapacityMeter:
    return CapacityMeter.for_model(TaskModel, dynamodb_client(settings),
                                   LeaseModel._get_connection().connection).attach()


# A heartbeat is sent once an interval has passed since the last one was sent, on the heartbeat
# thread's next wake: a little later than the interval.
BEAT_LAG_SECONDS = 0.05


def _longest_task_beats() -> int:
    """Lock extensions of a task that runs as long as a worker may (Lambda's 15 minutes)."""
    return math.ceil(p.LAMBDA_MAX_SECONDS / HEARTBEAT_SECONDS)


def _heartbeat_units(endpoint: str, beats: int, slot_beats: int = 3) -> tuple[tuple[float, ...], float]:
    """Write units of a running task's first n lock extensions (n = 0 ... ``beats``), sent every
    interval (plus :data:`BEAT_LAG_SECONDS`) with the due time of its index entry kept as the
    heartbeat keeps it; and of one slot extension."""
    settings = _settings(endpoint, "heartbeat")
    interval = timedelta(seconds=settings.effective_heartbeat_seconds + BEAT_LAG_SECONDS)
    start = utcnow() - beats * interval  # every beat's "now" has passed: none is in the future
    submit.put_task(TaskSpec(key="long", type="slow"), settings, now=start - timedelta(seconds=1))
    claim = lifecycle.claim("long", "bill-worker", settings, now=start)
    assert claim is not None
    slot = slots.slot_key(0)
    assert slots.take(slot, "bill-worker", 60, "running")
    meter = _meter(settings)
    listed_until, units = claim.task.due_at, [0.0]
    for number in range(1, beats + 1):
        extension = lifecycle.extend_lock(claim, settings, start + number * interval, listed_until)
        assert extension
        listed_until = extension.listed_until or listed_until
        units.append(_billed(meter.snapshot()))
    locks = meter.snapshot()
    for _ in range(slot_beats):
        assert slots.extend(slot, "bill-worker", 60)
    both = meter.snapshot()
    meter.detach()
    return tuple(units), (_billed(both) - _billed(locks)) / slot_beats


# Payload sizes (as DynamoDB stores them) that the bill prices, beside the small one.
PAYLOAD_SIZES = (1024, 4096, 16384)


def _payload_units(endpoint: str, sizes: Sequence[int]
                   ) -> tuple[dict[int, tuple[float, float]], tuple[float, float]]:
    """Write units that a payload of each of ``sizes`` bytes adds to a task's put, claim and
    finish, and to one lock extension that leaves the index entry, over a task with the happy
    path's payload; and the same for the largest kept in the results bucket (a local folder
    here), its reference on the record."""
    def units(name: str, payload: Any, **overrides: Any) -> tuple[float, float]:
        settings = _settings(endpoint, name, **overrides)
        meter = _meter(settings)
        submit.put_task(TaskSpec(key="sized", type="slow", payload=payload), settings)
        claim = lifecycle.claim("sized", "bill-worker", settings)
        assert claim is not None
        own = _billed(meter.snapshot())
        assert lifecycle.extend_lock(claim, settings, listed_until=utcnow() + timedelta(days=1))
        extension = _billed(meter.snapshot()) - own
        assert lifecycle.complete(claim, settings) is lifecycle.RecordOutcome.FINISHED
        own = _billed(meter.snapshot()) - extension
        meter.detach()
        return own, extension

    def padded(size: int) -> dict[str, str]:
        return {"data": "x" * max(0, size - 16)}  # the attribute names and the JSON make up the rest

    def added(sized: tuple[float, float]) -> tuple[float, float]:
        return sized[0] - small[0], sized[1] - small[1]

    small = units("payload-small", {"n": 1})
    on_record = {size: added(units(f"payload-{size}", padded(size), inline_payload_bytes=max(size * 2, 16384)))
                 for size in sizes}
    with tempfile.TemporaryDirectory(prefix="bill-payloads-") as folder:
        in_bucket = added(units("payload-bucket", padded(max(sizes)), inline_payload_bytes=256, result_dir=folder))
    return on_record, in_bucket


# Failed attempts before the finish that the bill measures a task's life with (0 ... this).
RETRIED_FAILURES = 3


def _retry_units(endpoint: str, most: int) -> tuple[float, ...]:
    """Write units of a task's whole life when its first n attempts fail, n = 0 ... ``most``: each
    failure a system error with a message of about 140 characters and a traceback at its cap (one
    through a few libraries passes 2 KB), retried at once, then a claim that finishes."""
    settings = _settings(endpoint, "retries", backoff_base_seconds=0, backoff_max_seconds=0, max_attempts=most + 1)
    message = "ConnectionError: " + "m" * (lifecycle.MAX_MESSAGE_CHARS // 8)
    traceback = "t" * lifecycle.MAX_TRACEBACK_CHARS
    meter = _meter(settings)
    lives = []
    for failures in range(most + 1):
        before = _billed(meter.snapshot())
        key = f"retried-{failures}"
        submit.put_task(TaskSpec(key=key, type="slow"), settings)
        for attempt in range(1, failures + 2):
            claim = lifecycle.claim(key, "bill-worker", settings)
            assert claim is not None
            if attempt <= failures:
                error = lifecycle.error_record(attempt, ErrorKind.SYSTEM, message, utcnow(), traceback)
                assert lifecycle.fail(claim, settings, error) is lifecycle.RecordOutcome.FAILED
            else:
                assert lifecycle.complete(claim, settings) is lifecycle.RecordOutcome.FINISHED
        lives.append(_billed(meter.snapshot()) - before)
    meter.detach()
    return tuple(lives)


# Task key lengths the tracked design is measured with: the happy path's (``task-000001``), and a
# longer one, such as a URL or an order id with a prefix. The slot's records grow with them.
TRACKED_KEY_CHARS = (11, 64)


def _tracked_units(endpoint: str, windows: int = 3) -> Tracked:
    """Write units of the design that tracks running tasks per worker invocation (see
    :class:`Tracked`), for each of :data:`TRACKED_KEY_CHARS`: ``windows`` feed windows of the
    feeder's size, each recorded in the slot before its claims (the slot's list set to the keys
    still running, a thread's worth, and the new window's), then claimed and finished; a slot
    heartbeat with those keys held; and the recovery of a lapsed slot, a fence on each key it
    held."""
    settings = _settings(endpoint, "tracked")
    window = 4 * settings.batch_size  # the feeder's window (feeder.Feeder)
    slot = slots.slot_key(0)
    assert slots.take(slot, "bill-worker", 600, "running")
    client = LeaseModel._get_connection().connection.client
    own: dict[int, float] = {}
    write_ahead: dict[int, float] = {}
    extension: dict[int, float] = {}

    def record(keys: Sequence[str]) -> None:
        values: dict[str, Any] = {":holder": {"S": "bill-worker"}}
        if keys:
            values[":keys"] = {"SS": list(keys)}
        client.update_item(TableName=settings.table_name, Key={"key": {"S": slot}},
                           UpdateExpression="SET held_keys = :keys" if keys else "REMOVE held_keys",
                           ConditionExpression="holder = :holder", ExpressionAttributeValues=values)

    meter = _meter(settings)
    for chars in TRACKED_KEY_CHARS:
        batches = [[f"t{chars}-{n}-{i:04d}".ljust(chars, "x") for i in range(window)] for n in range(windows)]
        before, ahead, running = meter.snapshot(), 0.0, []
        for keys in batches:
            for key in keys:
                submit.put_task(TaskSpec(key=key, type="quick", payload={"n": 1}), settings)
            mark = _billed(meter.snapshot())
            record([*running, *keys])
            ahead += _billed(meter.snapshot()) - mark
            for key in keys:
                claim = _claim_out_of_index(key, settings)
                _finish_without_index(claim, settings)
            running = keys[-settings.batch_size:]  # a window is fetched while a thread's worth still runs
        mark = _billed(meter.snapshot())
        assert slots.extend(slot, "bill-worker", 600)
        extension[chars] = _billed(meter.snapshot()) - mark
        record([])
        ahead += _billed(meter.snapshot()) - mark - extension[chars]
        tasks = windows * window
        own[chars] = (_billed(meter.snapshot()) - _billed(before) - ahead - extension[chars]) / tasks
        write_ahead[chars] = ahead / tasks
    # A lapsed slot's recovery: half its window claimed (put back into the index), half not yet.
    keys = [f"fence-{i:04d}" for i in range(window)]
    for number, key in enumerate(keys):
        submit.put_task(TaskSpec(key=key, type="quick", payload={"n": 1}), settings)
        if number % 2:
            _claim_out_of_index(key, settings)
    mark = _billed(meter.snapshot())
    for key in keys:
        _fence(key, slot, settings)
    fence = (_billed(meter.snapshot()) - mark) / window
    meter.detach()
    return Tracked(own_write_units=own, write_ahead_units=write_ahead, slot_extension_units=extension,
                   fence_units=fence, window=window)


def _claim_out_of_index(key: str, settings: Settings) -> lifecycle.Claim:
    """A prototype of the tracked design's claim: today's claim, but the task leaves the status
    index (no ``status_shard``, no ``due_at``) instead of moving to ``processing``."""
    now = utcnow()
    expires = lifecycle.lock_expiry(settings, now)
    task = TaskModel(key)
    actions = [TaskModel.claimed_from.set(TaskModel.status), TaskModel.status.set("processing"),
               TaskModel.status_shard.remove(), TaskModel.due_at.remove(), TaskModel.lock_owner.set("bill-worker"),
               TaskModel.lock_expires_at.set(expires), TaskModel.attempts.add(1), TaskModel.updated_at.set(now)]
    claimable = (TaskModel.status == "todo") & (TaskModel.due_at <= now) & (TaskModel.attempts < TaskModel.max_attempts)
    assert writes.update(task, actions, claimable, f"claim task {key!r}")
    return lifecycle.Claim(task=task, owner="bill-worker", attempt=int(task.attempts))


def _finish_without_index(claim: lifecycle.Claim, settings: Settings) -> None:
    """A prototype of the tracked design's finish: today's, with no index entry to remove."""
    now = utcnow()
    actions = [TaskModel.status.set("finished"), TaskModel.finished_at.set(now), *lifecycle.release_lock_actions(now)]
    if settings.retention_days:
        actions.append(TaskModel.delete_after_epoch.set(now + timedelta(days=settings.retention_days)))
    assert writes.update(claim.task, actions, lifecycle.fenced(claim), "record", refresh=False)


def _fence(key: str, slot: str, settings: Settings) -> None:
    """A prototype of the recovery's fence: a task the lapsed slot claimed goes back into the
    index as lost work (``processing``, due now); one not yet claimed is marked so that the slot's
    late claim fails; one another worker holds is left alone. One write either way."""
    now = utcnow()
    client = TaskModel._get_connection().connection.client
    shard = TaskModel.shard_value_of(key, "processing")
    client.update_item(
        TableName=settings.table_name, Key={"key": {"S": key}},
        UpdateExpression="SET revoked_by = :slot, status_shard = if_not_exists(status_shard, :shard), "
                         "due_at = if_not_exists(due_at, :now)",
        ConditionExpression="attribute_not_exists(lock_owner) OR lock_owner = :owner",
        ExpressionAttributeValues={":slot": {"S": slot}, ":shard": {"S": shard},
                                   ":now": {"S": TaskModel.due_at.serialize(now)}, ":owner": {"S": "bill-worker"}})


def _claim_races(endpoint: str, invocations: int, rounds: int = 10, seconds: float = 0.5) -> tuple[float, int, int]:
    """Failed conditional task writes (each billed at least one write unit) per worker invocation,
    with ``invocations`` invocations of 10 threads feeding themselves from one queue; the tasks
    and the invocations of the run. Races come at the start and at the end of an invocation's
    work, not with each task: 5 and 20 rounds of tasks per thread made 28 and 33 per invocation."""
    settings = _settings(endpoint, "races", max_concurrency=invocations * 10, batch_size=10)
    tasks = invocations * 10 * rounds
    for i in range(tasks):
        submit.put_task(TaskSpec(key=f"race-{i:06d}", type="slow", payload={"seconds": seconds}), settings)
    failed = 0

    def count(parsed: dict, **_) -> None:
        nonlocal failed
        if parsed.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            failed += 1

    client = TaskModel._get_connection().connection.client
    client.meta.events.register("after-call.dynamodb.UpdateItem", count)
    invoker = dispatch.InProcessInvoker(settings)
    finished = 0
    sink = open(os.devnull, "w")  # noqa: SIM115 - EMF lines of the workers
    try:
        with contextlib.redirect_stdout(sink):
            while finished < tasks:
                dispatch.tick(settings, invoker)
                reports = invoker.wait()
                finished += sum(r.outcome is TaskOutcome.FINISHED for r in reports)
                metrics.clear_metrics()
    finally:
        client.meta.events.unregister("after-call.dynamodb.UpdateItem", count)
        invoker.shutdown()
        sink.close()
    started = len(invoker.requests)
    return failed / started, tasks, started


def _log_bytes(endpoint: str, tasks: int = 40) -> tuple[float, float]:
    """Bytes the worker Lambda handler prints: for one invocation that runs no task, and per task
    of one that runs ``tasks`` (Powertools' JSON logs at INFO and its EMF metrics)."""
    from coworker_local.gateway import LocalLambdaContext

    settings = _settings(endpoint, "logs")
    os.environ.update(settings.as_environment())
    module = _handler_module("worker")

    def invoke(keys: list[str]) -> int:
        with _printed() as sink:
            module.handler({"keys": keys}, LocalLambdaContext())
        return len(sink.getvalue().encode())

    empty = invoke([])
    keys = [f"log-{i:04d}" for i in range(tasks)]
    for key in keys:
        submit.put_task(TaskSpec(key=key, type="quick", payload={"n": 1}), settings)
    busy = invoke(keys)
    return max(0.0, (busy - empty) / tasks), float(empty)


def _handler_module(function: str):
    path = Path(__file__).resolve().parents[1] / "cdk" / "coworker_cdk" / "functions" / function / "handler.py"
    spec = importlib.util.spec_from_file_location(f"{function}_handler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _coordinator(endpoint: str) -> tuple[RunCost, RunCost]:
    """A scheduled coordinator run on a deployment with nothing to do (the second of two: the
    first publishes its gauges once), and one tick that dispatches work."""
    settings = _settings(endpoint, "coordinator")
    invoker = dispatch.InProcessInvoker(settings)

    def cost_of(step: Callable[[], object]) -> RunCost:
        meter = _meter(settings)
        stream_reads = 0

        def count(**_) -> None:
            nonlocal stream_reads
            stream_reads += 1

        streams = progress.follower(settings)._streams()
        streams.meta.events.register("after-call.dynamodbstreams.GetRecords", count)
        try:
            with _printed() as sink:
                step()
        finally:
            streams.meta.events.unregister("after-call.dynamodbstreams.GetRecords", count)
            meter.detach()
        total = meter.snapshot()
        printed = sink.getvalue()
        names = frozenset(name for line in printed.splitlines() if '"_aws"' in line
                          for directive in json.loads(line)["_aws"]["CloudWatchMetrics"]
                          for name in (m["Name"] for m in directive["Metrics"]))
        return RunCost(sum(total.requests.values()) + stream_reads, stream_reads, total.read_units,
                       _billed(total), len(printed.encode()), names)

    def scheduled_run() -> None:
        dispatch.supervise(settings, invoker, lambda: SUPERVISE_SECONDS + 10)

    cost_of(scheduled_run)
    idle = cost_of(scheduled_run)

    for i in range(settings.batch_size):
        submit.put_task(TaskSpec(key=f"tick-{i}", type="quick"), settings)

    recorder = RecordingInvoker()

    def busy_tick() -> None:  # the tick alone: the workers it starts are priced per task
        dispatch.tick(settings, recorder, measure_backlog=True)
        metrics.flush_metrics()

    busy = cost_of(busy_tick)
    recorder.release()
    invoker.shutdown()
    return idle, busy


# --- the designs ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Bill:
    name: str
    lines: dict[str, float]
    note: str = ""

    @property
    def total(self) -> float:
        return sum(self.lines.values())


@dataclasses.dataclass(frozen=True)
class Workload:
    tasks: int
    seconds: float
    memory_gb: float
    threads: int  # tasks at once in one Lambda invocation, every design
    concurrency: int  # tasks at once in all (Coworker's max_concurrency)

    @property
    def task_gb_seconds(self) -> float:
        """Lambda GB-s of all the tasks, ``threads`` at once per invocation."""
        return self.tasks * (self.seconds + p.DYNAMODB_SECONDS_PER_TASK) / self.threads * self.memory_gb

    @property
    def hours(self) -> float:
        """How long the job runs at ``concurrency`` tasks at once, or longer where the table bounds it
        (:mod:`coworker.capacity`: as deployed, 50-ms tasks wait on a new table's write units)."""
        deployment = capacity.Capacity(max_concurrency=self.concurrency, batch_size=self.threads)
        return self.tasks / deployment.tasks_per_second(self.seconds) / 3600


def _beat_units_line(m: Measured) -> str:
    beats = len(m.lock_beat_units) - 1
    shown = [n for n in (1, 2, 3, 6, 14) if n <= beats]
    firsts = ", ".join(f"{m.lock_beat_units[n]:.0f} for {n}" for n in shown)
    return f"{firsts} ({m.lock_beat_units[beats] / beats:.2f} a beat over {beats} beats)"


def _cell(bill: Bill, width: int = 12) -> str:
    if bill.lines:
        return f"{'$' + format(bill.total, ',.2f'):>{width}}"
    return f"{'n/a' if bill.note == LAMBDA_NA else '-':>{width}}"


def _ratio(a: Bill, b: Bill) -> str:
    return f"{a.total / b.total:>11.2f}x" if a.lines and b.lines else f"{'-':>12}"


def _print_bill_table(m: Measured, workload: Callable[[float], Workload], fargate: FargateTask,
                      runner_threads: int) -> None:
    """Every design by task length: the Lambda designs to 5 minutes, the Fargate designs beside
    them and beyond."""
    print(f"  {'design':<40}" + "".join(f"{_length(s):>12}" for s in BILL_LENGTHS))
    rows: dict[str, list[Bill]] = {
        "Coworker, Lambda worker": [coworker_bill(m, workload(s)) for s in BILL_LENGTHS],
        "Coworker, Lambda, no time limits declared": [coworker_bill(m, workload(s), limits_declared=False)
                                                      for s in BILL_LENGTHS],
        "SQS + Lambda + status table": [sqs_bill(m, workload(s)) for s in BILL_LENGTHS],
        "Distributed Map + Lambda (cheapest batch)": [cheapest_distributed_map(m, workload(s)) for s in BILL_LENGTHS],
        "Coworker, container runner (Fargate)": [coworker_runner_bill(m, workload(s), fargate, runner_threads)
                                                 for s in BILL_LENGTHS],
        "Distributed Map + ECS (Fargate)": [distributed_map_ecs_bill(m, workload(s), fargate) for s in BILL_LENGTHS],
        "AWS Batch on Fargate": [batch_bill(m, workload(s), fargate) for s in BILL_LENGTHS],
    }
    for name, bills in rows.items():
        print(f"  {name:<40}" + "".join(_cell(b) for b in bills))
        if name.startswith("Distributed Map + Lambda"):
            batches = (b.name.partition("(batch ")[2].rstrip(")") if b.lines else "" for b in bills)
            print(f"  {'  (its item batch)':<40}" + "".join(f"{batch:>12}" for batch in batches))
    print(f"  (n/a = {LAMBDA_NA[5:-1]})")
    lambda_worker, runner = rows["Coworker, Lambda worker"], rows["Coworker, container runner (Fargate)"]
    for name, mine, other in (
        ("Coworker / SQS", lambda_worker, rows["SQS + Lambda + status table"]),
        ("Coworker / Distributed Map + Lambda", lambda_worker, rows["Distributed Map + Lambda (cheapest batch)"]),
        ("runner / Distributed Map + ECS", runner, rows["Distributed Map + ECS (Fargate)"]),
        ("runner / AWS Batch", runner, rows["AWS Batch on Fargate"]),
    ):
        print(f"  {name:<40}" + "".join(_ratio(a, b) for a, b in zip(mine, other, strict=True)))
    for name, other in (("AWS Batch", batch_bill), ("Distributed Map + ECS", distributed_map_ecs_bill)):
        even = runner_break_even(m, workload(1.0), other, fargate, runner_threads)
        if even is None:
            print(f"  (the runner costs less than {name} at every length to a day)")
        else:
            print(f"  (the runner costs less than {name} for tasks up to {_break_even_text(even)}: beyond, its "
                  f"heartbeats, {HEARTBEAT_SECONDS:g} s apart, cost more than a Fargate start a task)")


def _break_even_text(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    if seconds >= 600:
        return f"{seconds / 60:,.0f} min"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:,.0f} s"


# Lambda memories the break-even is printed for: the bill's own and these.
BREAK_EVEN_LAMBDA_MB = (1024, p.LAMBDA_ONE_VCPU_MB)


def _print_lambda_or_fargate(m: Measured, workload: Callable[[float], Workload], fargate: FargateTask) -> None:
    """Coworker on its Lambda worker or on its container runner, one task at a time in each: the
    bill of 5-minute tasks, and the task length from which Fargate costs less."""
    memories = sorted({round(workload(1.0).memory_gb * 1024), *BREAK_EVEN_LAMBDA_MB})
    lengths = (60.0, 300.0)

    def alone(seconds: float, memory_mb: int) -> Workload:
        return dataclasses.replace(workload(seconds), memory_gb=memory_mb / 1024, threads=1)

    print(f"\nLambda or Fargate, one task at a time in each (per {workload(1.0).tasks:,} tasks; Fargate arm64 "
          f"{fargate}, ${fargate.hourly:.4f} an hour):\n")
    print(f"  {'design':<52}" + "".join(f"{_length(s):>12}" for s in lengths))
    for memory in memories:
        hourly = memory / 1024 * p.LAMBDA_GB_SECOND_ARM * 3600
        print(f"  {f'Coworker, Lambda worker, {memory} MB (${hourly:.4f} an hour)':<52}"
              + "".join(_cell(coworker_bill(m, alone(s, memory))) for s in lengths))
    for name, priced in (
        ("Coworker, container runner, deep backlog", lambda w: coworker_runner_bill(m, w, fargate, 1)),
        ("Coworker, container runner, a runner per task", lambda w: coworker_runner_bill(m, w, fargate, 1, 1)),
        ("AWS Batch on Fargate", lambda w: batch_bill(m, w, fargate)),
    ):
        print(f"  {name:<52}" + "".join(_cell(priced(alone(s, 1024))) for s in lengths))
    print(f"\n  Fargate costs less than Lambda for tasks longer than:\n  {'Lambda memory':<52}"
          + "".join(f"{f'{mb} MB':>12}" for mb in memories))
    private = dataclasses.replace(fargate, public_ip=False)
    rows: list[tuple[str, FargateTask, int | None]] = [("container runner, deep backlog", fargate, None),
                                                       ("a runner per task (tasks come apart)", fargate, 1)]
    if fargate.public_ip:
        rows.append(("a runner per task, no public IPv4 address", private, 1))
    for name, task, per_start in rows:
        evens = [lambda_fargate_break_even(m, alone(1.0, mb), task, per_start) for mb in memories]
        print(f"  {name:<52}" + "".join(f"{_break_even_text(t):>12}" for t in evens))
    print(f"  (a second of Fargate {fargate} costs what a second of Lambda at "
          f"{lambda_memory_like(fargate) * 1024:,.0f} MB does,\n"
          f"   {lambda_memory_like(private) * 1024:,.0f} MB without the address; Lambda has one vCPU at "
          f"{p.LAMBDA_ONE_VCPU_MB} MB; never: Lambda costs less at every length to its "
          f"{_length(LAMBDA_LONGEST_TASK)})")


def _print_by_payload(m: Measured, workload: Callable[[float], Workload]) -> None:
    sizes: list[int | None] = [None, *sorted(m.payload_units)]
    names = "".join(f"{'small' if size is None else _bytes(size):>10}" for size in sizes)
    print(f"\nBy payload size (as stored), per {workload(1.0).tasks:,} tasks:\n")
    print(f"  {'design':<44}{names}")
    for seconds in (1.0, 60.0):
        w = workload(seconds)
        rows = {
            f"Coworker, payload on the record ({_length(seconds)})":
                [coworker_bill(m.with_payload(size), w).total for size in sizes],
            f"Coworker, payload in the bucket ({_length(seconds)})":
                [coworker_bill(m.with_payload_in_bucket(), w, payload_in_bucket=True).total for _ in sizes],
            f"SQS + Lambda + status table ({_length(seconds)})":
                [sqs_bill(m, w, size or 0).total for size in sizes],
        }
        for name, totals in rows.items():
            print(f"  {name:<44}" + "".join(f"{'$' + format(total, ',.2f'):>10}" for total in totals))
    own = ", ".join(f"{_bytes(size)} +{units[0]:.0f}" for size, units in sorted(m.payload_units.items()))
    print(f"  (write units a payload adds to a task's put, claim and finish: {own}; a lock extension "
          f"adds about a third of that;\n   in the bucket: {m.bucket_units[0]:+.0f} and a PUT and a GET; "
          "COWORKER_INLINE_PAYLOAD_BYTES decides, 16 KB by default)")


# The options that reach 1,000 tasks/s, beside the template as deployed: (context, Capacity changes).
REACHING_OPTIONS: tuple[tuple[str, dict[str, int]], ...] = (
    ("as deployed", {}),
    ("-c maxConcurrency=1020 (102 worker invocations)", {"max_concurrency": 1020}),
    ("  and -c warmWriteUnits=10000", {"max_concurrency": 1020, "warm_write_units": 10_000}),
    ("  and -c statusShards=8", {"max_concurrency": 1020, "warm_write_units": 10_000, "status_shards": 8}),
)


def _print_reaching(m: Measured, workload: Callable[[float], Workload]) -> None:
    """Tasks/s of the template as deployed and with the options that reach 1,000 tasks/s
    (:class:`coworker.capacity.Capacity`), and what a million 1-second tasks cost with each: the
    tasks cost the same, the job's length changes what the coordinator and metrics cost while it
    runs. Warm throughput is billed once by DynamoDB, per unit raised (not priced here)."""
    base = workload(1.0)
    deployed = capacity.Capacity(max_concurrency=base.concurrency, batch_size=base.threads)
    print(f"\nTasks/s as deployed and with the options that reach 1,000 tasks/s ({base.tasks:,} tasks of 1 s):\n")
    print(f"  {'options':<62}{'at once':>8}{'1 s':>8}{'50 ms':>8}{'job':>9}{'bill':>10}")
    for label, changes in REACHING_OPTIONS:
        option = dataclasses.replace(deployed, **changes)
        w = dataclasses.replace(base, concurrency=option.max_concurrency)
        hours = option.hours_for(w.tasks, 1.0)
        job = f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"
        bill = coworker_bill(m, w)  # 1-s tasks are bound by the workers: the job lasts w.hours
        print(f"  {label:<62}{option.max_concurrency:>8,}{option.tasks_per_second(1.0):>8,.0f}"
              f"{option.tasks_per_second(0.05):>8,.0f}{job:>9}{'$' + format(bill.total, ',.2f'):>10}")
    print("  (tasks/s: the lowest of the workers, the table's write units (4 index units a task) and the "
          "status shards (1,000 units/s a key value, 2 a task): coworker/capacity.py)")


def _print_deadline_losses() -> None:
    print("\nAttempts killed at a worker's deadline, tasks back to back in each thread "
          f"(margin {TIMEOUT_MARGIN:g} s):\n")
    print(f"  {'':<34}" + "".join(f"{_length(s):>12}" for s in TASK_LENGTHS))
    for declared, name in ((False, "no limits declared"), (True, "limits declared")):
        timeouts = [coworker_worker_timeout(s, declared) for s in TASK_LENGTHS]
        print(f"  {name + ': worker timeout':<34}" + "".join(f"{t:>11}s" for t in timeouts))
        shares = [deadline_rounds(s, t, declared).lost_share for s, t in zip(TASK_LENGTHS, timeouts, strict=True)]
        print(f"  {'  attempts killed':<34}" + "".join(f"{share:>12.0%}" for share in shares))


def _print_tracked(m: Measured, workload: Callable[[float], Workload]) -> None:
    """What the per-task lock and index entry cost: the bill as built beside the design that tracks
    running tasks per worker invocation (measured write by write, not built)."""
    tracked = m.tracked
    if tracked is None:
        return
    header = "".join(f"{_length(s):>12}" for s in TASK_LENGTHS)
    print(f"\nWhat the per-task lock costs, per {workload(1.0).tasks:,} tasks (docs/cost.md; the second design "
          "is not built):\n")
    print(f"  {'design':<50}{header}")
    sqs = [sqs_bill(m, workload(s)).total for s in TASK_LENGTHS]
    rows = {"Coworker as built: each task its own lock": [coworker_bill(m, workload(s)).total for s in TASK_LENGTHS]}
    for chars in sorted(tracked.write_ahead_units):
        rows[f"running tasks tracked per invocation, {chars}-char keys"] = [
            coworker_bill(m.with_running_tracked_per_invocation(chars), workload(s)).total for s in TASK_LENGTHS]
    for name, totals in rows.items():
        print(f"  {name:<50}" + "".join(f"{'$' + format(total, ',.2f'):>12}" for total in totals))
        print(f"  {'  / SQS + Lambda + status table':<50}"
              + "".join(f"{a / b:>11.2f}x" for a, b in zip(totals, sqs, strict=True)))
    own = ", ".join(f"{units:.2f}" for _, units in sorted(tracked.own_write_units.items()))
    ahead = ", ".join(f"{units:.3f} with {chars}-char keys"
                      for chars, units in sorted(tracked.write_ahead_units.items()))
    beats = ", ".join(f"{units:.2f}" for _, units in sorted(tracked.slot_extension_units.items()))
    print(f"  (write units a task, tracked: {own} for its put, claim and finish, and its share "
          f"of the slot's key records, one a window of {tracked.window}: {ahead};\n"
          f"   no lock heartbeats, a slot heartbeat {beats} with its keys held; after a crash, "
          f"{tracked.fence_units:.2f} a key the lapsed slot held)")


def _bytes(size: int) -> str:
    return f"{size // 1024} KB" if size % 1024 == 0 else f"{size} B"


def coworker_worker_timeout(seconds: float, limits_declared: bool = True) -> int:
    """The worker timeout a deployment for tasks of ``seconds`` has. With their time limit declared
    (``seconds``), the stack's choice: the default (300 s), or the shortest that gives the limit.
    Without (as before issue 47): the default while a task fits in half of it, else Lambda's longest
    (900 s), as a team would have set it by hand."""
    if not limits_declared:
        return WORKER_TIMEOUT if seconds <= WORKER_TIMEOUT / 2 else p.LAMBDA_MAX_SECONDS
    needed = timing.worker_timeout_for(seconds, TIMEOUT_MARGIN)
    return max(WORKER_TIMEOUT, needed if needed is not None else p.LAMBDA_MAX_SECONDS)


@dataclasses.dataclass(frozen=True)
class Rounds:
    """What one thread of a worker invocation does with back-to-back tasks of one length."""

    finished: int  # tasks it runs to the end
    lost: int  # attempts it starts and that are killed at its deadline (0 or 1)
    seconds: float  # how long the invocation runs

    @property
    def lost_share(self) -> float:
        return self.lost / (self.finished + self.lost)


def deadline_rounds(seconds: float, timeout: int, limits_declared: bool = True) -> Rounds:
    """Back-to-back tasks of ``seconds`` in one thread of a ``timeout``-s worker.

    Declared limits: a task starts only if it ends before the deadline less the margin, and the
    invocation ends after its last one. Without: the worker claims until the last tenth of its
    timeout and starts a handler until the deadline less the margin, so the task that straddles it
    is killed there (its attempt lost) and the invocation runs to its end.
    """
    length = seconds + p.DYNAMODB_SECONDS_PER_TASK
    handlers_until = timeout - TIMEOUT_MARGIN
    finished = max(1, math.floor(handlers_until / length)) if handlers_until >= length else 0
    if limits_declared:
        return Rounds(max(1, finished), 0, max(1, finished) * length)
    claims_until = timeout - max(2 * TIMEOUT_MARGIN, 0.1 * timeout)
    starts = math.ceil(claims_until / length)
    lost = 1 if starts > finished else 0
    finished = min(starts, finished)
    return Rounds(finished, lost, timeout if lost else finished * length)


def coworker_bill(m: Measured, w: Workload, batched: bool = False, payload_in_bucket: bool = False,
                  limits_declared: bool = True) -> Bill:
    """``payload_in_bucket``: ``m`` measured with the payload kept in the results bucket, whose
    requests are added (a PUT when the task is put, a GET when a worker runs it). Without
    ``limits_declared``, the attempts killed at a worker's deadline (see :func:`deadline_rounds`)
    are billed: their Lambda time, and the writes of a failed attempt (``m.retry_units``) each."""
    if w.seconds > p.LAMBDA_MAX_SECONDS:
        return Bill("Coworker", {}, note=LAMBDA_NA)
    timeout = coworker_worker_timeout(w.seconds, limits_declared)
    rounds = deadline_rounds(w.seconds, timeout, limits_declared)
    if rounds.finished == 0:
        return Bill("Coworker (no limits declared)", {}, note=f"infeasible: a task outlasts a {timeout}-s worker")
    # Each attempt is lost with the same chance: attempts per finished task, geometric.
    attempts = 1 / (1 - rounds.lost_share)
    lost_per_task = attempts - 1
    thread_rounds = w.tasks * attempts / (rounds.finished + rounds.lost)  # one thread's invocation each
    invocations = math.ceil(thread_rounds / w.threads)
    invocation_seconds = thread_rounds * rounds.seconds / w.threads / invocations
    lock_beats = max(0, math.ceil(w.seconds / HEARTBEAT_SECONDS) - 1)
    slot_beats = math.floor(invocation_seconds / HEARTBEAT_SECONDS)
    failed_attempt_units = (m.retry_units[1] - m.retry_units[0]) if len(m.retry_units) > 1 else m.own_write_units
    task_units = (m.own_write_units + m.lock_heartbeat_units(lock_beats)
                  + lost_per_task * (failed_attempt_units + m.lock_heartbeat_units(lock_beats))
                  + (m.batch_extra_write_units if batched else 0.0))
    invocation_units = m.invocation_write_units + m.race_write_units + slot_beats * m.slot_extension_units
    log_bytes = w.tasks * m.log_bytes_per_task + invocations * (m.log_bytes_per_invocation
                                                                + p.LAMBDA_PLATFORM_LOG_BYTES)
    # While the job runs the coordinator supervises (a minute per scheduled run) and every metric
    # is published; the monthly table prices a deployment with nothing to do.
    supervising = coordinator_busy(m, w.hours)
    bucket = {"S3 payload requests": w.tasks * (p.S3_PUT + p.S3_GET)} if payload_in_bucket else {}
    name = f"Coworker{' (one batch)' if batched else ''}{'' if limits_declared else ' (no limits declared)'}"
    lost_note = (f"; {rounds.lost_share:.0%} of attempts killed at the deadline ({lost_per_task:.2f} a task, "
                 f"{rounds.lost_share ** MAX_ATTEMPTS:.1%} of tasks ignored at {MAX_ATTEMPTS} attempts)"
                 if rounds.lost else "")
    return Bill(name, {
        "DynamoDB writes, tasks": w.tasks * task_units * p.DYNAMODB_WRITE_UNIT,
        "DynamoDB writes, invocations": invocations * invocation_units * p.DYNAMODB_WRITE_UNIT,
        "DynamoDB reads": w.tasks * m.read_units * p.DYNAMODB_READ_UNIT,
        "DynamoDB storage (a month)": w.tasks * p.ITEM_BYTES / 1e9 * p.DYNAMODB_GB_MONTH,
        "Lambda requests": invocations * p.LAMBDA_REQUEST,
        "Lambda GB-s": invocations * invocation_seconds * w.memory_gb * p.LAMBDA_GB_SECOND_ARM,
        "API Gateway (1,000 tasks per POST)": math.ceil(w.tasks / 1000) * p.API_GATEWAY_REST_REQUEST,
        "CloudWatch Logs": log_bytes / 1e9 * p.CLOUDWATCH_LOGS_GB,
        "X-Ray": invocations * p.XRAY_SAMPLED * p.XRAY_TRACE,
        "coordinator and metrics while it runs": supervising.total,
        **bucket,
    }, note=f"{invocations:,} worker invocations of {w.threads} threads (timeout {timeout} s); "
            f"{lock_beats} lock heartbeats a task; write units: {task_units:.2f} a task, "
            f"{invocation_units:.0f} an invocation{lost_note}")


def sqs_requests_per_task(payload_bytes: int = 0) -> float:
    """Send, receive and delete in batches of 10; SQS bills a request per 64 KB it carries, and a
    send or receive batch carries its 10 payloads."""
    chunks = max(1, math.ceil(p.SQS_LAMBDA_BATCH * payload_bytes / SQS_CHUNK_BYTES))
    return p.SQS_REQUESTS_PER_TASK + 2 * (chunks - 1) / p.SQS_LAMBDA_BATCH


SQS_CHUNK_BYTES = 64 * 1024


def sqs_bill(m: Measured, w: Workload, payload_bytes: int = 0) -> Bill:
    if w.seconds > p.LAMBDA_MAX_SECONDS:
        return Bill("SQS + Lambda + status table", {}, note=LAMBDA_NA)
    if w.seconds + p.DYNAMODB_SECONDS_PER_TASK > p.LAMBDA_MAX_SECONDS:
        return Bill("SQS + Lambda + status table", {}, note="infeasible: a task outlasts Lambda's 15 minutes")
    invocations = math.ceil(w.tasks / p.SQS_LAMBDA_BATCH)
    log_bytes = w.tasks * m.log_bytes_per_task + invocations * p.LAMBDA_PLATFORM_LOG_BYTES
    threads = min(w.threads, p.SQS_LAMBDA_BATCH)
    return Bill("SQS + Lambda + status table", {
        "SQS requests": w.tasks * sqs_requests_per_task(payload_bytes) * p.SQS_REQUEST,
        "DynamoDB writes": w.tasks * p.STATUS_TABLE_WRITES * p.DYNAMODB_WRITE_UNIT,
        "DynamoDB storage (a month)": w.tasks * p.ITEM_BYTES / 1e9 * p.DYNAMODB_GB_MONTH,
        "Lambda requests": invocations * p.LAMBDA_REQUEST,
        "Lambda GB-s": w.tasks * (w.seconds + p.DYNAMODB_SECONDS_PER_TASK) / threads * w.memory_gb
                       * p.LAMBDA_GB_SECOND_ARM,
        "CloudWatch Logs": log_bytes / 1e9 * p.CLOUDWATCH_LOGS_GB,
        "X-Ray": invocations * p.XRAY_SAMPLED * p.XRAY_TRACE,
    }, note=f"{p.SQS_LAMBDA_BATCH} messages an invocation, {threads} at once; visibility timeout above "
            "the function's; no heartbeat needed")


def distributed_map_bill(m: Measured, w: Workload, batch: int) -> Bill:
    """Children of ``batch`` items, each one Lambda call that runs ``threads`` items at once:
    Express children while a child fits in 5 minutes, Standard children beyond (Lambda's 15)."""
    if w.seconds > p.LAMBDA_MAX_SECONDS:
        return Bill(f"Distributed Map (batch {batch})", {}, note=LAMBDA_NA)
    lambda_seconds = math.ceil(batch / w.threads) * w.seconds + p.DYNAMODB_SECONDS_PER_TASK
    child_seconds = lambda_seconds + 0.1  # the child waits for its Lambda
    if lambda_seconds > p.LAMBDA_MAX_SECONDS:
        return Bill(f"Distributed Map (batch {batch})", {}, note="infeasible: a child's Lambda outlasts 15 minutes")
    children = math.ceil(w.tasks / batch)
    log_bytes = w.tasks * m.log_bytes_per_task + children * p.LAMBDA_PLATFORM_LOG_BYTES
    lines = {"parent state transitions": children * p.STEP_FUNCTIONS_TRANSITION}
    express = child_seconds <= p.EXPRESS_MAX_SECONDS
    if express:
        lines["express child requests"] = children * p.EXPRESS_REQUEST
        lines["express child duration (64 MB)"] = children * child_seconds * 0.0625 * p.EXPRESS_GB_SECOND
    else:
        lines["standard child transitions"] = children * p.STANDARD_CHILD_TRANSITIONS * p.STEP_FUNCTIONS_TRANSITION
    lines["Lambda requests"] = children * p.LAMBDA_REQUEST
    lines["Lambda GB-s"] = children * lambda_seconds * w.memory_gb * p.LAMBDA_GB_SECOND_ARM
    lines["CloudWatch Logs"] = log_bytes / 1e9 * p.CLOUDWATCH_LOGS_GB
    kind = "Express" if express else "Standard (a child outlasts Express's 5 minutes)"
    return Bill(f"Distributed Map (batch {batch})", lines,
                note=f"{kind} children of {batch} items, {min(batch, w.threads)} at once in one Lambda call")


def cheapest_distributed_map(m: Measured, w: Workload) -> Bill:
    bills = [distributed_map_bill(m, w, b) for b in p.DISTRIBUTED_MAP_BATCHES]
    feasible = [bill for bill in bills if bill.lines]
    return min(feasible, key=lambda bill: bill.total) if feasible else bills[-1]


# --- the Fargate designs: tasks longer than Lambda's 15 minutes ---------------------------------


@dataclasses.dataclass(frozen=True)
class FargateTask:
    """What a Fargate task (Linux/ARM) is billed for, a second at a time: its size, and the
    public IPv4 address it holds in a public subnet (none in private subnets, whose NAT gateway
    or VPC endpoints are priced apart)."""

    vcpu: float = p.RUNNER_VCPU
    memory_gb: float = p.RUNNER_MEMORY_GB
    public_ip: bool = True

    def __str__(self) -> str:
        return f"{self.vcpu:g} vCPU / {self.memory_gb:g} GB{', public IPv4' if self.public_ip else ''}"

    @property
    def hourly(self) -> float:
        return (self.vcpu * p.FARGATE_VCPU_HOUR_ARM + self.memory_gb * p.FARGATE_GB_HOUR_ARM
                + (p.PUBLIC_IPV4_HOUR if self.public_ip else 0.0))

    def lines(self, fargate_tasks: float, seconds: float) -> dict[str, float]:
        """``fargate_tasks`` Fargate tasks of ``seconds`` each, rounded up to the second and
        billed a minute at least."""
        hours = fargate_tasks * max(p.FARGATE_MIN_SECONDS, math.ceil(seconds)) / 3600
        address = {"public IPv4 addresses": hours * p.PUBLIC_IPV4_HOUR} if self.public_ip else {}
        return {"Fargate vCPU-hours": hours * self.vcpu * p.FARGATE_VCPU_HOUR_ARM,
                "Fargate GB-hours": hours * self.memory_gb * p.FARGATE_GB_HOUR_ARM, **address}


def _launches(fargate_tasks: float) -> str:
    hours = fargate_tasks / p.FARGATE_LAUNCHES_PER_SECOND / 3600
    return f"{fargate_tasks:,.0f} launches take {hours:,.1f} h at Fargate's {p.FARGATE_LAUNCHES_PER_SECOND} a second"


def coworker_runner_bill(m: Measured, w: Workload, fargate: FargateTask = FargateTask(),
                         runner_threads: int = RUNNER_THREADS, tasks_per_start: float | None = None) -> Bill:
    """Coworker's container runner: Fargate tasks the coordinator starts (ECS RunTask), one a free
    runner slot, each running ``runner_threads`` tasks at once and feeding itself until no
    container work is due. With a deep backlog (``tasks_per_start`` None) each runner slot's one
    start covers its share of the job: ``concurrency / runner_threads`` runners, at most
    ``max_runners`` allows. Tasks that come apart start a runner each (``tasks_per_start=1``).
    A task's writes and heartbeats are the Lambda worker's; a runner's are an invocation's (its
    slot's reserve, start and release, its lost claims, a slot heartbeat every 20 s). The job runs
    at :data:`RUNNER_CONCURRENCY` tasks at once, whatever ``w.concurrency`` (the Lambda worker's)."""
    w = dataclasses.replace(w, concurrency=RUNNER_CONCURRENCY)
    length = w.seconds + p.DYNAMODB_SECONDS_PER_TASK
    runners = max(1, min(w.concurrency // runner_threads, MOST_RUNNERS))
    if tasks_per_start is None:
        starts = min(runners, math.ceil(w.tasks / runner_threads))
    else:
        starts = math.ceil(w.tasks / tasks_per_start)
    working = w.tasks / starts * length / runner_threads  # seconds a runner runs tasks
    billed = p.FARGATE_START_SECONDS + working
    lock_beats = max(0, math.ceil(w.seconds / HEARTBEAT_SECONDS) - 1)
    task_units = m.own_write_units + m.lock_heartbeat_units(lock_beats)
    runner_units = (m.invocation_write_units + m.race_write_units
                    + math.floor(working / HEARTBEAT_SECONDS) * m.slot_extension_units)
    log_bytes = w.tasks * m.log_bytes_per_task + starts * m.log_bytes_per_invocation
    name = "Coworker, container runner" + (", a runner per task" if tasks_per_start == 1 else "")
    return Bill(name, {
        **fargate.lines(starts, billed),
        "DynamoDB writes, tasks": w.tasks * task_units * p.DYNAMODB_WRITE_UNIT,
        "DynamoDB writes, runners": starts * runner_units * p.DYNAMODB_WRITE_UNIT,
        "DynamoDB reads": w.tasks * m.read_units * p.DYNAMODB_READ_UNIT,
        "DynamoDB storage (a month)": w.tasks * p.ITEM_BYTES / 1e9 * p.DYNAMODB_GB_MONTH,
        "API Gateway (1,000 tasks per POST)": math.ceil(w.tasks / 1000) * p.API_GATEWAY_REST_REQUEST,
        "CloudWatch Logs": log_bytes / 1e9 * p.CLOUDWATCH_LOGS_GB,
        "coordinator and metrics while it runs": coordinator_busy(m, w.hours).total,
    }, note=f"{starts:,} runners of {fargate}, {runner_threads} task at once, {_length(billed)} billed each "
            f"({p.FARGATE_START_SECONDS} s to start and stop); {lock_beats} lock heartbeats a task; "
            f"write units: {task_units:.2f} a task, {runner_units:,.0f} a runner")


def distributed_map_ecs_bill(m: Measured, w: Workload, fargate: FargateTask = FargateTask()) -> Bill:
    """Step Functions Distributed Map, each item a Standard child (Express children cannot wait
    for a job) whose one Task state runs it in its own ECS task on Fargate (``ecs:runTask.sync``):
    a Fargate start an item, no reuse."""
    return Bill("Distributed Map + ECS", {
        "parent state transitions": w.tasks * p.STEP_FUNCTIONS_TRANSITION,
        "standard child transitions": w.tasks * p.STANDARD_CHILD_TRANSITIONS * p.STEP_FUNCTIONS_TRANSITION,
        **fargate.lines(w.tasks, p.FARGATE_START_SECONDS + w.seconds),
        "CloudWatch Logs": w.tasks * m.log_bytes_per_task / 1e9 * p.CLOUDWATCH_LOGS_GB,
    }, note=f"a Standard child and a Fargate task ({fargate}) an item; {_launches(w.tasks)}")


def batch_bill(m: Measured, w: Workload, fargate: FargateTask = FargateTask()) -> Bill:
    """AWS Batch on Fargate: a job a task (array jobs of up to 10,000), each its own Fargate task.
    Batch, its queue and its job states cost nothing."""
    return Bill("AWS Batch on Fargate", {
        **fargate.lines(w.tasks, p.FARGATE_START_SECONDS + w.seconds),
        "CloudWatch Logs": w.tasks * m.log_bytes_per_task / 1e9 * p.CLOUDWATCH_LOGS_GB,
    }, note=f"a job and a Fargate task ({fargate}) a task; {_launches(w.tasks)}")


def break_even(first: Callable[[float], float], second: Callable[[float], float],
               longest: float = LAMBDA_LONGEST_TASK) -> float | None:
    """The task length (seconds) from which ``second`` (a length's bill) costs no more than
    ``first``, to a millisecond: 0.0 if it never costs more, ``None`` if it costs more at every
    length up to ``longest``. The two cross once: each grows by the second at its own rate, and
    ``second`` starts above (a Fargate start against Lambda; heartbeats against a start)."""
    def second_cheaper(seconds: float) -> bool:
        return second(seconds) <= first(seconds)

    low, high = 0.001, longest
    if second_cheaper(low):
        return 0.0
    if not second_cheaper(high):
        return None
    while high - low > 0.001:
        middle = (low + high) / 2
        low, high = (low, middle) if second_cheaper(middle) else (middle, high)
    return high


def lambda_fargate_break_even(m: Measured, w: Workload, fargate: FargateTask = FargateTask(),
                              tasks_per_start: float | None = None) -> float | None:
    """Where Coworker on its Lambda worker (``w``'s memory and threads) and on its container runner
    (``fargate``, ``w.threads`` tasks at once) cost the same, by task length (see :func:`break_even`)."""
    def at(seconds: float) -> Workload:
        return dataclasses.replace(w, seconds=seconds)

    return break_even(lambda seconds: coworker_bill(m, at(seconds)).total,
                      lambda seconds: coworker_runner_bill(m, at(seconds), fargate, w.threads, tasks_per_start).total)


def runner_break_even(m: Measured, w: Workload, other: Callable[[Measured, Workload, FargateTask], Bill],
                      fargate: FargateTask = FargateTask(), runner_threads: int = RUNNER_THREADS,
                      longest: float = 24 * 3600) -> float | None:
    """The task length from which ``other``, a Fargate design that starts a Fargate task for each
    task, costs no more than Coworker's container runner with a deep backlog: where the runner's
    heartbeats and coordinator pass a Fargate start a task (see :func:`break_even`)."""
    def at(seconds: float) -> Workload:
        return dataclasses.replace(w, seconds=seconds)

    return break_even(lambda seconds: coworker_runner_bill(m, at(seconds), fargate, runner_threads).total,
                      lambda seconds: other(m, at(seconds), fargate).total, longest)


def lambda_memory_like(fargate: FargateTask) -> float:
    """The Lambda memory (GB, arm64) whose second costs what a second of ``fargate`` on Fargate does."""
    return fargate.hourly / 3600 / p.LAMBDA_GB_SECOND_ARM


# --- the fixed monthly cost -----------------------------------------------------------------------


def _coordinator_runs(run: RunCost, runs: float, seconds: float, metric_names: int,
                      metric_hours: float) -> Bill:
    log_bytes = runs * (run.log_bytes + p.LAMBDA_PLATFORM_LOG_BYTES)
    return Bill("coordinator", {
        "coordinator Lambda": runs * (p.LAMBDA_REQUEST + seconds * p.COORDINATOR_MEMORY_GB * p.LAMBDA_GB_SECOND_ARM),
        "DynamoDB reads and writes": runs * (run.read_units * p.DYNAMODB_READ_UNIT
                                             + run.write_units * p.DYNAMODB_WRITE_UNIT),
        "DynamoDB Streams reads": runs * run.stream_reads * p.DYNAMODB_STREAMS_READ,
        "custom metrics": metric_names * metric_hours / p.HOURS_A_MONTH * p.CLOUDWATCH_METRIC_MONTH,
        "CloudWatch Logs": log_bytes / 1e9 * p.CLOUDWATCH_LOGS_GB,
        # The default sampling rule traces the first request of each second (its reservoir) and 5 %
        # of the rest: a run a minute is always the first of its second, so every run is traced.
        "X-Ray": runs * p.XRAY_TRACE,
    })


def coordinator_idle(m: Measured) -> Bill:
    """A month of scheduled runs that each find nothing to do and end after one tick."""
    run = m.idle_run
    seconds = p.LAMBDA_RUN_OVERHEAD_SECONDS + run.requests * p.DYNAMODB_SECONDS_PER_REQUEST
    return _coordinator_runs(run, p.COORDINATOR_RUNS_A_MONTH, seconds, len(run.metric_names), p.HOURS_A_MONTH)


def coordinator_busy(m: Measured, hours: float) -> Bill:
    """``hours`` of supervision: a run a minute, ticking every ``tick_seconds``, every metric sent."""
    runs = hours * 60
    ticks = SUPERVISE_SECONDS / TICK_SECONDS
    tick = m.busy_tick
    per_run = RunCost(tick.requests * ticks, tick.stream_reads * ticks, tick.read_units * ticks,
                      tick.write_units * ticks, int(tick.log_bytes * ticks), tick.metric_names)
    # A metric costs a month's price for each month it is sent in (prorated): a job of 2,000 hours
    # pays nearly three months of them.
    return _coordinator_runs(per_run, runs, SUPERVISE_SECONDS, len(CUSTOM_METRICS), hours)


def monitoring() -> Bill:
    return Bill("alarms and dashboard", {
        f"{p.STACK_ALARM_METRICS} alarm metrics": p.STACK_ALARM_METRICS * p.CLOUDWATCH_ALARM_METRIC_MONTH,
        "dashboard (beyond the account's first three)": p.STACK_DASHBOARDS * p.CLOUDWATCH_DASHBOARD_MONTH,
        "the alarm topic's KMS key": p.STACK_KMS_KEYS * p.KMS_KEY_MONTH,
    })


def sqs_idle() -> Bill:
    return Bill("SQS + Lambda", {"empty long polls of the event source mapping":
                                 p.SQS_IDLE_RECEIVES_A_MONTH * p.SQS_REQUEST})


# --- printing -------------------------------------------------------------------------------------


def _length(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g} ms"
    if seconds >= 3600:
        return f"{seconds / 3600:,.4g} h"
    return f"{seconds:g} s" if seconds < 60 else f"{seconds / 60:g} min"


def _print_bill(bill: Bill) -> None:
    if not bill.lines:
        print(f"  {bill.name}: {bill.note}")
        return
    print(f"  {bill.name}: ${bill.total:,.2f}   ({bill.note})" if bill.note else f"  {bill.name}: ${bill.total:,.2f}")
    for name, amount in bill.lines.items():
        print(f"      {name:<46}${amount:>10,.4f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--task-seconds", type=float, default=1.0, help="the task length itemised in full")
    parser.add_argument("--memory-mb", type=int, default=512, help="worker memory (all designs)")
    parser.add_argument("--threads", type=int, default=capacity.DEFAULT_BATCH_SIZE,
                        help="tasks at once in one invocation (all designs; default: the template's batchSize)")
    parser.add_argument("--concurrency", type=int, default=capacity.DEFAULT_MAX_CONCURRENCY,
                        help="tasks at once in all (default: the template's maxConcurrency)")
    parser.add_argument("--fargate-vcpu", type=float, default=p.RUNNER_VCPU, help="a Fargate task's vCPUs")
    parser.add_argument("--fargate-memory-gb", type=float, default=p.RUNNER_MEMORY_GB, help="a Fargate task's memory")
    parser.add_argument("--no-public-ip", action="store_true",
                        help="Fargate tasks in private subnets (their NAT gateway or VPC endpoints priced apart)")
    parser.add_argument("--runner-threads", type=int, default=RUNNER_THREADS,
                        help="tasks at once in one container runner (Coworker's runner_threads)")
    parser.add_argument("--race-invocations", type=int, default=None,
                        help="worker invocations racing for one queue when claim races are measured "
                             "(default: as many as run at --concurrency: 12 as deployed)")
    parser.add_argument("--db", choices=("auto", "dynamodb-local", "moto"), default=None)
    args = parser.parse_args(argv)
    print(f"$ .venv/bin/python benchmarks/bill.py {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        m = measure(args.db, race_invocations=args.race_invocations or max(1, args.concurrency // args.threads))
    print()
    where = "moto (write units by the documented rules)" if _rules_only else "its embedded DynamoDB"
    idle, tick = m.idle_run, m.busy_tick
    for line in (
        f"Measured on the real engine and {where}:",
        f"  write units a task: {m.own_write_units:.2f} its own (put, claim, finish); "
        f"a batch task {m.batch_extra_write_units:+.2f} (its head and counters, 100 tasks a request)",
        f"  write units a worker invocation: {m.invocation_write_units:.2f} its slot; "
        f"{m.race_write_units:.1f} claims lost to another worker",
        f"    ({m.race_invocations} invocations of 10 threads racing: {m.race_tasks:,} tasks, "
        f"{m.race_started} invocations)",
        f"  heartbeats (every {HEARTBEAT_SECONDS:g} s): a running task's lock, in write units, "
        f"{_beat_units_line(m)};",
        f"    {m.slot_extension_units:.2f} an invocation's slot a beat",
        f"  a task's whole life when its first n attempts fail (system errors, 2 KB tracebacks), "
        f"n = 0 ... {len(m.retry_units) - 1}: " + ", ".join(f"{units:.2f}" for units in m.retry_units)
        + " write units",
        *(["  the design that tracks running tasks per invocation (not built), write units a task: "
           + ", ".join(f"{units:.2f}" for _, units in sorted(m.tracked.own_write_units.items()))
           + " and its slot's key records"] if m.tracked else []),
        f"  read units a task: {m.read_units:.2f}; log bytes: {m.log_bytes_per_task:,.0f} a task, "
        f"{m.log_bytes_per_invocation:,.0f} an invocation",
        f"  a coordinator run with nothing to do: {idle.requests} requests ({idle.stream_reads} stream reads), "
        f"{idle.read_units:.1f} read and {idle.write_units:.1f} write units,",
        f"    {idle.log_bytes:,} log bytes, metrics: {', '.join(sorted(idle.metric_names)) or 'none'}",
        f"  a tick with work: {tick.requests} requests, {tick.read_units:.1f} read units, "
        f"{len(tick.metric_names)} metrics",
    ):
        print(line)

    memory_gb = args.memory_mb / 1024

    def workload(seconds: float) -> Workload:
        return Workload(args.tasks, seconds, memory_gb, args.threads, args.concurrency)

    fargate = FargateTask(args.fargate_vcpu, args.fargate_memory_gb, public_ip=not args.no_public_ip)
    print(f"\nCost of {args.tasks:,} tasks by task length (us-east-1 list prices of {p.PRICES_AS_OF}, USD, no free "
          f"tier): Lambda designs {args.threads} at once per invocation, {args.memory_mb} MB; Fargate designs "
          f"arm64 {fargate} (${fargate.hourly:.4f} an hour), one task at a time in each "
          f"(Coworker's runner {args.runner_threads})\n")
    _print_bill_table(m, workload, fargate, args.runner_threads)

    _print_reaching(m, workload)
    _print_deadline_losses()
    _print_tracked(m, workload)
    _print_by_payload(m, workload)

    _print_lambda_or_fargate(m, workload, fargate)

    w = workload(args.task_seconds)
    print(f"\nItemised, tasks of {_length(args.task_seconds)}:\n")
    for bill in (coworker_bill(m, w), coworker_bill(m, w, batched=True), sqs_bill(m, w),
                 *(distributed_map_bill(m, w, b) for b in p.DISTRIBUTED_MAP_BATCHES)):
        _print_bill(bill)
    w = workload(CONTAINER_TASK_LENGTHS[-1])
    print(f"\nItemised, tasks of {_length(w.seconds)}:\n")
    for bill in (coworker_runner_bill(m, w, fargate, args.runner_threads), distributed_map_ecs_bill(m, w, fargate),
                 batch_bill(m, w, fargate)):
        _print_bill(bill)

    idle, busy, watch = coordinator_idle(m), coordinator_busy(m, p.HOURS_A_MONTH), monitoring()
    print("\nA month, fixed (whatever the tasks cost):\n")
    print(f"  {'design':<34}{'nothing to do':>16}{'work all month':>16}   alarms and dashboard")
    print(f"  {'Coworker':<34}{'$' + format(idle.total, ',.2f'):>16}{'$' + format(busy.total, ',.2f'):>16}"
          f"   ${watch.total:,.2f} (in the stack)")
    print(f"  {'SQS + Lambda + status table':<34}{'$' + format(sqs_idle().total, ',.2f'):>16}{'$0.00':>16}"
          "   the team's own")
    print(f"  {'Distributed Map':<34}{'$0.00':>16}{'$0.00':>16}   the team's own")
    verdict = "meets" if idle.total <= 1.0 else "MISSES"
    print(f"\n  Coworker with nothing to do: ${idle.total:.2f} a month beyond its alarms and dashboard "
          f"(target <= $1: {verdict})")
    for bill, when in ((idle, "nothing to do"), (busy, "work all month"), (watch, "a month")):
        _print_bill(dataclasses.replace(bill, name=f"{bill.name}, {when}"))
    print(f"\n({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
