"""Execution environments: the processes that stand in for Lambda's, shared by the worker pool
(:mod:`coworker_local.workers`) and the API's (:mod:`coworker_local.api_environments`).

An environment is a ``python -m <module>`` child that prints ``{"ready": <pid>}`` once its init
phase is over, then answers JSON lines read from its stdin with JSON lines on its original stdout
(the child points its own stdout at stderr, so logs cannot corrupt the replies).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import coworker

import coworker_local

# Lambda's init phase has its own limit (10 s), not counted in the function timeout; a busy
# laptop starting many Python processes at once needs more.
INIT_TIMEOUT_SECONDS = 60.0
# Where the two packages live: the library (the Lambda layer) and this local tooling.
PACKAGE_ROOTS = tuple(dict.fromkeys(str(Path(package.__path__[0]).resolve().parent)
                                   for package in (coworker, coworker_local)))


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with both packages, then its own and this process's ``PYTHONPATH``, importable."""
    merged = dict(environ)
    merged["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
        p for p in (*PACKAGE_ROOTS, *environ.get("PYTHONPATH", "").split(os.pathsep),
                    *os.environ.get("PYTHONPATH", "").split(os.pathsep)) if p
    ))
    return merged


class Environment:
    """One child process: sends requests, reads replies with a time limit."""

    def __init__(self, command: list[str], environ: Mapping[str, str], log: IO[Any] | int) -> None:
        # A new session: Ctrl-C in the terminal reaches the runtime only, which then stops the
        # environments in order (drain, SIGTERM, SIGKILL) instead of all dying mid-write.
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            env=dict(environ), start_new_session=True,
        )
        self._buffer = b""

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def read_reply(self, deadline: float) -> dict[str, Any] | None:
        """The child's reply, ``None`` if it exited first; :class:`TimeoutError` at ``deadline``."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        chunks = [self._buffer]  # joined once the line is whole: a reply may be megabytes
        while b"\n" not in chunks[-1]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._buffer = b"".join(chunks)
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._buffer = b"".join(chunks)
                return None
            chunks.append(chunk)
        line, self._buffer = b"".join(chunks).split(b"\n", 1)
        return json.loads(line)

    def wait_ready(self, deadline: float) -> bool:
        """Wait for the end of the init phase; an environment that fails it is killed (``False``)."""
        try:
            ready = self.read_reply(deadline)
        except TimeoutError:
            ready = None
        if ready and "ready" in ready:
            return True
        self.signal(signal.SIGKILL)
        self.close(wait=1.0)
        return False

    def signal(self, signum: int) -> None:
        try:
            self.process.send_signal(signum)
        except ProcessLookupError:
            pass

    def end_input(self) -> None:
        try:
            if self.process.stdin:
                self.process.stdin.close()
        except OSError:
            pass

    def close(self, wait: float = 2.0) -> None:
        """End an idle environment: EOF on stdin makes it exit; kill it if it does not."""
        self.end_input()
        try:
            self.process.wait(timeout=wait)
        except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
            self.process.kill()
            self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()


def reply_channel() -> IO[str]:
    """In the child: the original stdout, for replies; what is printed from now on (logs, EMF)
    goes to stderr."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return replies


def terminate_with_parent(interval: float = 0.5) -> None:
    """In the child: SIGTERM this process when the runtime that started it dies without stopping
    it, so an environment never outlives its runtime."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
