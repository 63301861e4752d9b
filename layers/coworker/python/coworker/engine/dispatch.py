"""Dispatch: starting workers when there is work and a free worker slot.

Three paths start workers, all through the same capacity accounting (worker slots, see
:mod:`coworker.engine.slots`), so together they never run more than ``max_concurrency`` tasks:

* **on submit** (:func:`dispatch_submitted`): the API, having put tasks, reserves free slots and
  invokes workers with the new keys at once, so a task starts well within a second;
* **self-feeding** (:mod:`coworker.engine.feeder`): a running worker claims more due work itself
  until its time or the backlog runs out;
* **the supervisor** (:class:`Supervisor`): the coordinator ticks every ``tick_seconds`` on a
  fixed cadence within one long invocation, holding a single-flight lease; each tick tops up
  free slots with workers for due work (retries, expired locks, anything the other paths
  missed), retires tasks lost on their last attempt and reports the backlog. Its writes besides
  (batch counting, slot reservations, schedule occurrences and callbacks, parks and cancels) run
  on threads of its own (:class:`TickThreads`), so a write a throttled table holds for seconds
  never holds a tick past its wait.

Delivery stays at-least-once: a key may be handed to two workers (the index is eventually
consistent); the claim, one conditional write, decides.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

from aws_lambda_powertools.metrics import MetricUnit

from coworker.config import Settings
from coworker.data import index
from coworker.data.layout import COORDINATOR_LEASE, shard_of
from coworker.data.models import LeaseState, TaskModel, TaskStatus, utcnow
from coworker.engine import (
    batches,
    callbacks,
    control,
    gates,
    lifecycle,
    progress,
    reshard,
    runners,
    schedules,
    slots,
    worker,
)
from coworker.engine.control import DueAction
from coworker.engine.feeder import FEED_ORDER
from coworker.engine.outcomes import TaskReport
from coworker.engine.worker import WorkerRequest
from coworker.errors import BatchNotFoundError
from coworker.observability import MetricName, logger, metrics, publish_metrics, tracer

# Order in which work is handed out: lost by dead workers, then due retries, then new.
DISPATCH_ORDER = FEED_ORDER
# New tasks younger than this are left to dispatch-on-submit (whose worker may still be
# starting), so a tick does not hand the same key to a second worker.
SUBMIT_GRACE_SECONDS = 2.0
# Invocations sent at once by one dispatcher.
FAN_OUT_THREADS = 16
# Tasks of paused types a tick reads past and parks out of the queue, and held tasks of
# resumed types it puts back, at most (each is one conditional write, FAN_OUT_THREADS at a time).
PARK_BUDGET = 1000
RELEASE_BUDGET = 1000
# Container runners' tasks a tick reads past at most, per status, for the Lambda workers' work.
RUNNER_READ_PAST = 1000
STOPPED_BATCH_REASON = "because its batch stopped at its failure threshold"
# Index entries read per backlog measurement for stopped batches' tasks that are not due yet.
STOPPED_SWEEP_BUDGET = 1000
# The coordinator's lease outlives this many missed ticks before another may take over.
LEASE_TICKS = 3
MIN_LEASE_SECONDS = 10.0
# It is extended once less than this share of it is left, not every tick: one write on the loop's
# path every few ticks (a throttled table holds each for seconds), a stall of half a lease
# (at least 5 s and 1.5 ticks) still tolerated.
LEASE_RENEW_SHARE = 0.5
# A supervisor's tick waits for the parts it runs on other threads (slot reservations, schedule
# occurrences and batch callbacks, parks and cancels) half a tick from its start, at least this long.
MIN_THREAD_WAIT_SECONDS = 1.0


class Invoker(Protocol):
    """Starts one worker invocation, without waiting for it."""

    def invoke(self, request: WorkerRequest) -> None: ...


class LambdaInvoker:
    """Production invoker: asynchronous ``Invoke`` of the worker function (``endpoint``: a
    local Lambda API, as the local runtime serves).

    Its boto3 client is built here (no request is sent): a function makes its invoker in its init
    phase, where AWS advises creating SDK clients, so that its first request does not pay for
    loading the Lambda service model (about 0.3 s of CPU)."""

    def __init__(self, function_name: str, region: str, endpoint: str | None = None,
                 client: Any | None = None) -> None:
        self._function_name = function_name
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.client("lambda", region_name=region, endpoint_url=endpoint,
                                  config=Config(max_pool_connections=FAN_OUT_THREADS, retries={"mode": "standard"}))
        self.client = client

    def invoke(self, request: WorkerRequest) -> None:
        self.client.invoke(
            FunctionName=self._function_name,
            InvocationType="Event",
            Payload=json.dumps(request.to_event()).encode(),
        )


def invoker_from_settings(settings: Settings) -> LambdaInvoker | None:
    """The worker invoker these settings name, or ``None`` without a worker function."""
    if not settings.worker_function:
        return None
    return LambdaInvoker(settings.worker_function, settings.region, settings.lambda_endpoint)


class InProcessInvoker:
    """Test invoker: each invocation runs ``worker.run_invocation`` on a thread pool.

    ``worker_timeout_seconds`` plays the Lambda timeout: the invocation gets that deadline.
    """

    def __init__(self, settings: Settings, max_invocations: int | None = None,
                 owner_prefix: str = "local") -> None:
        self._settings = settings
        self._pool = ThreadPoolExecutor(max_workers=max_invocations or settings.worker_slots + 2,
                                        thread_name_prefix="invocation")
        self._owner_prefix = owner_prefix
        self._count = 0
        self._lock = threading.Lock()
        self.requests: list[WorkerRequest] = []
        self.futures: list[Future[list[TaskReport]]] = []

    def invoke(self, request: WorkerRequest) -> None:
        with self._lock:
            self._count += 1
            owner = f"{self._owner_prefix}-{self._count}"
            self.requests.append(request)
            deadline = time.monotonic() + self._settings.worker_timeout_seconds
            self.futures.append(self._pool.submit(worker.run_invocation, request, owner, self._settings, deadline))

    def wait(self) -> list[TaskReport]:
        """Wait for every invocation so far; return their reports."""
        with self._lock:
            futures, self.futures = self.futures, []
        return [report for future in futures for report in future.result()]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def fan_out(invoker: Invoker, requests: Sequence[WorkerRequest]) -> int:
    """Send ``requests`` in parallel; returns how many were sent (failures are logged)."""

    def send(request: WorkerRequest) -> bool:
        try:
            invoker.invoke(request)
            return True
        except Exception:  # noqa: BLE001 - the slot's reservation lapses; the tasks stay due
            logger.exception("worker invocation failed", extra={"slot": request.slot})
            return False

    if len(requests) <= 1:
        return sum(send(request) for request in requests)
    with ThreadPoolExecutor(max_workers=min(FAN_OUT_THREADS, len(requests))) as pool:
        return sum(pool.map(send, requests))


def start_workers(settings: Settings, invoker: Invoker, keys: Sequence[str],
                  free: Sequence[str] | None = None, now: datetime | None = None,
                  reservations: Reservations | None = None, wait_seconds: float = 0.0) -> list[WorkerRequest]:
    """Reserve free slots and start one worker per slot's worth of keys (as many as slots allow).

    Each worker is handed as many keys as it runs threads. Returns the requests sent. Keys
    beyond the reserved slots stay due: running workers feed on them, or a later tick hands
    them out. With ``reservations`` (a supervisor's), the reservations are made on its threads
    and waited for at most ``wait_seconds`` (see :class:`Reservations`).
    """
    if not keys:
        return []
    now = now or utcnow()
    if free is None:
        free = slots.free_slots(settings.worker_slots, math.ceil(len(keys) / settings.batch_size), now)
    remaining = list(dict.fromkeys(keys))
    if reservations is not None:
        return reservations.start(settings, invoker, remaining, free, now, wait_seconds)
    requests: list[WorkerRequest] = []
    candidates = list(free)
    while remaining and candidates:
        # As many slots as the keys left need, reserved at once: a tick waits for the slowest of
        # their writes, not for their sum (a throttled table holds each for seconds).
        wanted = candidates[:math.ceil(len(remaining) / settings.batch_size)]
        candidates = candidates[len(wanted):]
        for slot, token in _reserve_all(wanted, settings.reservation_seconds, now):
            hints, remaining = _hints_for(settings, slot, remaining)
            requests.append(WorkerRequest(tuple(hints), slot, token))
    fan_out(invoker, requests)
    return requests


def _hints_for(settings: Settings, slot: str, keys: Sequence[str]) -> tuple[list[str], list[str]]:
    """The keys handed to ``slot``'s worker (as many as it runs threads), and the keys left."""
    number = slots.slot_number(slot)
    # The keys of the slot's own stripe first: the ones self-feeding workers of other slots
    # leave alone (see feeder.Feeder), so they do not race this worker for them.
    own = [key for key in keys if shard_of(key, settings.worker_slots) == number]
    rest = [key for key in keys if shard_of(key, settings.worker_slots) != number]
    hints = (own + rest)[:settings.slot_threads(number)]
    taken = set(hints)
    return hints, [key for key in keys if key not in taken]


class Reservations:
    """Where a supervisor's ticks reserve slots and start their workers: on threads of their own,
    so that a tick waits for them at most ``wait_seconds``. A reservation write held longer (a
    throttled table) lands while the next ticks run, and its worker starts when it does; its keys
    stay in ``memory`` meanwhile, so no tick hands them out again, and leave it if the slot was
    taken. Keys are given to the slots before their writes are sent; a slot another dispatcher
    took leaves its keys due (the next tick, or a feeding worker, takes them)."""

    def __init__(self, memory: HintMemory | None = None) -> None:
        self.memory = memory
        self._pool = ThreadPoolExecutor(max_workers=FAN_OUT_THREADS, thread_name_prefix="reserve")
        self._pending: dict[Future[WorkerRequest | None], str] = {}  # (to the slot each reserves)
        self._lock = threading.Lock()

    def unclaimed(self, free: Sequence[str]) -> list[str]:
        """The slots of ``free`` with no reservation of this supervisor's in flight (the index
        still lists a slot as free while its reservation write is held)."""
        with self._lock:
            claimed = set(self._pending.values())
        return [slot for slot in free if slot not in claimed]

    def start(self, settings: Settings, invoker: Invoker, keys: Sequence[str], free: Sequence[str],
              now: datetime, wait_seconds: float) -> list[WorkerRequest]:
        """Reserve slots of ``free`` for ``keys`` and start their workers; the requests sent
        within ``wait_seconds`` (the rest are sent when their reservations land)."""
        planned: list[tuple[str, list[str]]] = []
        remaining = list(keys)
        for slot in free:
            if not remaining:
                break
            hints, remaining = _hints_for(settings, slot, remaining)
            planned.append((slot, hints))
        if self.memory is not None:
            self.memory.remember([key for _, hints in planned for key in hints])
        with self._lock:
            futures = [self._pool.submit(self._reserve_and_start, settings, invoker, slot, hints, now)
                       for slot, hints in planned]
            self._pending.update(zip(futures, (slot for slot, _ in planned), strict=True))
        for future in futures:
            future.add_done_callback(self._done)
        done, _ = wait(futures, timeout=wait_seconds)
        return [request for future in futures if future in done and (request := future.result()) is not None]

    def _reserve_and_start(self, settings: Settings, invoker: Invoker, slot: str, hints: list[str],
                           now: datetime) -> WorkerRequest | None:
        token = slots.new_token()
        try:
            reserved = slots.reserve(slot, token, settings.reservation_seconds, now)
        except Exception:  # noqa: BLE001 - the keys stay due; a later tick hands them out
            logger.exception("could not reserve a worker slot", extra={"slot": slot})
            reserved = False
        if not reserved:
            if self.memory is not None:
                self.memory.forget(hints)
            return None
        request = WorkerRequest(tuple(hints), slot, token)
        return request if fan_out(invoker, [request]) else None

    def _done(self, future: Future[WorkerRequest | None]) -> None:
        with self._lock:
            self._pending.pop(future, None)

    def pending(self) -> int:
        """Reservations sent and not landed yet."""
        with self._lock:
            return len(self._pending)

    def shutdown(self, wait_seconds: float) -> None:
        """Let the reservations in flight land for up to ``wait_seconds``, then stop taking more."""
        with self._lock:
            pending = list(self._pending)
        if pending:
            wait(pending, timeout=wait_seconds)
        self._pool.shutdown(wait=False)


T = TypeVar("T")


class BoundedStep(Generic[T]):
    """A part of a supervisor's tick run on a thread of its own and waited for a bounded time:
    a write a throttled table holds for seconds holds that thread, never the tick. One run at a
    time: a tick that finds the last run still under way starts no other, and the first tick
    to find it done takes its result."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._running: Future[T] | None = None

    def start(self, work: Callable[[], T]) -> None:
        """Run ``work`` unless the last run is still under way."""
        if self._running is None:
            self._running = self._pool.submit(work)

    def result(self, wait_seconds: float) -> T | None:
        """The run's result once it is done (raising what it raised), waiting at most
        ``wait_seconds``; ``None`` while it is still under way."""
        running = self._running
        if running is None:
            return None
        done, _ = wait([running], timeout=wait_seconds)
        if not done:
            return None
        self._running = None
        return running.result()

    def busy(self) -> bool:
        return self._running is not None

    def shutdown(self, wait_seconds: float) -> None:
        """Let a run under way end for up to ``wait_seconds``, then stop taking more."""
        if self._running is not None:
            wait([self._running], timeout=wait_seconds)
        self._pool.shutdown(wait=False)


@dataclasses.dataclass(frozen=True)
class _Puts:
    """What a tick puts besides dispatch: its schedules' occurrences and its batches' callbacks."""
    occurrences: schedules.OccurrenceReport = dataclasses.field(default_factory=schedules.OccurrenceReport)
    fired: callbacks.CallbackReport = dataclasses.field(default_factory=callbacks.CallbackReport)


@dataclasses.dataclass(frozen=True)
class _Chores:
    """What a tick writes besides dispatch for the tasks it met: parked (a paused type's),
    cancelled (a stopped batch's) and released (a type no longer paused)."""
    parked: int = 0
    cancelled: int = 0
    released: int = 0


class TickThreads:
    """The threads a supervisor's ticks hand their writes to, each waited for at most
    ``wait_seconds`` (the rest lands while later ticks run): batch counting
    (:class:`~coworker.engine.progress.CountingLoop`, never waited for), slot reservations
    (:class:`Reservations`), the schedules' occurrences with the batches' callbacks, and the
    chores (parking, cancelling, releasing: each a :class:`BoundedStep`). Made and stopped by
    :meth:`Supervisor.run`."""

    def __init__(self, settings: Settings, memory: HintMemory | None) -> None:
        self.wait_seconds = max(MIN_THREAD_WAIT_SECONDS, settings.tick_seconds / 2)
        self.counting = progress.CountingLoop(settings, settings.tick_seconds, settings.tick_seconds / 2).start()
        self.reservations = Reservations(memory)
        self.puts: BoundedStep[_Puts] = BoundedStep("puts")
        self.chores: BoundedStep[_Chores] = BoundedStep("chores")

    def left(self, began: float) -> float:
        """How long a tick that began at ``began`` (monotonic) may still wait for its threads."""
        return max(0.0, self.wait_seconds - (time.monotonic() - began))

    def busy(self) -> bool:
        """Writes handed over and not landed yet."""
        return self.reservations.pending() > 0 or self.puts.busy() or self.chores.busy()

    def stop(self, wait_seconds: float) -> None:
        self.counting.stop(wait=wait_seconds)
        self.reservations.shutdown(wait_seconds)
        self.puts.shutdown(wait_seconds)
        self.chores.shutdown(wait_seconds)


def _reserve_all(wanted: Sequence[str], seconds: float, now: datetime) -> list[tuple[str, str]]:
    """Reserve the ``wanted`` slots, their writes sent together: the ``(slot, token)`` reserved,
    in ``wanted``'s order (a slot another dispatcher took meanwhile is left out)."""
    tokens = [slots.new_token() for _ in wanted]

    def reserve(slot_and_token: tuple[str, str]) -> bool:
        return slots.reserve(*slot_and_token, seconds, now)

    pairs = list(zip(wanted, tokens, strict=True))
    if len(pairs) <= 1:
        reserved = [reserve(pair) for pair in pairs]
    else:
        with ThreadPoolExecutor(max_workers=min(FAN_OUT_THREADS, len(pairs))) as pool:
            reserved = list(pool.map(reserve, pairs))
    return [pair for pair, ok in zip(pairs, reserved, strict=True) if ok]


def dispatch_submitted(settings: Settings, invoker: Invoker | None, keys: Sequence[str]) -> int:
    """Dispatch on submit: start workers for freshly put ``keys`` if slots are free.

    Costs one index query (plus one conditional write and one Invoke per worker started) and
    never raises: if it cannot start anything, the tasks are still due and the supervisor or a
    self-feeding worker picks them up.
    """
    if invoker is None or not settings.dispatch_on_submit or not keys:
        return 0
    try:
        started = len(start_workers(settings, invoker, keys))
    except Exception:  # noqa: BLE001 - the put succeeded; dispatch is best effort
        logger.exception("dispatch on submit failed; the tasks wait for the next tick")
        return 0
    if started:
        metrics.add_metric(name=MetricName.DISPATCHED_ON_SUBMIT, unit=MetricUnit.Count, value=started)
    return started


class HintMemory:
    """Keys a supervisor handed out recently, so the next ticks do not hand them out again while
    their worker is still starting (each entry lasts a reservation's lifetime)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._seconds = seconds
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()  # (reservations landing late forget their keys from other threads)

    def __contains__(self, key: str) -> bool:
        return self._until.get(key, 0.0) > self._clock()

    def remember(self, keys: Sequence[str]) -> None:
        now = self._clock()
        with self._lock:
            if len(self._until) > 10_000:
                self._until = {k: t for k, t in self._until.items() if t > now}
            for key in keys:
                self._until[key] = now + self._seconds

    def forget(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._until.pop(key, None)


_runner_memories: dict[tuple[str, float, Callable[[], float]], HintMemory] = {}


def _runner_memory(settings: Settings, clock: Callable[[], float]) -> HintMemory:
    """The process's memory of the keys handed to starting runners (one per table, lifetime and clock)."""
    seconds = settings.runner_start_seconds
    return _runner_memories.setdefault((settings.table_name, seconds, clock), HintMemory(seconds, clock))


@dataclasses.dataclass(frozen=True)
class TickReport:
    busy_slots: int
    free_slots: int
    due: int  # due tasks seen this tick (at most the free slots' worth, plus one page)
    dispatched: int  # keys handed to new workers
    invocations: int  # workers started
    reaped: int
    running_tasks: int  # tasks holding a live lock (all of them, however many)
    parked: int = 0  # due tasks of paused types moved out of the queue
    cancelled: int = 0  # open tasks of stopped batches cancelled
    released: int = 0  # held tasks of resumed types put back
    woken: int = 0  # blocked tasks put back by the concurrency sweep
    scheduled: int = 0  # tasks put for schedules' occurrences
    callbacks: int = 0  # batch callback tasks put
    counted: int = 0  # batch changes counted from the table's stream
    backlog: index.Backlog | None = None  # measured this tick (every backlog_seconds), else None
    runners_started: int = 0  # container runners started for due container work
    busy_runners: int | None = None  # runner slots reserved or held (None: this deployment has no runners)
    # Nothing ran, moved or was counted, and nothing is due within the supervision window: a
    # scheduled run may end here (the next one checks again).
    idle: bool = False


@dataclasses.dataclass
class _DueWork:
    """What one tick found in the queue, and what it does with it."""

    keys: list[str] = dataclasses.field(default_factory=list)  # to hand to new workers
    due: int = 0
    reaped: int = 0
    to_park: list[TaskModel] = dataclasses.field(default_factory=list)
    to_cancel: list[TaskModel] = dataclasses.field(default_factory=list)


@tracer.capture_method
def tick(settings: Settings, invoker: Invoker, now: datetime | None = None,
         memory: HintMemory | None = None, measure_backlog: bool = False,
         launcher: runners.Launcher | None = None, runner_memory: HintMemory | None = None,
         threads: TickThreads | None = None) -> TickReport:
    """One coordinator pass: find free slots and due work, start workers, retire lost tasks.

    Reads at most ``worker_slots`` slot entries, the running tasks' index entries (to count them
    and find lost ones: at most ``max_concurrency``, a few hundred bytes each), and for failed
    and todo about the free slots' worth of entries (at least ``batch_size``) plus a page per
    index shard, whatever the size of the backlog; and the schedules due within the supervision
    window (one query), putting the task of each occurrence due now (:mod:`coworker.engine.schedules`)
    and handing those out at once. With ``measure_backlog`` it also counts the
    due backlog by status (at most ``backlog_count_cap`` entries each, see :func:`index.backlog`).
    With a ``launcher``, it starts container runners on free runner slots for due container work
    (:mod:`coworker.engine.runners`); the Lambda workers are never handed such work. Batch
    progress is counted here, after dispatch, unless the tick has the supervisor's ``threads``:
    then counting, slot reservations, schedule occurrences and batch callbacks, parks, cancels
    and releases run on those, and the tick waits for them a bounded time (:class:`TickThreads`).
    """
    began = time.monotonic()
    now = now or utcnow()

    def put_due() -> _Puts:  # (before the queue read: what they put is handed out this tick)
        return _Puts(schedules.create_due_occurrences(settings, now, timedelta(seconds=settings.supervise_seconds)),
                     _fire_batch_callbacks(settings, now))  # (on the counts of the last tick's follow)

    if threads is not None:
        threads.puts.start(put_due)
    free = slots.free_slots(settings.worker_slots, settings.worker_slots, now)
    if threads is not None:
        free = threads.reservations.unclaimed(free)
    free_threads = sum(settings.slot_threads(slots.slot_number(slot)) for slot in free)
    view = control.read()
    _reshard(view, now)  # before reading the queue: tasks in retired shards are read this tick
    woken = gates.sweep(view.limits, now)  # before reading the queue: they are due at once
    puts = put_due() if threads is None else None
    running, lost = index.running_and_lost(now)
    backlog = _measure_backlog(settings, now, lost) if measure_backlog else None
    # With every slot busy the queue is read only for what a tick does besides handing out work:
    # parking paused types' tasks and cancelling stopped batches' (lost work comes from ``lost``).
    read_queue = bool(free) or bool(view.paused or view.stopped_batches)
    work = _find_due_work(settings, view, now, lost, max(free_threads, settings.batch_size), memory, read_queue)
    if threads is not None:  # (run beside the reads above; what lands later is handed out by a later tick)
        puts = threads.puts.result(threads.left(began))
    puts = puts or _Puts()  # (none yet: the run started is still under way)
    occurrences, fired = puts.occurrences, puts.fired

    def chores() -> _Chores:  # (tasks met here are not handed out: they may be written after dispatch)
        return _Chores(
            parked=_each(lambda task: control.park(task, now), work.to_park),
            cancelled=(_each(lambda task: lifecycle.cancel(task.key, settings, reason=STOPPED_BATCH_REASON) is not None,
                             work.to_cancel)
                       + (_settle_stopped_batches(settings, view) if measure_backlog else 0)),
            released=_release_held(view))

    if threads is None:
        done = chores()
    else:  # (a run still under way from an earlier tick: these tasks are met again by a later one)
        threads.chores.start(chores)
    # Tasks this tick put for schedules are handed out at once, as a submit's are (the queue
    # read leaves the freshest tasks to dispatch on submit and to feeding workers).
    scheduled = [key for key, task_type in occurrences.put + fired.put
                 if not view.is_paused(task_type) and key not in work.keys]
    hand_out = (work.keys + scheduled)[:free_threads]
    reservations = threads.reservations if threads is not None else None
    requests = (start_workers(settings, invoker, hand_out, free=free, now=now, reservations=reservations,
                              wait_seconds=threads.left(began) if threads is not None else 0.0) if free else [])
    sent = [key for request in requests for key in request.keys]
    if memory is not None and reservations is None:  # (reservations remember their keys as they send them)
        memory.remember(sent)
    runner_requests, busy_runners = _start_runners(settings, launcher, view, now, lost, runner_memory)
    if threads is not None:
        done = threads.chores.result(threads.left(began)) or _Chores()
    parked, cancelled, released = done.parked, done.cancelled, done.released
    counted = threads.counting.take() if threads is not None else _count_batch_progress(settings, now)
    # (the last terms read the index and wait for a counting pass, so they are only asked when
    # everything else is quiet: nothing is handed out then)
    idle = (settings.idle_exit and not requests and not runner_requests and work.due == 0 and work.reaped == 0
            and (threads is None or not threads.busy())
            and running == 0 and not lost
            and len(free) == settings.worker_slots and counted == 0
            and parked == released == cancelled == woken == occurrences.created == fired.created == 0
            and not occurrences.due_soon and not fired.settling
            and not view.stopped_batches and not view.to_release
            and not index.any_due(now + timedelta(seconds=settings.supervise_seconds))
            and (threads is None or threads.counting.quiet(since=began, wait=settings.tick_seconds / 2)))
    report = TickReport(busy_slots=settings.worker_slots - len(free), free_slots=len(free), due=work.due,
                        dispatched=len(sent), invocations=len(requests), reaped=work.reaped,
                        running_tasks=running, parked=parked, released=released, cancelled=cancelled,
                        woken=woken, scheduled=occurrences.created, callbacks=fired.created, counted=counted,
                        backlog=backlog, runners_started=len(runner_requests), busy_runners=busy_runners,
                        idle=idle)
    _publish_tick(report)
    logger.debug("coordinator tick", extra=dataclasses.asdict(report))
    return report


def _start_runners(settings: Settings, launcher: runners.Launcher | None, view: control.ControlView,
                   now: datetime, lost: Sequence[TaskModel], memory: HintMemory | None
                   ) -> tuple[list[runners.RunnerRequest], int | None]:
    """Start runners on the free runner slots for due container work not handed out lately:
    ``(requests sent, runner slots busy now)``; ``None`` busy without a launcher."""
    if launcher is None or settings.max_runners == 0:
        return [], None
    free = slots.free_slots(settings.max_runners, settings.max_runners, now, pool=slots.RUNNERS)
    busy = settings.max_runners - len(free)
    if not free:
        return [], busy
    keys = runners.due_container_work(settings, view, now, len(free) * settings.runner_threads, lost)
    # A key handed to a runner still starting is left to it (a Fargate task takes a minute to
    # start); one that is lost was claimed since, by a runner that died: it needs a new one now.
    lost_keys = {task.key for task in lost}
    keys = [key for key in keys if memory is None or key not in memory or key in lost_keys]
    requests = runners.start_runners(settings, launcher, keys, now, free=free) if keys else []
    if memory is not None:
        memory.remember([key for request in requests for key in request.keys])
    return requests, busy + len(requests)


def _reshard(view: control.ControlView, now: datetime) -> None:
    """Move tasks out of index shards a lowered ``status_shards`` no longer reads (see
    :mod:`coworker.engine.reshard`); a failure is logged and the next tick tries again."""
    try:
        moved = reshard.step(view, now)
    except Exception:  # noqa: BLE001 - must not stop dispatch
        logger.exception("could not move tasks out of retired index shards this tick")
        return
    if moved:
        logger.info("moved tasks out of retired index shards", extra={"moved": moved})


def _measure_backlog(settings: Settings, now: datetime, lost: Sequence[TaskModel]) -> index.Backlog:
    """The due backlog by status, and the tasks blocked on their concurrency groups."""
    backlog = index.backlog(now, settings.backlog_count_cap, lost)
    blocked, blocked_capped = gates.count_blocked(settings.backlog_count_cap)
    return dataclasses.replace(backlog, blocked=blocked,
                               capped=backlog.capped + (("blocked",) if blocked_capped else ()))


def _find_due_work(settings: Settings, view: control.ControlView, now: datetime, lost: Sequence[TaskModel],
                   capacity: int, memory: HintMemory | None, read_queue: bool = True) -> _DueWork:
    """Read the queue, lost work first, for up to ``capacity`` keys to hand out, applying
    :func:`control.due_action` to each task met (tasks lost at their ceiling are retired here).
    Without ``read_queue`` only the lost work is looked at (no index read)."""
    fresh_after = now - timedelta(seconds=SUBMIT_GRACE_SECONDS) if settings.dispatch_on_submit else now
    on_runners = set(runners.container_types(settings))  # the container runners' work, not the workers'
    work = _DueWork()
    for status in DISPATCH_ORDER:
        if len(work.keys) >= capacity or (status is not TaskStatus.PROCESSING and not read_queue):
            break
        limit = capacity - len(work.keys)
        # Tasks of paused types (parked) and of stopped batches (cancelled) are read past, up to
        # PARK_BUDGET in all, so that such a backlog at the head of the queue does not hold back
        # the other work.
        read_past = (PARK_BUDGET - len(work.to_park) - len(work.to_cancel)
                     if view.paused or view.stopped_batches else 0)
        if on_runners:  # the runners' work at the head of the queue does not hide the workers'
            read_past += RUNNER_READ_PAST
        found = (lost[:limit + read_past] if status is TaskStatus.PROCESSING
                 else index.due(status, now, limit, read_past))
        taken = 0
        for task in found:
            action = control.due_action(view, task, status)
            if action is DueAction.CANCEL:
                work.to_cancel.append(task)  # its batch stopped at its failure threshold
                continue
            if action is DueAction.PARK:
                work.to_park.append(task)
                continue
            if action is not DueAction.REAP and task.task_type in on_runners:
                continue
            if taken >= limit:
                break
            taken += 1
            work.due += 1
            if action is DueAction.REAP:
                # Lost on its last allowed attempt: no claim can take it, so retire it here.
                work.reaped += lifecycle.reap_lost(task.key, int(task.attempts), settings, now)
            elif not (status is TaskStatus.TODO and task.due_at > fresh_after) and not (
                    memory is not None and task.key in memory):
                work.keys.append(task.key)
            if taken >= limit and not (view.paused or view.stopped_batches):
                break  # (not one entry more than needed: reading past the runners' work reads no page for nothing)
    return work


# The gauges this process last published. A tick with work publishes every figure; an idle tick
# publishes its tick (the coordinator-silence alarm counts them) and only the gauges that changed
# since (the zeros once, after work), so an idle deployment pays for one custom metric, not all.
_last_gauges: dict[str, float] = {}


def _publish_tick(report: TickReport) -> None:
    """A tick's figures as metrics."""
    metrics.add_metric(name=MetricName.COORDINATOR_TICKS, unit=MetricUnit.Count, value=1)
    gauges = [(MetricName.BUSY_SLOTS, MetricUnit.Count, report.busy_slots),
              (MetricName.RUNNING_TASKS, MetricUnit.Count, report.running_tasks),
              *([(MetricName.BUSY_RUNNERS, MetricUnit.Count, report.busy_runners)]
                if report.busy_runners is not None else ()),
              *(backlog_gauges(report.backlog) if report.backlog is not None else ())]
    for name, unit, value in gauges:
        if not report.idle or _last_gauges.get(name, value) != value:
            metrics.add_metric(name=name, unit=unit, value=value)
            _last_gauges[name] = value
    if report.idle:
        return
    metrics.add_metric(name=MetricName.DISPATCHED, unit=MetricUnit.Count, value=report.dispatched)
    metrics.add_metric(name=MetricName.WORKER_INVOCATIONS, unit=MetricUnit.Count, value=report.invocations)
    if report.reaped:
        metrics.add_metric(name=MetricName.REAPED, unit=MetricUnit.Count, value=report.reaped)
    if report.woken:
        metrics.add_metric(name=MetricName.WOKEN, unit=MetricUnit.Count, value=report.woken)
    if report.parked or report.released:
        metrics.add_metric(name=MetricName.PARKED, unit=MetricUnit.Count, value=report.parked)
        metrics.add_metric(name=MetricName.RELEASED, unit=MetricUnit.Count, value=report.released)


def _each(write: Callable[[TaskModel], bool], tasks: Sequence[TaskModel]) -> int:
    """Apply a conditional write to each of ``tasks``, FAN_OUT_THREADS at a time; how many took."""
    if not tasks:
        return 0
    with ThreadPoolExecutor(max_workers=min(FAN_OUT_THREADS, len(tasks))) as pool:
        return sum(pool.map(write, tasks))


def _fire_batch_callbacks(settings: Settings, now: datetime) -> callbacks.CallbackReport:
    """Fire the watched batches' callbacks and events (:mod:`coworker.engine.callbacks`); a
    failure is logged and the next tick looks again (each fires once however often it is tried)."""
    try:
        return callbacks.fire_due(settings, now)
    except Exception:  # noqa: BLE001 - must not stop dispatch
        logger.exception("could not look at the watched batches this tick")
        return callbacks.CallbackReport()


def _count_batch_progress(settings: Settings, now: datetime) -> int:
    """Count what the table's stream holds for batches, in the tick (for a caller without a
    :class:`~coworker.engine.progress.CountingLoop`): after dispatch, so it never delays a start,
    starting no new read or write after half a tick (one under way, however slow, is waited
    for); a failure is logged and the next tick reads the same records again."""
    try:
        return progress.follow(settings, now, budget_seconds=settings.tick_seconds / 2).changes
    except Exception:  # noqa: BLE001 - counting must not stop dispatch; nothing is lost by waiting
        logger.exception("could not count batch progress from the stream this tick")
        return 0


def _settle_stopped_batches(settings: Settings, view: control.ControlView) -> int:
    """Bring every stopped batch to an end, so that the control record does not keep it (and
    grow) for ever: a batch with no open task left is dropped from the record (it stays failed
    on its own item); one with open tasks that are not due yet (a retry's backoff, ``run_at``),
    which the tick's queue read does not meet, has them cancelled now, reading at most
    STOPPED_SWEEP_BUDGET index entries per call in all. Running tasks finish; if one fails, a
    later call cancels it. Returns the tasks cancelled."""
    budget = STOPPED_SWEEP_BUDGET
    cancelled = 0
    for batch_id in sorted(view.stopped_batches):
        try:
            if batches.get_batch(batch_id).done:
                control.forget_stopped_batch(batch_id)
                continue
        except BatchNotFoundError:
            control.forget_stopped_batch(batch_id)
            continue
        for status in (TaskStatus.TODO, TaskStatus.FAILED):
            if budget <= 0:
                return cancelled
            read = index.MergedRead(status.value, want=budget, filter_condition=TaskModel.batch_id == batch_id,
                                    budget=budget)
            found = list(read)
            budget -= max(read.scanned, 1)
            cancelled += _each(lambda task: lifecycle.cancel(task.key, settings, reason=STOPPED_BATCH_REASON)
                               is not None, found)
    return cancelled


def _release_held(view: control.ControlView) -> int:
    """Put back held tasks of types that are no longer paused (RELEASE_BUDGET per tick in all);
    a type with none left is dropped from the held types."""
    released = 0
    for task_type in sorted(view.to_release):
        budget = RELEASE_BUDGET - released
        if budget <= 0:
            break
        held = control.held(task_type, budget)
        if not held:
            control.forget_held(task_type)
            continue
        released += _each(control.unpark, held)
    return released


def backlog_gauges(backlog: index.Backlog) -> list[tuple[str, MetricUnit, float]]:
    """Backlog metrics: due tasks by status, their total, the oldest one's age, and the tasks
    waiting for a place in a concurrency group."""
    return [(MetricName.DUE_TODO, MetricUnit.Count, backlog.todo),
            (MetricName.DUE_RETRY, MetricUnit.Count, backlog.retry),
            (MetricName.LOST_TASKS, MetricUnit.Count, backlog.lost),
            (MetricName.BACKLOG, MetricUnit.Count, backlog.due),
            (MetricName.OLDEST_DUE_AGE, MetricUnit.Seconds, backlog.oldest_due_age_seconds),
            (MetricName.BLOCKED_TASKS, MetricUnit.Count, backlog.blocked)]


def _keep_slots(count: int, pool: slots.SlotPool) -> None:
    """Create the missing slots below ``count`` and delete the free ones above it, at a run's start.
    A write DynamoDB refuses (throttling, an outage) is logged and counted (``SlotUpkeepFailed``,
    to alarm on) and the run goes on: missing slots start fewer workers, surplus ones are never
    used (only slots below ``count`` are), and the next run tries again."""
    for step in (slots.ensure_slots, slots.retire_extra_slots):
        try:
            step(count, pool=pool)
        except Exception:  # noqa: BLE001 - no upkeep failure may keep the run from ticking
            logger.exception("could not keep the worker slots; the run goes on, the next run tries again",
                             extra={"step": step.__name__, "slot_pool": pool.prefix, "slots": count})
            metrics.add_metric(name=MetricName.SLOT_UPKEEP_FAILED, unit=MetricUnit.Count, value=1)


class Supervisor:
    """The coordinator's long-running loop: one tick every ``tick_seconds``, on a fixed cadence,
    while it holds the single-flight lease ``lease#coordinator``.

    ``run`` returns when the time given runs out, when ``stop`` is set, or when the lease is lost
    (another coordinator took it after this one stalled); it releases the lease on the way out.
    """

    def __init__(self, settings: Settings, invoker: Invoker, holder: str | None = None,
                 clock: Callable[[], float] = time.monotonic, launcher: runners.Launcher | None = None) -> None:
        self.settings = settings
        self.invoker = invoker
        self.launcher = launcher  # starts container runners (None: this deployment has none)
        # Keys handed to runners still starting: process-wide, since a runner outlives the
        # coordinator run that started it (a warm coordinator's next run knows them too).
        self.runner_memory = _runner_memory(settings, clock)
        self.holder = holder or f"coordinator-{uuid.uuid4().hex[:12]}"
        self.clock = clock
        self.memory = HintMemory(settings.reservation_seconds, clock)
        self.lease_seconds = max(MIN_LEASE_SECONDS, LEASE_TICKS * settings.tick_seconds)
        self.backlog_measured_at: float | None = None
        self.on_tick: Callable[[TickReport | None, str | None], None] | None = None

    def _take_lease(self, remaining: Callable[[], float], stop: threading.Event) -> float | None:
        """Wait for the lease (an overlapping run still holds it) while time remains: the clock's
        time when the write that took it was sent, or ``None``."""
        while True:
            sent_at = self.clock()
            if slots.take(COORDINATOR_LEASE, self.holder, self.lease_seconds, LeaseState.HELD):
                return sent_at
            if remaining() < self.settings.tick_seconds or stop.wait(min(1.0, self.settings.tick_seconds)):
                return None

    def run(self, remaining: Callable[[], float], stop: threading.Event | None = None) -> list[TickReport]:
        """Tick until ``remaining()`` (seconds) drops below one tick, or ``stop`` is set."""
        stop = stop or threading.Event()
        settings = self.settings
        taken_at = self._take_lease(remaining, stop)
        if taken_at is None:
            logger.info("another coordinator holds the lease; this run ends")
            return []
        renew_at = taken_at + LEASE_RENEW_SHARE * self.lease_seconds
        reports: list[TickReport] = []
        # Counting, slot reservations, occurrences and callbacks on threads of their own: a write
        # held for seconds (a throttled table) holds one of those, never a tick.
        threads = TickThreads(settings, self.memory)
        try:
            _keep_slots(settings.worker_slots, slots.WORKERS)
            if self.launcher is not None:
                _keep_slots(settings.max_runners, slots.RUNNERS)
            next_at = self.clock()
            while not stop.is_set() and remaining() >= settings.tick_seconds:
                if self.clock() >= renew_at:
                    sent_at = self.clock()
                    if not slots.extend(COORDINATOR_LEASE, self.holder, self.lease_seconds):
                        logger.warning("coordinator lease lost to another coordinator; stopping")
                        return reports
                    renew_at = sent_at + LEASE_RENEW_SHARE * self.lease_seconds
                measure = (self.backlog_measured_at is None
                           or self.clock() - self.backlog_measured_at >= settings.backlog_seconds)
                try:
                    report = tick(settings, self.invoker, memory=self.memory, measure_backlog=measure,
                                  launcher=self.launcher, runner_memory=self.runner_memory, threads=threads)
                    if measure:
                        self.backlog_measured_at = self.clock()
                    reports.append(report)
                    self._notify(report, None)
                except Exception as exc:  # noqa: BLE001 - a failed tick is logged; the next one runs
                    logger.exception("coordinator tick failed")
                    self._notify(None, f"{type(exc).__name__}: {exc}")
                publish_metrics()  # each tick's figures reach CloudWatch now, not at the run's end
                if settings.idle_exit and reports and reports[-1].idle:
                    # Nothing to supervise: end the run (a minute of Lambda for nothing otherwise).
                    # Its tick was published, so the heartbeat alarm stays quiet; the next scheduled
                    # run looks again, and work put meanwhile starts on submit.
                    logger.info("nothing running or due: this coordinator run ends early")
                    return reports
                next_at += settings.tick_seconds
                if next_at < self.clock():  # a tick overran: skip the missed beats, keep the phase
                    missed = math.ceil((self.clock() - next_at) / settings.tick_seconds)
                    next_at += missed * settings.tick_seconds
                stop.wait(max(0.0, next_at - self.clock()))
        finally:
            threads.stop(settings.tick_seconds)
            slots.release(COORDINATOR_LEASE, self.holder)
        return reports

    def _notify(self, report: TickReport | None, error: str | None) -> None:
        if self.on_tick is not None:
            self.on_tick(report, error)


def supervise(settings: Settings, invoker: Invoker, lambda_remaining: Callable[[], float],
              slack_seconds: float = 10.0, launcher: runners.Launcher | None = None) -> list[TickReport]:
    """The coordinator Lambda's work: supervise for ``supervise_seconds`` or until the Lambda
    time left (``lambda_remaining()``) nears ``slack_seconds``; ``launcher`` starts container
    runners."""
    started = time.monotonic()

    def remaining() -> float:
        return min(settings.supervise_seconds - (time.monotonic() - started),
                   lambda_remaining() - slack_seconds)

    return Supervisor(settings, invoker, launcher=launcher).run(remaining)
