"""The heartbeat: one thread per worker invocation that keeps its running tasks' leases alive
and enforces the handlers' deadline."""

from __future__ import annotations

import dataclasses
import threading
import time

from aws_lambda_powertools.metrics import MetricUnit

from coworker.config import Settings
from coworker.data.models import ErrorKind, utcnow
from coworker.engine import gates, lifecycle, slots
from coworker.engine.handlers import TaskContext
from coworker.engine.lifecycle import Claim, RecordOutcome
from coworker.engine.outcomes import OUTCOME_METRIC, TaskReport, outcome_of
from coworker.observability import MetricName, logger, metrics


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
            if not slots.extend(self._slot, self._token or "", settings.effective_lock_seconds):
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
                extended = ((not task.claim.groups or gates.extend(task.claim, settings, now))
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
            self.expired.append(TaskReport(claim.key, outcome_of(task.outcome), claim.attempt,
                                           time.monotonic() - task.started))
            metrics.add_metric(name=OUTCOME_METRIC[task.outcome], unit=MetricUnit.Count, value=1)

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
