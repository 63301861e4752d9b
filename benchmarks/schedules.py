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
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.data.models import TaskModel  # noqa: E402
from coworker_local.api_client import ApiClient  # noqa: E402
from coworker_local.database import create_table, start_database  # noqa: E402
from system import Runtime  # noqa: E402

TABLE = "schedules-bench"


def start_runtime(endpoint: str) -> Runtime:
    """One local runtime on the shared database: the stamping handlers, the one table, a worker
    environment ready at once."""
    return Runtime(endpoint, env={"COWORKER_TABLE_NAME": TABLE, "COWORKER_HANDLER_MODULES": "bench_handlers"},
                   args=("--prewarm-workers", "1"))


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
    runtimes: list[Runtime | None] = [start_runtime(database.endpoint), start_runtime(database.endpoint)]
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
                runtimes = [start_runtime(database.endpoint), start_runtime(database.endpoint)]
                print(f"  outage over at {outage[1]:%H:%M:%S}", flush=True)
                continue
            victim = rng.randrange(2)
            runtimes[victim].kill()  # type: ignore[union-attr]
            kills += 1
            time.sleep(rng.uniform(3, 10))
            runtimes[victim] = start_runtime(database.endpoint)
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
