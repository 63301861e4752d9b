"""The heartbeat: one thread per worker invocation that keeps the leases of its tasks ahead of
their expiry, and enforces the handlers' deadline.

A task is watched from its claim on (before its concurrency gates are entered and its handler
starts), so its lock is kept alive however long those steps take. Each lock is scheduled by its
own expiry, not by a round of all of them: a lock is extended once ``heartbeat_seconds`` have
passed since the last extension that took (its write was *sent*, since the expiry written is
the send time plus the lock's lifetime), and extensions run side by side on a small pool, so one
slow write delays no other lock. While an extension is slow, another is sent every half
interval (at most :data:`MAX_IN_FLIGHT` at once): the first to land keeps the lock. Extensions
only ever move a lock forward (a late write cannot shorten it, see
:func:`coworker.engine.lifecycle.extend_lock`). Each task remembers the index due time it last
wrote, so that an extension moves the task's index entry (two more write units) only when the
new lock would pass it: every other beat.

Timeline of one lock (``L`` the lock's lifetime, ``h`` the heartbeat interval, ``m = h / 2``)::

    t0        claimed: lock until t0 + L
    t0 + h    extension sent (lands whenever; it writes t0 + h + L)
    t0 + h + m  still in flight: a second one is sent
    ...
    t0 + L - m  nothing has landed: the handler is told its claim is lost (before the lock lapses,
                so no other worker can have it yet); its result will be discarded, and a note on
                the task says why, for the worker_lost entry of whoever takes it over. A task
                still waiting to start (a concurrency place, a rate token) is given back instead.

A refused extension means the claim was taken over or cancelled: the handler is told at once (a
task whose handler returned, or that its worker gave back, has nothing to be told). Every warning
names the stage the task was at: waiting to start, its handler running.
A refused slot extension means the capacity accounting gave the slot away (this worker stalled):
the worker stops taking new work. A handler still running at its own time limit
(``Running.ends_at``) is recorded as timed out then, and its task retried. At ``deadline`` (a
``time.monotonic()`` value) every handler still running is recorded as timed out, and a task whose
handler has not started is given back (its attempt does not count); from then on no handler starts.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from aws_lambda_powertools.metrics import MetricUnit

from coworker.config import Settings
from coworker.data.models import ErrorKind, utcnow
from coworker.engine import gates, lifecycle, slots
from coworker.engine.handlers import TaskContext
from coworker.engine.lifecycle import Claim, RecordOutcome
from coworker.engine.outcomes import OUTCOME_METRIC, TaskReport, outcome_of
from coworker.observability import MetricName, logger, metrics

# Extensions of one lock in flight at once (a slow write is not waited for before the next).
MAX_IN_FLIGHT = 3


@dataclasses.dataclass
class Running:
    """A claimed task, as the heartbeat watches it (from the claim until its outcome is recorded).

    ``lock`` decides who acts on it: the worker thread (starts the handler, records its outcome)
    or the heartbeat at the deadline (gives it back, or records a timeout); never both.
    """

    claim: Claim
    context: TaskContext
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    started: float = dataclasses.field(default_factory=time.monotonic)
    # When the write that set the lock's current expiry was sent (the claim's, then each extension's).
    locked_at: float = dataclasses.field(default_factory=time.monotonic)
    handler_started: bool = False
    # The heartbeat gave the claim back itself (its handler had not started; see Heartbeat._late).
    given_back: bool = False
    # When its handler must have returned (its start plus its time limit, or the deadline), and
    # that limit (``None``: none declared, the invocation's deadline only): set as it starts.
    ends_at: float | None = None
    limit: float | None = None
    done: bool = False
    timed_out: bool = False
    outcome: RecordOutcome | None = None
    # Set once the heartbeat has written what a timeout leaves (its record, or the claim given back).
    settled: threading.Event = dataclasses.field(default_factory=threading.Event)
    in_flight: int = 0
    last_sent: float = 0.0
    # The index due time last written for this claim (see lifecycle.extend_lock): the claim's.
    listed_until: datetime | None = None

    def __post_init__(self) -> None:
        if self.listed_until is None:
            self.listed_until = self.claim.task.due_at

    @property
    def stage(self) -> str:
        """Where the task is, in the words a warning about it uses (read under ``lock``)."""
        if self.done:
            return "its handler has returned" if self.handler_started else "it is being given back unstarted"
        if self.handler_started:
            return "its handler is running"
        return "it is waiting to start (its handler has not run: a concurrency place or a rate token)"


class Heartbeat:
    """Keeps an invocation's leases (its slot, its tasks' locks and gate places) and its deadline."""

    def __init__(self, settings: Settings, slot: str | None = None, token: str | None = None,
                 deadline: float | None = None) -> None:
        self._settings = settings
        self._slot, self._token = slot, token
        self._deadline = deadline
        # What a handler still running at the deadline is recorded as not having done.
        self._deadline_reason = "did not finish within the worker's time limit"
        self._running: dict[str, Running] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.slot_lost = threading.Event()
        # Called once when the slot is found given away (the invocation then takes no more work).
        self.on_slot_lost: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._slot_locked_at = time.monotonic()
        self._slot_in_flight = False
        self.expired: list[TaskReport] = []

    @property
    def interval(self) -> float:
        return self._settings.effective_heartbeat_seconds

    def start(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._pool is not None:
            # Extensions not yet sent are dropped; one under way may still land: fenced and only
            # ever moving a lock forward, it cannot undo what the worker recorded meanwhile.
            self._pool.shutdown(wait=False, cancel_futures=True)

    def stop_by(self, deadline: float, reason: str) -> None:
        """Bring the deadline forward to ``deadline`` (a runner told to stop): handlers still
        running then are recorded as timed out, with ``reason``."""
        with self._lock:
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline
                self._deadline_reason = reason
        self._wake.set()

    def watch(self, claim: Claim, context: TaskContext, locked_at: float | None = None) -> Running:
        """Keep ``claim``'s lock from now on; ``locked_at``: when the claim was sent."""
        running = Running(claim, context, locked_at=locked_at if locked_at is not None else time.monotonic())
        with self._lock:
            self._running[claim.key] = running
        # (Its first extension is due an interval from now: the loop looks at least every half one.)
        return running

    def unwatch(self, key: str) -> None:
        with self._lock:
            self._running.pop(key, None)

    def held(self) -> list[Claim]:
        """Claims of the tasks watched now (what a shutdown must release)."""
        with self._lock:
            return [running.claim for running in self._running.values()]

    def recording(self) -> bool:
        """Whether a worker thread is writing what became of a watched task now: its outcome, once
        its handler has returned, or the claim given back unstarted."""
        with self._lock:
            return any(running.done for running in self._running.values())

    def beat(self) -> None:
        """One round: extend the slot and every watched lock now, side by side, and wait for them
        (tests call it; the loop schedules each lock by its own expiry instead)."""
        now = time.monotonic()
        if self._slot and not self.slot_lost.is_set():
            self._extend_slot(now)
        with self._lock:
            running = [task for task in self._running.values() if not task.context.lost.is_set()]
            for task in running:
                task.in_flight += 1
                task.last_sent = now
        list(self._executor().map(lambda task: self._extend(task, now), running))

    def expire(self) -> None:
        """The deadline has passed: record every running handler as timed out, give back every
        claim whose handler has not started. Called again for tasks watched after it."""
        with self._lock:
            running = list(self._running.values())
        for task in running:
            self._expire(task)

    def _expire(self, task: Running, only_past: float | None = None) -> None:
        """Record ``task``'s handler as timed out (give its claim back if it never started); with
        ``only_past``, only if its handler started and must have returned by then."""
        with task.lock:
            if task.done or task.timed_out or task.given_back:
                return
            if only_past is not None and not (task.handler_started and task.ends_at is not None
                                              and task.ends_at <= only_past):
                return
            task.timed_out = True
            started = task.handler_started
        task.context.lost.set()  # whatever it returns now is discarded: it may as well stop
        try:
            if started:
                self._record_timeout(task)
            else:
                self._give_back(task)
        finally:
            task.settled.set()

    def _record_timeout(self, task: Running) -> None:
        claim = task.claim
        over_limit = (task.limit is not None and task.ends_at is not None
                      and (self._deadline is None or task.ends_at < self._deadline))
        reason = (f"did not finish within its time limit of {task.limit:g} s" if over_limit and task.limit
                  else self._deadline_reason)
        error = lifecycle.error_record(claim.attempt, ErrorKind.TIMEOUT, f"{reason} (attempt {claim.attempt})",
                                       utcnow())
        metrics.add_metric(name=MetricName.TIMED_OUT, unit=MetricUnit.Count, value=1)
        logger.warning("task timed out; recording and releasing the lock",
                       extra={"task_key": claim.key, "time_limit_seconds": task.limit})
        try:
            task.outcome = lifecycle.fail(claim, self._settings, error)
        except Exception:  # noqa: BLE001 - the lock then expires and the task runs again
            logger.exception("could not record a timeout", extra={"task_key": claim.key})
            return
        self.expired.append(TaskReport(claim.key, outcome_of(task.outcome), claim.attempt,
                                       time.monotonic() - task.started))
        metrics.add_metric(name=OUTCOME_METRIC[task.outcome], unit=MetricUnit.Count, value=1)

    def _give_back(self, task: Running) -> None:
        """A claim whose handler never started: back to its queue, the attempt not counted."""
        try:
            lifecycle.release_unstarted(task.claim)
        except Exception:  # noqa: BLE001 - the lock then expires and the task runs again
            logger.exception("could not give back an unstarted task", extra={"task_key": task.claim.key})

    # -- extensions -------------------------------------------------------------------------------

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            workers = MAX_IN_FLIGHT * (self._settings.batch_size + 1)
            self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="heartbeat-write")
        return self._pool

    def _extend(self, task: Running, sent: float) -> None:
        """One extension of a task's gate places and lock, sent at ``sent`` (monotonic)."""
        settings, claim = self._settings, task.claim
        try:
            # The concurrency leases first, with the same expiry: they never end before the lock.
            now = utcnow()
            extended: bool | None = False
            if not claim.groups or gates.extend(claim, settings, now):
                with self._lock:
                    listed_until = task.listed_until
                extension = lifecycle.extend_lock(claim, settings, now, listed_until)
                extended = extension.held
        except Exception:  # noqa: BLE001 - a failed write is sent again on schedule
            logger.exception("heartbeat failed", extra={"task_key": claim.key})
            extended = None
        with self._lock:
            task.in_flight -= 1
            if extended:
                task.locked_at = max(task.locked_at, sent)
                moved = extension.listed_until
                if moved is not None and (task.listed_until is None or moved > task.listed_until):
                    task.listed_until = moved
        if extended is False:
            self._taken(task)

    def _taken(self, task: Running) -> None:
        """An extension was refused: the claim is no longer this attempt's (taken over, cancelled,
        or recorded). Told to the handler if it runs, or to the worker if the task waits to start;
        nothing to tell once the worker is done with it (its own record or give-back did it)."""
        with task.lock:
            if task.done or task.context.lost.is_set():
                return
            stage = task.stage
            task.context.lost.set()
        metrics.add_metric(name=MetricName.LOST_CLAIM_SIGNALLED, unit=MetricUnit.Count, value=1)
        told = "the handler is told" if task.handler_started else "it will not start here"
        logger.warning(f"claim lost while {stage}: a newer attempt or a cancel owns the task; {told}",
                       extra={"task_key": task.claim.key, "attempt": task.claim.attempt, "stage": stage})

    def _late(self, task: Running) -> None:
        """Nothing has landed and the lock lapses within half an interval, while no other worker
        can have the task yet. A running handler is told (its result will be discarded); a task
        waiting to start is given back unstarted now, its attempt not counted, rather than hold a
        lock it cannot keep until another worker takes it over as lost work. Once the worker is
        done with it, its own write (the outcome, or the give-back) is under way: nothing to say."""
        with task.lock:
            if task.done or task.context.lost.is_set():
                return
            stage = task.stage
            give_back = not task.handler_started and not task.timed_out
            task.given_back = give_back
            task.context.lost.set()  # (under the lock: the worker then cannot start the handler)
        metrics.add_metric(name=MetricName.LOST_CLAIM_SIGNALLED, unit=MetricUnit.Count, value=1)
        told = "it is given back unstarted" if give_back else "the handler is told"
        logger.warning(f"the task's lock could not be extended in time (writes are slow) while {stage}; {told}",
                       extra={"task_key": task.claim.key, "attempt": task.claim.attempt, "stage": stage})
        if give_back:
            self._executor().submit(self._give_back, task)
        else:
            waited = time.monotonic() - task.locked_at
            self._executor().submit(self._note_lapse, task, f"its lock extensions did not land within {waited:.1f} s "
                                    f"(writes were slow) while {stage}; it was told, and its result discarded")

    def _note_lapse(self, task: Running, reason: str) -> None:
        """Leave why on the task, for the worker that takes it over (:func:`lifecycle.note_lapse`)."""
        try:
            lifecycle.note_lapse(task.claim, reason)
        except Exception:  # noqa: BLE001 - the takeover then says no word came from this worker
            logger.exception("could not note why the lock lapses", extra={"task_key": task.claim.key})

    def _extend_slot(self, sent: float) -> None:
        try:
            taken: bool | None = slots.extend(self._slot or "", self._token or "",
                                              self._settings.effective_lock_seconds)
        except Exception:  # noqa: BLE001 - not extended: sent again on schedule
            logger.exception("could not extend the worker slot")
            taken = None
        finally:
            self._slot_in_flight = False
        if taken:
            self._slot_locked_at = max(self._slot_locked_at, sent)
        elif taken is False and not self.slot_lost.is_set():
            self.slot_lost.set()
            if self.on_slot_lost is not None:
                self.on_slot_lost()
            logger.warning("worker slot was taken over; taking no more work", extra={"slot": self._slot})

    def _schedule(self, now: float) -> float:
        """Send the extensions due at ``now``, tell handlers whose lock cannot be kept in time;
        returns when to look again."""
        lock_seconds, interval = self._settings.effective_lock_seconds, self.interval
        retry = interval / 2
        wake = now + retry
        due: list[Running] = []
        late: list[Running] = []
        overdue: list[Running] = []
        with self._lock:
            for task in self._running.values():
                if task.ends_at is not None and task.handler_started and not (task.done or task.timed_out):
                    if now >= task.ends_at:
                        overdue.append(task)  # past its time limit: recorded as timed out below
                    else:
                        wake = min(wake, task.ends_at)
                # (A task whose handler returned keeps its lock while its outcome is written.)
                if task.context.lost.is_set():
                    continue
                if now >= task.locked_at + lock_seconds - retry:
                    # Nothing landed and the lock lapses within half an interval: stop the handler
                    # now, while no other worker can have the task.
                    late.append(task)
                    continue
                next_send = max(task.locked_at + interval, task.last_sent + retry)
                if now >= next_send and task.in_flight < MAX_IN_FLIGHT:
                    task.in_flight += 1
                    task.last_sent = now
                    due.append(task)
                    next_send = now + retry
                wake = min(wake, next_send, task.locked_at + lock_seconds - retry)
        for task in overdue:  # on the pool: a slow write delays no other lock
            self._executor().submit(self._expire, task, now)
        for task in late:
            self._late(task)
        for task in due:
            self._executor().submit(self._extend, task, now)
        if self._slot and not self.slot_lost.is_set() and not self._slot_in_flight:
            if now >= self._slot_locked_at + interval:
                self._slot_in_flight = True
                self._executor().submit(self._extend_slot, now)
            wake = min(wake, self._slot_locked_at + interval)
        return wake

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                deadline = self._deadline  # (a runner told to stop brings it forward)
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self.expire()  # again on each round: a task watched since is given back too
                wake = self._schedule(now)
                if deadline is not None and now < deadline:
                    wake = min(wake, deadline)
            except Exception:  # noqa: BLE001 - never let the heartbeat thread die
                logger.exception("heartbeat round failed")
                wake = time.monotonic() + self.interval / 2
            self._wake.wait(max(0.01, wake - time.monotonic()))
            self._wake.clear()
