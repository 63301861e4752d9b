"""The container runner: one ECS Fargate task (a runner process locally) that runs the container
runner's task types, with the same claim, heartbeat, fencing and record writes as a Lambda worker.

The coordinator starts it with RunTask, its request (a reserved runner slot, the slot's token and
keys of due container work) in its environment (:class:`~coworker.engine.runners.RunnerRequest`).
It acquires the slot, runs ``runner_threads`` tasks at a time, its hints first, then feeds itself
on due container work (:class:`RunnerFeeder`) until none is due, then releases the slot and
exits: no always-on service, no idle cost. It has no deadline of its own: each task must end by
its own time limit (the heartbeat records it as timed out then), and a task without one runs
until its handler returns.

Stopped by ECS (SIGTERM, ``runner_stop_seconds`` before SIGKILL), it takes no more work; its
handlers may finish until shortly before the SIGKILL, and one still running then is recorded as
timed out ("the runner was stopped") and retried, as a Lambda worker's at its deadline. A runner
killed outright leaves its tasks' locks to lapse: the tasks run again after ``lock_seconds``.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from coworker.bootstrap import configure
from coworker.config import Settings
from coworker.data.models import utcnow
from coworker.engine import control, runners, slots
from coworker.engine.feeder import Feeder
from coworker.engine.outcomes import TaskReport, TaskSource
from coworker.engine.runners import RunnerRequest
from coworker.engine.worker import Invocation, WorkerRequest
from coworker.errors import InvalidEventError
from coworker.observability import logger, publish_metrics

STOPPED_REASON = "did not finish before its runner was stopped (SIGTERM)"


# Looks for more work a runner makes after each of its tasks ends before it may exit: the task's
# follow-ups are due at once, and the index may show them a moment late.
LOOKS_AFTER_A_TASK = 2


class RunnerFeeder(Feeder):
    """Feeds a runner the due work of the container runner's types: lost by dead runners first,
    then due retries, then new tasks (a filtered read of the status index, see
    :func:`coworker.engine.runners.due_container_work`). It ends when none is due: when a look
    finds nothing and, since the last of its tasks ended, :data:`LOOKS_AFTER_A_TASK` looks did."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held = threading.local()  # whether the calling thread ran a task since it last asked
        self._looks_left = 0

    def next(self) -> tuple[str, TaskSource] | None:
        if getattr(self._held, "task", False):
            self._held.task = False  # (the base class's next() calls this one again while it waits)
            with self._cond:
                self._looks_left = LOOKS_AFTER_A_TASK  # its follow-ups, or its retry, may be due now
                self._exhausted = False
        item = super().next()
        self._held.task = item is not None
        return item

    def _fetch(self) -> list[str]:
        settings = self._settings
        view = control.cached(settings.control_cache_seconds)
        keys = runners.due_container_work(settings, view, utcnow(), self._window, skip=self._seen, read_lost=True)
        self.pages += 1
        self._looks_left = max(0, self._looks_left - 1)
        self._fresh_elsewhere = not keys and self._looks_left > 0  # (look again after the pause)
        self._seen.update(keys)
        return keys


class Runner(Invocation):
    """A container runner: an invocation with no deadline, on the container runner's types."""

    def __init__(self, request: RunnerRequest, owner: str, settings: Settings) -> None:
        super().__init__(WorkerRequest(request.keys, request.slot, request.token), owner, settings, math.inf,
                         runner="container")

    def _threads(self) -> int:
        return self.settings.runner_threads

    def _feeder(self, threads: int) -> Feeder:
        return RunnerFeeder(self.settings, self.request.keys, self_feed=True, feed_until=math.inf,
                            stop=self.stopping, window=threads)

    def stop_soon(self) -> None:
        """ECS is stopping this runner: its handlers have until shortly before the SIGKILL."""
        grace = max(1.0, self.settings.runner_stop_seconds - self.settings.timeout_margin_seconds)
        logger.warning("runner told to stop: taking no more work", extra={"grace_seconds": grace})
        self.stop_by(time.monotonic() + grace, STOPPED_REASON)


def run_runner(request: RunnerRequest, owner: str, settings: Settings) -> list[TaskReport]:
    """Run one container runner to its end (tests and tools; :func:`main` is the container's)."""
    return Runner(request, owner, settings).run()


class InProcessLauncher:
    """Test launcher: each runner runs :func:`run_runner` on a thread of this process."""

    def __init__(self, settings: Settings, owner_prefix: str = "local-runner") -> None:
        self._settings = settings
        self._pool = ThreadPoolExecutor(max_workers=max(1, settings.max_runners), thread_name_prefix="runner")
        self._owner_prefix = owner_prefix
        self._lock = threading.Lock()
        self.requests: list[RunnerRequest] = []
        self.futures: list[Future[list[TaskReport]]] = []

    def launch(self, request: RunnerRequest) -> None:
        with self._lock:
            self.requests.append(request)
            owner = f"{self._owner_prefix}-{len(self.requests)}"
            self.futures.append(self._pool.submit(run_runner, request, owner, self._settings))

    def wait(self) -> list[TaskReport]:
        """Wait for every runner so far; return their reports."""
        with self._lock:
            futures, self.futures = self.futures, []
        return [report for future in futures for report in future.result()]

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def main(environ: Mapping[str, str] | None = None) -> int:
    """The container's entry point: read the settings and the start request from the environment,
    run until no container work is due (or SIGTERM), publish the metrics; exit status 0, or 2 for
    a malformed start request."""
    environ = os.environ if environ is None else environ
    settings = configure()
    try:
        request = RunnerRequest.from_environment(environ)
    except InvalidEventError as exc:
        logger.error("runner not started", extra={"error": str(exc)})
        return 2
    owner = f"runner-{slots.slot_number(request.slot):04d}-{request.token[:8]}"
    logger.append_keys(runner=owner)
    runner = Runner(request, owner, settings)

    def on_sigterm(signum: int, frame: Any) -> None:
        runner.stop_soon()

    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.monotonic()
    reports = runner.run()
    outcomes: dict[str, int] = {}
    for report in reports:
        outcomes[report.outcome.value] = outcomes.get(report.outcome.value, 0) + 1
    logger.info("runner done", extra={"tasks": len(reports), "outcomes": outcomes,
                                      "seconds": round(time.monotonic() - started, 1)})
    publish_metrics()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
