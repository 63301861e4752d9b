"""A web console for the local table: dynamodb-admin, the DynamoDB console's local stand-in.

On AWS people inspect tasks in the DynamoDB console; locally ``--console`` starts dynamodb-admin
(the npm package pinned in package.json, installed by ``scripts/bootstrap.sh`` with DynamoDB Local)
against the runtime's embedded database. It is bound to 127.0.0.1 whatever ``--host`` says (it has
no credentials to check, and it can change and delete items), and it stops with the runtime: on
:meth:`TableConsole.stop`, at interpreter exit, and (on Linux) by the kernel when the process that
started it dies, as DynamoDB Local does.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
from typing import IO

from coworker_local.child_server import ChildServer
from coworker_local.database import FAKE_CREDENTIALS, free_port
from coworker_local.dynamodb_local import REPO_ROOT

# Where ``npm ci`` puts the pinned package's command.
NPM_BIN = REPO_ROOT / "node_modules" / ".bin" / "dynamodb-admin"
HOST = "127.0.0.1"
DEFAULT_PORT = 8001  # dynamodb-admin's own default
START_TIMEOUT_SECONDS = 180.0  # about 1 s on an idle machine, over 60 s at load 10: a ceiling, not a budget
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


class TableConsole(ChildServer):
    """dynamodb-admin on ``127.0.0.1:port`` (``port`` 0: a free one), showing ``endpoint``'s tables."""

    label = "dynamodb-admin"
    start_error = ConsoleStartError

    def __init__(self, endpoint: str, port: int = DEFAULT_PORT, log: IO[bytes] | None = None) -> None:
        super().__init__(log)
        self.endpoint = endpoint
        self.port = port or free_port(HOST)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        reason = unavailable_reason()
        if reason:
            raise ConsoleStartError(reason)
        return [str(NPM_BIN), "--host", HOST, "--port", str(self.port), "--dynamo-endpoint", self.endpoint,
                "--skip-default-credentials"]

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> TableConsole:
        """Start dynamodb-admin and return once it answers."""
        # The runtime's own fake credentials and region (DynamoDB Local runs with -sharedDb, moto
        # keeps one account: either way the console sees the runtime's table).
        environ = {**os.environ, **FAKE_CREDENTIALS, "AWS_REGION": FAKE_CREDENTIALS["AWS_DEFAULT_REGION"]}
        self._launch(self.command(), self._answers, timeout, env=environ)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=5):
                return True
        except (urllib.error.URLError, OSError):  # not listening yet
            return False
