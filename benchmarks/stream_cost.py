"""What the table's stream costs DynamoDB Local: the engine on a table with and without it.

    .venv/bin/python benchmarks/stream_cost.py [--tasks 600] [--rounds 5] [--concurrency 8]

One DynamoDB Local; two Coworker tables of the same layout (``coworker.schema``), one with the
stream batch progress is counted from and one without, made first (DynamoDB Local serves a table
with a stream more slowly the more such tables were made before it); the peer (pynamodb_mate's
tracker) on tables of its own. Each round runs the three, order alternating, as
``benchmarks/throughput.py`` runs its equal-concurrency section, and prints tasks/s and the
database server's CPU per task (put, claim, finish and the reads, from /proc). The table without
a stream is not a configuration Coworker offers: it measures the emulator's price of the stream,
to weigh it against counting batches another way.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
from collections.abc import Callable

import throughput
from coworker import schema
from coworker.config import Settings
from coworker_local.database import dynamodb_client, embedded_database


def _table(endpoint: str, name: str, stream: bool) -> str:
    request = schema.create_table_request(name)
    if not stream:
        request.pop("StreamSpecification")
    client = dynamodb_client(Settings(table_name=name, dynamodb_endpoint=endpoint))
    client.create_table(**request)
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1})
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=600, help="tasks per run")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--concurrency", type=int, default=8, help="worker threads, and the peer's")
    args = parser.parse_args(argv)
    database = embedded_database("dynamodb-local").start()
    counter = throughput.RequestCounter().install()
    try:
        streamed = _table(database.endpoint, "cw-stream", stream=True)
        plain = _table(database.endpoint, "cw-no-stream", stream=False)
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
        for round_no in range(args.rounds):
            order = list(runs) if round_no % 2 == 0 else list(reversed(runs))
            for label in order:
                before = throughput._process_cpu_seconds(database.pid)
                with contextlib.redirect_stdout(sink):
                    result = runs[label]()
                cpu_ms = 1000 * (throughput._process_cpu_seconds(database.pid) - before) / result["tasks"]
                rates[label].append(throughput._rate(result))
                server[label].append(cpu_ms)
                print(f"  round {round_no + 1}: {label:<34}{rates[label][-1]:7.1f} tasks/s   "
                      f"database server {cpu_ms:.2f} ms CPU/task", flush=True)
        print()
        peer = rates["peer"]
        for label in runs:
            ratio = statistics.median(a / b for a, b in zip(rates[label], peer, strict=True))
            print(f"{label:<34}{statistics.median(rates[label]):7.1f} tasks/s  {ratio:5.2f}x the peer  "
                  f"database server {statistics.median(server[label]):.2f} ms CPU/task (medians)")
    finally:
        database.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
