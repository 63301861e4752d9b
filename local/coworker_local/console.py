"""A web console for the local table: dynamodb-admin, the DynamoDB console's local stand-in.

On AWS people inspect tasks in the DynamoDB console; locally ``--console`` starts dynamodb-admin
(the npm package pinned in package.json, installed by ``scripts/bootstrap.sh`` with DynamoDB Local)
against the runtime's embedded database. It is bound to 127.0.0.1 whatever ``--host`` says (it has
no credentials to check, and it can change and delete items), and it stops with the runtime: on
:meth:`TableConsole.stop`, at interpreter exit, and (on Linux) by the kernel when the process that
started it dies, as DynamoDB Local does.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import IO, Any

from coworker_local.database import FAKE_CREDENTIALS, free_port
from coworker_local.dynamodb_local import REPO_ROOT, _die_with_parent

# Where ``npm ci`` puts the pinned package's command.
NPM_BIN = REPO_ROOT / "node_modules" / ".bin" / "dynamodb-admin"
HOST = "127.0.0.1"
DEFAULT_PORT = 8001  # dynamodb-admin's own default
START_TIMEOUT_SECONDS = 60.0  # about 1 s on an idle machine: a ceiling, not a budget
INSTALL_HINT = ("the table console needs Node.js and the npm package dynamodb-admin (npm ci, run by "
                "scripts/bootstrap.sh)")


class ConsoleStartError(RuntimeError):
    """The console could not be started (the message says why and what to install)."""


def unavailable_reason() -> str | None:
    """Why the console cannot run here (``None`` when it can)."""
    if not NPM_BIN.exists():
        return f"dynamodb-admin is not installed ({INSTALL_HINT})"
    if shutil.which("node") is None:
        return f"node was not found ({INSTALL_HINT})"
    return None


class TableConsole:
    """dynamodb-admin on ``127.0.0.1:port`` (``port`` 0: a free one), showing ``endpoint``'s tables."""

    def __init__(self, endpoint: str, port: int = DEFAULT_PORT, log: IO[bytes] | None = None) -> None:
        self.endpoint = endpoint
        self.port = port or free_port(HOST)
        self._log = log
        self._process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def command(self) -> list[str]:
        reason = unavailable_reason()
        if reason:
            raise ConsoleStartError(reason)
        return [str(NPM_BIN), "--host", HOST, "--port", str(self.port), "--dynamo-endpoint", self.endpoint,
                "--skip-default-credentials"]

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> TableConsole:
        """Start dynamodb-admin and return once it answers."""
        command = self.command()
        # The runtime's own fake credentials and region (DynamoDB Local runs with -sharedDb, moto
        # keeps one account: either way the console sees the runtime's table).
        environ = {**os.environ, **FAKE_CREDENTIALS, "AWS_REGION": FAKE_CREDENTIALS["AWS_DEFAULT_REGION"]}
        self._output = self._log or tempfile.TemporaryFile(prefix="dynamodb-admin-")
        self._process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=self._output, stderr=subprocess.STDOUT, env=environ,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,  # noqa: PLW1509
        )
        atexit.register(self.stop)
        try:
            self._wait_until_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        assert self._process is not None
        while True:
            if self._process.poll() is not None:
                raise ConsoleStartError(f"dynamodb-admin exited with code {self._process.returncode}:\n"
                                        f"{self._tail()}")
            try:
                with urllib.request.urlopen(self.url, timeout=5):
                    return
            except (urllib.error.URLError, OSError):  # not listening yet
                if time.monotonic() > end:
                    raise ConsoleStartError(f"dynamodb-admin did not answer on {self.url} within "
                                            f"{timeout:.0f} s:\n{self._tail()}") from None
                time.sleep(0.1)

    def _tail(self, size: int = 4000) -> str:
        if self._output is None or self._log is not None:
            return "(output in the log file)"
        self._output.seek(0)
        return self._output.read().decode(errors="replace")[-size:]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop dynamodb-admin (SIGTERM, then SIGKILL); idempotent."""
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

    def __enter__(self) -> TableConsole:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

