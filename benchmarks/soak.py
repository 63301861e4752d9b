"""A scale run in one command (issue 50): the whole local system through a long drain, beside its peer.

    make soak
    .venv/bin/python benchmarks/soak.py [--tasks 100000] [--ingest-only-tasks 1000000] [--data-dir DIR]
                                        [--peer-threads 16] [--chunk 1000] [--parallel 4]

One DynamoDB Local with a data folder (``--data-dir``, kept; else a temporary one, removed at the
end) holds both sides, and ``python -m coworker_local --no-demo`` (its local defaults: 60 slots,
batches of 10) runs on it from start to end, so its processes live through the whole run.

1. **Drain, interleaved by tenths.** ``--tasks`` tasks, every other one a no-op (``bench-noop``),
   the others sleeping 10 ms (``bench-sleep``), all in **one batch with a complete callback**
   (``bench-callback``). Each tenth, Coworker's tenth is put through the Python client
   (:class:`coworker_local.client.Coworker`) in keyed requests of ``--chunk``, ``--parallel`` at
   once; they run as they arrive, and the tenth is over when the batch counters show every one of
   them ended. Right after, the peer (pynamodb_mate's status tracker) puts as many tasks into its
   own table on the same database and runs them (``query_for_unfinished`` then ``with
   Task.start(id)`` on ``--peer-threads`` threads). So the two alternate, neither running while the
   other is measured, and both see the machine's load of the same minutes. (Pausing Coworker's
   task types between its windows was tried first: a pause parks every due task of the type, a
   write each, and a resume puts them back 1,000 a tick, which measured the pause, not the drain.)
   Between tenths nothing of the batch is open but a sentinel task due in a day, which keeps the
   batch from completing; it is cancelled after the last tenth, the batch completes and its
   callback runs.
2. **Check.** The batch must read done and its callback must have run; then one scan of the table
   counts every task's status (failures and tasks not terminal must be 0; the sentinel is left out)
   and gives each task's end (``finished_at``, written by the worker that ran it, on this clock).
3. **Ingest only** (``--ingest-only-tasks``, 0 skips): that many more tasks, due in a day so that
   nothing runs, put the same way into another batch of the same table, timed; the read routes
   are timed when that batch holds 1k, 10k, 100k tasks and at its end (``GET /stats``, ``GET
   /tasks?status=todo``, ``GET /batches/{id}`` and the dashboard's refresh: the eight requests its
   page sends each refresh, six at a time as a browser does, timed to the last answer), then the
   table's size (DynamoDB Local's ``DescribeTable``, and the data folder on disk).

Figures per tenth, each printed beside the first tenth's:

* **tasks/s**: the tenth's tasks / (its first put to its last ``finished_at``), the put included,
  as the peer's put is; **put/s**: ``POST /tasks`` while the tenth's first tasks run;
* **CPU per task** (``/proc``): Coworker's runtime and every process under it (API, coordinator,
  workers) over its window, the peer's this process over its put and run, DynamoDB Local's added
  to each; its own CPU is printed too (without the database's);
* **resident memory** (VmRSS) of every process at the end of each tenth: the runtime's, DynamoDB
  Local's and this one's (the peer);
* **stream follower's lag**: now minus ``stream#counted-through`` (every stream shard read to its
  end past that time), sampled every half second while Coworker's tenth runs;
* **batch counters behind the tasks**: for each sample of ``GET /batches/{id}`` (time t,
  ``finished + ignored`` = c), t minus the time the c-th task's ``finished_at`` was written; the
  samples are half a second apart, so that is the figure's grain.

Targets (PASS/MISS): CPU per task and tasks/s of the last tenth within 20 % of the first; no
process's memory grows more than 20 % from the second tenth to the last; the batch counters at
most 3 s behind the tasks; each read route at the largest size within 2x of the same route at
1k. CPU per task moves far less with the machine's load than tasks/s does (docs/FACTS): both are
printed, with /proc/loadavg at the start and the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

BENCHMARKS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS_DIR))
from coworker.config import Settings  # noqa: E402
from coworker.data import layout  # noqa: E402
from coworker_local.client import CHUNK_TASKS, SUBMIT_PARALLEL, Coworker  # noqa: E402
from coworker_local.database import dynamodb_client, start_database  # noqa: E402
from system import Runtime, descendants, own_cpu_seconds  # noqa: E402
from throughput import peer_model, process_cpu_seconds  # noqa: E402

TYPES = ("bench-noop", "bench-sleep")
SLEEP_SECONDS = 0.01
CALLBACK = {"complete": {"type": "bench-callback"}}
PROBE_REPEATS = 5
INGEST_STEP = 25_000  # the ingest-only pass says how far it got at least this often
SAMPLE_SECONDS = 0.5
WINDOW_LIMIT_SECONDS = 3600  # a guard against a window that never ends, not a budget
DISTANCE_TARGET_SECONDS = 3.0
SENTINEL = "soak-sentinel"  # due in a day: keeps the batch open between tenths, cancelled at the end
DASHBOARD_PATHS = ("/local/info", "/stats", "/types?limit=100", "/schedules?limit=100", "/rate-limits?limit=100",
                   "/local/events", "/local/failures?limit=10")


def say(text: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {text}", flush=True)


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def rss_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def process_name(pid: int) -> str:
    with contextlib.suppress(OSError):
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        text = " ".join(w.decode(errors="replace") for w in words if w)
        if "DynamoDBLocal" in text:
            return "DynamoDB Local"
        return text.replace(sys.executable, "python")[-70:]
    return "?"


def spec(number: int, prefix: str = "soak") -> dict[str, Any]:
    if number % 2:
        return {"key": f"{prefix}-{number:07d}", "type": "bench-sleep", "payload": {"seconds": SLEEP_SECONDS}}
    return {"key": f"{prefix}-{number:07d}", "type": "bench-noop"}


class Soak:
    """One run: the database, the runtime on it, the client, and the figures gathered."""

    def __init__(self, args: argparse.Namespace, data_dir: Path) -> None:
        self.args = args
        self.database = start_database("dynamodb-local", data_dir=data_dir)
        self.db_pid: int | None = getattr(self.database, "pid", None)
        self.runtime = Runtime(self.database.endpoint, env={"COWORKER_HANDLER_MODULES": "noop_handlers,bench_handlers"},
                               args=["--prewarm-api", str(args.parallel)])
        self.runtime.wait_warm()
        assert self.runtime.url is not None
        self.url = self.runtime.url
        self.client = Coworker(self.url)
        self.settings = Settings(dynamodb_endpoint=self.database.endpoint)
        self.dynamodb = dynamodb_client(self.settings)
        self.batch_id = f"soak-{int(time.time())}"
        self._cpu_seen: dict[int, float] = {}

    # -- small readers ------------------------------------------------------------------------

    def get(self, path: str) -> Any:
        return self.client.api.request("GET", path)

    def coworker_cpu(self) -> float:
        """CPU seconds of the runtime and every process under it, ended ones included (as last
        read: a worker process that ends between two reads loses its last moments)."""
        root = self.runtime.process.pid
        for pid in [root, *descendants(root)]:
            self._cpu_seen[pid] = max(self._cpu_seen.get(pid, 0.0), process_cpu_seconds(pid))
        return sum(self._cpu_seen.values())

    def db_cpu(self) -> float:
        return process_cpu_seconds(self.db_pid)

    def memory(self) -> dict[int, tuple[str, float]]:
        pids = [self.runtime.process.pid, *descendants(self.runtime.process.pid), os.getpid()]
        if self.db_pid:
            pids.append(self.db_pid)
        found = {}
        for pid in pids:
            size = rss_mb(pid)
            if size is not None:
                found[pid] = ("this process (the peer)" if pid == os.getpid() else process_name(pid), size)
        return found

    def ended(self) -> int:
        batch = self.get(f"/batches/{self.batch_id}")
        return int(batch["finished"]) + int(batch["ignored"])

    def follower_lag(self) -> float | None:
        item = self.dynamodb.get_item(TableName=self.settings.table_name, ConsistentRead=True,
                                      Key={layout.PARTITION_KEY: {"S": layout.COUNTED_THROUGH_KEY}}).get("Item", {})
        through = item.get("counted_through", {}).get("S")
        return time.time() - datetime.fromisoformat(through).timestamp() if through else None

    # -- read routes --------------------------------------------------------------------------

    def timed(self, call: Callable[[], object]) -> float:
        started = time.perf_counter()
        call()
        return 1000 * (time.perf_counter() - started)

    def dashboard_refresh(self, batch_id: str) -> None:
        paths = [*DASHBOARD_PATHS, f"/local/batches?id={batch_id}"]
        with ThreadPoolExecutor(max_workers=6) as pool:  # a browser's connections per host
            list(pool.map(self.get_raw, paths))

    def get_raw(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=120) as answer:
            return bytes(answer.read())

    def probe(self, batch_id: str) -> dict[str, float]:
        routes: dict[str, Callable[[], object]] = {
            "GET /stats": lambda: self.get("/stats"),
            "GET /tasks?status=todo": lambda: self.get("/tasks?status=todo"),
            "GET /batches/{id}": lambda: self.get(f"/batches/{batch_id}"),
            "dashboard refresh": lambda: self.dashboard_refresh(batch_id),
        }
        return {name: statistics.median(self.timed(call) for _ in range(PROBE_REPEATS))
                for name, call in routes.items()}

    # -- phases -------------------------------------------------------------------------------

    def ingest(self, tasks: int, marks: Sequence[int], batch_id: str, prefix: str,
               run_at: str | None = None) -> tuple[float, float, dict]:
        """Put ``tasks`` in ``batch_id`` (due at ``run_at``, else at once), timing the read routes
        at each of ``marks`` and saying how far it got every INGEST_STEP tasks: (seconds of
        putting, CPU ms per task of the runtime and the database, probes by mark)."""
        probes: dict[int, dict[str, float]] = {}
        seconds = cpu = 0.0
        done = 0
        steps = set(range(INGEST_STEP, tasks, INGEST_STEP))
        for mark in sorted({*marks, *steps, tasks}):
            if mark <= done:
                continue
            cpu0 = self.coworker_cpu() + self.db_cpu()
            started = time.perf_counter()
            self.client.submit(({**spec(n, prefix), **({"run_at": run_at} if run_at else {})}
                                for n in range(done, mark)), batch_id=batch_id,
                               chunk_size=self.args.chunk, parallel=self.args.parallel)
            seconds += time.perf_counter() - started
            cpu += self.coworker_cpu() + self.db_cpu() - cpu0
            done = mark
            say(f"ingest only: {done:,}/{tasks:,} put, {done / seconds:,.0f} tasks/s so far")
            if mark in marks:
                probes[mark] = self.probe(batch_id)
                say(f"  read routes at {mark:,} tasks: "
                    + ", ".join(f"{k} {v:.0f} ms" for k, v in probes[mark].items()))
        return seconds, 1000 * cpu / tasks, probes

    def coworker_tenth(self, first: int, last: int, samples: list[tuple[float, int, float | None]]) -> dict:
        """Put tasks ``first`` to ``last - 1`` into the batch (they run as they arrive) and wait
        until the batch counters show every one of them ended (the sentinel stays open)."""
        cpu0, db0, started = self.coworker_cpu(), self.db_cpu(), time.time()
        self.client.submit((spec(n) for n in range(first, last)), batch_id=self.batch_id, chunk_size=self.args.chunk,
                           parallel=self.args.parallel, callbacks=CALLBACK)
        put = time.time() - started
        shown = time.monotonic()
        while True:
            before = time.time()
            ended = self.ended()
            lag = self.follower_lag()
            self.coworker_cpu()  # keeps the CPU of processes that end in the window
            samples.append(((before + time.time()) / 2, ended, lag))
            if ended >= last:
                break
            if time.monotonic() - shown > 15:
                say(f"  coworker: {ended:,}/{last:,} ended")
                shown = time.monotonic()
            if time.time() - started > WINDOW_LIMIT_SECONDS:
                raise RuntimeError(f"the drain stopped at {ended:,} of {last:,}")
            time.sleep(SAMPLE_SECONDS)
        return {"start": started, "put": put, "counted_at": time.time(), "cpu": self.coworker_cpu() - cpu0,
                "db": self.db_cpu() - db0, "memory": self.memory(), "first": first, "last": last}

    def peer_tenth(self, model: type, first: int, last: int) -> dict:
        """The peer puts tasks ``first`` to ``last - 1`` and runs that many to the end."""
        cpu0, db0, started = own_cpu_seconds(), self.db_cpu(), time.perf_counter()
        left = last - first

        def run(task_id: str) -> None:
            with model.start(task_id):
                pass  # the trivial handler

        with ThreadPoolExecutor(max_workers=self.args.peer_threads) as pool:
            list(pool.map(lambda i: model.make_and_save(task_id=f"t-{i:07d}"), range(first, last)))
            put = time.perf_counter() - started
            while left > 0:
                ids = [task.task_id for task in model.query_for_unfinished(limit=min(100, left))]
                if not ids:
                    break
                list(pool.map(run, ids))
                left -= len(ids)
        return {"tasks": last - first - left, "seconds": time.perf_counter() - started, "put": put,
                "cpu": own_cpu_seconds() - cpu0, "db": self.db_cpu() - db0}

    def scan_batch(self) -> tuple[dict[str, int], dict[str, float], list[str]]:
        """Every task of the batch but the sentinel: counts by status, end times by key, callback
        task statuses."""
        statuses: dict[str, int] = {}
        ends: dict[str, float] = {}
        callbacks: list[str] = []
        pages = self.dynamodb.get_paginator("scan").paginate(
            TableName=self.settings.table_name, ProjectionExpression="#k, #s, finished_at, updated_at, batch_id, #t",
            ExpressionAttributeNames={"#k": layout.PARTITION_KEY, "#s": layout.STATUS_ATTRIBUTE, "#t": "type"})
        for page in pages:
            for item in page["Items"]:
                status = item.get(layout.STATUS_ATTRIBUTE, {}).get("S", "?")
                if item.get("type", {}).get("S") == "bench-callback":
                    callbacks.append(status)
                key = item[layout.PARTITION_KEY]["S"]
                if item.get("batch_id", {}).get("S") != self.batch_id or key == SENTINEL:
                    continue
                statuses[status] = statuses.get(status, 0) + 1
                when = item.get("finished_at", item.get("updated_at", {})).get("S")
                if status in ("finished", "ignored") and when:
                    ends[key] = datetime.fromisoformat(when).timestamp()
        return statuses, ends, callbacks

    def table_size(self) -> tuple[int, int, int]:
        table = self.dynamodb.describe_table(TableName=self.settings.table_name)["Table"]
        data_dir = self.database.data_dir if hasattr(self.database, "data_dir") else None
        disk = sum(p.stat().st_size for p in Path(data_dir).rglob("*") if p.is_file()) if data_dir else 0
        return int(table.get("ItemCount", 0)), int(table.get("TableSizeBytes", 0)), disk

    def stop(self) -> None:
        self.runtime.stop()
        self.database.stop()


def percent(value: float, first: float) -> str:
    return f"{100 * (value / first - 1):+.0f}%" if first else "n/a"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main(argv: Sequence[str] | None = None) -> int:  # noqa: C901, PLR0915 - one run, told in order
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks of the drained batch (and the peer's)")
    parser.add_argument("--ingest-only-tasks", type=int, default=1_000_000, help="the ingest-only pass (0 skips)")
    parser.add_argument("--data-dir", type=Path, help="DynamoDB Local's data folder (kept); default a temporary one")
    parser.add_argument("--peer-threads", type=int, default=16)
    parser.add_argument("--chunk", type=int, default=CHUNK_TASKS, help="tasks per POST /tasks")
    parser.add_argument("--parallel", type=int, default=SUBMIT_PARALLEL, help="POST /tasks requests at once")
    args = parser.parse_args(argv)
    if args.tasks < 100:
        parser.error("--tasks must be at least 100 (ten tenths)")
    given = sys.argv[1:] if argv is None else argv
    print(f"$ .venv/bin/python benchmarks/soak.py {shlex.join(given)}".rstrip())
    load_start = loadavg()
    say(f"{os.cpu_count()} CPUs, load {load_start} (1, 5, 15 min)")
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="coworker-soak-"))
    n, m = args.tasks, args.ingest_only_tasks
    soak = Soak(args, data_dir)
    try:
        say(f"runtime {soak.url} on DynamoDB Local {soak.database.endpoint}, data in {data_dir}")
        tomorrow = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        soak.client.submit([{"key": SENTINEL, "type": "bench-noop", "run_at": tomorrow}], batch_id=soak.batch_id,
                           callbacks=CALLBACK)
        model = peer_model(soak.database.endpoint)
        samples: list[tuple[float, int, float | None]] = []
        ours: list[dict] = []
        peers: list[dict] = []
        for tenth in range(1, 11):
            first, last = n * (tenth - 1) // 10, n * tenth // 10
            sampled = len(samples)
            window = soak.coworker_tenth(first, last, samples)
            window["samples"] = (sampled, len(samples))
            ours.append(window)
            peer = soak.peer_tenth(model, first, last)
            peers.append(peer)
            seconds = window["counted_at"] - window["start"]
            say(f"tenth {tenth}/10: coworker {last - first:,} put ({(last - first) / window['put']:.0f}/s) and ended, "
                f"counted in {seconds:.1f} s ({(last - first) / seconds:.0f}/s); peer {peer['tasks']:,} put "
                f"({peer['tasks'] / peer['put']:.0f}/s) and run in {peer['seconds']:.1f} s "
                f"({peer['tasks'] / peer['seconds']:.0f}/s); load {loadavg()}")
        soak.client.cancel(SENTINEL)
        deadline = time.monotonic() + 300
        batch = soak.get(f"/batches/{soak.batch_id}")
        while not ("complete" in batch.get("fired", []) and batch["done"]) and time.monotonic() < deadline:
            time.sleep(1)
            batch = soak.get(f"/batches/{soak.batch_id}")
        time.sleep(3)  # the callback task runs at once: let it end before the scan
        say(f"batch: {batch['state']}, done {batch['done']}, fired {batch.get('fired')}; scanning the table")
        statuses, ends, callbacks = soak.scan_batch()

        probes: dict[int, dict[str, float]] = {}
        ingest_only: tuple[float, float, tuple[int, int, int]] | None = None
        if m:
            marks = sorted({mark for mark in (1_000, 10_000, 100_000) if mark < m} | {m})
            seconds, cpu, probes = soak.ingest(m, marks, f"{soak.batch_id}-ingest-only", "only", run_at=tomorrow)
            ingest_only = (seconds, cpu, soak.table_size())
    finally:
        soak.stop()
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    load_end = loadavg()

    # -- figures --------------------------------------------------------------------------------
    order = sorted(ends.values())  # the batch's task ends, oldest first

    def distances(window: dict) -> list[float]:
        """For each counter sample of the window (time t, c ended by the counters): how long
        before t the first task the counters did not show yet had ended (0 if none had)."""
        first, last = window["samples"]
        return [max(0.0, when - order[counted]) if counted < len(order) else 0.0
                for when, counted, _ in samples[first:last]]

    def nan_median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    rows = []
    for window, peer in zip(ours, peers, strict=True):
        keys = [spec(i)["key"] for i in range(window["first"], window["last"])]
        end = max(ends.get(key, window["counted_at"]) for key in keys)
        count = len(keys)
        seconds = end - window["start"]
        lags = [lag for _, _, lag in samples[window["samples"][0]:window["samples"][1]] if lag is not None]
        gaps = distances(window)
        rows.append({
            "count": count, "seconds": seconds, "rate": count / seconds, "put": count / window["put"],
            "cpu": 1000 * (window["cpu"] + window["db"]) / count, "client": 1000 * window["cpu"] / count,
            "peer_rate": peer["tasks"] / peer["seconds"], "peer_put": peer["tasks"] / peer["put"],
            "peer_cpu": 1000 * (peer["cpu"] + peer["db"]) / max(1, peer["tasks"]),
            "peer_client": 1000 * peer["cpu"] / max(1, peer["tasks"]),
            "lag_p50": nan_median(lags), "lag_max": max(lags, default=float("nan")),
            "gap_p50": nan_median(gaps), "gap_max": max(gaps, default=float("nan")),
            "rss": sum(size for _, size in window["memory"].values())})
        rows[-1]["ratio"] = rows[-1]["rate"] / rows[-1]["peer_rate"]
    first = rows[0]
    print()
    print(f"{n:,} tasks (half no-op, half 10 ms) in one batch with a complete callback, put and drained a tenth at "
          f"a time, each tenth followed by the peer's put and run of as many, on the same DynamoDB Local; "
          f"load {load_start} at the start, {load_end} at the end")
    print(f"{'tenth':>5} {'put/s':>6} {'tasks/s':>8} {'vs 1st':>7} {'CPU ms/task':>12} {'vs 1st':>7} "
          f"{'peer put/s':>10} {'peer/s':>7} {'peer CPU':>9} {'ratio':>6} {'lag p50/max s':>14} "
          f"{'behind p50/max s':>17} {'RSS MB':>7}")
    for number, row in enumerate(rows, 1):
        print(f"{number:>5} {row['put']:>6.0f} {row['rate']:>8.1f} {percent(row['rate'], first['rate']):>7} "
              f"{row['cpu']:>12.2f} {percent(row['cpu'], first['cpu']):>7} {row['peer_put']:>10.0f} "
              f"{row['peer_rate']:>7.1f} {row['peer_cpu']:>9.2f} {row['ratio']:>5.2f}x "
              f"{row['lag_p50']:>6.1f}/{row['lag_max']:<7.1f} {row['gap_p50']:>8.1f}/{row['gap_max']:<8.1f} "
              f"{row['rss']:>7.0f}")
    print("  put/s: POST /tasks while the tenth runs; tasks/s: the tenth's tasks / (first put to last finished_at); "
          "CPU ms/task: Coworker's processes + DynamoDB Local's over its window\n  (the peer's: this process + "
          "DynamoDB Local's over its put and run); ratio: Coworker's tasks/s / the peer's, same tenth; lag: the "
          "stream follower's; behind: the batch counters behind the tasks")
    print("  client CPU ms/task (without DynamoDB Local): Coworker "
          + " ".join(f"{row['client']:.2f}" for row in rows) + "; peer " + " ".join(f"{row['peer_client']:.2f}"
                                                                              for row in rows))

    print("\nResident memory (MB) of every process at the end of each tenth (those alive at the second and the last):")
    second, last_memory = ours[1]["memory"], ours[-1]["memory"]
    growths: list[tuple[float, str]] = []
    for pid, (name, size) in sorted(second.items()):
        if pid in last_memory:
            growth = last_memory[pid][1] / size - 1
            growths.append((growth, name))
            trail = " ".join(f"{w['memory'][pid][1]:.0f}" if pid in w["memory"] else "-" for w in ours)
            print(f"  {pid:>7} {name[:48]:<48} {trail}  ({growth:+.0%} from tenth 2)")
    gone = [pid for pid in second if pid not in last_memory]
    if gone:
        print(f"  ({len(gone)} process(es) of tenth 2 had ended by the last: {gone})")

    not_terminal = sum(count for status, count in statuses.items() if status not in ("finished", "ignored"))
    failures = sum(count for status, count in statuses.items() if status != "finished")
    ratios = [row["ratio"] for row in rows]
    print(f"\nTasks of the batch by status (the scan): {statuses}; {n - sum(statuses.values())} missing; callback "
          f"tasks: {callbacks}; failures {failures}, not terminal {not_terminal}")
    print(f"Against the peer, same database, interleaved by tenths: median ratio {statistics.median(ratios):.2f}x "
          f"(tenths {min(ratios):.2f}-{max(ratios):.2f}); CPU per task, median of the tenths: Coworker "
          f"{nan_median([r['cpu'] for r in rows]):.2f} ms, the peer {nan_median([r['peer_cpu'] for r in rows]):.2f} ms")
    route_ratios: dict[str, float] = {}
    if ingest_only is not None:
        seconds, cpu, (items, size, disk) = ingest_only
        print(f"Ingest only (due in a day, nothing running): {m:,} tasks in {seconds:.0f} s = {m / seconds:,.0f} "
              f"tasks/s ({cpu:.2f} ms CPU/task, runtime + DynamoDB Local); the table then {items:,} items, "
              f"{size / 1e6:,.1f} MB by DescribeTable, data folder {disk / 1e6:,.1f} MB on disk")
        marks = sorted(probes)
        print("\nRead routes (median of 5, ms) during the ingest-only pass, nothing running, at its batch's size:")
        print("  " + f"{'route':<24}" + "".join(f"{f'{mark:,} tasks':>14}" for mark in marks)
              + f"{'largest/smallest':>18}")
        for route in probes[marks[0]]:
            values = [probes[mark][route] for mark in marks]
            route_ratios[route] = values[-1] / values[0]
            print(f"  {route:<24}" + "".join(f"{v:>14.0f}" for v in values) + f"{route_ratios[route]:>17.2f}x")

    last = rows[-1]
    gap_max = max((row["gap_max"] for row in rows if row["gap_max"] == row["gap_max"]), default=float("nan"))
    checks = [
        ("failures and tasks not terminal: 0", failures == 0 and not_terminal == 0 and callbacks == ["finished"]
         and sum(statuses.values()) == n,
         f"{failures} failures, {not_terminal} not terminal, callback {callbacks}"),
        ("CPU per task, last tenth within 20% of the first", abs(last["cpu"] / first["cpu"] - 1) <= 0.2,
         f"{first['cpu']:.2f} -> {last['cpu']:.2f} ms ({percent(last['cpu'], first['cpu'])})"),
        ("drain rate, last tenth within 20% of the first", abs(last["rate"] / first["rate"] - 1) <= 0.2,
         f"{first['rate']:.1f} -> {last['rate']:.1f} tasks/s ({percent(last['rate'], first['rate'])})"),
        ("no process's memory +20% from tenth 2 to the last", bool(growths) and max(growths)[0] <= 0.2,
         "largest growth " + (f"{max(growths)[0]:+.0%} ({max(growths)[1]})" if growths else "n/a")),
        (f"batch counters at most {DISTANCE_TARGET_SECONDS:g} s behind the tasks", gap_max <= DISTANCE_TARGET_SECONDS,
         f"largest {gap_max:.1f} s"),
        ("read routes at the largest size within 2x of 1k", bool(route_ratios) and max(route_ratios.values()) <= 2,
         ", ".join(f"{k} {v:.2f}x" for k, v in route_ratios.items()) or "not measured (--ingest-only-tasks 0)"),
    ]
    print("\nTargets:")
    for name, ok, detail in checks:
        print(f"  {verdict(ok)}  {name}: {detail}")
    return 0 if checks[0][1] else 1


if __name__ == "__main__":
    raise SystemExit(main())
