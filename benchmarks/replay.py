"""The engine and its peer against raw replays of their own writes: how close each comes to what
the database can take of that very workload.

    .venv/bin/python benchmarks/replay.py [--tasks 1000] [--rounds 3] [--concurrency 8]
                                          [--replay 2x16] [--engine-processes 2x16] [--warmup 2]

One DynamoDB Local, as in ``benchmarks/throughput.py``. Each round, interleaved (the order
reversed every other round):

* **engine**: ``throughput.run_coworker``: ``--tasks`` tasks put, then the engine alone in this
  process (one worker invocation of ``--concurrency`` threads feeding itself, the coordinator's
  ticks in the same process) until every task finished;
* **engine in processes** (``--engine-processes`` S x T): ``throughput.ProcessEngine``, the engine in
  S worker processes of T threads as the local runtime runs them, ticks in this process (what
  the workers send is captured by ``benchmarks/capture/sitecustomize.py`` on their path);
* **peer**: ``throughput.run_peer``: pynamodb_mate's status tracker putting the same number of tasks,
  then running them on ``--concurrency`` threads;
* **replay of each**: every request either side sent is captured on the wire (botocore's
  ``Endpoint._send``: operation and body). The task writes of its run phase (each task's claim
  and finish, or start and finish, refused ones included, in the order sent) are then sent again,
  the same requests but for the item's key (``replay-`` in front), over plain keep-alive HTTP from
  ``--replay`` P x T (processes x threads), each task's writes in order, to the same table (the
  peer's: a new one, as its runs get) holding the same items (its put phase replayed first,
  untimed). Reads, leases and slots are not replayed:
  the replay is the database's ceiling for the writes a task needs;
* **the same replay through botocore** (``--botocore``): the same requests, in the same order, from
  the same processes and threads, sent by a plain botocore DynamoDB client (one per process, as
  the engine shares one: signing, serialising, urllib3, parsing, its standard retry handler)
  instead of plain HTTP. No pynamodb and none of Coworker's code: what the library that both
  sides use costs for exactly these writes, so the best any botocore-based client could do.

Per side and per task: tasks/s of the run phase, client CPU (this process's, or the replaying
processes'), DynamoDB Local's CPU (both from /proc) and requests (for a replay, with those
refused: a condition that failed again, as it did when first sent); then each side's rate as a
share of its replay's (issue 31's target for the engine: >= 0.8), and engine / peer. Warm-up
rounds (``--warmup``) let DynamoDB Local's JIT see every request kind first and are not counted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import importlib.util
import io
import json
import multiprocessing
import os
import resource
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402  - also sets Powertools' switches and registers "bench-noop"
from coworker_local.database import embedded_database  # noqa: E402

WRITES = ("PutItem", "UpdateItem", "DeleteItem")
# Labels of replayed runs end with one of these.
REPLAYS = (" replay", " botocore")
# Requests about tables, not their items (a new table for each peer run): not counted per task.
TABLE_ADMIN = ("CreateTable", "DescribeTable", "UpdateTable", "DescribeTimeToLive", "UpdateTimeToLive")


def item_key(body: dict) -> str | None:
    """The partition key value a write names (``Key`` or ``Item``), if it is a string."""
    named = body.get("Key") or body.get("Item") or {}
    for value in named.values():
        return value.get("S")
    return None


def split_writes(sent: list[tuple[str, dict]], keys: set[str]) -> tuple[list[dict], dict[str, list[tuple[str, dict]]]]:
    """The writes of ``keys``' tasks: their puts, and per task the rest in the order sent."""
    puts: list[dict] = []
    per_task: dict[str, list[tuple[str, dict]]] = collections.defaultdict(list)
    for operation, body in sent:
        key = item_key(body) if operation in WRITES else None
        if key not in keys:
            continue
        if operation == "PutItem" and not per_task.get(key):
            puts.append(body)
        else:
            per_task[key].append((operation, body))
    return puts, dict(per_task)


# -- the replaying processes ----------------------------------------------------------------------

_WORK: list[list[tuple[str, bytes]]] = []  # per task: (operation, body), inherited by forked senders


def _send_with_botocore(endpoint: str, tasks: list[list[tuple[str, bytes]]], threads: int) -> int:
    """Send each task's requests in order through one botocore client shared by ``threads``
    threads (the bodies decoded first, so the client does all the request's work); the refused count."""
    import botocore.config
    import botocore.exceptions
    import botocore.session

    client = botocore.session.get_session().create_client(
        "dynamodb", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
        aws_secret_access_key="test",
        config=botocore.config.Config(max_pool_connections=threads, retries={"mode": "standard"}))
    decoded = [[(operation, json.loads(body)) for operation, body in requests] for requests in tasks]
    refused = 0
    lock = threading.Lock()

    def send(requests: list[tuple[str, dict]]) -> None:
        nonlocal refused
        for operation, params in requests:
            try:
                client._make_api_call(operation, params)
            except botocore.exceptions.ClientError:
                with lock:
                    refused += 1

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(send, decoded))
    return refused


def _send_tasks(endpoint: str, tasks: list[list[tuple[str, bytes]]], threads: int, via: str = "http") -> int:
    """Send each task's requests in order, ``threads`` tasks at a time; the refused count."""
    if via == "botocore":
        return _send_with_botocore(endpoint, tasks, threads)
    where = urlsplit(endpoint)
    local = threading.local()
    refused = 0
    lock = threading.Lock()
    # A signature DynamoDB Local accepts: it reads the access key, not the signature.
    authorization = ("AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, "
                     "SignedHeaders=host;x-amz-date;x-amz-target, Signature=" + "0" * 64)

    def send(requests: list[tuple[str, bytes]]) -> None:
        nonlocal refused
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection(where.hostname, where.port)
        for operation, body in requests:
            connection.request("POST", "/", body=body, headers={
                "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": f"DynamoDB_20120810.{operation}",
                "X-Amz-Date": "20260101T000000Z", "Authorization": authorization})
            answer = connection.getresponse()
            answer.read()
            if answer.status != 200:
                with lock:
                    refused += 1

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(send, tasks))
    return refused


def _sender(endpoint: str, part: int, parts: int, threads: int, via: str, results: multiprocessing.Queue) -> None:
    results.put(_send_tasks(endpoint, _WORK[part::parts], threads, via))


def replay(endpoint: str, table: str, puts: list[dict], per_task: dict[str, list[tuple[str, dict]]],
           processes: int, threads: int, database_pid: int | None, via: str = "http") -> dict:
    """Put ``puts`` into ``table`` (untimed), then send ``per_task`` from processes x threads
    (``via`` plain HTTP or a botocore client), each item under a key of its own (``replay-``, or
    ``replay-<via>-``, and its key), so that a side's own table can take them."""
    prefix = "replay-" if via == "http" else f"replay-{via}-"

    def retarget(body: dict) -> bytes:
        body = {**body, "TableName": table}
        for field in ("Key", "Item"):
            if field in body:
                named = dict(body[field])
                name = next(iter(named))
                named[name] = {"S": prefix + named[name]["S"]}
                body[field] = named
        return json.dumps(body).encode()

    _send_tasks(endpoint, [[("PutItem", retarget(body))] for body in puts], 16)
    _WORK[:] = [[(operation, retarget(body)) for operation, body in requests] for requests in per_task.values()]
    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue = context.Queue()
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    server0 = throughput.process_cpu_seconds(database_pid)
    started = time.perf_counter()
    senders = [context.Process(target=_sender, args=(endpoint, part, processes, threads, via, results))
               for part in range(processes)]
    for sender in senders:
        sender.start()
    refused = sum(results.get() for _ in senders)
    for sender in senders:
        sender.join()
    seconds = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = children.ru_utime + children.ru_stime - children0.ru_utime - children0.ru_stime
    tasks = len(per_task)
    return {"tasks": tasks, "seconds": seconds, "client_ms": 1000 * client / tasks,
            "server_ms": 1000 * (throughput.process_cpu_seconds(database_pid) - server0) / tasks,
            "requests": sum(len(r) for r in per_task.values()) / tasks, "refused": refused / tasks}


# -- one side, measured -----------------------------------------------------------------------------

def measured(run: Callable[[], dict], database_pid: int | None, pids: Callable[[], list[int]] = list) -> dict:
    """``run``'s run phase with the client's CPU per task (this process's and those of ``pids``)
    and the database's."""
    def client_cpu() -> float:
        return sum(throughput.process_cpu_seconds(pid) for pid in [os.getpid(), *pids()])

    own0 = client_cpu()
    server0 = throughput.process_cpu_seconds(database_pid)
    with contextlib.redirect_stdout(io.StringIO()):  # the engine's metrics lines
        result = run()
    tasks = result["tasks"]
    return {**result,
            "client_ms": 1000 * (client_cpu() - own0) / tasks,
            "server_ms": 1000 * (throughput.process_cpu_seconds(database_pid) - server0) / tasks}


class WireCapture:
    """What this process and its worker processes send, from the files
    ``benchmarks/capture/sitecustomize.py`` writes: a copy of it in :attr:`directory` captures in
    every process that has that folder on its path, and :meth:`install` makes it capture here too."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="coworker-capture-"))
        shutil.copy(Path(__file__).resolve().parent / "capture" / "sitecustomize.py", self.directory)
        (self.directory / "capture-requests-here").touch()
        self._read: dict[Path, int] = {}

    def install(self) -> WireCapture:
        """Capture this process's requests too (the copy installs itself when it is loaded)."""
        spec = importlib.util.spec_from_file_location("coworker_capture", self.directory / "sitecustomize.py")
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        return self

    def take(self) -> list[tuple[str, dict]]:
        """What was sent since the last call, in the order sent (after a pause: each process
        writes every 0.2 s)."""
        time.sleep(0.6)
        sent: list[tuple[float, str, dict]] = []
        for path in self.directory.glob("*.jsonl"):
            with path.open() as lines:
                lines.seek(self._read.get(path, 0))
                for line in lines:
                    at, operation, body = json.loads(line)
                    sent.append((at, operation, json.loads(body) if body else {}))
                self._read[path] = lines.tell()
        return [(operation, body) for _, operation, body in sorted(sent, key=lambda entry: entry[0])]

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="rounds not counted (DynamoDB Local's JIT)")
    parser.add_argument("--concurrency", type=int, default=8, help="threads of each side")
    parser.add_argument("--replay", default="2x16", help="replaying processes x threads")
    parser.add_argument("--botocore", action="store_true",
                        help="also replay each side's writes through a plain botocore client (the library's floor)")
    parser.add_argument("--engine-processes", default="2x16",
                        help="the engine also in worker processes, slots x threads, as the local runtime "
                             "runs it ('' to skip)")
    args = parser.parse_args(argv)
    processes, threads = (int(n) for n in args.replay.split("x"))
    print(f"$ .venv/bin/python benchmarks/replay.py {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    counter = throughput.RequestCounter()  # run_coworker and run_peer take one; the capture counts
    capture = WireCapture().install()
    with contextlib.ExitStack() as cleanup, embedded_database("dynamodb-local") as database:
        cleanup.callback(capture.close)
        endpoint, pid = database.endpoint, getattr(database, "pid", None)
        engine_table = throughput.coworker_table(endpoint)  # before any other table with a stream
        # The engine's writes are replayed into its own table (DynamoDB Local serves a table with a
        # stream more slowly the more such tables were made before it: see throughput.py); the
        # peer's, whose keys repeat from run to run, into a new table each time, as its runs are.

        def peer_replay_table() -> str:
            return str(throughput.peer_model(endpoint).Meta.table_name)

        def engine() -> dict:
            return throughput.run_coworker(endpoint, args.tasks, args.concurrency, counter, table=engine_table)

        def peer() -> dict:
            return throughput.run_peer(endpoint, args.tasks, args.concurrency, counter)

        # Each side's task keys (throughput.py names them): not its slots, leases or control items.
        # (label, run, table to replay into, task keys, client processes besides this one)
        sides: list[tuple[str, Callable[[], dict], Callable[[], str], Callable[[str], bool],
                          Callable[[], list[int]]]] = [
            ("engine", engine, lambda: engine_table, lambda key: key.startswith("t-"), list),
            ("peer", peer, peer_replay_table, lambda key: "____t-" in key, list)]
        if args.engine_processes:
            slots_, threads_ = (int(n) for n in args.engine_processes.split("x"))
            engine_processes = throughput.ProcessEngine(endpoint, slots_, threads_, table=engine_table,
                                                        python_path=[str(capture.directory)])
            cleanup.callback(engine_processes.close)

            sides.append((f"engine {engine_processes.label}", lambda: engine_processes.run(args.tasks),
                          lambda: engine_table,
                          lambda key, prefix=f"{engine_processes.label}-r": key.startswith(prefix),
                          engine_processes.pool.pids))
        results: dict[str, list[dict]] = collections.defaultdict(list)
        for round_no in range(args.warmup + args.rounds):
            counted = round_no >= args.warmup
            for label, run, replay_table, is_task, pids in (sides if round_no % 2 == 0 else list(reversed(sides))):
                capture.take()
                result = measured(run, pid, pids)
                sent = capture.take()
                keys = {key for operation, body in sent
                        if operation == "PutItem" and (key := item_key(body)) is not None and is_task(key)}
                # Requests of the run phase: the tables' items and stream, but the tasks' puts.
                result["requests"] = sum(1 for operation, body in sent if operation not in TABLE_ADMIN
                                         and not (operation == "PutItem" and item_key(body) in keys)) / len(keys)
                puts, per_task = split_writes(sent, keys)
                replays = {"replay": replay(endpoint, replay_table(), puts, per_task, processes, threads, pid)}
                if args.botocore:
                    replays["botocore"] = replay(endpoint, replay_table(), puts, per_task, processes, threads, pid,
                                                 via="botocore")
                if not counted:
                    continue
                results[label].append(result)
                for kind, replayed in replays.items():
                    results[f"{label} {kind}"].append(replayed)
                for name, figures in ((label, result), *((f"{label} {kind}", r) for kind, r in replays.items())):
                    rate = figures["tasks"] / figures["seconds"]
                    print(f"  round {round_no - args.warmup + 1}: {name:<18} {rate:7.1f} tasks/s   CPU/task: "
                          f"client {figures['client_ms']:5.2f} ms + DynamoDB Local {figures['server_ms']:5.2f} ms   "
                          f"requests/task {figures['requests']:.2f}"
                          + (f" (refused {figures['refused']:.2f})" if "refused" in figures else ""), flush=True)

    def median(label: str, field: str) -> float:
        return statistics.median(r[field] for r in results[label])

    def ratio(top: str, bottom: str) -> float:
        return statistics.median((a["tasks"] / a["seconds"]) / (b["tasks"] / b["seconds"])
                                 for a, b in zip(results[top], results[bottom], strict=True))

    print(f"\nMedians over {args.rounds} rounds of {args.tasks:,} tasks (each side {args.concurrency} threads; "
          f"replays {processes} x {threads}):")
    for label in results:
        rate = statistics.median(r["tasks"] / r["seconds"] for r in results[label])
        print(f"  {label:<18} {rate:7.1f} tasks/s   CPU/task: client {median(label, 'client_ms'):.2f} ms "
              f"+ DynamoDB Local {median(label, 'server_ms'):.2f} ms   requests/task {median(label, 'requests'):.2f}")
    print(f"  engine / its replay: {ratio('engine', 'engine replay'):.2f} (target >= 0.8)")
    print(f"  peer / its replay:   {ratio('peer', 'peer replay'):.2f}")
    print(f"  engine / peer:       {ratio('engine', 'peer'):.2f}x (target >= 1.0 at equal concurrency)")
    print(f"  engine's replay / peer's replay: {ratio('engine replay', 'peer replay'):.2f}x (the writes alone)")
    for label in [label for label in results if label.startswith("engine ") and not label.endswith(REPLAYS)]:
        print(f"  {label} / its replay: {ratio(label, label + ' replay'):.2f}; / the peer: "
              f"{ratio(label, 'peer'):.2f}x")
    if args.botocore:
        for label in [label for label in results if not label.endswith(REPLAYS)]:
            print(f"  {label}: botocore replay / plain replay {ratio(label + ' botocore', label + ' replay'):.2f}; "
                  f"{label} / botocore replay {ratio(label, label + ' botocore'):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
