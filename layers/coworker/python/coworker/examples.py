"""Example handlers shipped with Coworker, used by the demo workload and the tests.

Payload fields are optional; defaults keep the demo quick.
"""

from __future__ import annotations

import hashlib
import random
import time
from typing import Any

from coworker.errors import TaskFailed
from coworker.handlers import TaskContext, task_handler


@task_handler("quick")
def quick(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Hash the payload: a task that takes a few milliseconds."""
    text = repr(sorted((payload or {}).items()))
    return {"sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


@task_handler("slow")
def slow(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Sleep ``seconds`` (default 1), standing in for a long download or a data file."""
    seconds = float((payload or {}).get("seconds", 1.0))
    time.sleep(seconds)
    return {"slept": seconds}


@task_handler("flaky")
def flaky(payload: dict[str, Any] | None, context: TaskContext) -> dict[str, Any]:
    """Fail with probability ``failure_rate`` (default 0.3): system errors, then success on a retry.

    ``fail_attempts`` makes it deterministic: attempts up to that number fail.
    """
    payload = payload or {}
    if "fail_attempts" in payload:
        failing = context.attempt <= int(payload["fail_attempts"])
    else:
        failing = random.random() < float(payload.get("failure_rate", 0.3))
    if failing:
        raise ConnectionError(f"upstream reset the connection (attempt {context.attempt})")
    return {"attempt": context.attempt}


@task_handler("always-fail")
def always_fail(payload: dict[str, Any] | None, context: TaskContext) -> None:
    """A business failure on every attempt: ends ignored at the ceiling."""
    raise TaskFailed((payload or {}).get("reason", "the order references an unknown product"))
