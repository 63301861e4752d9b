"""The bill for a job: N tasks of a given length and memory on Coworker, beside SQS + Lambda with a
DynamoDB status table, and Step Functions Distributed Map, at the same workload.

    .venv/bin/python benchmarks/bill.py [--tasks 1000000] [--task-seconds 1] [--memory-mb 512]
                                        [--db moto]

What Coworker does per task is **measured** on the real engine and its embedded DynamoDB:
DynamoDB write and read units per finished task, single and in a batch (DynamoDB Local's own
accounting, with the documented rules filling in where it is silent: ``benchmarks/cost.py``),
and the log bytes one worker invocation prints per task (the worker Lambda handler itself,
Powertools logs and EMF metrics, called in this process). The rest is arithmetic on the
prices below, with the assumptions named next to them. Prices are us-east-1 list prices, as
published on the AWS pricing pages on PRICES_AS_OF; check them before you rely on a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import math
import os
import shlex
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

os.environ["POWERTOOLS_METRICS_DISABLED"] = "false"  # EMF lines are log bytes too: count them
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "Coworker")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "coworker")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "INFO")  # the deployed default
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost import happy_path  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.engine import slots, submit  # noqa: E402
from coworker.engine.tasks import TaskSpec
from coworker_local.database import create_table, start_database  # noqa: E402

PRICES_AS_OF = "2026-11-01"
# DynamoDB on-demand (request units) and storage.
DYNAMODB_WRITE_UNIT = 0.625 / 1e6
DYNAMODB_READ_UNIT = 0.125 / 1e6
DYNAMODB_GB_MONTH = 0.25
# Lambda, arm64 (Coworker's functions run on Graviton).
LAMBDA_REQUEST = 0.20 / 1e6
LAMBDA_GB_SECOND_ARM = 0.0000133334
# Lambda writes START, END and REPORT lines per invocation (about this many bytes).
LAMBDA_PLATFORM_LOG_BYTES = 350
API_GATEWAY_REST_REQUEST = 3.50 / 1e6
SQS_REQUEST = 0.40 / 1e6  # standard queue, per 64 KB request
STEP_FUNCTIONS_TRANSITION = 0.025 / 1000  # standard workflow state transition
EXPRESS_REQUEST = 1.00 / 1e6  # express workflow execution (Distributed Map child)
EXPRESS_GB_SECOND = 0.00001667  # express duration, billed in 64 MB steps
CLOUDWATCH_LOGS_GB = 0.50  # ingestion
XRAY_TRACE = 5.00 / 1e6  # traces recorded
XRAY_SAMPLED = 0.05  # the default sampling rule keeps about 5% (plus 1 per second)

# Assumptions, named.
DYNAMODB_SECONDS_PER_TASK = 0.02  # claim + finish round trips inside the worker, on AWS
COWORKER_FEED_SHARE = 0.9  # a worker keeps taking work until 10% of its timeout remains
STATUS_TABLE_WRITES = 3  # the SQS design's status table: put, "running", "done" (no index)
SQS_REQUESTS_PER_TASK = 0.3  # send, receive, delete, each in batches of 10
SQS_LAMBDA_BATCH = 10  # messages per invocation, run one after another
ITEM_BYTES = 350  # a task item, for storage


@dataclasses.dataclass(frozen=True)
class Measured:
    write_units: float
    batch_write_units: float
    read_units: float
    log_bytes_per_task: float
    log_bytes_per_invocation: float


def _units(result: dict) -> tuple[float, float]:
    total = result["total"]
    tasks = result["finished"]
    reported = total.reported_write_units + total.unreported_write_units
    return reported / tasks, total.read_units / tasks


def measure(db: str | None, tasks: int = 100) -> Measured:
    server = start_database(db)
    try:
        single = happy_path(server.endpoint, tasks, 10)
        batched = happy_path(server.endpoint, tasks, 10, batch_id="bill")
        per_task, per_invocation = _log_bytes(server.endpoint)
    finally:
        server.stop()
    write_units, read_units = _units(single)
    batch_write_units, _ = _units(batched)
    return Measured(write_units, batch_write_units, read_units, per_task, per_invocation)


def _log_bytes(endpoint: str, tasks: int = 40) -> tuple[float, float]:
    """Bytes the worker Lambda handler prints: for one invocation that runs no task, and per task
    of one that runs ``tasks`` (Powertools' JSON logs at INFO and its EMF metrics)."""
    from coworker_local.gateway import LocalLambdaContext

    table = f"bill-logs-{uuid.uuid4().hex[:8]}"
    settings = Settings(table_name=table, dynamodb_endpoint=endpoint, dispatch_on_submit=False)
    create_table(settings)
    os.environ.update(settings.as_environment())
    spec = importlib.util.spec_from_file_location(
        "worker_handler",
        Path(__file__).resolve().parents[1] / "cdk" / "coworker_cdk" / "functions" / "worker" / "handler.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    slots.ensure_slots(settings.worker_slots)

    def invoke(keys: list[str]) -> int:
        sink = io.StringIO()
        with contextlib.redirect_stdout(sink):
            module.handler({"keys": keys}, LocalLambdaContext())
        return len(sink.getvalue().encode())

    empty = invoke([])
    keys = [f"log-{i:04d}" for i in range(tasks)]
    for key in keys:
        submit.put_task(TaskSpec(key=key, type="quick", payload={"n": 1}), settings)
    busy = invoke(keys)
    return max(0.0, (busy - empty) / tasks), float(empty)


@dataclasses.dataclass
class Bill:
    name: str
    lines: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.lines.values())


def coworker_bill(m: Measured, tasks: int, seconds: float, memory_gb: float, threads: int,
                  batched: bool, timeout: float) -> Bill:
    per_invocation = max(1.0, threads * timeout * COWORKER_FEED_SHARE / (seconds + DYNAMODB_SECONDS_PER_TASK))
    invocations = math.ceil(tasks / per_invocation)
    gb_seconds = tasks * (seconds + DYNAMODB_SECONDS_PER_TASK) / threads * memory_gb
    log_bytes = tasks * m.log_bytes_per_task + invocations * (m.log_bytes_per_invocation + LAMBDA_PLATFORM_LOG_BYTES)
    wcu = m.batch_write_units if batched else m.write_units
    return Bill(f"Coworker{' (one batch)' if batched else ''}", {
        "DynamoDB writes": tasks * wcu * DYNAMODB_WRITE_UNIT,
        "DynamoDB reads": tasks * m.read_units * DYNAMODB_READ_UNIT,
        "DynamoDB storage (a month)": tasks * ITEM_BYTES / 1e9 * DYNAMODB_GB_MONTH,
        "Lambda requests": invocations * LAMBDA_REQUEST,
        "Lambda GB-s": gb_seconds * LAMBDA_GB_SECOND_ARM,
        "API Gateway (1,000 per POST)": math.ceil(tasks / 1000) * API_GATEWAY_REST_REQUEST,
        "CloudWatch Logs": log_bytes / 1e9 * CLOUDWATCH_LOGS_GB,
        "X-Ray": invocations * XRAY_SAMPLED * XRAY_TRACE,
    })


def sqs_bill(m: Measured, tasks: int, seconds: float, memory_gb: float) -> Bill:
    invocations = math.ceil(tasks / SQS_LAMBDA_BATCH)
    log_bytes = tasks * m.log_bytes_per_task + invocations * LAMBDA_PLATFORM_LOG_BYTES
    return Bill("SQS + Lambda + status table", {
        "SQS requests": tasks * SQS_REQUESTS_PER_TASK * SQS_REQUEST,
        "DynamoDB writes": tasks * STATUS_TABLE_WRITES * DYNAMODB_WRITE_UNIT,
        "DynamoDB storage (a month)": tasks * ITEM_BYTES / 1e9 * DYNAMODB_GB_MONTH,
        "Lambda requests": invocations * LAMBDA_REQUEST,
        "Lambda GB-s": tasks * (seconds + DYNAMODB_SECONDS_PER_TASK) * memory_gb * LAMBDA_GB_SECOND_ARM,
        "CloudWatch Logs": log_bytes / 1e9 * CLOUDWATCH_LOGS_GB,
        "X-Ray": invocations * XRAY_SAMPLED * XRAY_TRACE,
    })


def distributed_map_bill(m: Measured, tasks: int, seconds: float, memory_gb: float, batch: int) -> Bill:
    children = math.ceil(tasks / batch)
    child_seconds = batch * seconds + 0.1  # the child waits for its Lambda, which runs the batch
    log_bytes = tasks * m.log_bytes_per_task + children * LAMBDA_PLATFORM_LOG_BYTES
    return Bill(f"Step Functions Distributed Map (batch {batch})", {
        "parent state transitions": children * STEP_FUNCTIONS_TRANSITION,
        "express child requests": children * EXPRESS_REQUEST,
        "express child duration (64 MB)": children * child_seconds * 0.0625 * EXPRESS_GB_SECOND,
        "Lambda requests": children * LAMBDA_REQUEST,
        "Lambda GB-s": tasks * seconds * memory_gb * LAMBDA_GB_SECOND_ARM,
        "CloudWatch Logs": log_bytes / 1e9 * CLOUDWATCH_LOGS_GB,
    })


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--task-seconds", type=float, default=1.0)
    parser.add_argument("--memory-mb", type=int, default=512, help="worker memory (all designs)")
    parser.add_argument("--threads", type=int, default=10, help="Coworker batch_size: tasks per invocation at once")
    parser.add_argument("--worker-timeout", type=float, default=300.0)
    parser.add_argument("--db", choices=("auto", "dynamodb-local", "moto"), default=None)
    args = parser.parse_args(argv)
    print(f"$ .venv/bin/python benchmarks/bill.py {shlex.join(sys.argv[1:] if argv is None else argv)}".rstrip())
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        measured = measure(args.db)
    print()
    print("Measured on the real engine (per finished task): "
          f"{measured.write_units:.2f} write units single, {measured.batch_write_units:.2f} in a batch; "
          f"{measured.read_units:.2f} read units; {measured.log_bytes_per_task:,.0f} log bytes "
          f"(+ {measured.log_bytes_per_invocation:,.0f} per invocation)")
    memory_gb = args.memory_mb / 1024
    bills = [
        coworker_bill(measured, args.tasks, args.task_seconds, memory_gb, args.threads, False, args.worker_timeout),
        coworker_bill(measured, args.tasks, args.task_seconds, memory_gb, args.threads, True, args.worker_timeout),
        sqs_bill(measured, args.tasks, args.task_seconds, memory_gb),
        *(distributed_map_bill(measured, args.tasks, args.task_seconds, memory_gb, batch)
          for batch in (1, 10, 100, 1000)),
    ]
    print(f"\nBill for {args.tasks:,} tasks of {args.task_seconds:g} s at {args.memory_mb} MB "
          f"(us-east-1 list prices of {PRICES_AS_OF}, USD):\n")
    for bill in bills:
        print(f"  {bill.name}: ${bill.total:,.2f}")
        for name, amount in bill.lines.items():
            print(f"      {name:<34}${amount:>10,.4f}")
    sqs = bills[2].total
    dmap = min(b.total for b in bills[3:])
    print()
    for bill in bills[:2]:
        verdict_sqs = "meets" if bill.total <= 1.5 * sqs else "MISSES"
        verdict_map = "meets" if bill.total < dmap else "MISSES"
        print(f"  {bill.name}: {bill.total / sqs:.2f}x SQS + Lambda + status table (target <= 1.5x: {verdict_sqs}); "
              f"{bill.total / dmap:.2f}x the cheapest Distributed Map (target < 1: {verdict_map})")
    print(f"\n(Coworker runs {args.threads} tasks at once per worker invocation; the SQS design runs "
          f"{SQS_LAMBDA_BATCH} messages one after another; Distributed Map children run their batch in one "
          f"Lambda call. {time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
