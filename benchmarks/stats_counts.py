"""How long GET /stats takes at a large backlog (issue 50, item 3).

    PYTHONPATH=. .venv/bin/python benchmarks/stats_counts.py [TASKS]     # default 100,000; CAPS=1000,2500

Loads TASKS tasks (70 % todo, 10 % each processing, failed, ignored; copies of a real task item,
written with BatchWriteItem: 4-5 minutes on a loaded machine) into an in-memory DynamoDB Local,
then times 7 counts of each way to count, at each cap: a status after another, keys read (GET
/stats before issue 50); every shard of every status at once, keys read; the same with
Select=COUNT; and GET /stats as the code stands (through the resolver, as API Gateway calls it).
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")

from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.data import index, layout  # noqa: E402
from coworker.data.models import TaskModel, status_shards, utcnow  # noqa: E402
from coworker.engine import submit  # noqa: E402
from coworker.engine.tasks import TaskSpec  # noqa: E402
from coworker_local.database import create_table, dynamodb_client, embedded_database  # noqa: E402

from tests.support.doubles import Api  # noqa: E402

SHARE = {"todo": 0.7, "processing": 0.1, "failed": 0.1, "ignored": 0.1}
STATUSES = list(SHARE)
RUNS = 7


def load(settings: Settings, total: int) -> None:
    client = dynamodb_client(settings)
    submit.put_task(TaskSpec(key="template", type="quick", payload={"n": 0}), settings)
    template = client.get_item(TableName=settings.table_name, Key={"key": {"S": "template"}})["Item"]
    client.delete_item(TableName=settings.table_name, Key={"key": {"S": "template"}})
    base = utcnow() - timedelta(hours=1)
    items = []
    for status, share in SHARE.items():
        for number in range(int(total * share)):
            key = f"{status}-{number:06d}"
            due = (base + timedelta(microseconds=number)).strftime("%Y-%m-%dT%H:%M:%S.%f+0000")
            items.append({**template, "key": {"S": key}, "status": {"S": status}, "due_at": {"S": due},
                          "status_shard": {"S": TaskModel.shard_value_of(key, status)}})

    def write(chunk: list[dict[str, Any]]) -> None:
        writer = dynamodb_client(settings)
        pending = {settings.table_name: [{"PutRequest": {"Item": item}} for item in chunk]}
        while pending:
            pending = writer.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, [items[i:i + 25] for i in range(0, len(items), 25)]))


def sequential(cap: int) -> dict[str, tuple[int, bool]]:
    """GET /stats before: a status after another, its shards at once, keys read."""
    return {status: index.count_capped(status, cap) for status in STATUSES}


def count_shard_select(value: str, cap: int) -> tuple[int, bool]:
    connection = TaskModel._get_connection()
    total, last = 0, None
    while total <= cap:
        page = connection.query(value, index_name=TaskModel.status_index.Meta.index_name, select="COUNT",
                                limit=cap + 1 - total, exclusive_start_key=last)
        total += int(page.get("Count", 0))
        last = page.get("LastEvaluatedKey")
        if last is None:
            break
    return min(total, cap), total > cap


def at_once(cap: int, shard_counter: Callable[[str, int], tuple[int, bool]]) -> dict[str, tuple[int, bool]]:
    """Every shard of every status in one parallel round, each up to its share of the cap."""
    values = {status: layout.shard_values(status, status_shards()) for status in STATUSES}
    calls = [functools.partial(shard_counter, value, max(1, math.ceil(cap / len(values[status]))))
             for status in STATUSES for value in values[status]]
    counted = iter(index._parallel(calls))
    found = {}
    for status in STATUSES:
        part = [next(counted) for _ in values[status]]
        total = sum(n for n, _ in part)
        found[status] = (min(total, cap), total > cap or any(capped for _, capped in part))
    return found


def timed(count: Callable[[], Any]) -> tuple[str, Any]:
    times, result = [], None
    for _ in range(RUNS):
        started = time.monotonic()
        result = count()
        times.append(time.monotonic() - started)
    return f"median {statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f})", result


def main() -> None:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    database = embedded_database("dynamodb-local").start()
    try:
        settings = Settings(table_name="stats-measure", dynamodb_endpoint=database.endpoint)
        create_table(settings)
        configure(settings)
        started = time.monotonic()
        load(settings, total)
        print(f"loaded {total} tasks in {time.monotonic() - started:.0f} s; {status_shards()} shards", flush=True)
        api = Api(settings)
        ways: dict[str, Callable[[int], Any]] = {
            "a status after another, keys read (before)": sequential,
            "at once, keys read": lambda cap: at_once(cap, index._count_shard),
            "at once, Select=COUNT": lambda cap: at_once(cap, count_shard_select),
            "GET /stats as the code stands": lambda cap: api.call("GET", f"/stats?cap={cap}")[1]["counts"],
        }
        for cap in [int(c) for c in os.environ.get("CAPS", "1000,2500").split(",")]:
            for name, count in ways.items():
                figures, result = timed(functools.partial(count, cap))
                print(f"cap={cap} {name}: {figures}; {result}", flush=True)
    finally:
        database.stop()


if __name__ == "__main__":
    main()
