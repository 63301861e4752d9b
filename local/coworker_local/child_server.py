"""A server process the local runtime starts and stops: DynamoDB Local, the table console.

It writes its output to a log (or a temporary file, read back when it fails to start), is
stopped on :meth:`ChildServer.stop`, at interpreter exit, and (on Linux) by the kernel when the
process that started it dies, however that happens.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any, Self


def die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it when its parent dies (any way)."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class ChildServer:
    """One server child process; subclasses say how it is started and when it answers.

    ``label`` names it in messages; ``start_error`` is what a failed start raises.
    """

    label = "the server"
    start_error: type[Exception] = RuntimeError

    def __init__(self, log: IO[bytes] | None = None) -> None:
        self._log = log
        self._process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None
        self._exited_early = False  # the last start failed because the process exited

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def _launch(self, command: list[str], answers: Callable[[], bool], timeout: float, **popen: Any) -> None:
        """Start ``command`` and return once ``answers()`` is true; stopped again if it is not
        by ``timeout`` (seconds), or if it exits first (``start_error``, with its output)."""
        self._exited_early = False
        self._output = self._log or tempfile.TemporaryFile(prefix=f"{self.label.replace(' ', '-')}-")
        self._process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self._output, stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
            **popen,
        )
        atexit.register(self.stop)
        try:
            self._wait_until_ready(answers, timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self, answers: Callable[[], bool], timeout: float) -> None:
        end = time.monotonic() + timeout
        assert self._process is not None
        while True:
            if self._process.poll() is not None:
                self._exited_early = True
                raise self.start_error(f"{self.label} exited with code {self._process.returncode}:\n{self._tail()}")
            if answers():
                return
            if time.monotonic() > end:
                raise self.start_error(f"{self.label} did not answer within {timeout:.0f} s:\n{self._tail()}")
            time.sleep(0.1)

    def _tail(self, size: int = 4000) -> str:
        if self._output is None or self._log is not None:
            return "(output in the log file)"
        self._output.seek(0)
        return self._output.read().decode(errors="replace")[-size:]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop it (SIGTERM, then SIGKILL); idempotent."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._output is not None and self._log is None:
            self._output.close()
        self._output = None
        atexit.unregister(self.stop)

    def start(self) -> Self:
        """Start it and return once it answers (subclasses take a timeout too)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
