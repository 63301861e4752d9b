"""Chaos on the whole local system: slow writes and killed workers, then a check of every task.

    .venv/bin/python benchmarks/chaos.py [--tasks 300] [--slow-share 0.33] [--slow-seconds 5]
                                         [--slow-reads] [--kills 6] [--kill-every 5]
                                         [--runtime-kills 1] [--seed 1]

The local runtime (API, coordinator, worker processes, its local defaults: a 10 s lock) runs on
DynamoDB Local through a proxy that holds a share of the writes (PutItem, UpdateItem, DeleteItem,
BatchWriteItem, TransactWriteItems) for a random time up to ``--slow-seconds`` before passing
them on, as a throttled table or a slow network path would; reads pass at once, unless
``--slow-reads`` holds them back too. Meanwhile a
worker process is SIGKILLed every ``--kill-every`` seconds, ``--kills`` times, and the whole
runtime (coordinator mid-tick, API, workers mid-task) ``--runtime-kills`` times, each followed by
a new runtime on the same database, as a crashed machine's successor would be. The tasks run 0.2
to 4 s (handler ``chaos-run`` in ``benchmarks/chaos_handlers.py``), a fifth fail their first
attempt, and half stop when told their claim is lost (the others run on, as user code may).

Then it checks, from the handlers' own notes and the task records:

* every task ended (finished, or ignored with its reason), and every one ran;
* no two runs of one task overlapped, unless the earlier had been told its claim was lost (a
  worker tells its handler before the lock lapses; a handler that does not heed it runs on, and
  its result is discarded);
* every finished task's result was written by its last attempt, from a run not told its claim
  was lost: no stale attempt overwrote a newer one;
* while the batch ran, no running task's index entry was seen behind its lock (``due_at`` before
  ``lock_expires_at``: a reader of the index would take a live lock for lost work), from a scan of
  the table every half second, straight from DynamoDB Local.

It also prints how many runs were told their claim was lost: live workers whose lock extensions
could not land in time (writes slower than the lock allows). Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BENCHMARKS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS_DIR))
from coworker.config import Settings  # noqa: E402
from coworker_local.client import Coworker  # noqa: E402
from coworker_local.database import dynamodb_client  # noqa: E402
from system import Runtime, descendants, start_database  # noqa: E402

WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})
WAIT_LIMIT_SECONDS = 1200  # a guard against a run that never ends, not a budget


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a killed worker's connection
            super().handle_error(request, client_address)


class SlowWrites:
    """An HTTP proxy in front of DynamoDB that holds ``share`` of the writes (of every request,
    with ``reads``) for a random time up to ``seconds`` each; ``held`` and ``passed`` count the
    requests."""

    def __init__(self, upstream: str, share: float, seconds: float, seed: int, reads: bool = False) -> None:
        target = urlsplit(upstream)
        self.upstream = (target.hostname or "127.0.0.1", target.port or 80)
        self.share, self.seconds, self.reads = share, seconds, reads
        self.held = self.passed = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._server = _QuietServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def delay(self, operation: str) -> float:
        with self._lock:
            self.passed += 1
            if (self.reads or operation in WRITES) and self._random.random() < self.share:
                self.held += 1
                return self._random.uniform(0, self.seconds)
        return 0.0

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self
        connections = threading.local()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the standard library's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(proxy.delay(self.headers.get("X-Amz-Target", "").rpartition(".")[2]))
                headers = {name: value for name, value in self.headers.items()
                           if name.lower() not in ("host", "connection")}
                for attempt in (1, 2):  # a kept-alive connection the server closed: open another
                    connection = getattr(connections, "upstream", None) or http.client.HTTPConnection(
                        *proxy.upstream, timeout=120)
                    connections.upstream = connection
                    try:
                        connection.request("POST", self.path, body=body, headers=headers)
                        answer = connection.getresponse()
                        data = answer.read()
                        break
                    except (OSError, http.client.HTTPException):
                        connection.close()
                        connections.upstream = None
                        if attempt == 2:
                            raise
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(OSError):  # the caller gave up waiting (a killed worker)
                    self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> SlowWrites:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()


def worker_processes(runtime: Runtime) -> list[int]:
    """The runtime's worker processes (``python -m coworker_local.workers``)."""
    found = []
    for pid in descendants(runtime.process.pid):
        with contextlib.suppress(OSError):
            if b"coworker_local.workers" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def crash(runtime: Runtime) -> None:
    """SIGKILL the runtime and every process under it at once (worker and API processes run in
    sessions of their own, so killing the runtime's group alone would let them end in order)."""
    for pid in descendants(runtime.process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    runtime.kill()


def workload(count: int, rng: random.Random, notes: Path) -> list[dict[str, Any]]:
    return [{"key": f"chaos-{number:05d}", "type": "chaos-run", "max_attempts": 5,
             "payload": {"seconds": rng.choice((0.2, 1.0, 2.0, 4.0)), "fails_first": rng.random() < 0.2,
                         "heeds": rng.random() < 0.5, "notes": str(notes)}}
            for number in range(count)]


def read_runs(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Each task's runs, oldest first: ``started``, and ``ended`` and ``told`` if it returned."""
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        note = json.loads(line)
        runs.setdefault((note["key"], note["token"]), {}).update(note)
    by_key: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for run in runs.values():
        by_key[run["key"]].append(run)
    for key_runs in by_key.values():
        key_runs.sort(key=lambda run: run["started"])
    return by_key


class EntryWatch:
    """Scans the running tasks every half second, straight from the database, for an index entry
    behind its lock (``due_at`` before ``lock_expires_at``). Each item a scan returns is one
    version of it, so the rule holds for it whatever the scan's consistency."""

    def __init__(self, endpoint: str) -> None:
        self.client = dynamodb_client(Settings(dynamodb_endpoint=endpoint))
        self.table = Settings().table_name
        self.behind: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="entry-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(Exception):  # the table is made by the first runtime
                for page in self.client.get_paginator("scan").paginate(
                        TableName=self.table, FilterExpression="#s = :p",
                        ProjectionExpression="#k, due_at, lock_expires_at",
                        ExpressionAttributeNames={"#s": "status", "#k": "key"},
                        ExpressionAttributeValues={":p": {"S": "processing"}}):
                    for item in page["Items"]:
                        due, lock = item.get("due_at", {}).get("S"), item.get("lock_expires_at", {}).get("S")
                        if due is not None and lock is not None and due < lock:
                            self.behind.append(f"{item['key']['S']}: due {due}, lock {lock}")
                self.scans += 1

    def __enter__(self) -> EntryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def check(tasks: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, Any]]],
          behind: Sequence[str] = ()) -> dict[str, list[str]]:
    """What broke a promise, by check (empty lists: none)."""
    problems: dict[str, list[str]] = {"not ended": [], "never ran": [], "ran twice at once": [], "stale result": [],
                                      "entry behind its lock": list(behind)}
    for key, task in tasks.items():
        if task["status"] not in ("finished", "ignored"):
            problems["not ended"].append(f"{key} is {task['status']}")
        key_runs = runs.get(key, [])
        if not key_runs:
            problems["never ran"].append(f"{key}: {task['status']}, {(task['errors'] or [{}])[-1].get('message')}")
        for before, after in zip(key_runs, key_runs[1:], strict=False):
            # A killed run has no end: its process died, so it was over when the next began.
            if "ended" in before and before["ended"] > after["started"] and not before["told"]:
                problems["ran twice at once"].append(f"{key}: attempts {before['attempt']} and {after['attempt']}")
        if task["status"] == "finished":
            token = (task.get("result") or {}).get("token")
            writer = next((run for run in key_runs if run["token"] == token), None)
            if writer is None or writer.get("told", True) or writer["attempt"] != task["attempts"]:
                problems["stale result"].append(f"{key}: result of {token}, {task['attempts']} attempts")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--slow-share", type=float, default=0.33, help="share of writes held back")
    parser.add_argument("--slow-seconds", type=float, default=5.0, help="longest hold (half the local lock)")
    parser.add_argument("--slow-reads", action="store_true", help="hold reads back too")
    parser.add_argument("--kills", type=int, default=6, help="worker processes SIGKILLed")
    parser.add_argument("--kill-every", type=float, default=5.0, help="seconds between kills")
    parser.add_argument("--runtime-kills", type=int, default=1,
                        help="whole runtimes SIGKILLed (and started again), spread over the run")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="coworker-chaos-") as scratch:
        notes = Path(scratch) / "runs.jsonl"
        notes.touch()
        specs = workload(args.tasks, rng, notes)
        database = start_database("dynamodb-local")
        try:
            with SlowWrites(database.endpoint, args.slow_share, args.slow_seconds, args.seed,
                            args.slow_reads) as proxy, EntryWatch(database.endpoint) as watch:
                runtimes: list[Runtime] = []

                def start() -> Runtime:
                    runtimes.append(Runtime(proxy.url, env={"COWORKER_HANDLER_MODULES": "chaos_handlers"}))
                    return runtimes[-1]

                try:
                    tasks, kills = run(start, specs, args, rng)
                finally:
                    runtimes[-1].stop()
                held, passed = proxy.held, proxy.passed
        finally:
            database.stop()
        runs = read_runs(notes)
    problems = check(tasks, runs, watch.behind if watch.scans else ["no scan of the running tasks succeeded"])
    statuses = collections.Counter(task["status"] for task in tasks.values())
    reasons = collections.Counter((task["errors"] or [{}])[-1].get("kind", "?") for task in tasks.values()
                                  if task["status"] == "ignored")
    every = [run for key_runs in runs.values() for run in key_runs]
    print(f"chaos: {args.tasks} tasks (0.2-4 s, a fifth fail their first attempt, half heed a lost claim); "
          f"{held:,} of {passed:,} requests held up to {args.slow_seconds:g} s "
          f"({args.slow_share:.0%} of {'requests' if args.slow_reads else 'writes'}); "
          f"{kills} worker processes and {len(runtimes) - 1} whole runtimes SIGKILLed; "
          f"{watch.scans} scans of the running tasks")
    print(f"  ended: {dict(statuses)}" + (f"; ignored because: {dict(reasons)}" if reasons else ""))
    print(f"  runs: {len(every)} started, {sum('ended' not in run for run in every)} killed mid-run, "
          f"{sum(bool(run.get('told')) for run in every)} told their claim was lost (lock extensions "
          "that could not land in time)")
    for name, found in problems.items():
        print(f"  {name}: {len(found)}" + (f"  {found[:5]}" if found else ""))
    failed = any(problems.values())
    print("verdict:", "a promise was broken" if failed else "every task ended, none ran twice at once, "
          "no stale result")
    return 1 if failed else 0


def run(start: Callable[[], Runtime], specs: list[dict[str, Any]], args: argparse.Namespace,
        rng: random.Random) -> tuple[dict[str, dict[str, Any]], int]:
    """Submit, kill workers (and runtimes) while the batch runs, wait for it; every task's record
    and the worker kills."""
    runtime = start()
    assert runtime.url is not None
    client = Coworker(runtime.url)
    started = time.monotonic()
    submitted = client.submit(specs, chunk_size=100, parallel=2)
    print(f"submitted {submitted.submitted} tasks in {time.monotonic() - started:.1f} s", flush=True)
    kills, restarts, last_kill, last_word = 0, 0, time.monotonic(), 0.0
    while time.monotonic() - started < WAIT_LIMIT_SECONDS:
        progress = client.batch(submitted.batch_id)
        if progress.done:
            break
        now = time.monotonic()
        ended = progress.finished + progress.ignored
        if restarts < args.runtime_kills and ended >= len(specs) * (restarts + 1) / (args.runtime_kills + 1):
            crash(runtime)
            restarts += 1
            print(f"  {now - started:5.0f} s: the whole runtime SIGKILLed at {ended} ended; a new one starts",
                  flush=True)
            runtime = start()
            assert runtime.url is not None
            client = Coworker(runtime.url)
            continue
        if kills < args.kills and now - last_kill >= args.kill_every:
            victims = worker_processes(runtime)
            if victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rng.choice(victims), signal.SIGKILL)
                kills, last_kill = kills + 1, now
        if now - last_word >= 5:
            print(f"  {now - started:5.0f} s: {progress}, {kills} killed", flush=True)
            last_word = now
        time.sleep(0.5)
    return {key: client.task(key).raw for key in submitted.keys}, kills


if __name__ == "__main__":
    sys.exit(main())
