"""What a long-lived DynamoDB Local costs as tables come and go: the test suite's pattern.

    .venv/bin/python benchmarks/dynamodb_local_streams.py [--rounds 12] [--streams off]
                                                          [--renew-after 20]

Each round makes 10 new task tables (as :mod:`coworker.data.layout` defines them, stream on unless
``--streams off``), writes and reads 100 items on each, and deletes all but the 4 newest, as the
test fixtures do. It prints, per round, the CPU-seconds of the server's JVM and of its SQLite
thread (where DynamoDB Local does its work), from ``/proc``. ``--renew-after N`` starts the server
afresh once N tables were made on it, as ``tests/conftest.py`` does between tests. Linux only.

Measured 2026-11-30, 12 rounds on a quiet machine: with streams on, the JVM's CPU per round grew
from 2.0 s (round 1) to 7.7 s (round 11), its SQLite thread's from 1.2 s to 6.6 s, 53 CPU-s in all;
with streams off, 1.2-1.6 s a round throughout. Started afresh after every 20 tables: 1.8-2.0 s a
round, 3.9-4.1 s with a start, 35 CPU-s in all. Deleting the tables does not bring the cost down;
a fresh server does.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402  - sets up the import paths and Powertools' switches
from coworker.config import Settings  # noqa: E402
from coworker.data.layout import PARTITION_KEY  # noqa: E402
from coworker_local.database import admin_client, create_table  # noqa: E402
from coworker_local.dynamodb_local import DynamoDBLocal  # noqa: E402

TABLES_PER_ROUND, ITEMS_PER_TABLE, KEPT_TABLES = 10, 100, 4
_TICKS = os.sysconf("SC_CLK_TCK")


def jvm_cpu(pid: int) -> collections.Counter[str]:
    """CPU-seconds so far of the whole JVM and of its SQLite thread (threads that ended count in
    the whole only)."""
    spent = collections.Counter({"jvm": throughput.process_cpu_seconds(pid)})
    for task in Path(f"/proc/{pid}/task").iterdir():  # (/proc/<thread id>/stat would give the whole JVM's)
        try:
            if (task / "comm").read_text().startswith("SQLite"):
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                spent["sqlite"] += (int(fields[11]) + int(fields[12])) / _TICKS
        except OSError:
            continue
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--streams", choices=("on", "off"), default="on")
    parser.add_argument("--renew-after", type=int, default=0,
                        help="start the server afresh after this many tables (0: never)")
    args = parser.parse_args()
    server = DynamoDBLocal().start()
    made_on_server = 0
    kept: collections.deque[str] = collections.deque()
    renewal = f"started afresh after every {args.renew_after} tables" if args.renew_after else "one server throughout"
    print(f"{args.rounds} rounds of {TABLES_PER_ROUND} tables, streams {args.streams}, {renewal}")
    print("round  JVM CPU-s  its SQLite thread  wall (s)")
    try:
        for number in range(args.rounds):
            began, wall = jvm_cpu(server.pid or 0), time.monotonic()
            spent: collections.Counter[str] = collections.Counter()
            restarts = 0
            for index in range(TABLES_PER_ROUND):
                if args.renew_after and made_on_server >= args.renew_after:
                    spent.update(jvm_cpu(server.pid or 0))
                    spent.subtract(began)
                    server.stop()
                    server.start()
                    began = collections.Counter()  # (the new server's start counts)
                    made_on_server, restarts = 0, restarts + 1
                    kept.clear()
                settings = Settings(table_name=f"tasks-{number}-{index}", dynamodb_endpoint=server.endpoint)
                create_table(settings)
                made_on_server += 1
                client = admin_client(settings)
                if args.streams == "off":
                    client.update_table(TableName=settings.table_name, StreamSpecification={"StreamEnabled": False})
                for item in range(ITEMS_PER_TABLE):
                    key = {PARTITION_KEY: {"S": f"task-{item}"}}
                    client.put_item(TableName=settings.table_name, Item={**key, "status": {"S": "pending"}})
                    client.get_item(TableName=settings.table_name, Key=key)
                kept.append(settings.table_name)
                while len(kept) > KEPT_TABLES:
                    client.delete_table(TableName=kept.popleft())
            spent.update(jvm_cpu(server.pid or 0))
            spent.subtract(began)
            note = f"  ({restarts} fresh start, its CPU included)" if restarts else ""
            print(f"{number:5d}  {spent['jvm']:9.2f}  {spent['sqlite']:17.2f}  {time.monotonic() - wall:8.1f}{note}",
                  flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
