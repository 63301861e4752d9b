"""End-to-end fixtures: the local runtime (``python -m coworker_local``) as a real subprocess,
reached only over HTTP, like a user would."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_PATTERN = re.compile(r"API\s+(http://\S+)")
START_TIMEOUT = 180  # a ceiling on the wait for the "API" line, not a budget: start-up takes seconds

# Short clocks so failures, retries, timeouts and lost workers all happen within seconds.
FAST_SETTINGS = {
    "COWORKER_TICK_SECONDS": "0.5",
    "COWORKER_BACKOFF_BASE_SECONDS": "0.2",
    "COWORKER_BACKOFF_MAX_SECONDS": "0.5",
    "COWORKER_WORKER_TIMEOUT_SECONDS": "8",
    "COWORKER_TIMEOUT_MARGIN_SECONDS": "2",
    "COWORKER_LOCK_SECONDS": "10",
    "COWORKER_MAX_CONCURRENCY": "20",
    "COWORKER_BATCH_SIZE": "5",
}


class LocalRuntimeProcess:
    """A running ``python -m coworker_local``; its output is collected in :attr:`output`."""

    def __init__(self, args: list[str], env: dict[str, str], log_file: Path, **popen: Any) -> None:
        self.log_file = log_file
        self.process = subprocess.Popen(
            [sys.executable, "-m", "coworker_local", "--api-port", "0", "--log-file", str(log_file), *args],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own process group, so a test can kill it with its children
            **popen,
        )
        self.output: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(START_TIMEOUT) or self.url is None:
            self.kill_group()  # the database and workers it started too
            raise RuntimeError("the local runtime did not start:\n" + "".join(self.output))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            match = READY_PATTERN.search(line)
            if match and self.url is None:
                self.url = match.group(1)
                self._ready.set()
        self._ready.set()

    def get(self, path: str, **kwargs) -> requests.Response:
        return requests.get(self.url + path, timeout=30, **kwargs)

    def post(self, path: str, **kwargs) -> requests.Response:
        return requests.post(self.url + path, timeout=30, **kwargs)

    def task(self, key: str) -> dict:
        response = self.get(f"/tasks/{key}")
        response.raise_for_status()
        return response.json()

    def wait_for(self, predicate, timeout: float, what: str, interval: float = 0.2):
        """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
        end = time.monotonic() + timeout
        last = None
        while time.monotonic() < end:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        pytest.fail(f"timed out after {timeout} s waiting for {what}; last seen: {last!r}")

    def wait_batch_done(self, batch_id: str, timeout: float = 60) -> dict:
        return self.wait_for(lambda: (b := self.get(f"/batches/{batch_id}").json()).get("done") and b,
                             timeout, f"batch {batch_id} to be done")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> int:
        """Stop like Ctrl-C does; return the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill_group()
                pytest.fail(f"the local runtime did not stop within {timeout} s:\n{self.text()}")
        return self.process.returncode

    def kill_group(self) -> None:
        """SIGKILL the runtime and every process of its group (database; workers have sessions of
        their own, and end when the runtime is gone): a power cut."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def text(self) -> str:
        return "".join(self.output)


def runtime_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COWORKER_")}
    env.update(FAST_SETTINGS)
    env.update(overrides)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT / "layers" / "coworker" / "python"), str(REPO_ROOT / "local"), str(REPO_ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


# Flags with which a runtime chooses or keeps its own database: such a runtime starts its own.
_OWN_DATABASE_FLAGS = ("--db", "--data-dir", "--dynamodb-endpoint")


@contextlib.contextmanager
def _runtimes(tmp_path_factory, database) -> Iterator:
    """A ``start(*args, own_database=False, **env)`` for local runtimes; every one started is
    stopped on leaving.

    A runtime is pointed at the session's DynamoDB Local (``database``), on a table of its own,
    unless ``own_database`` or its flags say otherwise: a runtime's own DynamoDB Local is a JVM
    that costs several CPU-seconds to start and more to warm up, which a test of the runtime's
    work does not need. The runtime's own database (the default for users) has its own tests,
    which pass ``own_database=True``.
    """
    started: list[LocalRuntimeProcess] = []

    def start(*args: str, own_database: bool = False, **env: str) -> LocalRuntimeProcess:
        log = tmp_path_factory.mktemp("local") / "coworker.log"
        if not own_database and not any(flag in args for flag in _OWN_DATABASE_FLAGS):
            table = f"coworker-e2e-{uuid.uuid4().hex[:12]}"
            args = (*args, "--dynamodb-endpoint", database.endpoint, "--table-name", table)
        runtime = LocalRuntimeProcess(list(args), runtime_env(**env), log)
        started.append(runtime)
        return runtime

    yield start
    failures = []
    for runtime in started:
        try:
            runtime.stop()
        except BaseException as exc:  # noqa: BLE001 - every runtime is stopped, whatever one did
            failures.append(exc)
        finally:
            runtime.kill_group()  # anything of its group still running (a no-op after a clean stop)
    if failures:
        raise failures[0]


@pytest.fixture
def start_runtime(tmp_path_factory, dynamodb_local_server) -> Iterator:
    """Start local runtimes (``start_runtime("--no-demo", COWORKER_X="1")``); all stopped at the
    end of the test (an idle runtime still ticks, with its database and workers: left running
    to the end of the module, a file's runtimes took a core between them)."""
    with _runtimes(tmp_path_factory, dynamodb_local_server) as start:
        yield start


@pytest.fixture(scope="module")
def start_module_runtime(tmp_path_factory, dynamodb_local_kept) -> Iterator:
    """Start local runtimes shared by the tests of a module; all stopped at the end of the module."""
    with _runtimes(tmp_path_factory, dynamodb_local_kept) as start:
        yield start


@pytest.fixture(scope="module")
def runtime(start_module_runtime) -> LocalRuntimeProcess:
    """One runtime with no demo, shared by the tests of a module."""
    return start_module_runtime("--no-demo")


@pytest.fixture
def run_local():
    """Run ``python -m coworker_local`` with the given arguments to completion (for what exits at once)."""

    def run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "coworker_local", *args], env=runtime_env(**env),
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)

    return run
