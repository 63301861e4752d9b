"""Scale model: the deployed system running 1,000,000 tasks, as the template deploys it and with
the options that reach 1,000 tasks/s, with DynamoDB's and Lambda's limits applied, fed with the
write units the real engine makes per task.

    .venv/bin/python benchmarks/scale_model.py [--tasks 1000000] [--max-concurrency 120] [--rate 1000]
                                               [--task-seconds 1] [--shards 1,4] [--batched] [--db moto]

The first row is the template as deployed: its defaults (``max_concurrency``, ``batch_size``,
``status_shards``, ``tick_seconds``) come from :mod:`coworker.capacity`, which reads them from the
library's settings, as the stack does (tests/infra/test_stack.py holds them equal). The other rows
set ``max_concurrency`` to ``--rate x --task-seconds`` and compare shard counts and warm throughput.

First a short real run (the engine on its embedded DynamoDB, metered write by write with
``coworker_local.capacity.CapacityMeter``) measures what one task writes: table write units, and
index write units *by index partition key value* (``todo#n``, ``processing#n``...). Then a
one-second-step simulation of the deployed system applies, per second:

* **per partition key value**: 1,000 write units/s (DynamoDB's per-partition limit; a GSI whose
  partition key value is written faster throttles, and a GSI throttle fails the table write);
  each status's writes spread evenly over its S shards (the key hash);
* **on-demand capacity**: a new table (and each GSI) takes 4,000 write units/s (or the warm
  throughput given), and at most twice the peak it served more than 30 minutes earlier;
* **Lambda**: worker concurrency grows by at most 1,000 every 10 s, up to the account limit and
  the worker slots (``max_concurrency / batch_size``); new workers start at coordinator ticks
  (``tick_seconds``), then feed themselves;
* **the coordinator's tick**: 3 x S + 1 queries, whatever the backlog;
* **a batch** (``--batched``): its head item takes one update per put request (measured); each of
  its counter items, one per stream shard, one write per tick (the coordinator counts from the
  stream; task writes do not touch them).

Submission runs at ``--submit-rate`` tasks/s (puts compete for the same ``todo`` partitions).
An operation that touches a throttled partition fails that second and is retried the next
(counted under "throttled"). What it does not model is listed in docs/cost.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import shlex
import sys
import time
from collections.abc import Sequence

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

from coworker import capacity  # noqa: E402
from coworker.data import layout  # noqa: E402
from coworker.engine import batches  # noqa: E402
from coworker_local.capacity import status_index  # noqa: E402

PARTITION_WRITE_LIMIT = capacity.PARTITION_WRITE_UNITS  # write units per second per partition key value
NEW_TABLE_WRITE_UNITS = capacity.NEW_ON_DEMAND_WRITE_UNITS  # what a new on-demand table (or GSI) takes at once
DOUBLING_WINDOW_SECONDS = 30 * 60  # on-demand: up to 2x the peak of 30 minutes before
LAMBDA_RAMP = 1_000  # concurrent executions added per function every 10 s
LAMBDA_RAMP_SECONDS = 10
WARM_SUGGESTED = 10_000  # the warmWriteUnits shown for a pre-warmed table


@dataclasses.dataclass
class TaskWrites:
    """What one task's lifecycle steps write, measured: table units and index units by status."""

    table: dict[str, float]  # step -> table write units per task
    index: dict[str, dict[str, float]]  # step -> {status: index write units per task}
    batch_item: dict[str, float]  # step -> write units on the batch's head item per task (put)


def measure_task_writes(batched: bool, db: str | None) -> TaskWrites:
    """Run a few quick tasks through the real engine on an embedded DynamoDB, metered."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cost import happy_path  # the cost benchmark's metered run
    from coworker_local.database import start_database

    server = start_database(db)
    try:
        result = happy_path(server.endpoint, 40, 10, batch_id="scale" if batched else None, keep_records=True)
    finally:
        server.stop()
    tasks = result["finished"]
    index = status_index()
    table: dict[str, float] = collections.defaultdict(float)
    by_status: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    batch_item: dict[str, float] = collections.defaultdict(float)
    for record in result["records"]:
        if not record.succeeded:
            continue
        step = _step_of(record)
        key = (record.new or record.old or {}).get("key", {}).get("S", "")
        if key == batches.batch_key("scale"):  # the head: one update per put request
            batch_item[step] += record.table_units / tasks
            continue
        if key.startswith(("batch#", "stream#")):  # counters and checkpoints: once per tick, modelled
            continue
        if key.startswith(("slot#", "lease#")):
            continue
        table[step] += record.table_units / tasks
        before = _partition(record.old) if index.contains(record.old) else None
        after = _partition(record.new) if index.contains(record.new) else None
        if before == after and before is not None:
            by_status[step][before] += record.index_units / tasks
        else:
            share = record.index_units / ((before is not None) + (after is not None) or 1)
            for status in (before, after):
                if status is not None:
                    by_status[step][status] += share / tasks
    return TaskWrites(dict(table), {k: dict(v) for k, v in by_status.items()}, dict(batch_item))


def _partition(item: dict | None) -> str:
    return (item or {}).get(layout.STATUS_INDEX_PARTITION_KEY, {}).get("S", "?").split("#")[0]


def _step_of(record) -> str:
    key = (record.new or record.old or {}).get("key", {}).get("S", "")
    if key.startswith("batch#"):  # the head is opened when tasks are put
        return "put"
    new_status = (record.new or {}).get("status", {}).get("S")
    old_status = (record.old or {}).get("status", {}).get("S")
    if record.operation.endswith("Put") or record.operation == "PutItem" or old_status is None:
        return "put"
    if new_status == "processing":
        return "claim"
    return "finish"


@dataclasses.dataclass
class Outcome:
    shards: int
    submitted_at: float | None
    drained_at: float | None
    peak_partition_demand: float
    peak_partition_status: str
    peak_table_units: float
    throttled_by_key: int  # operations refused because a partition key value was over its limit
    throttled_by_capacity: int  # ... because the table or index was over its on-demand capacity
    tick_queries: int
    warm_write_units: float | None


def simulate(writes: TaskWrites, *, tasks: int, rate: float, task_seconds: float, shards: int,
             batch_size: int, submit_rate: float, account_concurrency: int, tick_seconds: float,
             warm_write_units: float | None, batched: bool, limit_seconds: int = 6 * 3600) -> Outcome:
    max_concurrency = math.ceil(rate * task_seconds)
    slots = math.ceil(max_concurrency / batch_size)
    base_capacity = max(NEW_TABLE_WRITE_UNITS, warm_write_units or 0)
    served_table: list[float] = []
    served_index: list[float] = []
    to_submit, due, running, finished = tasks, 0, collections.deque(), 0
    workers = 0
    throttled_by_key = throttled_by_capacity = 0
    pending_finish = 0.0
    peak_partition, peak_status, peak_table = 0.0, "", 0.0
    submitted_at = drained_at = None
    for second in range(limit_seconds):
        # Lambda: workers start at ticks, within the ramp, the account limit and the slots.
        if second % max(1, round(tick_seconds)) == 0:
            ramp_cap = LAMBDA_RAMP * (1 + second // LAMBDA_RAMP_SECONDS)
            workers = min(slots, account_concurrency, ramp_cap)
        threads = min(max_concurrency, workers * batch_size)
        # Completions this second (tasks started task_seconds ago) free their threads now; a
        # finish throttled earlier still holds its thread.
        held = pending_finish
        while running and running[0][0] <= second:
            pending_finish += running.popleft()[1]
        busy = sum(count for _, count in running)
        want_put = min(to_submit, submit_rate)
        want_claim = min(due, max(0, threads - busy - held))
        want_finish = pending_finish
        demand = {"put": want_put, "claim": want_claim, "finish": want_finish}
        # Write units by partition key value (each status spread evenly over its shards).
        per_status: dict[str, float] = collections.defaultdict(float)
        for step, count in demand.items():
            for status, units in writes.index.get(step, {}).items():
                per_status[status] += count * units
        per_value = {status: units / shards for status, units in per_status.items()}
        if batched:  # every task in one batch: its items are more partition key values. Each put
            # request updates the head; each counter item (one per stream shard) takes one write per
            # coordinator tick, however many tasks the tick counted.
            per_value["batch item"] = max(want_put * writes.batch_item.get("put", 0.0), 1.0 / tick_seconds)
        table_units = sum(count * writes.table.get(step, 0.0) for step, count in demand.items())
        index_units = sum(per_status.values())
        window = second - DOUBLING_WINDOW_SECONDS
        capacity_table = max(base_capacity, 2 * max(served_table[:window], default=0.0) if window > 0 else 0.0)
        capacity_index = max(base_capacity, 2 * max(served_index[:window], default=0.0) if window > 0 else 0.0)
        factor_value = {name: min(1.0, PARTITION_WRITE_LIMIT / units) if units else 1.0
                        for name, units in per_value.items()}
        factor_table = min(1.0, capacity_table / table_units) if table_units else 1.0
        factor_index = min(1.0, capacity_index / index_units) if index_units else 1.0
        for name, units in per_value.items():
            if units > peak_partition:
                peak_partition, peak_status = units, name
        peak_table = max(peak_table, table_units)

        capacity = min(factor_table, factor_index)
        served = {step: _served(writes, step, count, factor_value, capacity, batched)
                  for step, count in demand.items()}
        put, claim, finish = (served[step][0] for step in ("put", "claim", "finish"))
        throttled_by_key += round(sum(count - served[step][1] for step, count in demand.items()))
        throttled_by_capacity += round(sum(served[step][1] - served[step][0] for step in demand))
        to_submit -= put
        due += put - claim
        running.append((second + max(1, round(task_seconds)), claim))
        pending_finish -= finish
        finished += finish
        served_table.append(table_units * min(1.0, factor_table))
        served_index.append(index_units * min(1.0, factor_index))
        if submitted_at is None and to_submit < 0.5:
            submitted_at = second + 1
        if finished >= tasks - 0.5:
            drained_at = second + 1
            break
    return Outcome(shards, submitted_at, drained_at, peak_partition, peak_status, peak_table,
                   throttled_by_key, throttled_by_capacity, 3 * shards + 1, warm_write_units)


def _served(writes: TaskWrites, step: str, count: float, by_value: dict[str, float], capacity: float,
            batched: bool) -> tuple[float, float]:
    """How many of ``count`` operations of ``step`` go through, and how many would with unlimited
    table capacity: an operation touching a throttled partition key value (or a table or index
    over its capacity) fails as a whole."""
    touched = [by_value[status] for status in writes.index.get(step, {}) if status in by_value]
    if batched and writes.batch_item.get(step):
        touched.append(by_value["batch item"])
    by_key = count * min([1.0, *touched])
    return by_key * capacity, by_key


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--max-concurrency", type=int, default=capacity.DEFAULT_MAX_CONCURRENCY,
                        help="tasks at once of the first row (default: the template's maxConcurrency)")
    parser.add_argument("--rate", type=float, default=1_000.0,
                        help="target tasks/s of the other rows (their max_concurrency: rate x task seconds)")
    parser.add_argument("--task-seconds", type=float, default=1.0)
    parser.add_argument("--shards", default=f"1,{capacity.DEFAULT_STATUS_SHARDS}",
                        help="status shard counts to compare (the last one is the first row's)")
    parser.add_argument("--batch-size", type=int, default=capacity.DEFAULT_BATCH_SIZE)
    parser.add_argument("--submit-rate", type=float, default=2_000.0, help="tasks/s the submitter puts")
    parser.add_argument("--account-concurrency", type=int, default=1_000, help="Lambda account limit")
    parser.add_argument("--tick-seconds", type=float, default=capacity.DEFAULT_TICK_SECONDS)
    parser.add_argument("--warm-write-units", type=float, default=None)
    parser.add_argument("--batched", action="store_true", help="every task in one batch (counter item)")
    parser.add_argument("--db", choices=("auto", "dynamodb-local", "moto"), default=None)
    args = parser.parse_args(argv)
    print(f"$ .venv/bin/python benchmarks/scale_model.py {shlex.join(sys.argv[1:] if argv is None else argv)}")
    started = time.monotonic()
    writes = measure_task_writes(args.batched, args.db)
    print()
    print("Measured per task on the real engine (write units; index units by status partition):")
    for step in ("put", "claim", "finish"):
        index = ", ".join(f"{status} {units:.2f}" for status, units in sorted(writes.index.get(step, {}).items()))
        extra = f"; batch item {writes.batch_item[step]:.2f}" if writes.batch_item.get(step) else ""
        print(f"  {step:<7} table {writes.table.get(step, 0):.2f}; index {index or '-'}{extra}")
    print()
    target = math.ceil(args.rate * args.task_seconds)
    print(f"Simulated: {args.tasks:,} tasks of {args.task_seconds:g} s, as deployed ({args.max_concurrency:,} at "
          f"once) and at a target of {args.rate:,.0f} tasks/s ({target:,} at once), batch size {args.batch_size}, "
          f"submitted at {args.submit_rate:,.0f}/s{', all in one batch' if args.batched else ''}")
    print()
    print(f"  {'at once':>8}{'shards':>7}{'warm WCU/s':>11}{'all put':>10}{'drained':>10}{'tasks/s':>9}"
          f"{'peak WCU/s per key value':>27}{'peak table WCU/s':>18}{'throttled: key value':>22}"
          f"{'capacity':>10}{'tick queries':>14}")
    shard_counts = [int(s) for s in args.shards.split(",")]
    # The template as deployed, then the target's concurrency by shard count.
    runs = [(args.max_concurrency, shard_counts[-1], args.warm_write_units)]
    runs += [(target, shards, args.warm_write_units) for shards in shard_counts]
    if args.warm_write_units is None:  # and the largest shard count with the table pre-warmed
        runs.append((target, shard_counts[-1], WARM_SUGGESTED))
    for at_once, shards, warm in runs:
        outcome = simulate(writes, tasks=args.tasks, rate=at_once / args.task_seconds, task_seconds=args.task_seconds,
                           shards=shards, batch_size=args.batch_size, submit_rate=args.submit_rate,
                           account_concurrency=args.account_concurrency, tick_seconds=args.tick_seconds,
                           warm_write_units=warm, batched=args.batched)
        drained = f"{outcome.drained_at:,} s" if outcome.drained_at else "> 6 h"
        put = f"{outcome.submitted_at:,} s" if outcome.submitted_at else "-"
        speed = f"{args.tasks / outcome.drained_at:,.0f}" if outcome.drained_at else "-"
        peak = f"{outcome.peak_partition_demand:,.0f} ({outcome.peak_partition_status})"
        shown_warm = f"{warm:,.0f}" if warm else "-"
        print(f"  {at_once:>8,}{shards:>7}{shown_warm:>11}{put:>10}{drained:>10}{speed:>9}{peak:>27}"
              f"{outcome.peak_table_units:>18,.0f}{outcome.throttled_by_key:>22,}"
              f"{outcome.throttled_by_capacity:>10,}{outcome.tick_queries:>14}")
    print()
    print(f"(per key value limit {PARTITION_WRITE_LIMIT:,} WCU/s; demand above it is throttled. "
          f"{time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
