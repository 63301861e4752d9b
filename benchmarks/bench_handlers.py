"""Task handlers of ``benchmarks/dispatch.py``, imported by its worker processes.

Each one stamps the wall clock (``time.time()``) where the handler starts, so the benchmark
can compare it with the client's clock in the same machine.
"""

from __future__ import annotations

import time
from typing import Any

from coworker.engine.handlers import TaskContext, task_handler


@task_handler("bench-stamp")
def bench_stamp(payload: Any, context: TaskContext) -> dict[str, float]:
    """Return at once with the time the handler started."""
    return {"started_at": time.time()}


@task_handler("bench-sleep")
def bench_sleep(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, float]:
    """Sleep ``seconds`` (default 1): one busy worker slot for that long."""
    started = time.time()
    time.sleep(float((payload or {}).get("seconds", 1.0)))
    return {"started_at": started, "ended_at": time.time()}


@task_handler("bench-long")
def bench_long(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Sleep up to ``seconds`` in small steps; stop early once the claim is lost (the task was
    cancelled or taken over) or the handler's deadline is near."""
    started = time.time()
    end = time.monotonic() + float((payload or {}).get("seconds", 30.0))
    while time.monotonic() < end and not context.claim_lost() and context.remaining_seconds() > 0.5:
        time.sleep(0.1)
    return {"started_at": started, "ended_at": time.time(), "attempt": context.attempt,
            "claim_lost": context.claim_lost()}


@task_handler("bench-fail")
def bench_fail(payload: Any, context: TaskContext) -> None:
    """Fail every attempt: the task ends ignored at its ceiling."""
    raise RuntimeError("bench-fail always fails")


@task_handler("bench-callback")
def bench_callback(payload: dict[str, Any], context: TaskContext) -> dict[str, Any]:
    """A batch's callback: return the event and the counts it was given, with its start time."""
    batch = payload["batch"]
    return {"started_at": time.time(), "event": payload["event"], "batch_id": batch["batch_id"],
            "finished": batch["finished"], "ignored": batch["ignored"], "attempt": context.attempt}


@task_handler("bench-container", timeout_seconds=1500)  # 25 minutes: longer than Lambda allows
def bench_container(payload: dict[str, Any], context: TaskContext) -> dict[str, Any]:
    """Sleep ``seconds`` in small steps on the container runner, appending ``start <attempt>`` and
    ``done <attempt>`` to the file ``log`` (so a run counts how often each task ran and finished);
    stop early once the claim is lost."""
    from pathlib import Path

    log = Path(payload["log"])
    with log.open("a") as out:
        out.write(f"{context.key} start {context.attempt}\n")
    started = time.time()
    end = time.monotonic() + float(payload.get("seconds", 60.0))
    while time.monotonic() < end and not context.claim_lost():
        time.sleep(0.5)
    if not context.claim_lost():
        with log.open("a") as out:
            out.write(f"{context.key} done {context.attempt}\n")
    return {"started_at": started, "ended_at": time.time(), "attempt": context.attempt}
