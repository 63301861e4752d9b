"""Batch callbacks under SIGKILLed runtimes: each batch's callbacks put once, each finished once,
and its events sent at least once (counted, with repeats).

    .venv/bin/python benchmarks/callbacks.py [--batches 40] [--tasks 20] [--minutes 4]

Two local runtimes (each an API, a coordinator and worker processes, as ``python -m
coworker_local`` runs them, with ``--events log`` into one shared file) on one DynamoDB Local.
Batches of ``bench-sleep`` tasks (0.2-3 s) are submitted over the run with callbacks for
``complete``, ``success`` and ``stopped``; a quarter of them also hold three ``bench-fail`` tasks
and tolerate one failure, so they stop. Every 10-25 s one runtime is SIGKILLed (its workers die
mid-task, its coordinator mid-tick, possibly between a callback's put and its record) and started
again 2-6 s later. At the end, for each batch, the callback tasks that exist must be exactly those
its final counts call for: ``complete`` always, ``success`` when none was ignored, ``stopped``
when it stopped. Each is one task (its key is derived), and must be finished.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.data.models import TaskModel  # noqa: E402
from coworker.engine import batches, callbacks  # noqa: E402
from coworker_local.api_client import ApiClient  # noqa: E402
from coworker_local.database import create_table, start_database  # noqa: E402
from system import Runtime  # noqa: E402

TABLE = "callbacks-bench"
CALLBACK = {"type": "bench-callback"}


def start_runtime(endpoint: str, events_file: Path) -> Runtime:
    return Runtime(endpoint, env={"COWORKER_TABLE_NAME": TABLE, "COWORKER_HANDLER_MODULES": "bench_handlers",
                                  "COWORKER_LOCK_SECONDS": "6", "COWORKER_BACKOFF_BASE_SECONDS": "0.5"},
                   args=("--prewarm-workers", "1", "--events", "log", "--events-file", str(events_file)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--tasks", type=int, default=20, help="tasks per batch")
    parser.add_argument("--minutes", type=float, default=4.0, help="how long the kills go on")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    events_file = Path(tempfile.mkdtemp(prefix="coworker-callbacks-")) / "events.jsonl"
    database = start_database("dynamodb-local")
    settings = Settings(table_name=TABLE, dynamodb_endpoint=database.endpoint)
    create_table(settings)
    configure(settings)
    runtimes = [start_runtime(database.endpoint, events_file), start_runtime(database.endpoint, events_file)]
    batch_ids = [f"cb{n:03d}" for n in range(args.batches)]
    stopping = {batch_id for n, batch_id in enumerate(batch_ids) if n % 4 == 3}
    kills = 0
    print(f"{args.batches} batches of {args.tasks} tasks ({len(stopping)} set to stop at a failure threshold), "
          f"2 runtimes on one DynamoDB Local, a SIGKILL every 10-25 s for {args.minutes:g} minutes", flush=True)
    try:
        end = time.monotonic() + args.minutes * 60
        pending = list(batch_ids)
        next_kill = time.monotonic() + rng.uniform(10, 25)
        while time.monotonic() < end:
            if pending:  # batches go in over the first half of the run, while runtimes die
                batch_id = pending.pop(0)
                tasks = [{"key": f"{batch_id}-{i}", "type": "bench-sleep", "payload": {"seconds": rng.uniform(0.2, 3)}}
                         for i in range(args.tasks)]
                body: dict = {"batch_id": batch_id, "tasks": tasks,
                              "callbacks": {"complete": CALLBACK, "success": CALLBACK, "stopped": CALLBACK}}
                if batch_id in stopping:
                    tasks += [{"key": f"{batch_id}-f{i}", "type": "bench-fail", "max_attempts": 1} for i in range(3)]
                    body["tolerated_failure_count"] = 1
                live = next(runtime for runtime in runtimes if runtime is not None)
                submit(ApiClient(str(live.url)), body)
            time.sleep(args.minutes * 60 / 2 / max(1, args.batches))
            if time.monotonic() >= next_kill:
                victim = rng.randrange(2)
                runtimes[victim].kill()
                kills += 1
                time.sleep(rng.uniform(2, 6))
                runtimes[victim] = start_runtime(database.endpoint, events_file)
                next_kill = time.monotonic() + rng.uniform(10, 25)
        print(f"  {kills} kills; waiting for every batch and callback to end", flush=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all_ended(batch_ids):
            time.sleep(2)
    finally:
        for runtime in runtimes:
            runtime.stop()

    problems: list[str] = []
    counts = Counter()
    runs = Counter()
    for batch_id in batch_ids:
        progress = batches.get_batch(batch_id)
        expected = set(callbacks.happened(progress))
        found = {event: task for event in callbacks.CALLBACK_EVENTS
                 if (task := maybe(callbacks.callback_key(batch_id, event))) is not None}
        counts.update(found.keys())
        if set(found) != expected:
            problems.append(f"{batch_id}: callbacks {sorted(found)}, its counts call for {sorted(expected)} "
                            f"({progress.state}, {progress.finished} finished, {progress.ignored} ignored)")
        for event, task in found.items():
            runs[int(task.attempts)] += 1
            if task.status != "finished" or task.result["event"] != event:
                problems.append(f"{task.key}: {task.status}")
    sent = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file.exists() else []
    completed = Counter(e["detail"]["batch_id"] for e in sent if e["detail-type"] == "Batch Completed")
    stopped = Counter(e["detail"]["batch_id"] for e in sent if e["detail-type"] == "Batch Stopped")
    ignored = Counter(e["detail"]["event_id"] for e in sent if e["detail-type"] == "Task Ignored")
    database.stop()
    missing = [b for b in batch_ids if not completed[b]] + [b for b in stopping if not stopped[b]]
    print(f"\n{kills} SIGKILLs; {args.batches} batches: callbacks put {dict(counts)} "
          f"(each batch's set as its counts call for: {'yes' if not problems else 'NO'})")
    print(f"  callback attempts until finished: {dict(sorted(runs.items()))} (a second attempt: its worker was killed)")
    print(f"  events: Batch Completed {sum(completed.values())} for {len(completed)} batches, Batch Stopped "
          f"{sum(stopped.values())} for {len(stopped)}, Task Ignored {sum(ignored.values())} "
          f"({len(ignored)} distinct ids); batches with no event: {missing or 'none'}")
    for problem in problems[:20]:
        print("  PROBLEM:", problem)
    return 0 if not problems and not missing else 1


def submit(api: ApiClient, body: dict) -> None:
    for _ in range(5):  # a runtime killed mid-request: the batch is sent again (idempotent by key)
        try:
            api.request("POST", "/tasks", body=body)
            return
        except Exception:  # noqa: BLE001
            time.sleep(1)
    raise RuntimeError(f"could not submit {body['batch_id']}")


def all_ended(batch_ids: list[str]) -> bool:
    for batch_id in batch_ids:
        progress = batches.get_batch(batch_id)
        if not progress.done:
            return False
        for event in callbacks.happened(progress):
            task = maybe(callbacks.callback_key(batch_id, event))
            if task is None or task.status != "finished":
                return False
    return True


def maybe(key: str) -> TaskModel | None:
    try:
        return TaskModel.get(key, consistent_read=True)
    except TaskModel.DoesNotExist:
        return None


if __name__ == "__main__":
    sys.exit(main())
