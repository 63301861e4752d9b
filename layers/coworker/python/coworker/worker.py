"""The worker: claim tasks, run their handlers, record the outcomes, and keep going.

One invocation runs ``batch_size`` threads. Each thread takes the keys it was handed (the
*hints* of the dispatcher) and then, if the invocation holds a worker slot, feeds itself: it
claims more due work, oldest first, until the backlog or the invocation's time runs out, so
throughput is bounded by concurrency rather than by the coordinator's tick.

While tasks run, one heartbeat thread per invocation extends their locks and the slot's lease
(see :mod:`coworker.leases`); a task whose claim was taken over is told through its context.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import random
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from coworker import concurrency, control, leases, lifecycle, offload, queries, schema
from coworker.config import Settings
from coworker.errors import InvalidEventError, StorageError, TaskFailedError, UnknownTaskTypeError
from coworker.handlers import TaskContext, get_handler
from coworker.lifecycle import Claim, RecordOutcome
from coworker.model import ErrorKind, ErrorRecord, TaskStatus, status_shards, utcnow
from coworker.observability import MetricName, logger, metrics, tracer

MAX_HINTS = 100
# Work is looked for in this order: lost by dead workers, due retries, then new.
FEED_ORDER = (TaskStatus.PROCESSING, TaskStatus.FAILED, TaskStatus.TODO)
# Index entries one self-feeding query reads at most (one page).
MAX_FEED_PAGE = 200


@dataclasses.dataclass(frozen=True)
class WorkerRequest:
    """What one worker invocation is asked to do (its event).

    ``keys`` are hints: tasks to claim first. ``slot`` and ``token`` are the worker slot reserved
    for this invocation (see :mod:`coworker.leases`); with a slot the worker also feeds itself,
    without one it runs its keys only.
    """

    keys: tuple[str, ...] = ()
    slot: str | None = None
    token: str | None = None

    def to_event(self) -> dict[str, Any]:
        event: dict[str, Any] = {"keys": list(self.keys)}
        if self.slot:
            event.update(slot=self.slot, token=self.token)
        return event

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> WorkerRequest:
        """Parse an invocation event; :class:`InvalidEventError` if it is malformed."""
        keys = event.get("keys", [])
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise InvalidEventError("worker event: 'keys' must be a list of task keys")
        if len(keys) > MAX_HINTS:
            raise InvalidEventError(f"worker event: at most {MAX_HINTS} keys")
        slot, token = event.get("slot"), event.get("token")
        if (slot is None) != (token is None) or not all(isinstance(v, str | None) for v in (slot, token)):
            raise InvalidEventError("worker event: 'slot' and 'token' go together, as strings")
        return cls(tuple(dict.fromkeys(keys)), slot, token)


class TaskSource(str, enum.Enum):
    HINT = "hint"  # handed to the invocation by a dispatcher
    FEED = "feed"  # found by the worker itself


class TaskOutcome(str, enum.Enum):
    """What one worker did with one dispatched key."""

    NOT_CLAIMED = "not_claimed"  # another worker has it, or it is no longer due: nothing to do
    BLOCKED = "blocked"  # its concurrency group was full: it waits for a place, out of the queue
    SKIPPED = "skipped"  # too little time left to start it; it stays due for the next dispatch
    FINISHED = "finished"
    FAILED = "failed"
    IGNORED = "ignored"
    LOST = "lost"  # ran, but its claim was taken over or cancelled: the result was discarded


@dataclasses.dataclass(frozen=True)
class TaskReport:
    key: str
    outcome: TaskOutcome
    attempt: int | None = None
    seconds: float = 0.0
    source: TaskSource = TaskSource.HINT
    woken: tuple[str, ...] = ()  # blocked tasks its release woke: the worker may run them next


def _run_handler(claim: Claim, context: TaskContext, settings: Settings) -> tuple[Any, ErrorRecord | None, bool]:
    """Run the task's handler in this thread: ``(result, error, retryable)``.

    A payload kept in the object store is read first; failing to read it is a system error.
    """
    task = claim.task
    try:
        handler = get_handler(task.task_type)
        payload = task.payload
        if task.payload_ref is not None:
            payload = offload.load(task.payload_ref, offload.store_for(settings))
        return handler(payload, context), None, True
    except UnknownTaskTypeError as exc:
        logger.error("unknown task type", extra={"task_type": task.task_type})
        return None, lifecycle.error_record(claim.attempt, ErrorKind.UNKNOWN_TYPE, str(exc), utcnow()), True
    except TaskFailedError as exc:
        # A business failure is an expected outcome: its message says it all, no traceback.
        logger.info("task failed (business)", extra={"error": str(exc)})
        return None, lifecycle.error_record(claim.attempt, ErrorKind.BUSINESS, str(exc), utcnow()), exc.retryable
    except Exception as exc:  # noqa: BLE001 - any handler error is a recorded system error
        logger.warning("task raised", extra={"error": f"{type(exc).__name__}: {exc}"})
        return None, lifecycle.error_from_exception(claim.attempt, ErrorKind.SYSTEM, exc, utcnow()), True


def _record(claim: Claim, settings: Settings, context: TaskContext, result: Any, error: ErrorRecord | None,
            retryable: bool) -> RecordOutcome:
    if error is None:
        try:
            prepared = offload.prepare_result(result, settings, offload.store_for(settings), key=claim.key,
                                              attempt=claim.attempt, owner=claim.owner)
            return lifecycle.complete(claim, settings, result=prepared.inline,
                                      result_ref=prepared.stored.to_dict() if prepared.stored else None,
                                      follow_ups=context.follow_ups)
        except StorageError as exc:  # result or follow-ups not stored: the retry runs the handler again
            logger.warning("could not record the result", extra={"error": str(exc)})
            error = lifecycle.error_from_exception(claim.attempt, ErrorKind.SYSTEM, exc, utcnow())
        except offload.PayloadTooLargeError as exc:  # a retry would ask for the same payload
            error = lifecycle.error_record(claim.attempt, ErrorKind.SYSTEM,
                                           f"a follow-up task was refused: {exc}", utcnow())
            retryable = False
    return lifecycle.fail(claim, settings, error, retryable=retryable)


_OUTCOME_METRIC = {
    RecordOutcome.FINISHED: MetricName.FINISHED,
    RecordOutcome.FAILED: MetricName.FAILED,
    RecordOutcome.IGNORED: MetricName.IGNORED,
    RecordOutcome.LOST: MetricName.LOST_CLAIM,
}


@dataclasses.dataclass
class Running:
    """A task whose handler runs now, as the heartbeat watches it.

    ``lock`` decides who records its outcome: the worker thread when the handler returns, or the
    heartbeat when the deadline passes first (``timed_out``); never both.
    """

    claim: Claim
    context: TaskContext
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    started: float = dataclasses.field(default_factory=time.monotonic)
    done: bool = False
    timed_out: bool = False
    outcome: RecordOutcome | None = None


class Heartbeat:
    """Watches an invocation's running tasks from one thread: extends their locks and the slot's
    lease, and enforces the handlers' deadline.

    Every ``effective_heartbeat_seconds`` it extends the slot lease and the lock of every running
    task (each write fenced by owner and attempt). A task whose extension is refused was taken
    over or cancelled: its context's ``lost`` event is set. A refused slot extension means the
    capacity accounting gave the slot away (this worker stalled): the worker stops taking new
    work. At ``deadline`` (a ``time.monotonic()`` value) every task still running is recorded as
    timed out, which releases its lock, even if its handler never returns.
    """

    def __init__(self, settings: Settings, slot: str | None = None, token: str | None = None,
                 deadline: float | None = None) -> None:
        self._settings = settings
        self._slot, self._token = slot, token
        self._deadline = deadline
        self._running: dict[str, Running] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.slot_lost = threading.Event()
        self._thread: threading.Thread | None = None
        self.expired: list[TaskReport] = []

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def watch(self, claim: Claim, context: TaskContext) -> Running:
        running = Running(claim, context)
        with self._lock:
            self._running[claim.key] = running
        return running

    def unwatch(self, key: str) -> None:
        with self._lock:
            self._running.pop(key, None)

    def held(self) -> list[Claim]:
        """Claims of the tasks running now (what a shutdown must release)."""
        with self._lock:
            return [running.claim for running in self._running.values()]

    def beat(self) -> None:
        """One round of extensions (the loop calls it; tests call it directly)."""
        settings = self._settings
        if self._slot and not self.slot_lost.is_set():
            if not leases.extend(self._slot, self._token or "", settings.effective_lock_seconds):
                self.slot_lost.set()
                logger.warning("worker slot was taken over; taking no more work", extra={"slot": self._slot})
        with self._lock:
            running = list(self._running.values())
        for task in running:
            if task.context.lost.is_set():
                continue
            try:
                # The concurrency leases first, with the same expiry: they never end before the lock.
                now = utcnow()
                extended = ((not task.claim.groups or concurrency.extend(task.claim, settings, now))
                            and lifecycle.extend_lock(task.claim, settings, now))
            except Exception:  # noqa: BLE001 - a failed heartbeat is retried at the next beat
                logger.exception("heartbeat failed", extra={"task_key": task.claim.key})
                continue
            if not extended and not task.done:
                task.context.lost.set()
                metrics.add_metric(name=MetricName.LOST_CLAIM_SIGNALLED, unit=MetricUnit.Count, value=1)
                logger.warning("claim lost while the handler runs; the handler is told",
                               extra={"task_key": task.claim.key, "attempt": task.claim.attempt})

    def expire(self) -> None:
        """Record every task still running as timed out (the deadline has passed)."""
        with self._lock:
            running = list(self._running.values())
        for task in running:
            with task.lock:
                if task.done:
                    continue
                task.timed_out = True
            task.context.lost.set()  # whatever it returns now is discarded: it may as well stop
            claim = task.claim
            error = lifecycle.error_record(
                claim.attempt, ErrorKind.TIMEOUT,
                f"did not finish within the worker's time limit (attempt {claim.attempt})", utcnow())
            logger.warning("task timed out; recording and releasing the lock", extra={"task_key": claim.key})
            try:
                task.outcome = lifecycle.fail(claim, self._settings, error)
            except Exception:  # noqa: BLE001 - the lock then expires and the task runs again
                logger.exception("could not record a timeout", extra={"task_key": claim.key})
                continue
            self.expired.append(TaskReport(claim.key, TaskOutcome(task.outcome.value), claim.attempt,
                                           time.monotonic() - task.started))
            metrics.add_metric(name=_OUTCOME_METRIC[task.outcome], unit=MetricUnit.Count, value=1)

    def _loop(self) -> None:
        interval = self._settings.effective_heartbeat_seconds
        next_beat = time.monotonic() + interval
        deadline = self._deadline
        while True:
            wake = next_beat if deadline is None else min(next_beat, deadline)
            if self._stop.wait(max(0.0, wake - time.monotonic())):
                return
            try:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self.expire()
                    deadline = None  # once: nothing claims after the deadline
                if now >= next_beat:
                    self.beat()
                    next_beat = now + interval
            except Exception:  # noqa: BLE001 - never let the heartbeat thread die
                logger.exception("heartbeat round failed")


# Statuses whose last feed query found nothing, with when to look again (process-wide: warm
# invocations share it). The coordinator re-checks them every tick anyway.
_quiet_until: dict[TaskStatus, float] = {}
_quiet_lock = threading.Lock()


class Feeder:
    """Hands out the keys an invocation's threads run: its hints first, then due work it finds.

    Self-feeding reads one page of the status index (oldest first) and takes a window of it:
    the keys of its own *stripe* (a stable hash of the key, modulo the number of slots, equal to
    its slot number), and only when those run short, a few of the other stripes' newest keys.
    Workers that look at the same moment so take different tasks instead of racing for the head
    item, and no stripe starves when its slot is idle. It stops when a page has nothing new, when the
    feed cut-off passes, or when the invocation lost its slot.
    """

    def __init__(self, settings: Settings, hints: Sequence[str], self_feed: bool, feed_until: float,
                 slot_number: int | None = None, stop: threading.Event | None = None,
                 window: int | None = None) -> None:
        self._settings = settings
        self._queue: collections.deque[tuple[str, TaskSource]] = collections.deque(
            (key, TaskSource.HINT) for key in hints)
        self._seen: set[str] = set(hints)
        self._exhausted = not self_feed
        self._feed_until = feed_until
        self._window = max(4 * (window or settings.batch_size), 4)
        self._stripes = settings.worker_slots
        self._stripe = (slot_number if slot_number is not None else random.randrange(self._stripes)) % self._stripes
        self._stop = stop or threading.Event()
        self._cond = threading.Condition()
        self._fetching = False
        self._low_water = max(1, window or settings.batch_size)
        # Index shard each status is read from first: its own stripe's, then where work was found.
        self._first_shard = dict.fromkeys(FEED_ORDER, self._stripe)
        self.pages = 0

    def next(self) -> tuple[str, TaskSource] | None:
        """The next key to run, or ``None`` when there is no more work for this invocation.

        When fewer keys than threads are queued, the thread that notices fetches the next window
        while the others keep working (only a thread finding the queue empty waits for it).
        """
        with self._cond:
            while not self._queue:
                if self._exhausted:
                    return None
                if not self._fetching:
                    if not self._may_feed():
                        self._exhausted = True
                        return None
                    self._fetching = True
                    break
                self._cond.wait()
            item = self._queue.popleft() if self._queue else None
            fetch = item is None or (not self._fetching and len(self._queue) < self._low_water
                                     and not self._exhausted and self._may_feed())
            if fetch and item is not None:
                self._fetching = True
        if fetch:
            self._refill()
        return item if item is not None else self.next()

    def hand(self, key: str) -> None:
        """Run ``key`` next (a blocked task this invocation's release just woke)."""
        with self._cond:
            self._queue.appendleft((key, TaskSource.HINT))
            self._seen.add(key)
            self._cond.notify_all()

    def forget(self, key: str) -> None:
        """Let a later page hand out ``key`` again (it was blocked, and will be due once woken)."""
        with self._cond:
            self._seen.discard(key)

    def _may_feed(self) -> bool:
        return time.monotonic() < self._feed_until and not self._stop.is_set()

    def _refill(self) -> None:
        found: list[str] = []
        try:
            found = self._fetch()
        except Exception:  # noqa: BLE001 - no more feeding; the supervisor hands the work out
            logger.exception("could not look for more work; this invocation takes no more")
        finally:
            with self._cond:
                self._fetching = False
                self._queue.extend((key, TaskSource.FEED) for key in found)
                if not found:
                    self._exhausted = True
                self._cond.notify_all()

    def _fetch(self) -> list[str]:
        """One window of due keys not seen before by this invocation."""
        settings = self._settings
        now, clock = utcnow(), time.monotonic()
        # About two windows of this stripe's keys (a stripe is 1/stripes of the keys), one page a
        # shard; exactly one window when this worker is the only stripe.
        limit = min(MAX_FEED_PAGE, self._window * (2 * self._stripes - 1))
        # Where the stripes line up with the index shards (the slots divide the shards) a shard
        # holds one stripe's keys: when the first shard read is this worker's own, it is read a
        # window at a time, and one window is all that is read while it has work.
        lined_up = status_shards() % self._stripes == 0
        view = control.cached(settings.control_cache_seconds)
        page: list[str] = []
        own = 0  # keys of this stripe in ``page``
        for status in FEED_ORDER:
            if len(page) >= limit or own >= self._window:
                break
            with _quiet_lock:
                if _quiet_until.get(status, 0.0) > clock:
                    continue
            found = 0
            own_first = lined_up and self._first_shard[status] % self._stripes == self._stripe
            for task in queries.due_from_shard(status, now, limit - len(page), self._first_shard[status],
                                               first_page_size=self._window if own_first else None):
                found += 1
                # Start the next look where this one found work: a drained shard is not read again.
                self._first_shard[status] = schema.shard_of(task.key, status_shards())
                if task.key in self._seen or view.is_paused(task.task_type) or view.is_stopped(task.batch_id):
                    continue  # paused types wait, stopped batches end: the coordinator sees to both
                if status is TaskStatus.PROCESSING and task.attempts >= task.max_attempts:
                    self._seen.add(task.key)
                    continue  # lost on its last attempt: the coordinator retires it
                page.append(task.key)
                own += stripe_of(task.key, self._stripes) == self._stripe
                if own >= self._window:
                    break  # before the iterator reads another page
            if not found and status is not TaskStatus.TODO:
                with _quiet_lock:
                    _quiet_until[status] = clock + settings.tick_seconds
        self.pages += 1
        mine = [key for key in page if stripe_of(key, self._stripes) == self._stripe]
        others = [key for key in page if stripe_of(key, self._stripes) != self._stripe]
        # Other stripes' keys only when its own do not keep every thread busy, and from the newest
        # end: their own workers take them oldest first, so helper and owner meet in the middle
        # instead of racing for the same keys.
        window = mine[:self._window]
        if len(mine) < self._low_water:
            window += others[::-1][:self._low_water]
        self._seen.update(window)
        return window


def stripe_of(key: str, stripes: int) -> int:
    """The stripe of a task key: a stable hash, so every worker agrees on it."""
    return zlib.crc32(key.encode()) % stripes


def feed_cutoff(settings: Settings, deadline: float) -> float:
    """When a worker stops taking more work: 10% of its timeout (at least the margin) before the end."""
    tail = max(2 * settings.timeout_margin_seconds, 0.1 * settings.worker_timeout_seconds)
    return deadline - tail


def process_task(key: str, owner: str, settings: Settings, deadline: float,
                 heartbeat: Heartbeat | None = None, source: TaskSource = TaskSource.HINT) -> TaskReport:
    """Claim one task and carry it to a recorded outcome; never raises for task errors.

    The handler runs in the calling thread. With a ``heartbeat`` (as every invocation has), its
    lock is extended while it runs and a handler still running at the deadline is recorded as
    timed out by the heartbeat; without one, nothing stops a handler that overruns.
    """
    handler_deadline = deadline - settings.timeout_margin_seconds
    if handler_deadline - time.monotonic() <= 0:
        return TaskReport(key, TaskOutcome.SKIPPED, source=source)
    view = control.cached(settings.control_cache_seconds)
    paused, stopped_batches = view.claim_exclusions
    claim = lifecycle.claim(key, owner, settings, paused=paused, stopped_batches=stopped_batches)
    if claim is None:
        metrics.add_metric(name=MetricName.NOT_CLAIMED, unit=MetricUnit.Count, value=1)
        logger.debug("task not claimed: taken or not due", extra={"task_key": key})
        return TaskReport(key, TaskOutcome.NOT_CLAIMED, source=source)
    if handler_deadline - time.monotonic() <= 0:
        # The claim itself took the time that was left: give the task back untouched rather
        # than start a handler that would be recorded as timed out at once (an attempt burnt).
        lifecycle.release_unstarted(claim)
        logger.info("no time left after the claim; task given back", extra={"task_key": key})
        return TaskReport(key, TaskOutcome.SKIPPED, source=source)
    groups = concurrency.groups_of(claim.task, view.limits)
    if groups:
        entry = concurrency.enter(claim, groups)
        if entry is not concurrency.Entry.ENTERED:
            metrics.add_metric(name=MetricName.BLOCKED, unit=MetricUnit.Count, value=1)
            logger.debug("concurrency group full", extra={"task_key": key, "entry": entry.value})
            outcome = TaskOutcome.BLOCKED if entry is concurrency.Entry.BLOCKED else TaskOutcome.NOT_CLAIMED
            return TaskReport(key, outcome, source=source)
        claim = dataclasses.replace(claim, groups=groups)
    logger.thread_safe_append_keys(task_key=key, attempt=claim.attempt)
    metrics.add_metric(name=MetricName.CLAIMED, unit=MetricUnit.Count, value=1)
    context = TaskContext(
        key=key,
        attempt=claim.attempt,
        max_attempts=int(claim.task.max_attempts),
        fencing_token=claim.fencing_token,
        deadline=handler_deadline,
        batch_id=claim.task.batch_id,
    )
    started = time.monotonic()
    running = heartbeat.watch(claim, context) if heartbeat is not None else Running(claim, context)
    try:
        result, error, retryable = _run_handler(claim, context, settings)
        with running.lock:
            running.done = True
            timed_out = running.timed_out
        if timed_out:  # the heartbeat recorded the timeout: this late result is discarded
            outcome = running.outcome or RecordOutcome.LOST
        else:
            outcome = _record(claim, settings, context, result, error, retryable)
    finally:
        if heartbeat is not None:
            heartbeat.unwatch(key)
        # The handler has returned (one that never does keeps its places until its lease ends).
        woken = tuple(concurrency.leave(claim))
        logger.thread_safe_remove_keys(["task_key", "attempt"])
    seconds = time.monotonic() - started
    if not timed_out:
        metrics.add_metric(name=_OUTCOME_METRIC[outcome], unit=MetricUnit.Count, value=1)
    metrics.add_metric(name=MetricName.DURATION, unit=MetricUnit.Milliseconds, value=seconds * 1000)
    if outcome is RecordOutcome.LOST:
        logger.warning("lost the claim before recording: a newer attempt or a cancel owns the task")
    return TaskReport(key, TaskOutcome(outcome.value), claim.attempt, seconds, source, woken)


class Invocation:
    """One worker invocation: acquire the slot, run the threads, release the slot.

    It returns shortly after the handlers' deadline even if a handler never returns (that
    task is recorded as timed out by the heartbeat; its thread is abandoned, as Lambda freezes
    the sandbox and the local pool retires the process).
    """

    def __init__(self, request: WorkerRequest, owner: str, settings: Settings, deadline: float) -> None:
        self.request = request
        self.owner = owner
        self.settings = settings
        self.deadline = deadline
        self.handler_deadline = deadline - settings.timeout_margin_seconds
        self.heartbeat = Heartbeat(settings, request.slot, request.token, deadline=self.handler_deadline)

    def held(self) -> list[Claim]:
        return self.heartbeat.held()

    def run(self) -> list[TaskReport]:
        request, settings = self.request, self.settings
        if request.slot and not leases.acquire(request.slot, request.token or "", settings.effective_lock_seconds):
            metrics.add_metric(name=MetricName.SLOT_TAKEN_OVER, unit=MetricUnit.Count, value=1)
            logger.warning("worker slot no longer reserved for this invocation; not starting",
                           extra={"slot": request.slot})
            return []
        threads = settings.slot_threads(leases.slot_number(request.slot)) if request.slot else len(request.keys)
        if threads == 0:
            return []
        feeder = Feeder(
            settings, request.keys, self_feed=request.slot is not None,
            feed_until=feed_cutoff(settings, self.deadline),
            slot_number=leases.slot_number(request.slot) if request.slot else None,
            stop=self.heartbeat.slot_lost, window=threads,
        )
        runs: list[list[TaskReport]] = [[] for _ in range(threads)]
        workers = [threading.Thread(target=self._thread_loop, args=(feeder, runs[i]), daemon=True,
                                    name=f"worker-{i}") for i in range(threads)]
        self.heartbeat.start()
        try:
            for thread in workers:
                thread.start()
            # After the deadline the heartbeat records what still runs; a moment later, return.
            give_up = self.handler_deadline + min(1.0, settings.timeout_margin_seconds / 2)
            for thread in workers:
                thread.join(timeout=max(0.0, give_up - time.monotonic()))
        finally:
            self.heartbeat.stop()
            if request.slot and not self.heartbeat.slot_lost.is_set():
                leases.release(request.slot, request.token or "")
        reports = [report for run in runs for report in list(run)]
        reported = {report.key for report in reports}
        reports.extend(report for report in self.heartbeat.expired if report.key not in reported)
        metrics.add_metric(name=MetricName.FEED_PAGES, unit=MetricUnit.Count, value=feeder.pages)
        return reports

    def _thread_loop(self, feeder: Feeder, reports: list[TaskReport]) -> None:
        try:
            while (item := feeder.next()) is not None:
                key, source = item
                report = process_task(key, self.owner, self.settings, self.deadline, self.heartbeat, source)
                reports.append(report)
                if report.outcome is TaskOutcome.BLOCKED:
                    feeder.forget(key)  # once woken it is due again: this invocation may take it
                for woken in report.woken:
                    feeder.hand(woken)  # the place this task freed: its waiter starts here, now
                if report.outcome is TaskOutcome.SKIPPED:
                    break
        except Exception:  # noqa: BLE001 - e.g. DynamoDB unreachable: a task it held unlocks at expiry
            logger.exception("worker thread stopped on an error")


@tracer.capture_method
def run_invocation(request: WorkerRequest, owner: str, settings: Settings, deadline: float) -> list[TaskReport]:
    """Run one worker invocation before ``deadline`` (a ``time.monotonic()`` value).

    ``owner`` identifies this invocation in the locks (e.g. the Lambda request id).
    """
    return Invocation(request, owner, settings, deadline).run()


def run_batch(keys: Sequence[str], owner: str, settings: Settings, deadline: float) -> list[TaskReport]:
    """Process exactly ``keys`` (no slot, no self-feeding), each in its own thread."""
    return run_invocation(WorkerRequest(tuple(dict.fromkeys(keys))), owner, settings, deadline)
