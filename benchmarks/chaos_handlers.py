"""The task handler of ``benchmarks/chaos.py``, imported by its worker processes.

Each run notes its start and its end in the file its payload names (``notes``: one JSON line
each, appended in one write, so lines of concurrent processes never mix; a worker process gets
no environment but its settings), with the attempt's fencing token, so the benchmark can tell
which runs of a task overlapped and which result was kept.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from coworker.engine.handlers import TaskContext, task_handler


def _note(notes: str, record: dict[str, Any]) -> None:
    line = (json.dumps(record) + "\n").encode()
    descriptor = os.open(notes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line)
    finally:
        os.close(descriptor)


@task_handler("chaos-run")
def chaos_run(payload: dict[str, Any], context: TaskContext) -> dict[str, Any]:
    """Work ``seconds``; stop early when told the claim is lost if ``heeds`` (a handler that does
    not check keeps going, as user code may); fail the first attempt if ``fails_first``."""
    run = {"key": context.key, "token": context.fencing_token, "attempt": context.attempt}
    _note(payload["notes"], {**run, "started": time.time()})
    end = time.monotonic() + float(payload["seconds"])
    while time.monotonic() < end and not (payload.get("heeds") and context.claim_lost()):
        time.sleep(0.05)
    _note(payload["notes"], {**run, "ended": time.time(), "told": context.claim_lost()})
    if payload.get("fails_first") and context.attempt == 1:
        raise RuntimeError("the first attempt fails (chaos)")
    return {"token": context.fencing_token}
