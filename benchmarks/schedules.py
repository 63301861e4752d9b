"""Recurring schedules under coordinator kills: every occurrence put once, none burst-fired, and
how long from an occurrence's due time to its task's handler starting.

    .venv/bin/python benchmarks/schedules.py [--schedules 20] [--minutes 5] [--outage 130]

Two local runtimes (each an API, a coordinator and worker processes, as ``python -m
coworker_local`` runs them) share one DynamoDB Local, so two coordinators look at the same
schedules every tick. Half the schedules are ``cron(* * * * *)``, half ``rate(1 minute)``; every
task type is ``bench-stamp``, whose handler returns the time it started.

* **Kills**: every 15-40 s one of the runtimes is SIGKILLed (its coordinator dies mid-tick, at any
  point) and started again 3-10 s later; the other keeps running. Every occurrence that falls due
  must be put exactly once, with no gap.
* **Outage**: once, both are killed for ``--outage`` seconds. Schedules miss the occurrences of
  that span; with ``missed="once"`` (the default) each then puts exactly one task for the span
  (the latest occurrence), never one per missed occurrence.
* **Latency**: due time (the occurrence, in the task's key) to the handler's start, for the
  occurrences due while a coordinator ran (p50, p95, max), with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS_DIR.parent
import re  # noqa: E402

from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.data.models import TaskModel  # noqa: E402
from coworker_local.api_client import ApiClient  # noqa: E402
from coworker_local.database import FAKE_CREDENTIALS, create_table, start_database  # noqa: E402

READY = re.compile(r"API\s+(http://\S+)")
TABLE = "schedules-bench"


class Runtime:
    """``python -m coworker_local --no-demo`` on the shared database, killable at any moment."""

    def __init__(self, endpoint: str) -> None:
        env = {**os.environ, **FAKE_CREDENTIALS, "COWORKER_DYNAMODB_ENDPOINT": endpoint,
               "COWORKER_TABLE_NAME": TABLE, "COWORKER_HANDLER_MODULES": "bench_handlers",
               "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCHMARKS_DIR), os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "coworker_local", "--no-demo", "--api-port", "0", "--prewarm-workers", "1"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.url: str | None = None
        ready = threading.Event()

        def read() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                match = READY.search(line)
                if match and self.url is None:
                    self.url = match.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(300) or self.url is None:
            raise RuntimeError("a local runtime did not start")

    def kill(self) -> None:
        """SIGKILL the runtime and its worker processes (a coordinator dying mid-write)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


def occurrence_of(key: str) -> datetime:
    return datetime.strptime(key.rsplit("@", 1)[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the run lasts")
    parser.add_argument("--outage", type=float, default=130.0, help="seconds both coordinators are down once")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    database = start_database("dynamodb-local")
    settings = Settings(table_name=TABLE, dynamodb_endpoint=database.endpoint)
    create_table(settings)
    configure(settings)
    runtimes: list[Runtime | None] = [Runtime(database.endpoint), Runtime(database.endpoint)]
    try:
        first = runtimes[0]
        assert first is not None and first.url is not None
        api = ApiClient(first.url)
        names = []
        for i in range(args.schedules):
            name = f"s{i:02d}"
            expression = "cron(* * * * *)" if i % 2 == 0 else "rate(1 minute)"
            api.request("PUT", f"/schedules/{name}", body={"expression": expression, "task": {"type": "bench-stamp"}})
            names.append(name)
        started = datetime.now(UTC)
        end = time.monotonic() + args.minutes * 60
        outage_at = time.monotonic() + args.minutes * 60 * 0.45
        outage: tuple[datetime, datetime] | None = None
        kills = 0
        print(f"{args.schedules} schedules, 2 runtimes on one DynamoDB Local, {args.minutes:g} minutes, "
              f"an outage of {args.outage:g} s about {0.45 * args.minutes:.1f} minutes in", flush=True)
        loads: list[float] = []
        while time.monotonic() < end:
            time.sleep(rng.uniform(15, 40))
            loads.append(os.getloadavg()[0])
            if outage is None and time.monotonic() >= outage_at:
                down = datetime.now(UTC)
                for index, runtime in enumerate(runtimes):
                    if runtime is not None:
                        runtime.kill()
                    runtimes[index] = None
                print(f"  outage: both coordinators killed at {down:%H:%M:%S}", flush=True)
                time.sleep(args.outage)
                outage = (down, datetime.now(UTC))
                runtimes = [Runtime(database.endpoint), Runtime(database.endpoint)]
                print(f"  outage over at {outage[1]:%H:%M:%S}", flush=True)
                continue
            victim = rng.randrange(2)
            runtimes[victim].kill()  # type: ignore[union-attr]
            kills += 1
            time.sleep(rng.uniform(3, 10))
            runtimes[victim] = Runtime(database.endpoint)
        finished = datetime.now(UTC)
        time.sleep(30)  # let the last occurrences run (a killed worker's task waits for its lock to expire)
    finally:
        for runtime in runtimes:
            if runtime is not None:
                runtime.stop()
    tasks = [task for task in TaskModel.scan() if "@" in task.key and task.key.split("@")[0] in names]
    database.stop()

    by_schedule: dict[str, list[datetime]] = defaultdict(list)
    latencies = []
    unrun = sum(1 for task in tasks if not task.result)
    for task in tasks:
        name = task.key.split("@")[0]
        occurrence = occurrence_of(task.key)
        by_schedule[name].append(occurrence)
        in_outage = outage is not None and outage[0] - timedelta(seconds=60) <= occurrence <= outage[1]
        if task.result and not in_outage:
            latencies.append(float(task.result["started_at"]) - occurrence.timestamp())
    gaps = bursts = 0
    for name in names:
        seen = sorted(by_schedule[name])
        if len(seen) != len(set(seen)):
            raise AssertionError(f"{name}: an occurrence put twice")  # keys are unique: cannot happen
        for before, after in zip(seen, seen[1:], strict=False):
            step = (after - before).total_seconds()
            spans_outage = outage is not None and before <= outage[0] and after >= outage[1] - timedelta(seconds=60)
            if step > 60 and not spans_outage:
                gaps += 1
        if outage is not None:
            bursts += max(0, sum(outage[0] < occ < outage[1] for occ in seen) - 1)
    total = sum(len(v) for v in by_schedule.values())
    print(f"\n{kills} single kills and 1 outage over {(finished - started).total_seconds() / 60:.1f} minutes; "
          f"{total} occurrences put for {args.schedules} schedules ({unrun} not run yet at the end: a killed "
          f"worker's lock had not expired, or put in the last seconds)")
    print(f"  occurrences missing while a coordinator ran: {gaps} (target 0)")
    print(f"  extra occurrences put for the outage (a burst): {bursts} (target 0; 'once' puts the latest only)")
    print(f"  due -> handler start: p50 {statistics.median(latencies):.2f} s, p95 {percentile(latencies, 0.95):.2f} s, "
          f"max {max(latencies):.2f} s over the {len(latencies)} occurrences due while a coordinator ran "
          f"(the minute before the outage and the outage left out); load average during the run "
          f"{statistics.mean(loads):.1f} (max {max(loads):.1f})")
    return 0 if gaps == bursts == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
