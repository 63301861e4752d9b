"""Long tasks: attempts killed at a worker's deadline, and how much worker time went into handlers
that finished, with declared time limits and without, on the whole local system.

    .venv/bin/python benchmarks/long_tasks.py [--tasks 200] [--min-seconds 5] [--max-seconds 25]
                                              [--worker-timeout 30] [--margin 2] [--concurrency 20]
                                              [--sides declared,undeclared] [--db {auto,dynamodb-local,moto}]

Issue 47's run at 1/10 scale (a 300-s worker and tasks of 1 to 4 minutes become a 30-s worker and
tasks of 5 to 25 s): ``--tasks`` tasks of the ``bench-sleep`` type, their lengths drawn once (seed
47) and put the same way on each side, each side on a fresh local system (embedded DynamoDB, API,
coordinator, worker processes of one thread each, so that an invocation's time is its handler's):

* ``declared``: each task carries its time limit (``timeout_seconds``: its length plus 1 s);
* ``undeclared``: no limit anywhere (the worker plans them from observed run times, once known).

Printed per side, once every task is finished or ignored:

* attempts killed at a deadline (recorded ``timeout``): target 0 with limits;
* handler time of the attempts that finished / invocation time (the sum over worker invocations
  of how long each ran, sampled from the pool every 0.25 s): target >= 0.8;
* attempts, tasks finished and ignored, and the wall time.

Run it from a checkout of an earlier commit (``--sides undeclared``) for the figures before limits.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

BENCH_DIR = Path(__file__).resolve().parent
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), os.environ.get("PYTHONPATH", "")) if p)
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import requests  # noqa: E402
from coworker.data.models import TaskModel  # noqa: E402
from coworker_local.runtime import LocalRuntime, local_settings  # noqa: E402

HANDLER_MODULES = "coworker.engine.examples,bench_handlers"
SEED = 47
LIMIT_SLACK_SECONDS = 1.0
SAMPLE_SECONDS = 0.25
SUBMIT_CHUNK = 100


def say(text: str = "") -> None:
    print(text, file=sys.__stdout__, flush=True)


def lengths(args: argparse.Namespace) -> list[float]:
    rng = random.Random(SEED)
    return [round(rng.uniform(args.min_seconds, args.max_seconds), 2) for _ in range(args.tasks)]


class InvocationClock:
    """Integrates how many worker invocations run, sampled from the pool: invocation-seconds."""

    def __init__(self, runtime: LocalRuntime) -> None:
        self._runtime = runtime
        self._stop = threading.Event()
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> InvocationClock:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        assert self._runtime.pool is not None
        last = time.monotonic()
        while not self._stop.wait(SAMPLE_SECONDS):
            now = time.monotonic()
            self.seconds += len(self._runtime.pool.running()) * (now - last)
            last = now


_ENVIRON = dict(os.environ)  # a runtime exports its settings: each side starts from this


def run_side(side: str, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    os.environ.clear()
    os.environ.update(_ENVIRON)
    # the API function's handler.py reads its settings at import: a new runtime needs a fresh import
    sys.modules.pop("coworker_cdk.functions.api.handler", None)
    settings = local_settings(handler_modules=HANDLER_MODULES, worker_timeout_seconds=args.worker_timeout,
                              timeout_margin_seconds=args.margin, max_concurrency=args.concurrency, batch_size=1)
    runtime = LocalRuntime(settings, log=log, database=args.db)
    runtime.start()
    session = requests.Session()
    try:
        tasks = []
        for number, seconds in enumerate(lengths(args)):
            task: dict[str, Any] = {"key": f"{side}-{number:04d}", "type": "bench-sleep",
                                    "payload": {"seconds": seconds}}
            if side == "declared":
                task["timeout_seconds"] = seconds + LIMIT_SLACK_SECONDS
            tasks.append(task)
        started = time.monotonic()
        with InvocationClock(runtime) as clock:
            for offset in range(0, len(tasks), SUBMIT_CHUNK):
                answer = session.post(f"{runtime.url}/tasks", json={"tasks": tasks[offset:offset + SUBMIT_CHUNK]},
                                      timeout=120)
                if answer.status_code not in (200, 201):
                    raise RuntimeError(f"POST /tasks answered {answer.status_code}: {answer.text[:300]}")
            last_shown = 0.0
            while True:
                items = list(TaskModel.scan(TaskModel.key.startswith(f"{side}-")))
                done = sum(t.status in ("finished", "ignored") for t in items)
                if time.monotonic() - last_shown >= 10 or done == len(tasks):
                    say(f"  [{side}] {time.monotonic() - started:6.1f} s  {done}/{len(tasks)} terminal, "
                        f"{sum(int(t.attempts or 0) for t in items)} attempts")
                    last_shown = time.monotonic()
                if done == len(tasks):
                    break
                time.sleep(1.0)
        wall = time.monotonic() - started
        return summarise(side, items, clock.seconds, wall)
    finally:
        runtime.stop()


def summarise(side: str, items: Sequence[TaskModel], invocation_seconds: float, wall: float) -> dict[str, Any]:
    killed = [e for t in items for e in (t.errors or []) if e.kind == "timeout"]
    at_deadline = [e for e in killed if "worker's time limit" in e.message]
    handler_seconds = 0.0
    for task in items:
        if task.status == "finished" and isinstance(task.result, dict) and "ended_at" in task.result:
            handler_seconds += float(task.result["ended_at"]) - float(task.result["started_at"])
    return {
        "side": side, "tasks": len(items),
        "finished": sum(t.status == "finished" for t in items), "ignored": sum(t.status == "ignored" for t in items),
        "attempts": sum(int(t.attempts or 0) for t in items), "killed": len(killed),
        "killed_at_deadline": len(at_deadline),
        "handler_seconds": handler_seconds, "invocation_seconds": invocation_seconds, "wall": wall,
        "useful": handler_seconds / invocation_seconds if invocation_seconds else float("nan"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--min-seconds", type=float, default=5.0)
    parser.add_argument("--max-seconds", type=float, default=25.0)
    parser.add_argument("--worker-timeout", type=int, default=30)
    parser.add_argument("--margin", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--sides", default="declared,undeclared")
    parser.add_argument("--db", default="auto", choices=["auto", "dynamodb-local", "moto"])
    args = parser.parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / "coworker-long-tasks.log"
    drawn = lengths(args)
    say(f"{args.tasks} tasks of {args.min_seconds:g}-{args.max_seconds:g} s (mean {statistics.mean(drawn):.1f} s), "
        f"worker timeout {args.worker_timeout} s, margin {args.margin:g} s, {args.concurrency} slots x 1 thread; "
        f"log: {log_path}")
    results = []
    with open(log_path, "ab") as log:
        for side in sides:
            say(f"side {side}:")
            results.append(run_side(side, args, log))
            say(f"  {results[-1]}")
    say()
    say("| side | attempts | killed at a deadline (of which at the worker's) | finished / ignored | "
        "finished handler time / invocation time | wall |")
    say("|---|---:|---:|---:|---:|---:|")
    for r in results:
        say(f"| {r['side']} | {r['attempts']} | {r['killed']} ({r['killed_at_deadline']}) | "
            f"{r['finished']} / {r['ignored']} | {r['handler_seconds']:.0f} / {r['invocation_seconds']:.0f} s = "
            f"**{r['useful']:.2f}** | {r['wall']:.0f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
