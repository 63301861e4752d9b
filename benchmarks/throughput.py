"""Throughput benchmark: Coworker against its peer, on DynamoDB Local and on moto, in one run.

    .venv/bin/python benchmarks/throughput.py [--tasks 400] [--rounds 3] [--concurrency 8] [--warmup 3]
                                              [--demo-tasks 500] [--backends dynamodb-local,moto]

Both embedded databases are started side by side. Each round runs, on each backend, with the
order alternating between rounds so neither side always goes first on a warm machine:

* **coworker**: the engine alone with a no-op handler: ``--tasks`` tasks put, then coordinator
  ticks with in-process workers (``max_concurrency = --concurrency``) until every task finished;
* **peer**: pynamodb_mate's status tracker (the seed's own library) on the same database: its
  ``query_for_unfinished`` then ``with Task.start(id)`` (two conditional UpdateItems) on
  ``--concurrency`` threads, until nothing is unfinished.

Throughput counts the processing phase (first tick or query to last finish), not the puts.
Requests are counted on every botocore client of the process, by operation. Then, unless
``--demo-tasks 0``, the whole local system (``python -m coworker_local --exit-when-done``: API,
coordinator timer, worker processes, demo mix with its sleeps and retries) runs once per backend.

Warm-up runs of each system (``--warmup``, full size) on each database come first and are not
counted: DynamoDB Local is a JVM, and its JIT takes thousands of requests to compile each request
kind's path (measured: Coworker's 2x16 rate climbed 240, 308, 426, 507, 538, 565 tasks/s over its
first six runs of 1,000 tasks, the engine's requests more slowly than the peer's simpler ones), so
with one warm-up run the first rounds measured the emulator's warm-up. Figures are medians over
the rounds; ratios are taken within a round, then the median is shown.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

import botocore.client  # noqa: E402
from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.engine import dispatch, slots, submit  # noqa: E402
from coworker.engine.tasks import TaskSpec
from coworker.observability import metrics  # noqa: E402
from coworker_local.database import (  # noqa: E402
    BACKENDS,
    FAKE_CREDENTIALS,
    EmbeddedDatabase,
    create_table,
    embedded_database,
)
from coworker_local.runtime import PASSED_THROUGH  # noqa: E402
from coworker_local.workers import ProcessWorkerPool  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]


BENCHMARKS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS_DIR))
import noop_handlers  # noqa: E402,F401  - registers "bench-noop"


class RequestCounter:
    """Counts DynamoDB API calls made by any botocore client in this process."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._original = botocore.client.BaseClient._make_api_call

    def install(self) -> RequestCounter:
        counter, original = self, self._original

        def counted(client: object, operation_name: str, api_params: dict) -> dict:
            with counter._lock:
                counter.counts[operation_name] += 1
            return original(client, operation_name, api_params)

        botocore.client.BaseClient._make_api_call = counted  # type: ignore[method-assign]
        return self

    def snapshot(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self.counts)


# Every Coworker run on a database uses one table, as a deployment does (runs differ in their
# keys). DynamoDB Local serves writes to a table with a stream more slowly the more tables with
# streams were created before it (measured: 620 writes/s on the first, 260 on the sixth, 920
# without a stream), so a table per run would measure DynamoDB Local's bookkeeping, not Coworker.
_TABLES: dict[str, str] = {}


def coworker_table(endpoint: str) -> str:
    """The one Coworker table of ``endpoint`` (made at the first call: call it before any other
    table with a stream is made there)."""
    if endpoint not in _TABLES:
        _TABLES[endpoint] = f"cw-{uuid.uuid4().hex[:8]}"
        create_table(Settings(table_name=_TABLES[endpoint], dynamodb_endpoint=endpoint))
    return _TABLES[endpoint]


def run_coworker(endpoint: str, tasks: int, concurrency: int, counter: RequestCounter,
                 table: str | None = None) -> dict:
    """The engine alone, in this process: put, then one coordinator tick starts a worker (one
    slot of ``concurrency`` threads) that feeds itself until every task is finished (on
    ``table``, or the database's one Coworker table)."""
    settings = Settings(table_name=table or coworker_table(endpoint), dynamodb_endpoint=endpoint,
                        max_concurrency=concurrency, batch_size=concurrency, dispatch_on_submit=False)
    configure(settings)
    slots.ensure_slots(settings.worker_slots)
    slots.retire_extra_slots(settings.worker_slots)
    run = uuid.uuid4().hex[:6]
    for i in range(tasks):
        submit.put_task(TaskSpec(key=f"t-{run}-{i:06d}", type="bench-noop"), settings)
    invoker = dispatch.InProcessInvoker(settings)
    before = counter.snapshot()
    started = time.perf_counter()
    finished = ticks = 0
    while finished < tasks:
        report = dispatch.tick(settings, invoker)
        finished += sum(r.outcome.value == "finished" for r in invoker.wait())
        metrics.clear_metrics()
        ticks += 1
        if report.dispatched == 0 and ticks > 10 * tasks:
            raise RuntimeError("coworker stopped dispatching before every task finished")
    seconds = time.perf_counter() - started
    invoker.shutdown()
    return {"seconds": seconds, "tasks": tasks, "requests": counter.snapshot() - before}


class ProcessEngine:
    """Coworker with worker processes, as the local runtime runs them (one per worker slot,
    ``threads`` tasks each), on ``table`` or the database's one Coworker table, warm between runs;
    ``python_path`` goes first on the worker processes' ``PYTHONPATH``."""

    def __init__(self, endpoint: str, slots: int, threads: int, table: str | None = None,
                 python_path: Sequence[str] = ()) -> None:
        self.settings = Settings(
            table_name=table or coworker_table(endpoint), dynamodb_endpoint=endpoint,
            max_concurrency=slots * threads, batch_size=threads, dispatch_on_submit=False,
            worker_timeout_seconds=300, handler_modules="noop_handlers")
        environ = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
        environ.update(FAKE_CREDENTIALS)
        environ.update({k: v for k, v in os.environ.items() if k.startswith("POWERTOOLS_")})
        environ.update(self.settings.as_environment())
        environ["PYTHONPATH"] = os.pathsep.join([*python_path, str(BENCHMARKS_DIR)])
        self.pool = ProcessWorkerPool(environ, timeout_seconds=300, max_invocations=slots, log=sys.stderr)
        self.label = f"{slots}x{threads}"
        self._runs = 0

    def run(self, tasks: int) -> dict:
        settings = self.settings
        configure(settings)
        slots.ensure_slots(settings.worker_slots)  # this configuration's slots, as a deploy sets them
        slots.retire_extra_slots(settings.worker_slots)
        self._runs += 1
        for i in range(tasks):
            submit.put_task(TaskSpec(key=f"{self.label}-r{self._runs}-{i:06d}", type="bench-noop"),
                               settings)
        done_before = self.pool.outcomes.get("finished", 0)
        started = time.perf_counter()
        while self.pool.outcomes.get("finished", 0) - done_before < tasks:
            dispatch.tick(settings, self.pool)
            metrics.clear_metrics()
            time.sleep(0.02)
            while self.pool.stats()["running"] or self.pool.stats()["queued"]:
                time.sleep(0.005)
            if time.perf_counter() - started > 600 or self.pool.counts.get("init-failed"):
                raise RuntimeError("worker processes did not finish the tasks (see the log)")
        return {"seconds": time.perf_counter() - started, "tasks": tasks, "requests": collections.Counter()}

    def close(self) -> None:
        self.pool.shutdown(drain_seconds=1.0)


def peer_model(endpoint: str, table: str | None = None) -> type:
    """A pynamodb_mate status-tracker model on ``table`` of ``endpoint``, or on a new table."""
    from pynamodb.attributes import UnicodeAttribute
    from pynamodb_mate.patterns.status_tracker.impl import BaseTask, StatusAndUpdateTimeIndex, TrackerConfig

    new, table = table is None, table or f"peer-{uuid.uuid4().hex[:8]}"

    class PeerIndex(StatusAndUpdateTimeIndex):
        class Meta:
            index_name = "status_and_update_time-index"
            projection = StatusAndUpdateTimeIndex.Meta.projection

        value = UnicodeAttribute(hash_key=True)
        update_time = StatusAndUpdateTimeIndex.update_time

    class PeerTask(BaseTask):
        class Meta:
            table_name = table
            region = "us-east-1"
            host = endpoint
            billing_mode = "PAY_PER_REQUEST"

        status_and_update_time_index = PeerIndex()
        config = TrackerConfig.make(
            use_case_id="bench", pending_status=10, in_progress_status=20, failed_status=30,
            succeeded_status=40, ignored_status=50, n_pending_shard=1, n_in_progress_shard=1,
            n_failed_shard=1, n_succeeded_shard=1, n_ignored_shard=1, max_retry=3, lock_expire_seconds=300,
        )

    if new:
        PeerTask.create_table(wait=True)
    return PeerTask


def run_peer(endpoint: str, tasks: int, concurrency: int, counter: RequestCounter) -> dict:
    """pynamodb_mate's tracker at its best: large queries, ``concurrency`` threads running tasks."""
    model = peer_model(endpoint)
    for i in range(tasks):
        model.make_and_save(task_id=f"t-{i:06d}")

    def run(task_id: str) -> None:
        with model.start(task_id):
            pass  # the trivial handler

    before = counter.snapshot()
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        while True:
            ids = [task.task_id for task in model.query_for_unfinished(limit=100)]
            if not ids:
                break
            list(pool.map(run, ids))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "tasks": tasks, "requests": counter.snapshot() - before}


def run_demo(backend: str, tasks: int) -> dict:
    """``python -m coworker_local --exit-when-done`` on ``backend``: the whole system, demo mix."""
    command = [sys.executable, "-m", "coworker_local", "--exit-when-done", "--tasks", str(tasks),
               "--db", backend, "--api-port", "0", "--seed", "7"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - started
    match = re.search(r"throughput:\s+([\d.]+) tasks/s", done.stdout)
    return {"tasks_per_second": float(match.group(1)) if match else float("nan"), "wall": wall,
            "code": done.returncode, "tail": done.stdout[-600:] + done.stderr[-600:]}


def rate(result: dict) -> float:
    """Tasks per second of one run's result."""
    return result["tasks"] / result["seconds"]


def _per_task(result: dict) -> float:
    return sum(result["requests"].values()) / result["tasks"]


def machine_cpu() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine, from /proc/stat (Linux)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def process_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when unknown)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return 0.0


def best_concurrency(args: argparse.Namespace, database: EmbeddedDatabase, counter: RequestCounter,
                     emf_sink: Any) -> dict[str, list[float]]:
    """Each side at several concurrencies, interleaved by round: tasks/s per configuration, with
    how busy the machine's CPUs were and the database server's CPU per task."""
    configs = [tuple(int(n) for n in c.split("x")) for c in args.best.split(",") if c.strip()]
    engines = [ProcessEngine(database.endpoint, slots, threads) for slots, threads in configs]
    peers = [int(n) for n in args.peer_best.split(",") if n.strip()]
    rates: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for _ in range(args.warmup):  # start the worker processes, let the JIT see the requests
            for engine in engines:
                with contextlib.redirect_stdout(emf_sink):
                    engine.run(args.best_tasks)
            for threads in peers:
                run_peer(database.endpoint, args.best_tasks, threads, counter)
        for round_no in range(args.rounds):
            runs: list[tuple[str, Callable[[], dict]]] = [
                (f"coworker {engine.label}", lambda e=engine: e.run(args.best_tasks)) for engine in engines]
            runs += [(f"peer {threads} threads",
                      lambda t=threads: run_peer(database.endpoint, args.best_tasks, t, counter)) for threads in peers]
            if round_no % 2:
                runs.reverse()
            for label, run in runs:
                busy0, total0 = machine_cpu()
                server0 = process_cpu_seconds(getattr(database, "pid", None))
                with contextlib.redirect_stdout(emf_sink):
                    result = run()
                busy1, total1 = machine_cpu()
                server = process_cpu_seconds(getattr(database, "pid", None)) - server0
                rates[label].append(rate(result))
                load = (busy1 - busy0) / max(1, total1 - total0)
                print(f"  best-concurrency round {round_no + 1}: {label:<20} {rate(result):7.1f} tasks/s   "
                      f"CPUs {load:4.0%} busy, database server {1000 * server / result['tasks']:.2f} ms CPU/task",
                      flush=True)
    finally:
        for engine in engines:
            engine.close()
    return rates


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=400, help="tasks per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=3,
                        help="full-size warm-up runs of each system and configuration, not counted")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="coworker max_concurrency and the peer's threads (equal concurrency)")
    parser.add_argument("--demo-tasks", type=int, default=500, help="demo size of the whole-system run (0 skips)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: dynamodb-local,moto")
    parser.add_argument("--best", default="2x8,2x16,3x16",
                        help="coworker configurations for the best-concurrency section: worker processes x "
                             "threads, comma-separated ('' skips the section)")
    parser.add_argument("--peer-best", default="8,16,32", help="peer thread counts for that section")
    parser.add_argument("--best-tasks", type=int, default=1000, help="tasks per run in that section")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    print(f"$ .venv/bin/python benchmarks/throughput.py {shlex.join(given)}".rstrip(), flush=True)
    print(f"({os.cpu_count()} CPUs; {args.tasks} tasks per run, {args.rounds} rounds after {args.warmup} "
          f"warm-up runs, concurrency {args.concurrency}, no-op handler)")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    counter = RequestCounter().install()
    databases: dict[str, EmbeddedDatabase] = {b: embedded_database(b).start() for b in backends}
    for database in databases.values():
        coworker_table(database.endpoint)
    results: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    runners: dict[str, Callable[..., dict]] = {"coworker": run_coworker, "peer": run_peer}
    try:
        # A JVM runs its first requests interpreted: warm both databases and both systems first.
        emf_sink = open(os.devnull, "w")  # noqa: SIM115 - open for the whole run
        for _ in range(args.warmup):
            for backend in backends:
                for runner in runners.values():
                    with contextlib.redirect_stdout(emf_sink):
                        runner(databases[backend].endpoint, args.tasks, args.concurrency, counter)
        for round_no in range(args.rounds):
            order = [(b, s) for b in backends for s in runners]
            if round_no % 2:
                order.reverse()
            for backend, system in order:
                with contextlib.redirect_stdout(emf_sink):  # Powertools prints EMF every 100 metrics
                    result = runners[system](databases[backend].endpoint, args.tasks, args.concurrency, counter)
                results[backend, system].append(result)
                print(f"  round {round_no + 1}: {system:<9} on {backend:<15} {rate(result):7.1f} tasks/s  "
                      f"{_per_task(result):.2f} requests/task", flush=True)
        best = best_concurrency(args, databases[backends[0]], counter, emf_sink) if args.best else None
    finally:
        for database in databases.values():
            database.stop()

    print()
    print(f"{'':<17}{'coworker tasks/s':>18}{'peer tasks/s':>14}{'ratio':>8}"
          f"{'req/task coworker':>19}{'peer':>7}")
    for backend in backends:
        ours, peer = results[backend, "coworker"], results[backend, "peer"]
        ratios = [rate(a) / rate(b) for a, b in zip(ours, peer, strict=True)]
        print(f"{backend:<17}{statistics.median(map(rate, ours)):>18.1f}{statistics.median(map(rate, peer)):>14.1f}"
              f"{statistics.median(ratios):>7.2f}x{statistics.median(map(_per_task, ours)):>19.2f}"
              f"{statistics.median(map(_per_task, peer)):>7.2f}")
    if len(backends) == 2:
        for system in runners:
            first, second = results[backends[0], system], results[backends[1], system]
            ratios = [rate(a) / rate(b) for a, b in zip(first, second, strict=True)]
            print(f"{system}: {backends[0]} / {backends[1]} = {statistics.median(ratios):.2f}x "
                  f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
    sample = results[backends[0], "coworker"][-1]["requests"]
    print(f"coworker requests by operation ({backends[0]}, last round, per task): "
          + ", ".join(f"{op} {n / args.tasks:.2f}" for op, n in sorted(sample.items())))

    if best is not None:
        print()
        print(f"Best concurrency on {backends[0]} ({args.best_tasks} tasks per run, {args.rounds} rounds, "
              "medians; coworker: worker processes x threads, requests not counted across processes):")
        for label, rates in best.items():
            print(f"  {label:<22} {statistics.median(rates):7.1f} tasks/s   rounds: "
                  + ", ".join(f"{r:.1f}" for r in rates))
        ours = max((k for k in best if k.startswith("coworker")), key=lambda k: statistics.median(best[k]))
        peer = max((k for k in best if k.startswith("peer")), key=lambda k: statistics.median(best[k]))
        print(f"  best coworker ({ours}) / best peer ({peer}) = "
              f"{statistics.median(best[ours]) / statistics.median(best[peer]):.2f}x")

    if args.demo_tasks:
        print()
        print(f"Whole system: python -m coworker_local --exit-when-done --tasks {args.demo_tasks} --seed 7")
        for backend in backends:
            demo = run_demo(backend, args.demo_tasks)
            status = "" if demo["code"] == 0 else f"  (exit {demo['code']}):\n{demo['tail']}"
            print(f"  {backend:<15} {demo['tasks_per_second']:6.1f} tasks/s (created to last finished), "
                  f"{demo['wall']:.0f} s wall clock with start and stop{status}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
