"""The whole local system against its peer: tasks put through ``POST /tasks`` and run to the end
by the local runtime (API, coordinator, worker processes), against pynamodb_mate's status tracker
putting and running the same number of tasks; then ingest alone against raw conditional puts.

    .venv/bin/python benchmarks/system.py [--tasks 2000] [--rounds 3] [--peer-threads 8,16]
                                          [--chunk 250] [--parallel 4]

Each run gets a fresh DynamoDB Local (as a user's first run would), and the runs of a round are
interleaved, the order reversed every other round. Per run:

* **ours**: ``python -m coworker_local --no-demo`` with its defaults and a no-op handler; the
  tasks are submitted with the Python client in lists of ``--chunk`` (one batch), ``--parallel``
  requests at once (the CLI's default; the local API answers them side by side, each in a process
  of its own, as many started with the runtime), then the batch is polled until done. Timed
  from the first request to the batch's end, once the runtime's start-up is over (its worker
  environments ready, its first coordinator run made); ingest is the submit phase alone.
* **peer**: the status tracker's own put (``make_and_save``) and run (``query_for_unfinished``,
  then ``with Task.start(id)``) on ``N`` threads, both phases timed.
* **ingest alone** (after each of our runs): as many tasks due in a day, so that nothing runs
  while they are put.
* **raw puts** (before and after the ingest alone, on the same database): conditional PutItems of items
  shaped like ours (one of our stored tasks, re-keyed) into a table of the same layout, from as
  many threads as ``POST /tasks`` puts with: the database's own ceiling for that ingest.

Requests per task, by operation, are counted for the run phase on both sides: the peer's in this
process, ours in every process of the runtime (``benchmarks/counting/sitecustomize.py``, copied
onto the runtime's ``PYTHONPATH``), with our refused ones (a conditional write's failed check) apart.

CPU per task is read from /proc: our side is the runtime process and every process under it
(API, coordinator, workers), the peer's is this process's own, and the database's is DynamoDB
Local's. Load moves it far less than it moves tasks per second; both are printed with how busy
the machine's CPUs were.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS_DIR.parent
sys.path.insert(0, str(BENCHMARKS_DIR))
import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.engine.batches import PUT_THREADS  # noqa: E402
from coworker_local.client import SUBMIT_PARALLEL, Coworker  # noqa: E402
from coworker_local.database import FAKE_CREDENTIALS, create_table, start_database  # noqa: E402
from throughput import RequestCounter, machine_cpu, peer_model, process_cpu_seconds  # noqa: E402

READY = re.compile(r"API\s+(http://\S+)")
START_TIMEOUT = 300.0


def descendants(root: int) -> list[int]:
    """Every live process under ``root`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root`` and every live process under it."""
    return sum(process_cpu_seconds(pid) for pid in [root, *descendants(root)])


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_counts(directory: Path) -> collections.Counter[str]:
    """The DynamoDB requests counted so far by every process of a runtime (benchmarks/counting)."""
    total: collections.Counter[str] = collections.Counter()
    for path in directory.glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            total.update(json.loads(path.read_text()))
    return total


def settled_counts(directory: Path) -> collections.Counter[str]:
    time.sleep(0.5)  # each process writes its counts every 0.2 s
    return read_counts(directory)


class Runtime:
    """``python -m coworker_local --no-demo [args]`` on a given database, with the no-op handler
    (or the one ``env`` names); with ``count_dir`` its processes count their DynamoDB requests
    there. In a session of its own, so that :meth:`kill` takes it whole."""

    def __init__(self, endpoint: str, count_dir: Path | None = None, env: dict[str, str] | None = None,
                 args: Sequence[str] = ()) -> None:
        paths = [str(BENCHMARKS_DIR), os.environ.get("PYTHONPATH")]
        if count_dir is not None:
            shutil.copy(BENCHMARKS_DIR / "counting" / "sitecustomize.py", count_dir)
            (count_dir / "count-requests-here").touch()
            paths.insert(1, str(count_dir))
        environ = {**os.environ, **FAKE_CREDENTIALS, "COWORKER_DYNAMODB_ENDPOINT": endpoint,
                   "COWORKER_HANDLER_MODULES": "noop_handlers", "PYTHONUNBUFFERED": "1",
                   "PYTHONPATH": os.pathsep.join(filter(None, paths)), **(env or {})}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "coworker_local", "--no-demo", "--api-port", "0", *args],
            cwd=REPO_ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.url: str | None = None
        self.output: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                self.output.append(line)
                match = READY.search(line)
                if match and self.url is None:
                    self.url = match.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(START_TIMEOUT) or self.url is None:
            self.stop()
            raise RuntimeError("the local runtime did not start:\n" + "".join(self.output[-30:]))

    def wait_warm(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the runtime's start-up is over: its worker environments (started with it,
        like provisioned concurrency, after the banner) are ready and its coordinator has made
        its first run. A measurement that starts at the banner would count that start-up, about
        six Python processes' imports, as the first tasks' work; the peer's imports are done
        before it is timed too."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{self.url}/local/info", timeout=30) as answer:
                info = json.load(answer)
            workers = info.get("workers", {})
            started = workers.get("prewarmed", 0) + workers.get("init-failed", 0)
            if started >= workers.get("max_invocations", 0) and info.get("coordinator_state") != "starting":
                return
            time.sleep(0.2)
        raise RuntimeError("the local runtime's workers did not start")

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.process.pid)

    def kill(self) -> None:
        """SIGKILL the runtime (its coordinator dying mid-write); its worker processes see their
        parent gone and end."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(2)  # Ctrl-C: it stops its workers and its API
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Measure:
    """CPU of a client side, of the database, and of the machine, between start and stop."""

    def __init__(self, client_cpu: Callable[[], float], database_pid: int | None) -> None:
        self._client, self._pid = client_cpu, database_pid
        self._busy, self._total = machine_cpu()
        self._client0, self._server0 = client_cpu(), process_cpu_seconds(database_pid)

    def stop(self, tasks: int, seconds: float) -> dict:
        busy, total = machine_cpu()
        return {"tasks_per_second": tasks / seconds, "seconds": seconds,
                "client_ms": 1000 * (self._client() - self._client0) / tasks,
                "server_ms": 1000 * (process_cpu_seconds(self._pid) - self._server0) / tasks,
                "busy": (busy - self._busy) / max(1, total - self._total)}


def run_ours(tasks: int, chunk: int, parallel: int) -> dict:
    database = start_database("dynamodb-local")
    runtime: Runtime | None = None
    count_dir = Path(tempfile.mkdtemp(prefix="coworker-requests-"))
    try:
        # As many API processes started with it as the client sends requests at once, as its
        # worker environments are: the peer's imports are not timed either.
        runtime = Runtime(database.endpoint, count_dir, args=["--prewarm-api", str(parallel)])
        runtime.wait_warm()
        client = Coworker(runtime.url)
        specs = [{"key": f"s-{i:06d}", "type": "bench-noop"} for i in range(tasks)]
        counted_before = settled_counts(count_dir)
        measure = Measure(runtime.cpu_seconds, getattr(database, "pid", None))
        started = time.perf_counter()
        submitted = client.submit(specs, chunk_size=chunk, parallel=parallel)
        ingest_seconds = time.perf_counter() - started
        progress = client.wait(submitted.batch_id, poll_seconds=0.25)
        seconds = time.perf_counter() - started
        result = measure.stop(tasks, seconds)
        result["requests"] = settled_counts(count_dir) - counted_before
        if progress.finished != tasks:
            raise RuntimeError(f"{progress.finished} of {tasks} finished: {progress}")
        # Then ingest alone, on the database as warm as the raw puts find it: tasks due in a
        # day, so nothing runs while they are put
        # (between two runs of raw puts, averaged: the machine's load moves from one to the next)
        raw_before = raw_puts(database.endpoint, tasks)
        later = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        started = time.perf_counter()
        client.submit([{"key": f"later-{i:06d}", "type": "bench-noop", "run_at": later} for i in range(tasks)],
                      chunk_size=chunk, parallel=parallel)
        result["ingest_alone_per_second"] = tasks / (time.perf_counter() - started)
        result["ingest_per_second"] = tasks / ingest_seconds
        result["raw_put_per_second"] = (raw_before + raw_puts(database.endpoint, tasks)) / 2
        return result
    finally:
        if runtime is not None:
            runtime.stop()
        database.stop()
        shutil.rmtree(count_dir, ignore_errors=True)


def raw_puts(endpoint: str, tasks: int) -> float:
    """Conditional PutItems per second of items shaped like ours, from PUT_THREADS threads, into
    a fresh table of our layout on the same database."""
    settings = Settings(dynamodb_endpoint=endpoint)  # the runtime's table: the default name
    # A connection per thread, as the engine's own client has (boto3's default pool holds 10)
    client = boto3.client("dynamodb", region_name=settings.region, endpoint_url=endpoint,
                          config=Config(max_pool_connections=PUT_THREADS))
    template = client.scan(TableName=settings.table_name, Limit=1)["Items"][0]
    raw = Settings(table_name=f"raw-{uuid.uuid4().hex[:8]}", dynamodb_endpoint=endpoint)
    create_table(raw)
    items = [{**template, "key": {"S": f"raw-{i:06d}"}} for i in range(tasks)]

    def put(item: dict) -> None:
        client.put_item(TableName=raw.table_name, Item=item, ConditionExpression="attribute_not_exists(#k)",
                        ExpressionAttributeNames={"#k": "key"})

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=PUT_THREADS) as pool:
        list(pool.map(put, items))
    return tasks / (time.perf_counter() - started)


def run_peer(tasks: int, threads: int, counter: RequestCounter) -> dict:
    database = start_database("dynamodb-local")
    try:
        model = peer_model(database.endpoint)
        counted_before = counter.snapshot()
        measure = Measure(own_cpu_seconds, getattr(database, "pid", None))
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(lambda i: model.make_and_save(task_id=f"t-{i:06d}"), range(tasks)))
            ingest_seconds = time.perf_counter() - started

            def run(task_id: str) -> None:
                with model.start(task_id):
                    pass  # the trivial handler

            while ids := [task.task_id for task in model.query_for_unfinished(limit=100)]:
                list(pool.map(run, ids))
        result = measure.stop(tasks, time.perf_counter() - started)
        result["requests"] = counter.snapshot() - counted_before
        result["ingest_per_second"] = tasks / ingest_seconds
        return result
    finally:
        database.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peer-threads", default="8,16", help="the peer's thread counts")
    parser.add_argument("--chunk", type=int, default=250, help="tasks per POST /tasks")
    parser.add_argument("--parallel", type=int, default=SUBMIT_PARALLEL,
                        help="POST /tasks requests sent at once (default: the CLI's, %(default)s)")
    args = parser.parse_args(argv)
    print(f"$ .venv/bin/python benchmarks/system.py {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    counter = RequestCounter().install()  # the peer's requests, counted in this process
    sides: list[tuple[str, Callable[[], dict]]] = [("ours", lambda: run_ours(args.tasks, args.chunk, args.parallel))]
    sides += [(f"peer {n} threads", lambda n=n: run_peer(args.tasks, n, counter))
              for n in (int(t) for t in args.peer_threads.split(",") if t.strip())]
    results: dict[str, list[dict]] = {label: [] for label, _ in sides}
    for round_no in range(args.rounds):
        order = sides if round_no % 2 == 0 else list(reversed(sides))
        for label, run in order:
            result = run()
            results[label].append(result)
            extra = f"   ingest {result['ingest_per_second']:6.1f}/s"
            if "raw_put_per_second" in result:
                extra += (f" (nothing running: {result['ingest_alone_per_second']:6.1f}/s; "
                          f"raw puts {result['raw_put_per_second']:6.1f}/s)")
            print(f"  round {round_no + 1}: {label:<16} {result['tasks_per_second']:7.1f} tasks/s   CPU/task: "
                  f"client {result['client_ms']:5.1f} ms + DynamoDB Local {result['server_ms']:5.1f} ms   "
                  f"CPUs {result['busy']:4.0%} busy{extra}", flush=True)

    def median(label: str, field: str) -> float:
        return statistics.median(r[field] for r in results[label])

    print(f"\nMedians over {args.rounds} rounds of {args.tasks:,} tasks (ratios within each round, then the median):")
    for label in results:
        cpu = median(label, "client_ms") + median(label, "server_ms")
        print(f"  {label:<16} {median(label, 'tasks_per_second'):7.1f} tasks/s   CPU/task {cpu:5.1f} ms "
              f"(client {median(label, 'client_ms'):.1f} + DynamoDB Local {median(label, 'server_ms'):.1f})")
    ours = results["ours"]
    for label in list(results)[1:]:
        pairs = list(zip(ours, results[label], strict=True))
        ratio = statistics.median(o["tasks_per_second"] / p["tasks_per_second"] for o, p in pairs)
        cpu = statistics.median((p["client_ms"] + p["server_ms"]) / (o["client_ms"] + o["server_ms"]) for o, p in pairs)
        print(f"  ours / {label}: {ratio:.2f}x the tasks/s (target >= 1.0); the peer's CPU per task is "
              f"{cpu:.2f}x ours")
    print("\nDynamoDB requests per task, median over the rounds (the run phase: put and run; 'refused' are "
          "conditional writes whose check failed, and other errors):")
    for label in results:
        operations = sorted({op for r in results[label] for op in r["requests"]},
                            key=lambda op: -statistics.median(r["requests"][op] for r in results[label]))
        per_task = {op: statistics.median(r["requests"][op] / args.tasks for r in results[label]) for op in operations}
        total = statistics.median(sum(n for op, n in r["requests"].items() if not op.endswith(" refused"))
                                  / args.tasks for r in results[label])
        shown = ", ".join(f"{op} {n:.2f}" for op, n in per_task.items() if n >= 0.005)
        print(f"  {label:<16} {total:5.2f}: {shown}")
    ingest = statistics.median(o["ingest_per_second"] / o["raw_put_per_second"] for o in ours)
    alone = statistics.median(o["ingest_alone_per_second"] / o["raw_put_per_second"] for o in ours)
    print(f"  POST /tasks ingest / raw conditional puts ({PUT_THREADS} threads): {alone:.2f}x with nothing "
          f"running, {ingest:.2f}x while the tasks run (target >= 0.8)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
