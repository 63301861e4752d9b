"""What bounds Coworker on DynamoDB Local: the price of the table's stream, and the table's lock.

    .venv/bin/python benchmarks/stream_cost.py [--tasks 600] [--rounds 5] [--concurrency 8]
                                               [--best 2x16] [--peer-threads 16] [--peer-processes 2x16]
                                               [--best-tasks 1000] [--lock-waits]

One DynamoDB Local; two Coworker tables of the same layout (``coworker.data.layout``), one with the
stream batch progress is counted from and one without, made first (DynamoDB Local serves a table
with a stream more slowly the more such tables were made before it); the peer (pynamodb_mate's
tracker) on tables of its own. The table without a stream is not a configuration Coworker
offers: it measures the emulator's price of the stream, to weigh it against counting batches
another way.

* **Equal concurrency**: each round runs the three, order alternating, as
  ``benchmarks/throughput.py`` runs its equal-concurrency section (one process, ``--concurrency``
  worker threads and as many peer threads), and prints tasks/s and the database server's CPU per
  task (put, claim, finish and the reads, from /proc).
* **Best concurrency** (``--best``, '' skips): both tables with worker processes (``--best``
  = processes x threads, as throughput.py's best-concurrency section runs them) against the peer
  on ``--peer-threads`` threads, after two warm-up runs each; and the peer's own requests from
  ``--peer-processes`` processes x threads (not how pynamodb_mate runs: a probe of how fast
  DynamoDB Local makes a plain two-writes-per-task client's writes on one table when no Python
  interpreter bounds it). With ``--lock-waits`` (needs a JDK's
  ``jcmd`` and ``jfr``) Java Flight Recorder records every thread park in DynamoDB Local during
  each run, and the script prints how many requests were waiting for the table's lock on
  average: DynamoDB Local takes one lock per table (a ``ReentrantReadWriteLock`` in
  ``LocalDBAccess``) around every write, and its read side around every read, so one table's
  writes run one at a time whatever the number of clients.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import throughput
from coworker.config import Settings
from coworker.data import layout
from coworker.observability import logger
from coworker_local.database import EmbeddedDatabase, dynamodb_client, embedded_database

# Every thread park, with the stack that shows which lock it waited for.
_PARK_SETTINGS = """<?xml version="1.0" encoding="UTF-8"?>
<configuration version="2.0" label="coworker-lock-waits" description="thread parks" provider="coworker">
  <event name="jdk.ThreadPark">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
    <setting name="threshold">0 ms</setting>
  </event>
</configuration>
"""
_TABLE_LOCK_FRAME = "LocalDBAccess$"  # LocalDBAccess$WriteLockWithTimeout / $ReadLockWithTimeout


def _table(endpoint: str, name: str, stream: bool) -> str:
    request = layout.create_table_request(name)
    if not stream:
        request.pop("StreamSpecification")
    client = dynamodb_client(Settings(table_name=name, dynamodb_endpoint=endpoint))
    client.create_table(**request)
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1})
    return name


def _seconds(duration: str) -> float:
    """An ISO-8601 duration as ``jfr print --json`` writes it (``PT0.0123S``, ``PT1M2.5S``)."""
    text = duration.removeprefix("PT").removesuffix("S")
    minutes, _, seconds = text.rpartition("M")
    return 60 * float(minutes or 0) + float(seconds or 0)


class TableLockWaits:
    """Seconds DynamoDB Local's request threads spend waiting for a table's lock, per second of a
    run, from Java Flight Recorder's thread-park events (``jcmd`` and ``jfr`` of a JDK)."""

    def __init__(self, database: EmbeddedDatabase, folder: Path) -> None:
        self.pid = str(database.pid)
        self.folder = folder
        self.settings = folder / "lock-waits.jfc"
        self.settings.write_text(_PARK_SETTINGS)

    @staticmethod
    def available(database: EmbeddedDatabase) -> bool:
        return bool(getattr(database, "pid", None) and shutil.which("jcmd") and shutil.which("jfr"))

    @contextlib.contextmanager
    def record(self, result: dict) -> Iterator[None]:
        """Record while the block runs; sets ``result["lock_waiting"]`` (requests waiting, on
        average): every wait for a table's lock in the block (the run's puts, made from one
        thread, included) over the run's processing time, ``result["seconds"]``."""
        name, path = f"cw-{uuid.uuid4().hex[:6]}", self.folder / f"{uuid.uuid4().hex[:6]}.jfr"
        subprocess.run(["jcmd", self.pid, "JFR.start", f"name={name}", f"settings={self.settings}"],
                       check=True, capture_output=True)
        try:
            yield
        finally:
            subprocess.run(["jcmd", self.pid, "JFR.stop", f"name={name}", f"filename={path}"],
                           check=True, capture_output=True)
        printed = subprocess.run(["jfr", "print", "--json", "--stack-depth", "8", "--events", "jdk.ThreadPark",
                                  str(path)], check=True, capture_output=True, text=True).stdout
        path.unlink()
        waited = 0.0
        for event in json.loads(printed)["recording"]["events"]:
            frames = (event["values"].get("stackTrace") or {}).get("frames") or []
            if any(_TABLE_LOCK_FRAME in frame["method"]["type"]["name"] for frame in frames):
                waited += _seconds(event["values"]["duration"])
        result["lock_waiting"] = waited / result["seconds"]


def _peer_process(endpoint: str, table: str, task_ids: list[str], threads: int, start: object) -> None:
    from concurrent.futures import ThreadPoolExecutor

    model = throughput.peer_model(endpoint, table)
    model.exists()  # connect before the clock starts
    start.wait()  # type: ignore[attr-defined]

    def run(task_id: str) -> None:
        with model.start(task_id):
            pass

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(run, task_ids))


def run_peer_processes(endpoint: str, tasks: int, processes: int, threads: int) -> dict:
    """The peer's requests (``start``: two conditional UpdateItems a task) from ``processes``
    forked processes of ``threads`` threads, on a new table: the clock runs from the moment all
    are connected until the last one ends."""
    model = throughput.peer_model(endpoint)
    task_ids = [f"t-{i:06d}" for i in range(tasks)]
    for task_id in task_ids:
        model.make_and_save(task_id=task_id)
    context = multiprocessing.get_context("fork")
    start = context.Barrier(processes + 1)
    children = [context.Process(target=_peer_process, args=(endpoint, model.Meta.table_name, task_ids[n::processes],
                                                            threads, start)) for n in range(processes)]
    for child in children:
        child.start()
    start.wait(timeout=60)
    started = time.perf_counter()
    for child in children:
        child.join()
    if any(child.exitcode for child in children):
        raise RuntimeError("a peer process failed (see its traceback above)")
    return {"seconds": time.perf_counter() - started, "tasks": tasks}


def equal_concurrency(args: argparse.Namespace, database: EmbeddedDatabase, counter: throughput.RequestCounter,
                      streamed: str, plain: str) -> None:
    runs: dict[str, Callable[[], dict]] = {
        "coworker, table with its stream": lambda: throughput.run_coworker(
            database.endpoint, args.tasks, args.concurrency, counter, table=streamed),
        "coworker, same table without": lambda: throughput.run_coworker(
            database.endpoint, args.tasks, args.concurrency, counter, table=plain),
        "peer": lambda: throughput.run_peer(database.endpoint, args.tasks, args.concurrency, counter),
    }
    sink = io.StringIO()  # EMF lines Powertools prints at 100 values
    with contextlib.redirect_stdout(sink):
        for run in runs.values():  # warm-up, not counted
            run()
    rates: dict[str, list[float]] = {label: [] for label in runs}
    server: dict[str, list[float]] = {label: [] for label in runs}
    print(f"Equal concurrency: {args.concurrency} threads, {args.tasks} tasks per run")
    for round_no in range(args.rounds):
        order = list(runs) if round_no % 2 == 0 else list(reversed(runs))
        for label in order:
            before = throughput.process_cpu_seconds(database.pid)
            with contextlib.redirect_stdout(sink):
                result = runs[label]()
            cpu_ms = 1000 * (throughput.process_cpu_seconds(database.pid) - before) / result["tasks"]
            rates[label].append(throughput.rate(result))
            server[label].append(cpu_ms)
            print(f"  round {round_no + 1}: {label:<34}{rates[label][-1]:7.1f} tasks/s   "
                  f"database server {cpu_ms:.2f} ms CPU/task", flush=True)
    print()
    peer = rates["peer"]
    for label in runs:
        ratio = statistics.median(a / b for a, b in zip(rates[label], peer, strict=True))
        print(f"{label:<34}{statistics.median(rates[label]):7.1f} tasks/s  {ratio:5.2f}x the peer  "
              f"database server {statistics.median(server[label]):.2f} ms CPU/task (medians)")


def best_concurrency(args: argparse.Namespace, database: EmbeddedDatabase, counter: throughput.RequestCounter,
                     streamed: str, plain: str, lock_waits: TableLockWaits | None) -> None:
    slots, threads = (int(n) for n in args.best.split("x"))
    engines = {f"coworker {args.best}, with its stream": throughput.ProcessEngine(database.endpoint, slots, threads,
                                                                                 table=streamed),
               f"coworker {args.best}, without": throughput.ProcessEngine(database.endpoint, slots, threads,
                                                                         table=plain)}
    runs: dict[str, Callable[[], dict]] = {label: (lambda e=engine: e.run(args.best_tasks))
                                           for label, engine in engines.items()}
    runs[f"peer {args.peer_threads} threads"] = lambda: throughput.run_peer(
        database.endpoint, args.best_tasks, args.peer_threads, counter)
    if args.peer_processes:
        processes, peer_threads = (int(n) for n in args.peer_processes.split("x"))
        runs[f"peer's requests, {args.peer_processes}"] = lambda: run_peer_processes(
            database.endpoint, args.best_tasks, processes, peer_threads)
    sink = io.StringIO()
    rates: dict[str, list[float]] = {label: [] for label in runs}
    waiting: dict[str, list[float]] = {label: [] for label in runs}
    print()
    print(f"Best concurrency: {args.best_tasks} tasks per run" + (", requests waiting for the table's lock "
                                                                   "(Java Flight Recorder)" if lock_waits else ""))
    try:
        with contextlib.redirect_stdout(sink):
            for _ in range(2):  # start the worker processes, let the JIT see the requests
                for run in runs.values():
                    run()
        for round_no in range(args.rounds):
            order = list(runs) if round_no % 2 == 0 else list(reversed(runs))
            for label in order:
                busy0, total0 = throughput.machine_cpu()
                result: dict = {}
                with contextlib.ExitStack() as stack:
                    stack.enter_context(contextlib.redirect_stdout(sink))
                    if lock_waits:
                        stack.enter_context(lock_waits.record(result))
                    result.update(runs[label]())
                busy1, total1 = throughput.machine_cpu()
                rates[label].append(throughput.rate(result))
                waits = ""
                if "lock_waiting" in result:
                    waiting[label].append(result["lock_waiting"])
                    waits = f"   {result['lock_waiting']:5.1f} requests waiting for the table's lock"
                print(f"  round {round_no + 1}: {label:<34}{rates[label][-1]:7.1f} tasks/s   CPUs "
                      f"{(busy1 - busy0) / max(1, total1 - total0):4.0%} busy{waits}", flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    print()
    peer = rates[f"peer {args.peer_threads} threads"]
    for label in runs:
        ratio = statistics.median(a / b for a, b in zip(rates[label], peer, strict=True))
        waits = f"  {statistics.median(waiting[label]):5.1f} waiting for the lock" if waiting[label] else ""
        print(f"{label:<34}{statistics.median(rates[label]):7.1f} tasks/s  {ratio:5.2f}x the peer{waits} (medians)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=600, help="tasks per run (equal concurrency)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of each section")
    parser.add_argument("--concurrency", type=int, default=8, help="worker threads, and the peer's")
    parser.add_argument("--best", default="2x16", help="worker processes x threads ('' skips the section)")
    parser.add_argument("--peer-threads", type=int, default=16, help="the peer's threads in that section")
    parser.add_argument("--peer-processes", default="2x16",
                        help="the peer's requests from processes x threads in that section ('' skips)")
    parser.add_argument("--best-tasks", type=int, default=1000, help="tasks per run in that section")
    parser.add_argument("--lock-waits", action="store_true",
                        help="record DynamoDB Local's waits for the table lock in that section (jcmd, jfr)")
    args = parser.parse_args(argv)
    database = embedded_database("dynamodb-local").start()
    counter = throughput.RequestCounter().install()
    try:
        streamed = _table(database.endpoint, "cw-stream", stream=True)
        plain = _table(database.endpoint, "cw-no-stream", stream=False)
        # The coordinator says at every tick that the stream-less table counts no batches: known.
        logger.addFilter(lambda record: "has no stream" not in record.getMessage())
        equal_concurrency(args, database, counter, streamed, plain)
        if args.best:
            with tempfile.TemporaryDirectory() as folder:
                lock_waits = None
                if args.lock_waits:
                    if not TableLockWaits.available(database):
                        parser.error("--lock-waits needs DynamoDB Local's process and a JDK's jcmd and jfr")
                    lock_waits = TableLockWaits(database, Path(folder))
                best_concurrency(args, database, counter, streamed, plain, lock_waits)
    finally:
        database.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
