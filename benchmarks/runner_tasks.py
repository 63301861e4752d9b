"""Tasks of hours on the container runner, on the whole local system (runner processes).

    .venv/bin/python benchmarks/runner_tasks.py [--minutes 20] [--kill-after 60] [--short 200] [--long 5]
                                                [--long-seconds 60] [--runs long,kill,mixed]
                                                [--db {auto,dynamodb-local,moto}]

Issue 48's measures, each run on a fresh local system (embedded DynamoDB, API, coordinator,
worker processes, runner processes), the tasks put through the HTTP API:

* ``long``: one ``bench-container`` task (a type declaring 25 minutes: the container runner's) of
  ``--minutes``; printed every 30 s: its status, its runner, and its lock's expiry, which the
  runner's heartbeat keeps moving. At the end: attempts, the lock extensions seen, wall time.
* ``kill``: the same task; ``--kill-after`` seconds into it, its runner process is SIGKILLed (no
  SIGTERM: a Fargate task lost with its host). Nothing records anything: its lock lapses, the
  coordinator starts a runner, which takes the task over and finishes it. The handler's own log
  shows how often it started and finished: exactly once finished.
* ``mixed``: one batch of ``--short`` 0.5-s tasks (Lambda workers) and ``--long`` tasks of
  ``--long-seconds`` (runners), with a ``complete`` callback: every task finished once, the
  callback once, with the batch's counts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
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
_ENVIRON = dict(os.environ)


def say(text: str = "") -> None:
    print(text, file=sys.__stdout__, flush=True)


def start(args: argparse.Namespace, log: Any, **overrides: Any) -> LocalRuntime:
    os.environ.clear()
    os.environ.update(_ENVIRON)
    sys.modules.pop("coworker_cdk.functions.api.handler", None)  # a new runtime's settings, read at import
    settings = local_settings(handler_modules=HANDLER_MODULES, **overrides)
    return LocalRuntime(settings, log=log, database=args.db).start()


def post(runtime: LocalRuntime, body: dict[str, Any]) -> Any:
    answer = requests.post(f"{runtime.url}/tasks", json=body, timeout=120)
    if answer.status_code not in (200, 201):
        raise RuntimeError(f"POST /tasks answered {answer.status_code}: {answer.text[:300]}")
    return answer.json()


def task(key: str) -> TaskModel:
    return TaskModel.get(key, consistent_read=True)


def follow(runtime: LocalRuntime, key: str, kill_after: float | None) -> dict[str, Any]:
    """Watch one long task to its end (killing its runner once, ``kill_after`` s into its run)."""
    started = time.monotonic()
    expiries: set[Any] = set()
    owners: list[str] = []
    killed = None
    last_shown = 0.0
    while True:
        item = task(key)
        if item.lock_expires_at is not None and item.status == "processing":
            expiries.add(item.lock_expires_at)
            if item.lock_owner and (not owners or owners[-1] != item.lock_owner):
                owners.append(item.lock_owner)
        elapsed = time.monotonic() - started
        if kill_after is not None and killed is None and item.status == "processing" and elapsed >= kill_after:
            assert runtime.runners is not None
            [runner] = runtime.runners.running()
            runtime.runners.kill(runner.process.pid)
            killed = elapsed
            say(f"    {elapsed:7.1f} s  SIGKILLed runner pid {runner.process.pid} (slot {runner.request.slot})")
        if elapsed - last_shown >= 30 or item.status in ("finished", "ignored"):
            say(f"    {elapsed:7.1f} s  {item.status}, attempt {item.attempts}, owner {item.lock_owner}, "
                f"lock until {item.lock_expires_at}, {len(expiries)} lock expiries seen")
            last_shown = elapsed
        if item.status in ("finished", "ignored"):
            return {"status": item.status, "attempts": int(item.attempts), "owners": owners,
                    "lock_extensions_seen": max(0, len(expiries) - len(owners)), "killed_at": killed,
                    "wall": time.monotonic() - started, "errors": [e.message for e in item.errors or []]}
        time.sleep(2.0)


def run_long(args: argparse.Namespace, log: Any, folder: Path, kill: bool) -> dict[str, Any]:
    runtime = start(args, log)
    try:
        handler_log = folder / ("kill.log" if kill else "long.log")
        key = "kill-1" if kill else "long-1"
        post(runtime, {"key": key, "type": "bench-container",
                       "payload": {"seconds": args.minutes * 60, "log": str(handler_log)}})
        result = follow(runtime, key, args.kill_after if kill else None)
        lines = handler_log.read_text().splitlines()
        result["handler_log"] = Counter(line.split(" ", 1)[1].split(" ")[0] for line in lines)
        result["runners_started"] = runtime.runners.started if runtime.runners else 0
        return result
    finally:
        runtime.stop()


def run_mixed(args: argparse.Namespace, log: Any, folder: Path) -> dict[str, Any]:
    runtime = start(args, log, max_runners=args.long)
    handler_log = folder / "mixed.log"
    try:
        tasks = [{"key": f"short-{n:04d}", "type": "bench-sleep", "payload": {"seconds": 0.5}}
                 for n in range(args.short)]
        tasks += [{"key": f"long-{n}", "type": "bench-container",
                   "payload": {"seconds": args.long_seconds, "log": str(handler_log)}} for n in range(args.long)]
        started = time.monotonic()
        answer = post(runtime, {"tasks": tasks, "callbacks": {"complete": {"type": "bench-callback"}}})
        batch_id = answer["batch_id"]
        callback_key = f"{batch_id}~complete"
        last_shown = 0.0
        while True:
            items = {t.key: t for t in TaskModel.scan(TaskModel.batch_id == batch_id)}
            done = sum(t.status in ("finished", "ignored") for t in items.values())
            callback = next(iter(TaskModel.scan(TaskModel.key == callback_key)), None)
            if time.monotonic() - last_shown >= 10:
                say(f"    {time.monotonic() - started:6.1f} s  {done}/{len(tasks)} done, "
                    f"runners {runtime.runners.stats()['running'] if runtime.runners else 0} running, "
                    f"callback {callback.status if callback else 'not yet'}")
                last_shown = time.monotonic()
            if callback is not None and callback.status == "finished":
                break
            time.sleep(1.0)
        time.sleep(3.0)  # a second callback, if there were one, would be put by now
        callbacks = list(TaskModel.scan(TaskModel.key.startswith(f"{batch_id}~")))
        lines = handler_log.read_text().splitlines()
        return {"tasks": len(items), "finished": sum(t.status == "finished" for t in items.values()),
                "attempts_above_one": sum(int(t.attempts) > 1 for t in items.values()),
                "long_runs_finished": sum(" done " in line for line in lines),
                "callbacks": [(c.key, c.status, (c.result or {}).get("finished")) for c in callbacks],
                "runners_started": runtime.runners.started if runtime.runners else 0,
                "wall": time.monotonic() - started}
    finally:
        runtime.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--kill-after", type=float, default=60.0)
    parser.add_argument("--short", type=int, default=200)
    parser.add_argument("--long", type=int, default=5)
    parser.add_argument("--long-seconds", type=float, default=60.0)
    parser.add_argument("--runs", default="long,kill,mixed")
    parser.add_argument("--db", default="auto", choices=["auto", "dynamodb-local", "moto"])
    args = parser.parse_args(argv)
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / "coworker-runner-tasks.log"
    say(f"log: {log_path}")
    with open(log_path, "ab") as log, tempfile.TemporaryDirectory(prefix="coworker-runner-") as folder:
        for run in [r.strip() for r in args.runs.split(",") if r.strip()]:
            say(f"run {run}:")
            if run == "mixed":
                result = run_mixed(args, log, Path(folder))
            else:
                result = run_long(args, log, Path(folder), kill=run == "kill")
            say(f"  {run}: {result}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
