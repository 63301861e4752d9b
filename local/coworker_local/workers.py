"""A worker pool standing in for Lambda: each invocation runs in its own operating-system process.

Lambda, as far as Coworker's guarantees go, is modelled like this:

======================  ===================================================================
Lambda                  here
======================  ===================================================================
async ``Invoke``        :meth:`ProcessWorkerPool.invoke` queues the event and returns at once
                        (:mod:`coworker_local.lambda_service` serves it over Lambda's HTTP API)
reserved concurrency    at most ``max_invocations`` invocations run at once (the worker slots);
                        the rest wait, as throttled async events wait in Lambda's queue
execution environment   a ``python -m coworker_local.workers`` process, reused by later
                        invocations (warm start) and replaced after a kill (cold start)
provisioned concurrency ``prewarm`` environments started with the pool, so the first
                        invocations do not wait for a cold start
function timeout        the process is SIGKILLed ``worker_timeout_seconds`` after the
                        invocation started; the worker's own deadline is the same, so its
                        graceful timeout (``timeout_margin_seconds``) records first
environment variables   the process gets ``Settings.as_environment()`` and nothing else of ours
======================  ===================================================================

One environment runs one invocation at a time, as on Lambda. An environment whose handler threads
are still running after the invocation (a task that timed out cannot be stopped) is retired, as
Lambda would freeze and eventually discard it.

Protocol (JSON lines over the child's stdin and original stdout; the child points its own
stdout at stderr so logs cannot corrupt it)::

    child  -> parent  {"ready": <pid>}                    once, after start-up (the init phase)
    parent -> child   {"owner": "...", "event": {"keys": [...], "slot": ..., "token": ...}, "timeout": 30}
    child  -> parent  {"reports": [[key, outcome, attempt, seconds, source], ...], "retire": false}

On SIGTERM (the runtime is shutting down) the child records every task it holds as failed,
kind ``timeout`` ("interrupted"), releasing the locks and its slot, then exits: nothing is left
half-written.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from coworker.engine.outcomes import TaskReport
from coworker.engine.worker import WorkerRequest

from coworker_local.environments import (
    INIT_TIMEOUT_SECONDS,
    Environment,
    child_environment,
    reply_channel,
    terminate_with_parent,
)

# The pool kills an environment this long after the worker's own deadline: the child measures
# its deadline from when it reads the request, a moment after the parent sent it.
KILL_GRACE_SECONDS = 0.5
# How long a SIGTERMed environment gets to record its tasks as interrupted.
TERM_GRACE_SECONDS = 5.0
SERIES_SECONDS = 600


@dataclasses.dataclass
class Invocation:
    """One worker invocation, as the pool tracks it (shown on the debug endpoint)."""

    seq: int
    owner: str
    event: dict[str, Any]
    queued_at: float
    started_at: float | None = None
    finished_at: float | None = None
    pid: int | None = None
    cold_start: bool = False
    result: str = "queued"  # queued | running | ok | timeout-killed | crashed | interrupted | dropped
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        now = time.time()
        return {
            "seq": self.seq,
            "owner": self.owner,
            "keys": self.event.get("keys", []),
            "slot": self.event.get("slot"),
            "pid": self.pid,
            "cold_start": self.cold_start,
            "result": self.result,
            "queued_seconds": round((self.started_at or now) - self.queued_at, 3),
            "running_seconds": (round((self.finished_at or now) - self.started_at, 3)
                                if self.started_at else None),
            "outcomes": self.outcomes,
        }


class ProcessWorkerPool:
    """An :class:`coworker.engine.dispatch.Invoker` whose invocations run in worker processes."""

    def __init__(
        self,
        environ: Mapping[str, str],
        timeout_seconds: float,
        max_invocations: int,
        log: IO[Any] | int = subprocess.DEVNULL,
        python: str = sys.executable,
        history: int = 200,
        prewarm: int = 0,
    ) -> None:
        self._environ = child_environment(environ)
        self.timeout_seconds = timeout_seconds
        self.max_invocations = max_invocations
        self._log = log
        self._command = [python, "-m", "coworker_local.workers"]
        # The executor's queue plays Lambda's async event queue; its threads are the gates.
        self._executor = ThreadPoolExecutor(max_workers=max_invocations, thread_name_prefix="invocation")
        self._lock = threading.Lock()
        self._idle: list[Environment] = []
        self._busy: dict[int, tuple[Invocation, Environment]] = {}
        self._seq = itertools.count(1)
        self._run_id = uuid.uuid4().hex[:6]
        self._recent: collections.deque[Invocation] = collections.deque(maxlen=history)
        self._series: dict[int, collections.Counter[str]] = {}
        self.outcomes: collections.Counter[str] = collections.Counter()  # per task, from the replies
        # hint: keys handed to the invocation; feed: keys the worker found itself
        self.outcomes_by_source: collections.defaultdict[str, collections.Counter[str]] = (
            collections.defaultdict(collections.Counter))
        self._stopping = False
        self.counts: collections.Counter[str] = collections.Counter()
        if prewarm:
            threading.Thread(target=self._prewarm, args=(min(prewarm, max_invocations),),
                             name="prewarm", daemon=True).start()

    def _prewarm(self, count: int) -> None:
        """Start ``count`` environments together and keep them idle (like provisioned concurrency)."""
        starting = [Environment(self._command, self._environ, self._log) for _ in range(count)]
        deadline = time.monotonic() + INIT_TIMEOUT_SECONDS
        for environment in starting:
            if not environment.wait_ready(deadline):
                continue
            with self._lock:
                keep = not self._stopping
                if keep:
                    self._idle.append(environment)
                    self.counts["prewarmed"] += 1
            if not keep:
                environment.close(wait=1.0)

    # -- Invoker protocol ------------------------------------------------------------------

    def invoke(self, event: Mapping[str, Any] | WorkerRequest) -> None:
        """Queue one invocation of ``event`` and return at once (Lambda's ``Event`` invoke)."""
        if isinstance(event, WorkerRequest):
            event = event.to_event()
        with self._lock:
            if self._stopping:
                self.counts["dropped"] += 1
                return
            seq = next(self._seq)
            invocation = Invocation(seq=seq, owner=f"local-{self._run_id}-{seq}", event=dict(event),
                                    queued_at=time.time())
            self.counts["invoked"] += 1
            self._recent.append(invocation)
        self._executor.submit(self._run, invocation)

    # -- running one invocation ------------------------------------------------------------

    def _take_environment(self, invocation: Invocation) -> Environment | None:
        """A warm environment, or a new one once its init phase is over (``None`` if it failed)."""
        with self._lock:
            while self._idle:
                environment = self._idle.pop()
                if environment.alive():
                    return environment
        invocation.cold_start = True
        self.counts["cold_starts"] += 1
        environment = Environment(self._command, self._environ, self._log)
        return environment if environment.wait_ready(time.monotonic() + INIT_TIMEOUT_SECONDS) else None

    def _run(self, invocation: Invocation) -> None:
        if self._stopping:
            invocation.result = "dropped"
            return
        environment = self._take_environment(invocation)
        if environment is None:
            invocation.result = "init-failed"
            self.counts["init-failed"] += 1
            return
        invocation.pid = environment.pid
        invocation.started_at = time.time()
        invocation.result = "running"
        with self._lock:
            self._busy[invocation.seq] = (invocation, environment)
        keep = False
        try:
            environment.send({"owner": invocation.owner, "event": invocation.event,
                              "timeout": self.timeout_seconds})
            deadline = time.monotonic() + self.timeout_seconds + KILL_GRACE_SECONDS
            # Outcomes arrive one by one as tasks end, then the invocation's end with any left.
            while (reply := environment.read_reply(deadline)) is not None and "report" in reply:
                self._record_reports(invocation, [reply["report"]])
        except TimeoutError:
            # Lambda's hard timeout: the environment is killed whatever it was doing.
            environment.signal(signal.SIGKILL)
            invocation.result = "timeout-killed"
        except (BrokenPipeError, OSError):
            invocation.result = "crashed"
        else:
            if reply is None:
                code = environment.process.wait()
                invocation.result = "interrupted" if code == -signal.SIGTERM or code == 143 else "crashed"
            else:
                invocation.result = "ok"
                self._record_reports(invocation, reply["reports"])
                keep = not reply.get("retire")
        finally:
            invocation.finished_at = time.time()
            self.counts[invocation.result] += 1
            with self._lock:
                self._busy.pop(invocation.seq, None)
                if keep and not self._stopping:
                    self._idle.append(environment)
                    environment = None  # type: ignore[assignment]
            if environment is not None:
                environment.close(wait=0.5)

    def _record_reports(self, invocation: Invocation, reports: Sequence[Sequence[Any]]) -> None:
        invocation.outcomes.update({key: outcome for key, outcome, *_ in reports})
        self._count_outcomes([outcome for _key, outcome, *_ in reports], [source for *_, source in reports])

    def _count_outcomes(self, outcomes: Sequence[str], sources: Sequence[str]) -> None:
        second = int(time.time())
        with self._lock:
            bucket = self._series.setdefault(second, collections.Counter())
            for outcome, source in zip(outcomes, sources, strict=True):
                self.outcomes[outcome] += 1
                self.outcomes_by_source[source][outcome] += 1
                bucket[outcome] += 1
            for old in [s for s in self._series if s < second - SERIES_SECONDS]:
                del self._series[old]

    # -- observation and shutdown ----------------------------------------------------------

    def series(self, outcomes: Sequence[str] = ("finished", "failed", "ignored")) -> list[list[int]]:
        """Per-second counts of task outcomes over the last minutes: ``[[epoch, n1, n2...], ...]``."""
        with self._lock:
            return [[second, *(bucket.get(name, 0) for name in outcomes)]
                    for second, bucket in sorted(self._series.items())]

    def running(self) -> list[dict[str, Any]]:
        """Invocations in flight, with the pid of the process running each."""
        with self._lock:
            return [invocation.to_dict() for invocation, _ in self._busy.values()]

    def recent(self, limit: int = 50) -> list[dict[str, Any]]:
        with self._lock:
            return [invocation.to_dict() for invocation in list(self._recent)[-limit:]][::-1]

    def pids(self) -> list[int]:
        """Process ids of the environments alive, idle or running an invocation."""
        with self._lock:
            return [environment.pid for environment in [*self._idle, *(e for _, e in self._busy.values())]
                    if environment.alive()]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            running = len(self._busy)
            idle = len(self._idle)
        counts = dict(self.counts)
        ended = sum(counts.get(k, 0)
                    for k in ("ok", "timeout-killed", "crashed", "interrupted", "init-failed"))
        queued = counts.get("invoked", 0) - ended - running
        return {"running": running, "idle_environments": idle, "queued": max(queued, 0),
                "max_invocations": self.max_invocations, **counts,
                "task_outcomes": dict(self.outcomes),
                "task_outcomes_by_source": {k: dict(v) for k, v in self.outcomes_by_source.items()}}

    def shutdown(self, drain_seconds: float = 5.0) -> None:
        """Stop: drop queued invocations, let running ones finish for ``drain_seconds``, then
        SIGTERM them (they record their tasks as interrupted), then SIGKILL what is left."""
        with self._lock:
            self._stopping = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        for phase, grace in ((None, drain_seconds), (signal.SIGTERM, TERM_GRACE_SECONDS),
                             (signal.SIGKILL, 2.0)):
            with self._lock:
                busy = [environment for _, environment in self._busy.values()]
            if not busy:
                break
            if phase is not None:
                for environment in busy:
                    environment.signal(phase)
            end = time.monotonic() + grace
            while time.monotonic() < end:
                with self._lock:
                    if not self._busy:
                        break
                time.sleep(0.05)
        self._executor.shutdown(wait=True)
        with self._lock:
            idle, self._idle = self._idle, []
        # EOF to all first, so the idle processes exit together rather than one after another.
        for environment in idle:
            environment.end_input()
        for environment in idle:
            environment.close()


# -- the child process -------------------------------------------------------------------------


def _interrupt(invocation: Any) -> int:
    """Record the tasks ``invocation`` holds as failed (interrupted), release their locks, their
    places in concurrency groups and its slot.

    Each write is fenced by (owner, attempt), like any outcome, so a handler that finishes at the
    same moment either records first (and this write is refused) or is refused itself.
    """
    from coworker.data.models import ErrorKind, utcnow
    from coworker.engine import gates, lifecycle, slots

    recorded = 0
    for claim in invocation.held():
        error = lifecycle.error_record(
            claim.attempt, ErrorKind.TIMEOUT,
            "interrupted: the local runtime stopped (SIGTERM) before the task finished", utcnow())
        if lifecycle.fail(claim, invocation.settings, error) is not lifecycle.RecordOutcome.LOST:
            recorded += 1
        gates.leave(claim)  # its places in concurrency groups, if any
    request = invocation.request
    if request.slot:
        slots.release(request.slot, request.token or "")
    return recorded


_CURRENT: Any = None


def _on_sigterm(signum: int, frame: Any) -> None:
    current = _CURRENT
    if current is not None:
        from coworker.observability import logger

        recorded = _interrupt(current)
        logger.warning("worker interrupted by SIGTERM", extra={"owner": current.owner, "recorded": recorded})
    sys.stderr.flush()
    os._exit(143)


def _report_fields(report: TaskReport) -> list[Any]:
    return [report.key, report.outcome.value, report.attempt, round(report.seconds, 3), report.source.value]


def child_main() -> None:
    """Entry point of a worker process: serve invocations read from stdin until EOF."""
    global _CURRENT
    replies = reply_channel()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    signal.signal(signal.SIGTERM, _on_sigterm)
    terminate_with_parent()

    from coworker.bootstrap import configure
    from coworker.engine.worker import Invocation as WorkerInvocation
    from coworker.observability import logger, metrics

    settings = configure()
    replies.write(json.dumps({"ready": os.getpid()}) + "\n")
    baseline = threading.active_count()
    write_lock = threading.Lock()
    for line in sys.stdin:
        message = json.loads(line)
        deadline = time.monotonic() + float(message["timeout"])
        reports = []
        sent: set[int] = set()

        def send_report(report: TaskReport, sent: set[int] = sent) -> None:
            """Each outcome as it happens, so the runtime counts it then, not at the invocation's end."""
            with write_lock:
                replies.write(json.dumps({"report": _report_fields(report)}) + "\n")
                sent.add(id(report))

        try:
            request = WorkerRequest.from_event(message["event"])
            _CURRENT = WorkerInvocation(request, message["owner"], settings, deadline, on_report=send_report)
            reports = _CURRENT.run()
        except Exception:  # noqa: BLE001 - as on Lambda: the invocation fails, the process lives
            logger.exception("worker invocation failed")
        finally:
            _CURRENT = None
            # Lambda flushes metrics at the end of each invocation (to the log, as EMF lines).
            metrics.flush_metrics()
            metrics.clear_metrics()
        # A timed-out handler's thread is still running: retire this environment.
        retire = threading.active_count() > baseline
        with write_lock:  # the outcomes not sent yet (timeouts the heartbeat recorded), and the end
            replies.write(json.dumps({
                "reports": [_report_fields(r) for r in reports if id(r) not in sent],
                "retire": retire,
            }) + "\n")
        if retire:
            break


if __name__ == "__main__":
    child_main()
