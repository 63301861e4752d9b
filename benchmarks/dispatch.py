"""Dispatch benchmark: continuous dispatch measured on the whole local system, in this process.

    .venv/bin/python benchmarks/dispatch.py [--latency-tasks 60] [--concurrency 20] [--window 60]
                                            [--warmup 10] [--lock-seconds 10] [--kill-rounds 3]
                                            [--db {auto,dynamodb-local,moto}]
                                            [--only {latency,utilisation,kill}] ...

Each section starts its own :class:`coworker_local.runtime.LocalRuntime` (embedded database, API,
coordinator timer, worker processes) with its own settings, submits through the HTTP API and
stops it again. The handlers are in ``benchmarks/bench_handlers.py``; they stamp ``time.time()``
where they start, which the benchmark compares with its own clock (same machine).

1. **Submit -> start latency** with free capacity and a 30 s tick: single tasks ``POST /tasks``
   one by one; latency = handler start - client time just before the POST. Targets: p50 < 1 s,
   p95 < 2 s, whatever the tick. Also split by whether the task ran in an invocation that had to
   start a new worker process (a cold start: the first seconds of the run) or in a warm one.
2. **Slot utilisation** with one-second tasks: enough backlog to keep ``--concurrency`` slots busy;
   utilisation = sum of task run time inside a steady-state window / (window x concurrency), the
   window starting ``--warmup`` s after the first task started. Worker recycling (a worker stops
   feeding ``max(2 x timeout margin, 10 % of its timeout)`` before its end, 10 s locally; the next
   tick replaces it) is part of what it measures. Target >= 90 %.
3. **Duplicate dispatch**, from the worker pool's per-task reports of runs 1 and 2: keys handed to
   a worker (hints) that it could not claim, as a share of all hints (target < 5 %); and the same
   for keys workers found themselves (feed).
4. **SIGKILL -> running again**: a long task's worker process is killed as soon as the task is
   seen processing (its lock then has nearly all of ``lock_seconds`` left: the slow case); time
   until the task is claimed again (attempts 2, processing). Target < 2 x lock_seconds.
   ``kill-after-beat``: the same, killed right after a heartbeat moved the task's index entry
   ahead of its lock (half a lock lifetime past it: the slowest case since heartbeats move the
   entry only every other beat). Same target.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import os
import shlex
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

BENCH_DIR = Path(__file__).resolve().parent
# Worker processes import the handler module: they get PYTHONPATH = package roots + ours.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p)
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import requests  # noqa: E402
from coworker.api.models import MAX_BATCH_TASKS  # noqa: E402
from coworker.data.models import TaskModel  # noqa: E402
from coworker_local.runtime import LocalRuntime, local_settings  # noqa: E402

HANDLER_MODULES = "coworker.engine.examples,bench_handlers"
SECTIONS = ("latency", "utilisation", "kill", "kill-after-beat", "kill-busy")
SUBMIT_CHUNK = min(500, MAX_BATCH_TASKS)
LATENCY_PAUSE = 0.2
# After the window ends, time for the tasks that ran into it to finish and be recorded.
WINDOW_SETTLE_SECONDS = 3.0


def say(text: str = "") -> None:
    """Figures go to the real stdout: ``sys.stdout`` is pointed at /dev/null while the runtime
    runs (Powertools prints EMF lines from the in-process API handler)."""
    print(text, file=sys.__stdout__, flush=True)


def percentile(values: Sequence[float], share: float) -> float:
    """Linear interpolation between closest ranks (as numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = share * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


class Bench:
    """Shared state of one benchmark run: arguments, log file, a clean environment per section."""

    def __init__(self, args: argparse.Namespace, log: IO[bytes], log_path: Path, log_note: str = "") -> None:
        self.args = args
        self.log = log
        self.log_path = log_path
        self.log_note = log_note
        self.environ = dict(os.environ)  # restored before each section: no settings leak between them
        self.session = requests.Session()
        self.outcomes: dict[str, dict[str, dict[str, int]]] = {}
        # hints not claimed, from the pool's recent invocations: by cold or warm start, and how the
        # key was run instead
        self.misses: dict[str, collections.Counter[str]] = {}
        self.database_shown = False

    @contextlib.contextmanager
    def runtime(self, drain_seconds: float = 5.0, **overrides: Any) -> Iterator[LocalRuntime]:
        """A started :class:`LocalRuntime` with ``overrides``, stopped on the way out."""
        os.environ.clear()
        os.environ.update(self.environ)
        # the API function's handler.py reads its settings (and the Lambda endpoint) at import: a new
        # runtime needs a fresh import.
        sys.modules.pop("coworker_cdk.functions.api.handler", None)
        settings = local_settings(handler_modules=HANDLER_MODULES, **overrides)
        runtime = LocalRuntime(settings, log=self.log, database=self.args.db, drain_seconds=drain_seconds,
                               prewarm=self.args.prewarm_workers)
        try:
            runtime.start()
            if not self.database_shown and runtime.database is not None:
                say(f"database: {runtime.database.name} ({runtime.database.describe()}); "
                    f"log: {self.log_path}{self.log_note}")
                self.database_shown = True
            yield runtime
        finally:
            runtime.stop()

    def record_outcomes(self, name: str, runtime: LocalRuntime) -> None:
        assert runtime.pool is not None
        self.outcomes[name] = runtime.pool.stats()["task_outcomes_by_source"]
        recent = runtime.pool.recent(limit=10_000)
        ran_by: dict[str, str] = {}  # key -> how the invocation that ran it got it
        for item in recent:
            for key, outcome in item["outcomes"].items():
                if outcome != "not_claimed":
                    ran_by[key] = "hint" if key in item["keys"] else "feed"
        misses: collections.Counter[str] = collections.Counter()
        for item in recent:
            for key in item["keys"]:
                if item["outcomes"].get(key) == "not_claimed":
                    misses["cold" if item["cold_start"] else "warm"] += 1
                    misses["run by " + ("another hint" if ran_by.get(key) == "hint" else
                                        "a self-feeding worker" if ran_by.get(key) == "feed" else "unknown")] += 1
        self.misses[name] = misses

    def post(self, runtime: LocalRuntime, body: dict[str, Any]) -> dict[str, Any]:
        response = self.session.post(f"{runtime.url}/tasks", json=body, timeout=120)
        if response.status_code not in (200, 201):
            raise RuntimeError(f"POST /tasks answered {response.status_code}: {response.text[:300]}")
        return response.json()


def describe(runtime: LocalRuntime, *extra: str) -> str:
    s = runtime.settings
    parts = [f"tick_seconds={s.tick_seconds:g}", f"max_concurrency={s.max_concurrency}",
             f"batch_size={s.batch_size} ({s.worker_slots} worker slots)",
             f"worker_timeout_seconds={s.worker_timeout_seconds}", f"lock_seconds={s.lock_seconds}",
             f"heartbeat={s.effective_heartbeat_seconds:.2f} s", *extra]
    return "settings: " + ", ".join(parts)


def read_tasks(keys: Sequence[str]) -> dict[str, TaskModel]:
    return {task.key: task for task in TaskModel.batch_get(list(keys))}


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def pool_summary(runtime: LocalRuntime) -> str:
    assert runtime.pool is not None
    stats = runtime.pool.stats()
    parts = [f"{stats.get('invoked', 0)} invocations", f"{stats.get('cold_starts', 0)} cold starts"]
    parts += [f"{stats[name]} {name}" for name in ("timeout-killed", "crashed", "interrupted", "init-failed")
              if stats.get(name)]
    return "worker pool: " + ", ".join(parts)


# -- 1. submit -> start latency ---------------------------------------------------------------


def run_latency(bench: Bench) -> None:
    count = bench.args.latency_tasks
    say("\n== 1. Submit -> start latency, free capacity, long tick ==")
    with bench.runtime(tick_seconds=30) as runtime:
        say(describe(runtime, f"{count} single tasks, POST /tasks {LATENCY_PAUSE:g} s apart"))
        run = uuid.uuid4().hex[:6]
        posted: dict[str, float] = {}
        round_trips: list[float] = []
        for number in range(count):
            key = f"lat-{run}-{number:04d}"
            before = time.time()
            bench.post(runtime, {"key": key, "type": "bench-stamp"})
            round_trips.append(time.time() - before)
            posted[key] = before
            time.sleep(LATENCY_PAUSE)
        tasks: dict[str, TaskModel] = {}

        def all_finished() -> bool:
            tasks.update(read_tasks([k for k in posted if k not in tasks or tasks[k].status != "finished"]))
            return all(task.status == "finished" for task in tasks.values()) and len(tasks) == count

        wait_until(all_finished, timeout=120, interval=0.2, what="the latency tasks to finish")
        latencies = [tasks[key].result["started_at"] - posted[key] for key in posted]
        attempts = sum(int(task.attempts) for task in tasks.values())
        ticks = list(runtime.coordinator.history) if runtime.coordinator else []
        dispatched_by_ticks = sum(t.report.dispatched for t in ticks if t.report)
        assert runtime.pool is not None
        bench.record_outcomes("latency", runtime)
        say(f"latency (handler start - client clock before POST): p50 {percentile(latencies, 0.5):.3f} s, "
            f"p95 {percentile(latencies, 0.95):.3f} s, max {max(latencies):.3f} s, "
            f"min {min(latencies):.3f} s, count {len(latencies)}")
        say(f"  targets p50 < 1 s: {verdict(percentile(latencies, 0.5) < 1)}; "
            f"p95 < 2 s: {verdict(percentile(latencies, 0.95) < 2)}")
        cold = cold_keys(runtime)
        for label, chosen in (("on a cold-started worker", [k for k in posted if k in cold]),
                              ("on a warm worker", [k for k in posted if k not in cold])):
            values = [tasks[key].result["started_at"] - posted[key] for key in chosen]
            if values:
                say(f"  {label}: p50 {percentile(values, 0.5):.3f} s, p95 {percentile(values, 0.95):.3f} s, "
                    f"max {max(values):.3f} s, count {len(values)}")
        say("  in submission order: " + " ".join(f"{value:.2f}" for value in latencies))
        say(f"  POST /tasks round trip (put + dispatch on submit): p50 {percentile(round_trips, 0.5):.3f} s, "
            f"p95 {percentile(round_trips, 0.95):.3f} s")
        say(f"  {pool_summary(runtime)}; {attempts} attempts for {count} tasks; "
            f"{len(ticks)} coordinator ticks dispatched {dispatched_by_ticks} keys")


def cold_keys(runtime: LocalRuntime) -> set[str]:
    """Keys run by invocations that started a new worker process (a cold start)."""
    assert runtime.pool is not None
    return {key for item in runtime.pool.recent(limit=10_000) if item["cold_start"]
            for key, outcome in item["outcomes"].items() if outcome != "not_claimed"}


# -- 2. slot utilisation ------------------------------------------------------------------------


def first_invocation_start(runtime: LocalRuntime) -> float | None:
    """When the earliest running invocation started (wall clock), if any runs."""
    assert runtime.pool is not None
    now = time.time()
    running = [item["running_seconds"] for item in runtime.pool.running() if item["running_seconds"] is not None]
    return now - max(running) if running else None


def run_utilisation(bench: Bench) -> None:
    args = bench.args
    concurrency, window, warmup = args.concurrency, args.window, args.warmup
    total = int(concurrency * (warmup + window + 20))
    say("\n== 2. Slot utilisation, one-second tasks, backlog kept ==")
    with bench.runtime(drain_seconds=0.5, max_concurrency=concurrency, batch_size=10, tick_seconds=1) as runtime:
        say(describe(runtime, f"{total} bench-sleep tasks of 1 s in batches of {SUBMIT_CHUNK}",
                     f"warm-up {warmup:g} s, window {window:g} s"))
        run = uuid.uuid4().hex[:6]
        tasks = [{"key": f"util-{run}-{n:06d}", "type": "bench-sleep", "payload": {"seconds": 1.0}}
                 for n in range(total)]
        chunks = [tasks[i:i + SUBMIT_CHUNK] for i in range(0, total, SUBMIT_CHUNK)]
        submitted_at = time.time()
        bench.post(runtime, {"tasks": chunks[0], "batch_id": f"util-{run}-0"})
        errors: list[BaseException] = []

        def submit_rest() -> None:
            try:
                for number, chunk in enumerate(chunks[1:], start=1):
                    bench.post(runtime, {"tasks": chunk, "batch_id": f"util-{run}-{number}"})
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        submitter = threading.Thread(target=submit_rest, name="bench-submit", daemon=True)
        submitter.start()
        first: list[float] = []

        def started() -> bool:
            at = first_invocation_start(runtime)
            if at is not None:
                first.append(at)
            return bool(first)

        wait_until(started, timeout=120, interval=0.05, what="the first worker to start")
        # The invocation starts a moment before its first task: the settle time covers it.
        end_by = first[0] + warmup + window + WINDOW_SETTLE_SECONDS
        while time.time() < end_by:
            if errors:
                raise RuntimeError(f"submitting failed: {errors[0]}") from errors[0]
            time.sleep(0.2)
        submitter.join(timeout=60)
        read_at = time.time()
        spans = [(task.result["started_at"], task.result["ended_at"])
                 for task in TaskModel.scan(TaskModel.key.startswith(f"util-{run}-"))
                 if task.status == "finished" and isinstance(task.result, dict)]
        assert runtime.pool is not None
        bench.record_outcomes("utilisation", runtime)
        summary = pool_summary(runtime)
        ticks = [t for t in (runtime.coordinator.history if runtime.coordinator else []) if t.report]
    first_start = min(start for start, _ in spans)
    begin = first_start + warmup
    end = begin + window
    busy = sum(max(0.0, min(stop, end) - max(start, begin)) for start, stop in spans)
    in_window = sum(1 for _, stop in spans if begin <= stop < end)
    utilisation = busy / (window * concurrency)
    say(f"utilisation {utilisation:.1%} of {concurrency} slots over the {window:g} s window "
        f"(target >= 90 %: {verdict(utilisation >= 0.9)}); {in_window / window:.1f} tasks/s finished in it "
        f"(ideal {concurrency:.0f}/s)")
    say(f"  first task started {first_start - submitted_at:.2f} s after the first POST; "
        f"window read {read_at - end:.1f} s after it ended; {len(spans)} tasks finished by then")
    say(f"  {summary}; {len(ticks)} coordinator ticks dispatched {sum(t.report.dispatched for t in ticks)} keys "
        f"in {sum(t.report.invocations for t in ticks)} invocations")
    per_second = [0.0] * int(window)
    for start, stop in spans:
        for second in range(int(window)):
            lo, hi = begin + second, begin + second + 1
            per_second[second] += max(0.0, min(stop, hi) - max(start, lo))
    lows = sorted(range(len(per_second)), key=per_second.__getitem__)[:3]
    say("  busy slots per second in the window: min " + ", ".join(
        f"{per_second[s]:.1f} at +{s} s" for s in sorted(lows))
        + f"; median {statistics.median(per_second):.1f}")


# -- 3. duplicate dispatch ------------------------------------------------------------------------


def report_duplicates(bench: Bench) -> None:
    if not bench.outcomes:
        return
    say("\n== 3. Duplicate dispatch (worker pool's per-task reports, runs above) ==")
    say(f"{'run':<13}{'hints':>7}{'not claimed':>13}{'share':>8}   {'feed':>6}{'not claimed':>13}{'share':>8}")
    totals = {"hint": [0, 0], "feed": [0, 0]}
    for name, by_source in bench.outcomes.items():
        row = f"{name:<13}"
        for source, widths in (("hint", (7, 13, 8)), ("feed", (6, 13, 8))):
            counts = by_source.get(source, {})
            total, missed = sum(counts.values()), counts.get("not_claimed", 0)
            totals[source][0] += total
            totals[source][1] += missed
            share = f"{missed / total:.1%}" if total else "-"
            row += f"{total:>{widths[0]}}{missed:>{widths[1]}}{share:>{widths[2]}}"
            row += "   " if source == "hint" else ""
        say(row)
    hints, missed_hints = totals["hint"]
    feeds, missed_feeds = totals["feed"]
    hint_share = missed_hints / hints if hints else 0.0
    say(f"dispatched keys not claimed: {missed_hints}/{hints} = {hint_share:.1%} "
        f"(target < 5 %: {verdict(hint_share < 0.05)}); self-fed claim conflicts: {missed_feeds}/{feeds} = "
        f"{(missed_feeds / feeds if feeds else 0.0):.1%}")
    say("  (counted from the invocations that returned; those still running when a runtime stopped are not)")
    for name, misses in bench.misses.items():
        if misses:
            say(f"  {name}: hints not claimed by " + ", ".join(
                f"{kind}-started workers {misses[kind]}" for kind in ("cold", "warm"))
                + "; those keys were " + ", ".join(f"{what} {n}" for what, n in sorted(misses.items())
                                                    if what.startswith("run by")))


# -- 4. SIGKILL -> running again -------------------------------------------------------------------


def run_kill(bench: Bench, after_beat: bool = False) -> None:
    lock, rounds = bench.args.lock_seconds, bench.args.kill_rounds
    say("\n== 4. Worker SIGKILL -> its task claimed again =="
        if not after_beat else "\n== 4a. Worker SIGKILL right after a beat moved the index entry -> claimed again ==")
    with bench.runtime(lock_seconds=lock) as runtime:
        say(describe(runtime, f"{rounds} rounds, one bench-long task each "
                              f"({3 * lock} s, stops when its claim is lost)"))
        run = uuid.uuid4().hex[:6]
        results: list[float] = []
        for number in range(rounds):
            key = f"kill-{run}-{number}"
            bench.post(runtime, {"key": key, "type": "bench-long", "payload": {"seconds": 3 * lock}})
            task: list[TaskModel] = []

            def processing(attempt: int, key: str = key, task: list[TaskModel] = task) -> bool:
                task[:] = [TaskModel.get(key)]
                return task[0].status == "processing" and int(task[0].attempts) >= attempt

            wait_until(lambda: processing(1), timeout=60, interval=0.05, what=f"{key} to start")
            assert runtime.pool is not None
            holders: list[dict[str, Any]] = []

            def found(key: str = key, holders: list[dict[str, Any]] = holders) -> bool:
                holders[:] = [item for item in runtime.pool.running() if key in item["keys"] and item["pid"]]
                return bool(holders)

            wait_until(found, timeout=10, interval=0.05, what=f"the worker process of {key}")
            pid = holders[0]["pid"]
            if after_beat:
                def moved(key: str = key) -> bool:
                    current = TaskModel.get(key, consistent_read=True)
                    return current.lock_expires_at is not None and current.due_at > current.lock_expires_at

                wait_until(moved, timeout=3 * lock, interval=0.02, what=f"a beat to move {key}'s entry")
            expires = TaskModel.get(key).lock_expires_at
            os.kill(pid, signal.SIGKILL)
            killed = time.time()
            wait_until(lambda: processing(2), timeout=10 * lock, interval=0.1, what=f"{key} to be claimed again")
            reclaimed = time.time()
            seconds = reclaimed - killed
            results.append(seconds)
            lock_left = expires.timestamp() - killed if expires else math.nan
            say(f"  round {number + 1}: killed pid {pid}; claimed again (attempt {int(task[0].attempts)}, from "
                f"{task[0].claimed_from}) after {seconds:.2f} s; the lock had {lock_left:.2f} s left at the kill, "
                f"so {seconds - lock_left:.2f} s from expiry to re-claim")
            # Stop the second attempt: its heartbeat finds the claim cancelled, the handler returns.
            bench.session.post(f"{runtime.url}/tasks/{key}/cancel", timeout=30)
        summary = pool_summary(runtime)
    worst = max(results)
    say(f"kill -> re-claim: median {statistics.median(results):.2f} s, max {worst:.2f} s over {len(results)} rounds; "
        f"2 x lock_seconds = {2 * lock} s (target < 2 x L: {verdict(worst < 2 * lock)})")
    say(f"  {summary} (a killed environment shows as crashed; the next invocation starts a cold one)")


def run_kill_busy(bench: Bench) -> None:
    """Every worker slot runs a long task and as many again wait: a killed worker's task can only
    come back through slots that turn over, and the dead invocation's own."""
    lock, rounds, slots = bench.args.lock_seconds, bench.args.kill_rounds, bench.args.kill_busy_slots
    say("\n== 4b. Worker SIGKILL with every slot busy and a backlog waiting -> its task claimed again ==")
    with bench.runtime(lock_seconds=lock, max_concurrency=slots, batch_size=1) as runtime:
        say(describe(runtime, f"{rounds} rounds; {2 * slots} bench-long tasks, each running to its worker's deadline"))
        assert runtime.pool is not None
        run = uuid.uuid4().hex[:6]
        keys = [f"busy-{run}-{n}" for n in range(2 * slots)]
        bench.post(runtime, {"tasks": [{"key": key, "type": "bench-long", "payload": {"seconds": 3600}}
                                       for key in keys]})

        def running() -> dict[str, int]:
            """Each running task's worker process: the invocation that holds its lock."""
            pids = {item["owner"]: item["pid"] for item in runtime.pool.running() if item["pid"] and item["owner"]}
            found = {}
            for key in keys:
                task = TaskModel.get(key)
                owner = task.lock_owner or ""
                if task.status == "processing" and int(task.attempts) == 1:
                    for holder, pid in pids.items():
                        if owner.startswith(holder):
                            found[key] = pid
            return found

        wait_until(lambda: len(running()) >= slots, timeout=120, interval=0.2, what="every slot busy")
        results: list[float] = []
        killed_keys: set[str] = set()
        for number in range(rounds):
            key, pid = next((k, p) for k, p in running().items() if k not in killed_keys)
            killed_keys.add(key)
            expires = TaskModel.get(key).lock_expires_at
            os.kill(pid, signal.SIGKILL)
            killed = time.time()

            def again(key: str = key) -> bool:
                return int(TaskModel.get(key).attempts) >= 2

            try:
                wait_until(again, timeout=20 * lock, interval=0.1, what=f"{key} to be claimed again")
            except TimeoutError:
                say(f"  {key}: {TaskModel.get(key).to_simple_dict()}")
                raise
            seconds = time.time() - killed
            results.append(seconds)
            lock_left = expires.timestamp() - killed if expires else math.nan
            say(f"  round {number + 1}: killed pid {pid}; {key} claimed again after {seconds:.2f} s "
                f"({seconds - lock_left:.2f} s after its lock expired)")
        for status in ("todo", "processing"):
            bench.session.post(f"{runtime.url}/bulk", json={"action": "cancel", "status": status}, timeout=60)
    worst = max(results)
    say(f"kill -> re-claim, every slot busy: median {statistics.median(results):.2f} s, max {worst:.2f} s "
        f"over {len(results)} rounds; 2 x lock_seconds = {2 * lock} s (target < 2 x L: {verdict(worst < 2 * lock)})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-tasks", type=int, default=60, help="single tasks in the latency run")
    parser.add_argument("--concurrency", type=int, default=20, help="max_concurrency of the utilisation run")
    parser.add_argument("--window", type=float, default=60.0, help="steady-state window (s) of the utilisation run")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds after the first start before the window")
    parser.add_argument("--lock-seconds", type=int, default=10, help="lock_seconds of the kill run")
    parser.add_argument("--kill-rounds", type=int, default=3, help="rounds of the kill runs")
    parser.add_argument("--kill-busy-slots", type=int, default=4, help="worker slots of the busy kill run")
    parser.add_argument("--db", choices=("auto", "dynamodb-local", "moto"), default="auto", help="embedded database")
    parser.add_argument("--only", action="append", choices=SECTIONS,
                        help="run only this section (repeat for several); default all")
    parser.add_argument("--prewarm-workers", type=int, default=None, metavar="N",
                        help="worker processes started with each runtime (default: one per slot, as "
                             "the local runtime does; 0: every worker cold-starts on demand)")
    parser.add_argument("--log", type=Path, help="runtime log file (default: a temporary one, deleted at exit)")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    sections = [s for s in SECTIONS if s in (args.only or SECTIONS)]
    say(f"$ .venv/bin/python benchmarks/dispatch.py {shlex.join(given)}".rstrip())
    say(f"({os.cpu_count()} CPUs; sections: {', '.join(sections)}; database requested: {args.db})")
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="coworker-dispatch-bench-") as folder:
        log_path = args.log or Path(folder) / "runtime.log"
        with open(log_path, "ab") as log, open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            bench = Bench(args, log, log_path, "" if args.log else " (deleted at exit)")
            if "latency" in sections:
                run_latency(bench)
            if "utilisation" in sections:
                run_utilisation(bench)
            report_duplicates(bench)
            if "kill" in sections:
                run_kill(bench)
            if "kill-after-beat" in sections:
                run_kill(bench, after_beat=True)
            if "kill-busy" in sections:
                run_kill_busy(bench)
    say(f"\n({time.monotonic() - started:.0f} s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
