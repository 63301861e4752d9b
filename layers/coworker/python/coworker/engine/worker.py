"""The worker: claim tasks, run their handlers, record the outcomes, and keep going.

One invocation runs ``batch_size`` threads. Each thread takes the keys it was handed (the
*hints* of the dispatcher) and then, if the invocation holds a worker slot, feeds itself: it
claims more due work, oldest first, until the backlog or the invocation's time runs out, so
throughput is bounded by concurrency rather than by the coordinator's tick.

While tasks run, one heartbeat thread per invocation extends their locks and the slot's lease
(:mod:`coworker.engine.heartbeat`); a task whose claim was taken over is told through its
context. The keys come from :mod:`coworker.engine.feeder`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from coworker.config import Settings
from coworker.data.models import ErrorKind, ErrorRecord, TaskModel, utcnow
from coworker.engine import control, durations, gates, lifecycle, offload, rates, runners, slots
from coworker.engine.budget import Budget, limit_of, planned_seconds
from coworker.engine.feeder import Feeder
from coworker.engine.handlers import Runner, TaskContext, TaskLimits, get_handler
from coworker.engine.heartbeat import Heartbeat, Running
from coworker.engine.lifecycle import Claim, RecordOutcome
from coworker.engine.outcomes import OUTCOME_METRIC, TaskOutcome, TaskReport, TaskSource, outcome_of
from coworker.errors import InvalidEventError, PayloadTooLargeError, StorageError, TaskFailedError, UnknownTaskTypeError
from coworker.observability import MetricName, logger, metrics, tracer

MAX_HINTS = 100
# How often an invocation waiting for its threads looks at its deadline again.
JOIN_POLL_SECONDS = 1.0
# A rate token that frees within this long is waited for in the worker's thread, rather than the
# claim given back and the task booked; and how many times a task tries for its tokens.
RATE_WAIT_SECONDS = 0.1
RATE_ATTEMPTS = 4
# Threads a self-feeding invocation runs beyond its places, per place: a thread whose handler has
# returned gives its place up before it writes the outcome, so under slow writes the next task's
# claim and handler go on while that write is held (handlers at once stay at the places).
RECORDING_THREADS_PER_PLACE = 1
# How long before the invocation's end (its Lambda timeout, a runner's SIGKILL) it stops waiting
# for an outcome still being written, at most: a write cut off by the end is lost, and its task
# waits for its lock to lapse and ends ``worker_lost``.
RECORD_SAFETY_SECONDS = 0.5


class Places:
    """The handlers an invocation may run at once; a thread holds a place from asking for its next
    task until that task's handler has returned (or it was not started)."""

    def __init__(self, count: int) -> None:
        self._free = threading.BoundedSemaphore(count)

    def take(self) -> Callable[[], None]:
        """Wait for a place; return the call that gives it back (only the first call does)."""
        self._free.acquire()
        given_back = threading.Event()
        lock = threading.Lock()

        def give_back() -> None:
            with lock:
                if not given_back.is_set():
                    given_back.set()
                    self._free.release()

        return give_back


@dataclasses.dataclass(frozen=True)
class WorkerRequest:
    """What one worker invocation is asked to do (its event).

    ``keys`` are hints: tasks to claim first. ``slot`` and ``token`` are the worker slot reserved
    for this invocation (see :mod:`coworker.engine.slots`); with a slot the worker also feeds itself,
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
        # With its traceback: the task's record keeps only its newest one (lifecycle.kept_history).
        logger.warning("task raised", exc_info=True, extra={"error": f"{type(exc).__name__}: {exc}"})
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
        except PayloadTooLargeError as exc:  # a retry would ask for the same payload
            error = lifecycle.error_record(claim.attempt, ErrorKind.SYSTEM,
                                           f"a follow-up task was refused: {exc}", utcnow())
            retryable = False
    return lifecycle.fail(claim, settings, error, retryable=retryable)


def process_task(key: str, owner: str, settings: Settings, deadline: float | Budget,
                 heartbeat: Heartbeat | None = None, source: TaskSource = TaskSource.HINT,
                 handler_returned: Callable[[], None] | None = None) -> TaskReport:
    """Claim one task and carry it to a recorded outcome; never raises for task errors.

    The handler runs in the calling thread. ``deadline`` is the invocation's (a
    ``time.monotonic()`` value, or its :class:`~coworker.engine.budget.Budget`): a task is claimed
    and started only if the time left covers its time limit (see :mod:`coworker.engine.budget`);
    one that does not fit is left due for a fresh invocation. With a ``heartbeat`` (as every
    invocation has), the task's lock is kept from the claim on, and a handler still running at its
    limit or the deadline is recorded as timed out; without one, nothing stops a handler that
    overruns. ``handler_returned`` is called once the handler has returned, before its outcome is
    written (the invocation's :class:`Places`).
    """
    budget = deadline if isinstance(deadline, Budget) else Budget(settings, deadline)
    now = time.monotonic()
    time_left = budget.left(now)
    if time_left <= 0:
        return TaskReport(key, TaskOutcome.SKIPPED, source=source)
    view = control.cached(settings.control_cache_seconds)
    paused, stopped_batches = view.claim_exclusions
    sent, claimed_at = time.monotonic(), utcnow()
    # A task longer than the time left (its own limit, else its type's) is refused by the claim's
    # condition and left untouched.
    bounded = math.isfinite(time_left)  # (tests and tools may run a task with no deadline at all)
    try:
        claim = lifecycle.claim(key, owner, settings, now=claimed_at, paused=paused, stopped_batches=stopped_batches,
                                time_left=time_left if bounded else None,
                                too_long_types=budget.too_long_types(now) if bounded else (),
                                excluded_types=budget.other_runner_types())
    except StorageError as exc:
        return _claim_unanswered(key, owner, claimed_at, exc, source)
    if claim is None:
        metrics.add_metric(name=MetricName.NOT_CLAIMED, unit=MetricUnit.Count, value=1)
        logger.debug("task not claimed: taken, not due, another runner's, or longer than the time left",
                     extra={"task_key": key})
        return TaskReport(key, TaskOutcome.NOT_CLAIMED, source=source)
    if not budget.runs_here(claim.task.task_type):
        return _not_here(claim, budget, source)
    planned = planned_seconds(claim.task.task_type, claim.task.timeout_seconds)
    if planned is not None and not budget.may_claim(planned):
        return _too_long(claim, planned, budget, source)
    context = TaskContext(key=key, attempt=claim.attempt, max_attempts=int(claim.task.max_attempts),
                          fencing_token=claim.fencing_token, deadline=budget.handler_deadline,
                          batch_id=claim.task.batch_id, limits=_limits(claim.task),
                          follow_up_problem=functools.partial(_follow_up_problem, settings))
    # Watched from the claim on: its lock is kept while the gates are entered, however long.
    running = heartbeat.watch(claim, context, locked_at=sent) if heartbeat is not None else Running(claim, context)
    try:
        claim, turned_away = _enter_gates(claim, view.limits, settings)
        retry_at = None
        if turned_away is None:
            turned_away, retry_at = _take_rate_tokens(claim, view.rate_limits, settings, running)
        if turned_away is not None:
            report = TaskReport(key, turned_away, source=source, retry_at=retry_at)
        else:
            running.claim = claim
            report = _run(running, settings, budget, planned, source, handler_returned)
    except Exception as exc:  # noqa: BLE001 - the worker's own write or read failed: settle what is known
        report = _settle_trouble(running, exc, source)
    finally:
        if heartbeat is not None:
            heartbeat.unwatch(key)
        # The handler has returned (one that never does keeps its places until its lease ends).
        woken = tuple(gates.leave(claim))
    # The blocked tasks its places woke: this worker may run them next.
    return dataclasses.replace(report, woken=woken) if woken else report


def _claim_unanswered(key: str, owner: str, claimed_at: datetime, exc: StorageError,
                      source: TaskSource) -> TaskReport:
    """The claim's write failed with no answer that says whether it landed (a connection closed or
    timed out), or with an error (throttled past the retries, an outage). Read the task: a claim
    that landed is given back unstarted (fenced, its attempt not counted); one that did not has
    nothing to undo; if the read or the give-back fails too, nothing is known, and a lock taken
    lapses as a dead worker's would (the task is then taken over: never lost, never two live
    holders, since this worker starts no handler on it)."""
    metrics.add_metric(name=MetricName.WORKER_ERRORS, unit=MetricUnit.Count, value=1)
    try:
        landed = lifecycle.landed_claim(key, owner, claimed_at)
        settled = "it had not landed" if landed is None else (
            "it had landed and was given back" if lifecycle.release_unstarted(landed)
            else "it had landed and is no longer this worker's")
    except StorageError as again:
        settled = f"whether it landed is not known (its lock, if taken, lapses): {again}"
    logger.error(f"could not claim the task: {settled}; the thread goes on with its next task",
                 extra={"task_key": key, "error": str(exc)})
    return TaskReport(key, TaskOutcome.ERROR, source=source)


def _settle_trouble(running: Running, exc: Exception, source: TaskSource) -> TaskReport:
    """A write or read of the worker's own failed after the claim (a gate, a rate token, the
    outcome's record). A claim whose handler has not started, and that neither the heartbeat nor a
    takeover has ended, is given back unstarted (fenced: if an earlier give-back of it landed
    unanswered, this one changes nothing). One whose handler ran and whose outcome could not be
    written keeps its lock until it lapses, with a note on the task saying why, for the takeover's
    worker_lost entry: the handler runs again (at least once, never lost)."""
    claim = running.claim
    metrics.add_metric(name=MetricName.WORKER_ERRORS, unit=MetricUnit.Count, value=1)
    with running.lock:
        unstarted = not (running.handler_started or running.given_back or running.timed_out
                         or running.context.lost.is_set())
        running.done = True  # the heartbeat says nothing more of it (its lock is kept while this runs)
        stage = "it was waiting to start" if not running.handler_started else "its handler had run"
    try:
        if unstarted:
            settled = ("it was given back unstarted" if lifecycle.release_unstarted(claim)
                       else "it is no longer this worker's")
        elif running.handler_started and not running.timed_out and not running.context.lost.is_set():
            lifecycle.note_lapse(claim, f"its worker could not record the outcome: {exc}")
            settled = "its lock lapses and the task runs again"
        else:
            settled = "the heartbeat or another worker has settled it"
    except Exception as again:  # noqa: BLE001 - nothing more can be written now
        settled = f"its lock lapses and the task runs again (nothing more could be written: {again})"
    logger.error(f"a write or read failed while {stage}: {settled}; the thread goes on with its next task",
                 exc_info=exc, extra={"task_key": claim.key, "attempt": claim.attempt})
    return TaskReport(claim.key, TaskOutcome.ERROR, claim.attempt, source=source)


def _limits(task: TaskModel) -> TaskLimits:
    """The limits ``task`` carries, for follow-ups that inherit them."""
    def whole(value: float | None) -> int | None:
        return int(value) if value is not None else None

    return TaskLimits(concurrency_key=task.concurrency_key, concurrency_limit=whole(task.concurrency_limit),
                      rate_key=task.rate_key, rate_limit=whole(task.rate_limit),
                      rate_interval_seconds=float(task.rate_interval_seconds)
                      if task.rate_interval_seconds is not None else None)


def _follow_up_problem(settings: Settings, task_type: str, limit: float | None) -> str | None:
    return runners.runner_limit_problem(task_type, limit, settings, f"a task of type {task_type!r}")


def _not_here(claim: Claim, budget: Budget, source: TaskSource) -> TaskReport:
    """Give back, untouched, a claim of a task that runs on the other runner (a hint sent before
    its type moved to the container runner, or a runner's stray key), at the head of the queue."""
    logger.info("task given back: it runs on the other runner",
                extra={"task_key": claim.key, "task_type": claim.task.task_type, "runner": budget.runner})
    lifecycle.release_unstarted(claim, due=lifecycle.head_of_queue(claim.task, utcnow()))
    return TaskReport(claim.key, TaskOutcome.NOT_CLAIMED, source=source)


def _too_long(claim: Claim, planned: float, budget: Budget, source: TaskSource) -> TaskReport:
    """Give back a claim whose task would not finish in the time left: due again as of its
    creation (less its priority), so a fresh invocation takes it first; the attempt not counted."""
    metrics.add_metric(name=MetricName.TOO_LONG, unit=MetricUnit.Count, value=1)
    logger.info("task left for a fresh worker: its time is longer than this invocation has left",
                extra={"task_key": claim.key, "planned_seconds": planned, "seconds_left": round(budget.left(), 1)})
    if not lifecycle.release_unstarted(claim, due=lifecycle.head_of_queue(claim.task, utcnow())):
        return TaskReport(claim.key, TaskOutcome.NOT_CLAIMED, source=source)
    return TaskReport(claim.key, TaskOutcome.TOO_LONG, source=source)


def _enter_gates(claim: Claim, type_limits: Mapping[str, int], settings: Settings
                 ) -> tuple[Claim, TaskOutcome | None]:
    """Take the claim's places in its concurrency groups: ``(claim with its groups, None)``, or
    the outcome of a task turned away (its claim given back, blocked or not)."""
    groups = gates.groups_of(claim.task, type_limits)
    if not groups:
        return claim, None
    # The places are leased as long as the lock the heartbeat keeps from the claim on.
    entry = gates.enter(claim, groups, lease_until=lifecycle.lock_expiry(settings, utcnow()))
    if entry is gates.Entry.ENTERED:
        return dataclasses.replace(claim, groups=groups), None
    metrics.add_metric(name=MetricName.BLOCKED, unit=MetricUnit.Count, value=1)
    logger.debug("concurrency group full", extra={"task_key": claim.key, "entry": entry.value})
    return claim, TaskOutcome.BLOCKED if entry is gates.Entry.BLOCKED else TaskOutcome.NOT_CLAIMED


def _take_rate_tokens(claim: Claim, rate_limits: Mapping[str, control.Rate], settings: Settings,
                      running: Running) -> tuple[TaskOutcome | None, datetime | None]:
    """Take the claim's start tokens in its rate groups: ``(None, None)`` to start it now, or the
    outcome of a task turned away with when it is due again (its claim given back, its start
    booked: see :mod:`coworker.engine.rates`).

    A token that frees within ``RATE_WAIT_SECONDS`` is waited for here: cheaper than giving the
    claim back and claiming it again (6 write units); when writes are slow, one that frees within
    what turning the task away would take (:func:`rates.worth_waiting_seconds`). The handler starts on its tokens' stamp
    (a moment ahead); tokens whose write came back later than their margin are given back and
    taken again. A claim found lost meanwhile (taken over, or its lock not kept: the heartbeat
    gives it back) takes no token and books nothing; one it took then is given back.
    """
    groups = rates.groups_of(claim.task, rate_limits)
    if not groups:
        return None, None
    _preload_payload(claim, settings)  # before the token: the handler starts right after it
    lost = running.context.lost
    for _ in range(RATE_ATTEMPTS):
        if lost.is_set():
            return None, None  # (not started: ``_run`` finds it lost)
        worth = max(RATE_WAIT_SECONDS, rates.worth_waiting_seconds(settings.effective_lock_seconds))
        tokens, refused_by, free_ms = rates.admit(groups, wait_seconds=worth,
                                                  waiter=lambda group: rates.returning(claim.task, group))
        if refused_by is None:
            if rates.start_on(tokens) and not lost.is_set():
                return None, None
            rates.give_back(tokens)  # the write was slow (this start would be late), or the claim is lost
            continue
        wait = free_ms / 1000 - time.time()
        if wait > worth:
            break
        time.sleep(max(0.0, wait))
    else:
        refused_by = None  # every token it took came back past its stamp (the writes are slow)
    with running.lock:
        if lost.is_set():
            return None, None
        running.done = True  # given back by this thread: the heartbeat keeps the lock, and says nothing
    if refused_by is not None:
        start = rates.book(refused_by, free_ms)
    else:
        # Due again at once, as a waiter back at its booked start: it may pass the tasks booked
        # meanwhile, rather than go behind them all and be passed over again and again.
        start = utcnow()
    metrics.add_metric(name=MetricName.RATE_LIMITED, unit=MetricUnit.Count, value=1)
    logger.debug("rate group has no token", extra={"task_key": claim.key, "retry_at": start.isoformat(),
                                                   "rate_group": refused_by.name if refused_by else None})
    booked = [TaskModel.rate_booked_at.set(rates.epoch_ms(start)),
              TaskModel.rate_booked_by.set(refused_by.name) if refused_by else TaskModel.rate_booked_by.remove()]
    if not lifecycle.release_unstarted(claim, due=start, also=booked):
        return TaskOutcome.NOT_CLAIMED, None
    return TaskOutcome.DEFERRED, start


def _preload_payload(claim: Claim, settings: Settings) -> None:
    """Read a payload kept in the object store now, so that the handler starts without the read
    (a failed read is left to the handler's start, where it is recorded)."""
    if claim.task.payload_ref is None:
        return
    try:
        claim.task.payload = offload.load(claim.task.payload_ref, offload.store_for(settings))
        claim.task.payload_ref = None
    except Exception:  # noqa: BLE001 - read again, and recorded, when the handler starts
        logger.warning("could not read the payload ahead of the rate token", extra={"task_key": claim.key})


def _run(running: Running, settings: Settings, budget: Budget, planned: float | None,
         source: TaskSource, handler_returned: Callable[[], None] | None = None) -> TaskReport:
    """Start the handler if its time still fits and the claim still holds, and record its outcome.

    The handler must return by its limit (or the invocation's deadline, if sooner): the heartbeat
    records it as timed out then."""
    claim, key = running.claim, running.claim.key
    with running.lock:
        started = time.monotonic()
        startable = (not running.timed_out and not running.context.lost.is_set()
                     and budget.may_start(planned, started))
        limit = limit_of(claim.task.task_type, claim.task.timeout_seconds)
        if startable:
            running.ends_at = budget.ends_at(limit, started)
            running.limit = limit
            running.context = dataclasses.replace(running.context, deadline=running.ends_at)
        running.handler_started = startable
    if not startable:
        return _not_started(running, source)
    context = running.context
    logger.thread_safe_append_keys(task_key=key, attempt=claim.attempt)
    metrics.add_metric(name=MetricName.CLAIMED, unit=MetricUnit.Count, value=1)
    try:
        result, error, retryable = _run_handler(claim, context, settings)
        if handler_returned is not None:
            handler_returned()
        if limit is None:  # run times plan the tasks whose limit is not known
            durations.observed.observe(claim.task.task_type, time.monotonic() - started)
        with running.lock:
            running.done = True
            timed_out = running.timed_out
        if timed_out:  # the heartbeat records the timeout: this late result is discarded
            running.settled.wait(settings.effective_lock_seconds)  # a handler told at once returns first
            outcome = running.outcome or RecordOutcome.LOST
        elif context.lost.is_set():  # its lock was lost, or could not be kept: the result is discarded
            outcome = _abandon(claim, settings)
        else:
            outcome = _record(claim, settings, context, result, error, retryable)
    finally:
        logger.thread_safe_remove_keys(["task_key", "attempt"])
    seconds = time.monotonic() - started
    if not timed_out:
        metrics.add_metric(name=OUTCOME_METRIC[outcome], unit=MetricUnit.Count, value=1)
    metrics.add_metric(name=MetricName.DURATION, unit=MetricUnit.Milliseconds, value=seconds * 1000)
    if outcome is RecordOutcome.LOST:
        logger.warning("lost the claim before recording: a newer attempt or a cancel owns the task")
    return TaskReport(key, outcome_of(outcome), claim.attempt, seconds, source)


def _not_started(running: Running, source: TaskSource) -> TaskReport:
    """A claim whose handler was not started: out of time (given back by the heartbeat at the
    deadline, or here), or its lock lost meanwhile."""
    claim = running.claim
    with running.lock:
        running.done = True
        given_back = running.timed_out  # the heartbeat gave it back at the deadline
    if running.given_back:
        return TaskReport(claim.key, TaskOutcome.NOT_CLAIMED, source=source)  # the heartbeat gave it back
    if running.context.lost.is_set() and not given_back:
        # Its lock was lost, or could not be kept: give it back if it is still this attempt's.
        lifecycle.release_unstarted(claim)
        return TaskReport(claim.key, TaskOutcome.NOT_CLAIMED, source=source)
    if not given_back:
        # The time left went on the claim and the gates: give it back untouched rather than start
        # a handler that would be recorded as timed out at once (an attempt burnt).
        lifecycle.release_unstarted(claim)
    logger.info("no time left after the claim; task given back", extra={"task_key": claim.key})
    return TaskReport(claim.key, TaskOutcome.SKIPPED, source=source)


def _abandon(claim: Claim, settings: Settings) -> RecordOutcome:
    """The handler returned after its claim was lost or could not be kept: discard its result. If
    the lock is in fact still this attempt's (an extension landed late), the attempt is recorded
    as failed, so the task runs again rather than keep a result its handler was told to drop."""
    error = lifecycle.error_record(claim.attempt, ErrorKind.SYSTEM,
                                   "the worker could not keep the task's lock (its writes were too slow); "
                                   "the attempt's result was discarded", utcnow())
    return lifecycle.fail(claim, settings, error)


class Invocation:
    """One worker invocation: acquire the slot, run the threads, release the slot.

    It returns shortly after the handlers' deadline even if a handler never returns (that
    task is recorded as timed out by the heartbeat; its thread is abandoned, as Lambda freezes
    the sandbox and the local pool retires the process). A container runner is one with no
    deadline (``math.inf``) until it is told to stop (:meth:`stop_by`), see
    :mod:`coworker.engine.runner`.
    """

    def __init__(self, request: WorkerRequest, owner: str, settings: Settings, deadline: float,
                 on_report: Callable[[TaskReport], None] | None = None, runner: Runner = "lambda") -> None:
        self.request = request
        self.owner = owner
        self.settings = settings
        self.deadline = deadline
        # Told of each task's outcome as it happens (the local runtime's live counts); the
        # invocation's return value still lists them all.
        self.on_report = on_report
        self.budget = Budget(settings, deadline, runner)
        self.heartbeat = Heartbeat(settings, request.slot, request.token, deadline=self.handler_deadline)
        # Set to take no more work (its slot was given away, or it was told to stop).
        self.stopping = threading.Event()
        # Keys a thread met an error with (TaskOutcome.ERROR): handed out once more at most.
        self._troubled: set[str] = set()
        self._places = Places(1)  # (sized in run)

    @property
    def handler_deadline(self) -> float:
        return self.budget.handler_deadline

    def held(self) -> list[Claim]:
        return self.heartbeat.held()

    def stop_by(self, deadline: float, reason: str) -> None:
        """Take no more work, start no handler after ``deadline``, and record a handler still
        running then as timed out with ``reason``."""
        self.budget.stop_by(deadline)
        self.heartbeat.stop_by(deadline, reason)
        self.stopping.set()

    def _threads(self) -> int:
        request = self.request
        return self.settings.slot_threads(slots.slot_number(request.slot)) if request.slot else len(request.keys)

    def _feeder(self, threads: int) -> Feeder:
        request = self.request
        return Feeder(
            self.settings, request.keys, self_feed=request.slot is not None,
            feed_until=self.budget.feed_until, fits=self.budget.may_claim_type,
            slot_number=slots.slot_number(request.slot) if request.slot else None,
            stop=self.stopping, window=threads, exclude_types=self.budget.other_runner_types(),
        )

    def run(self) -> list[TaskReport]:
        request, settings = self.request, self.settings
        if request.slot and not slots.acquire(request.slot, request.token or "", settings.effective_lock_seconds):
            metrics.add_metric(name=MetricName.SLOT_TAKEN_OVER, unit=MetricUnit.Count, value=1)
            logger.warning("worker slot no longer reserved for this invocation; not starting",
                           extra={"slot": request.slot})
            return []
        places = self._threads()
        if places == 0:
            return []
        feeder = self._feeder(places)
        self.heartbeat.on_slot_lost = self.stopping.set
        # A self-feeding invocation writes outcomes on threads of their own beyond its places.
        threads = places * (1 + RECORDING_THREADS_PER_PLACE) if request.slot else places
        self._places = Places(places)
        runs: list[list[TaskReport]] = [[] for _ in range(threads)]
        workers = [threading.Thread(target=self._thread_loop, args=(feeder, runs[i]), daemon=True,
                                    name=f"worker-{i}") for i in range(threads)]
        self.heartbeat.start()
        try:
            for thread in workers:
                thread.start()
            # After the deadline the heartbeat records what still runs; a moment later, return
            # (the deadline is read again and again: a runner told to stop brings it forward).
            for thread in workers:
                while thread.is_alive():
                    left = self._return_by() - time.monotonic()
                    if left <= 0:
                        break
                    thread.join(timeout=min(left, JOIN_POLL_SECONDS))
        finally:
            self.heartbeat.stop()
            if request.slot and not self.heartbeat.slot_lost.is_set():
                slots.release(request.slot, request.token or "")
        reports = [report for run in runs for report in list(run)]
        reported = {report.key for report in reports}
        reports.extend(report for report in self.heartbeat.expired if report.key not in reported)
        metrics.add_metric(name=MetricName.FEED_PAGES, unit=MetricUnit.Count, value=feeder.pages)
        durations.observed.flush()
        return reports

    def _return_by(self) -> float:
        """When :meth:`run` stops waiting for its threads: a moment after the handlers' deadline
        (a handler still running then is abandoned, recorded by the heartbeat); while an outcome
        is still being written, up to just before the invocation's end, so that a slow write near
        the deadline lands rather than being cut off with the invocation."""
        margin = self.settings.timeout_margin_seconds
        soon = self.handler_deadline + min(1.0, margin / 2)
        if not self.heartbeat.recording():
            return soon
        end = min(self.deadline, self.handler_deadline + margin)  # (a runner's: its stop's SIGKILL)
        return max(soon, end - min(RECORD_SAFETY_SECONDS, margin / 4))

    def _thread_loop(self, feeder: Feeder, reports: list[TaskReport]) -> None:
        try:
            while True:
                give_back = self._places.take()
                try:
                    if (item := feeder.next()) is None:
                        break
                    key, source = item
                    try:
                        report = process_task(key, self.owner, self.settings, self.budget, self.heartbeat, source,
                                              handler_returned=give_back)
                    except Exception:  # noqa: BLE001 - one task's trouble costs the invocation no thread
                        logger.exception("worker thread met an error with a task; it goes on with its next task",
                                         extra={"task_key": key})
                        metrics.add_metric(name=MetricName.WORKER_ERRORS, unit=MetricUnit.Count, value=1)
                        report = TaskReport(key, TaskOutcome.ERROR, source=source)
                finally:
                    give_back()
                reports.append(report)
                if self.on_report is not None:
                    self.on_report(report)
                if report.outcome is TaskOutcome.ERROR and key not in self._troubled:
                    # Given back, or due again once its lock lapses: a later page may hand it out
                    # once more (not again and again: a task that always fails here is left).
                    self._troubled.add(key)
                    feeder.forget(key)
                if report.outcome is TaskOutcome.BLOCKED:
                    feeder.forget(key)  # once woken it is due again: this invocation may take it
                if report.outcome is TaskOutcome.DEFERRED and report.retry_at is not None:
                    feeder.hand_at(key, report.retry_at)  # its booked start: try it then, if still here
                for woken in report.woken:
                    feeder.hand(woken)  # the place this task freed: its waiter starts here, now
                if report.outcome is TaskOutcome.SKIPPED:
                    break
        except Exception:  # noqa: BLE001 - the feeder or a report's listener failed: nothing is held
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
