"""The upgrade rehearsal with work in flight (issue 51, item 6): the previous release's code and
HEAD's run side by side on one table, as they do while a deployment switches the functions over.

The released commit (the one ``tests/infra/released/`` snapshots) is exported from this clone and
its own local runtime (API, coordinator, worker processes) is started against the test's embedded
database, where it creates the table. Then:

1. the release's API takes a first wave of tasks and its workers run them; three *held* tasks
   wait in their handlers (on a gate file) so that they are in flight on the old code;
2. HEAD's local runtime starts on the same table (it adds what HEAD's layout needs: index,
   stream, shards) and the release's API takes a second wave, which both runtimes' workers share;
3. one old worker process holding a held task is killed (SIGKILL): its lock must expire and the
   task be taken over; the release's runtime is stopped (SIGTERM: no more ticks, its invocations
   drain) and the gate opens, so the other held tasks finish on the old code;
4. HEAD's runtime carries everything to an end.

Each handler run appends ``start`` and ``end`` lines (key, attempt, fencing token, pid, which
code) to a file opened with ``O_APPEND`` (one ``write`` per line: lines of concurrent processes
never interleave). The test then checks that every task ended terminal (finished, or ignored
where the handler fails every time), that none was lost, that both codes ran tasks, that the
killed task was taken over, and that no two runs of one task overlapped in time (a run killed
with its process ends at the kill; one without an end line on the old code ends, at the latest,
when the old runtime exited).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from coworker.bootstrap import configure
from coworker.config import Settings
from coworker.data import layout
from coworker.data.models import TaskModel
from coworker_local.database import FAKE_CREDENTIALS, EmbeddedDatabase, dynamodb_client

from scripts.released_template import MissingCommitError, export_tree, released_commit
from tests.support.waits import wait_until

HEAD_ROOT = Path(__file__).resolve().parents[2]
# What the release's local runtime imports: the library, the local tooling, the API function.
RELEASED_PATHS = ("functions", "layers", "local")
TASK_TYPE = "upgrade.step"
# The release's worker processes (its pool's reserved concurrency) of 2 threads each: after the
# first wave, a held task in each thread, so the release runs none of the second.
OLD_PROCESSES = 2
GATE_NAME = "gate"  # the held tasks' handlers return once this file exists
HELD = tuple(f"held-{n}" for n in range(OLD_PROCESSES * 2))
# Settings both runtimes run with (flags of ``python -m coworker_local`` in both versions): a
# short lock, so a killed holder's task is taken over within seconds; 3 worker slots of 2
# threads shared by both; a worker timeout far above the held tasks' wait, so no invocation is
# killed at its timeout.
RUNTIME_FLAGS = (
    "--no-demo", "--host", "127.0.0.1", "--api-port", "0", "--example-handlers", "false",
    "--lock-seconds", "4", "--reservation-seconds", "4", "--tick-seconds", "0.5",
    "--backoff-base-seconds", "0.2", "--backoff-max-seconds", "1", "--max-concurrency", "12", "--batch-size", "2",
    "--prewarm-workers", "1", "--worker-timeout-seconds", "300",
)
# The old runtime's drain on SIGTERM: its invocations end when they find nothing more to claim.
OLD_DRAIN_SECONDS = "240"

HANDLER_MODULE = '''
"""Handlers of the upgrade rehearsal: they run under either version's library."""

import json
import os
import time

import coworker
from coworker.engine.handlers import task_handler
from coworker.errors import TaskFailedError

RUN_LOG = {run_log!r}
GATE = {gate!r}
CODE = os.path.dirname(os.path.abspath(coworker.__file__))


def _append(**fields):
    fd = os.open(RUN_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(fields) + "\\n").encode())
    finally:
        os.close(fd)


@task_handler({task_type!r})
def step(payload, context):
    run = dict(key=context.key, attempt=context.attempt, token=repr(context.fencing_token), pid=os.getpid(),
               code=CODE)
    _append(event="start", at=time.time(), **run)
    # A held task waits for the gate; every task stops early when told its claim is lost (its
    # lock could not be kept, or was taken over), as a handler should.
    until = time.monotonic() + (240 if payload.get("hold") else payload.get("seconds", 0))
    while time.monotonic() < until and not context.claim_lost():
        if payload.get("hold") and os.path.exists(GATE):
            break
        context.lost.wait(0.05)
    lost_at = time.time() if context.claim_lost() else None
    fail = payload.get("fail")
    failed = fail == "always" or (fail == "once" and context.attempt == 1)
    _append(event="end", at=time.time(), failed=failed, lost_at=lost_at, **run)
    if failed:
        raise TaskFailedError("fails as planned")
    return {{"ok": True}}
'''


@dataclasses.dataclass
class Run:
    """One handler run, from its log lines."""

    key: str
    attempt: int
    token: str
    pid: int
    code: str
    start: float
    end: float | None = None
    failed: bool | None = None
    lost_at: float | None = None  # when the handler saw it was told its claim was lost


@pytest.fixture(scope="module")
def released_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's code, exported from this clone."""
    commit = released_commit()
    try:
        return export_tree(commit, tmp_path_factory.mktemp(f"released-{commit}"), RELEASED_PATHS)
    except MissingCommitError as exc:
        pytest.fail(str(exc))  # a CI clone is a full clone: never skip the rehearsal silently


class Runtime:
    """``python -m coworker_local`` of one version, on the shared table, in its own session."""

    def __init__(self, name: str, code_root: Path, workdir: Path, database: EmbeddedDatabase, table: str,
                 handlers: Path, *flags: str) -> None:
        self.name = name
        self.output = workdir / f"{name}.out"
        self.log = workdir / f"{name}.log"
        environ = {name: value for name, value in os.environ.items()
                   if not name.startswith(("COWORKER_", "PYTHONPATH", "AWS_"))}
        environ.update(FAKE_CREDENTIALS)
        environ.update(POWERTOOLS_METRICS_DISABLED="true",
                       # Ahead of everything else on the path (the virtual environment's editable
                       # install points at another checkout): this version's library and tooling.
                       PYTHONPATH=os.pathsep.join([str(code_root / "layers" / "coworker" / "python"),
                                                   str(code_root / "local")]))
        command = [sys.executable, "-m", "coworker_local", *RUNTIME_FLAGS, "--dynamodb-endpoint", database.endpoint,
                   "--table-name", table, "--handlers", str(handlers), "--log-file", str(self.log), *flags]
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(command, cwd=workdir, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self.url = ""
        self.exited_at: float | None = None

    def wait_up(self) -> str:
        def up() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"the {self.name} runtime exited: {self.output.read_text()}")
            found = re.search(r"API\s+(http://127\.0\.0\.1:\d+)", self.output.read_text())
            self.url = found.group(1) if found else ""
            return bool(found)

        wait_until(up, f"the {self.name} runtime up", attempts=1200, pause=0.1)
        return self.url

    def submit(self, tasks: list[dict[str, Any]]) -> None:
        request = urllib.request.Request(self.url + "/tasks", data=json.dumps({"tasks": tasks}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            assert json.loads(response.read())["created"] == len(tasks)

    def stop(self, timeout: float = 120) -> None:
        """SIGTERM (the runtime stops its coordinator and drains its workers), then wait."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        finally:
            self.exited_at = time.time()
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


def quick(key: str, fail: str | None = None, attempts: int = 3) -> dict[str, Any]:
    return {"key": key, "type": TASK_TYPE, "payload": {"seconds": 0.4, "fail": fail}, "max_attempts": attempts}


def read_runs(run_log: Path) -> list[Run]:
    runs: dict[tuple[str, str, int], Run] = {}
    if not run_log.exists():
        return []
    for line in run_log.read_text().splitlines():
        entry = json.loads(line)
        ident = (entry["key"], entry["token"], entry["pid"])
        if entry["event"] == "start":
            runs[ident] = Run(entry["key"], entry["attempt"], entry["token"], entry["pid"], entry["code"], entry["at"])
        else:
            runs[ident].end, runs[ident].failed, runs[ident].lost_at = entry["at"], entry["failed"], entry["lost_at"]
    return list(runs.values())


def index_shapes(table: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Name, keys and projection of each index of a table (described, or as created)."""
    return [(index["IndexName"], index["KeySchema"], index["Projection"]) for index in table["GlobalSecondaryIndexes"]]


def statuses(keys: list[str]) -> dict[str, str | None]:
    found = {task.key: task.status for task in TaskModel.batch_get(keys)}
    return {key: found.get(key) for key in keys}


@pytest.fixture
def runtimes(tmp_path: Path) -> Iterator[list[Runtime]]:
    started: list[Runtime] = []
    yield started
    (tmp_path / GATE_NAME).touch()  # a failed test leaves nothing running: held handlers return
    for runtime in started:
        try:
            runtime.stop(timeout=30)
        except subprocess.TimeoutExpired:
            pass  # killed


@pytest.mark.both_backends
def test_tasks_in_flight_on_the_previous_release_survive_the_switch_to_head(
        released_tree: Path, dynamodb_server: EmbeddedDatabase, tmp_path: Path, runtimes: list[Runtime]) -> None:
    table = f"upgrade-{os.getpid()}-{tmp_path.name}"
    run_log, gate = tmp_path / "runs.jsonl", tmp_path / GATE_NAME
    package = tmp_path / "handlers" / "upgrade_handlers"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(
        HANDLER_MODULE.format(run_log=str(run_log), gate=str(gate), task_type=TASK_TYPE)))
    old_code = str(released_tree / "layers" / "coworker" / "python" / "coworker")

    # Given the previous release running on the table it created, every task submitted to its
    # API: it runs a first wave, then each of its worker threads holds a held task
    old = Runtime("released", released_tree, tmp_path, dynamodb_server, table, package,
                  "--max-invocations", str(OLD_PROCESSES), "--drain-seconds", OLD_DRAIN_SECONDS)
    runtimes.append(old)
    old.wait_up()
    first = [quick(f"a{n:02d}", "once" if n % 6 == 3 else None) for n in range(10)] + [quick("doomed-a", "always", 2)]
    old.submit(first)

    def old_runs() -> list[Run]:
        return [run for run in read_runs(run_log) if run.code == old_code]

    wait_until(lambda: sum(run.end is not None and not run.failed for run in old_runs()) >= len(first) - 1,
               "the release running the first wave", attempts=1500)
    held = [{"key": key, "type": TASK_TYPE, "payload": {"hold": True}, "max_attempts": 3} for key in HELD]
    old.submit(held)
    wait_until(lambda: {run.key for run in old_runs() if run.end is None} >= set(HELD),
               "the release's workers holding every held task", attempts=1500)
    # ... and a second wave waits: the release's workers are all busy
    second = [quick(f"b{n:02d}", "once" if n % 6 == 3 else None) for n in range(24)] + [quick("doomed-b", "always", 2)]
    old.submit(second)
    # HEAD expects the table the release created: the same keys, index and projection.
    client = dynamodb_client(Settings(table_name=table, dynamodb_endpoint=dynamodb_server.endpoint))
    described, wanted = client.describe_table(TableName=table)["Table"], layout.create_table_request(table)
    assert described["KeySchema"] == wanted["KeySchema"]
    assert index_shapes(described) == index_shapes(wanted)

    # When the deployment switches: the release's API and coordinator stop, its invocations in
    # flight go on (it drains them), and HEAD's runtime starts and works beside them
    old.process.send_signal(signal.SIGTERM)
    head = Runtime("head", HEAD_ROOT, tmp_path, dynamodb_server, table, package, "--max-invocations", "3")
    runtimes.append(head)
    head.wait_up()
    wait_until(lambda: sum(run.code != old_code and run.end is not None for run in read_runs(run_log)) >= 6,
               "HEAD's workers running tasks beside the held ones", attempts=1500)
    assert old.process.poll() is None, "the release's runtime drains its held tasks"
    # ... one old worker process dies holding held tasks; the other finishes its own
    victims = [run for run in old_runs() if run.key in HELD and run.end is None]
    assert victims, "an old worker process holding a held task"
    victim_pid = victims[0].pid
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = time.time()
    killed = [run for run in old_runs() if run.pid == victim_pid and run.end is None]
    gate.touch()
    old.stop()

    # Then HEAD carries every task to an end
    keys = [task["key"] for task in held + first + second]
    configure(Settings(table_name=table, dynamodb_endpoint=dynamodb_server.endpoint, example_handlers=False))
    wait_until(lambda: all(status in ("finished", "ignored") for status in statuses(keys).values()),
               "every task terminal", attempts=1500)
    head.stop()

    final, runs = statuses(keys), read_runs(run_log)
    by_key: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_key[run.key].append(run)
    assert {key for key, status in final.items() if status == "ignored"} == {"doomed-a", "doomed-b"}
    assert set(by_key) == set(keys)  # none lost: every task ran
    assert all(any(run.failed is False for run in by_key[key]) for key in keys if not key.startswith("doomed"))
    assert {run.code == old_code for run in runs} == {True, False}, "both codes ran tasks"
    for lost in killed:  # every task the killed process held was taken over
        assert any(run.start > killed_at and run.attempt > lost.attempt for run in by_key[lost.key]), by_key[lost.key]
    assert old.exited_at is not None
    # No two runs of one task at once while both hold the claim: each run's hold ends (its handler
    # returns, it is told its claim is lost, or its process is killed) before the next one starts.
    for key, key_runs in by_key.items():
        key_runs.sort(key=lambda run: run.start)
        for before, after in itertools.pairwise(key_runs):
            if before.end is not None:
                held_until = min(before.end, before.lost_at or before.end)
            elif before.pid == victim_pid:
                held_until = killed_at
            else:
                assert before.code == old_code, f"a run of HEAD's never ended: {before}"
                held_until = old.exited_at  # interrupted by the old runtime's stop
            assert held_until <= after.start, f"{key}: {before} overlaps {after}"
            assert after.attempt > before.attempt, f"{key}: {after} is not a later claim than {before}"
