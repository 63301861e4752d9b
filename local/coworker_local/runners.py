"""Container runners on one machine: each runner the coordinator starts is a process of its own,
standing in for an ECS Fargate task.

============================  ================================================================
ECS Fargate                   here
============================  ================================================================
``RunTask`` (the coordinator) :meth:`ProcessRunnerLauncher.launch`: a ``python -m
                              coworker_local.runner_process`` process, the request in its
                              environment as the container's overrides carry it
the container's entry point   :func:`coworker.engine.runner.main`, the same as the image's
stop (SIGTERM, stop timeout)  :meth:`ProcessRunnerLauncher.shutdown`: SIGTERM, then SIGKILL after
                              ``runner_stop_seconds``
the task's logs               the runtime's log (stdout and stderr of the process)
============================  ================================================================

A runner exits by itself when no container work is due; it dies with the runtime (it watches
its parent's pid).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

from coworker.engine.runners import RunnerRequest

from coworker_local.environments import child_environment

# Runners kept in the dashboard's list after they exited.
RECENT_RUNNERS = 20


@dataclasses.dataclass
class RunnerProcess:
    request: RunnerRequest
    process: subprocess.Popen[bytes]
    started_at: float
    ended_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"slot": self.request.slot, "pid": self.process.pid, "hints": list(self.request.keys),
                "started_at": self.started_at, "exit_code": self.process.poll(),
                "seconds": round((self.ended_at or time.time()) - self.started_at, 1)}


class ProcessRunnerLauncher:
    """Starts container runners as local processes with ``environment`` (the settings, as the
    task definition's container environment carries them), each with its start request."""

    def __init__(self, environment: Mapping[str, str], stop_seconds: float,
                 log: IO[bytes] | IO[str] | int | None = None) -> None:
        self._environment = dict(environment)
        self._stop_seconds = stop_seconds
        self._log = log
        self._lock = threading.Lock()
        self._runners: list[RunnerProcess] = []
        self.started = 0

    def launch(self, request: RunnerRequest) -> None:
        environment = child_environment({**self._environment, **request.to_environment()})
        # A new session, as the worker environments: Ctrl-C reaches the runtime only, which then
        # stops the runners in order (SIGTERM, then SIGKILL).
        process = subprocess.Popen([sys.executable, "-m", "coworker_local.runner_process"], env=environment,
                                   stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                   start_new_session=True)
        with self._lock:
            self._runners.append(RunnerProcess(request, process, time.time()))
            self.started += 1

    def _reap(self) -> None:
        """Note the runners that exited; keep the latest few of them (call with the lock held)."""
        for runner in self._runners:
            if runner.ended_at is None and runner.process.poll() is not None:
                runner.ended_at = time.time()
        ended = [runner for runner in self._runners if runner.ended_at is not None]
        for runner in ended[:-RECENT_RUNNERS]:
            self._runners.remove(runner)

    def running(self) -> list[RunnerProcess]:
        with self._lock:
            self._reap()
            return [runner for runner in self._runners if runner.ended_at is None]

    def stats(self) -> dict[str, Any]:
        """Runners running and recently ended, for the dashboard."""
        with self._lock:
            self._reap()
            runners = [runner.to_dict() for runner in self._runners]
        return {"started": self.started, "running": sum(1 for r in runners if r["exit_code"] is None),
                "runners": runners}

    def kill(self, pid: int) -> None:
        """SIGKILL one runner (a test's stand-in for a Fargate task lost with its host)."""
        os.kill(pid, signal.SIGKILL)

    def shutdown(self) -> None:
        """Stop every runner as ECS stops a task: SIGTERM, then SIGKILL after the stop timeout."""
        running = self.running()
        for runner in running:
            runner.process.send_signal(signal.SIGTERM)
        until = time.monotonic() + self._stop_seconds
        for runner in running:
            try:
                runner.process.wait(timeout=max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                runner.process.kill()
                runner.process.wait()
