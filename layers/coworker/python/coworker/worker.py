"""The worker: claim each task of a batch, run its handler, record the outcome.

Each task of a batch runs in its own thread, so all of a batch's tasks are claimed within
moments of the invocation starting (the coordinator counts only claimed tasks as busy).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from coworker import lifecycle
from coworker.config import Settings
from coworker.errors import TaskFailedError, UnknownTaskTypeError
from coworker.handlers import TaskContext, get_handler
from coworker.lifecycle import Claim, RecordOutcome
from coworker.model import ErrorKind, utcnow
from coworker.observability import MetricName, logger, metrics, tracer

MAX_RESULT_CHARS = 1000


class TaskOutcome(str, enum.Enum):
    """What one worker did with one dispatched key."""

    NOT_CLAIMED = "not_claimed"  # another worker has it, or it is no longer due: nothing to do
    SKIPPED = "skipped"  # too little time left to start it; it stays due for the next dispatch
    FINISHED = "finished"
    FAILED = "failed"
    IGNORED = "ignored"
    LOST = "lost"  # ran, but its claim was taken over or cancelled: the result was discarded


@dataclasses.dataclass(frozen=True)
class TaskReport:
    key: str
    outcome: TaskOutcome
    attempt: int | None = None
    seconds: float = 0.0


class _Timeout(Exception):
    pass


def _summarise(result: Any) -> Any:
    """Keep a handler's return value only if it is small JSON; else a note saying so."""
    if result is None:
        return None
    try:
        text = json.dumps(result, default=str)
    except (TypeError, ValueError):
        return {"note": f"result of type {type(result).__name__} is not JSON"}
    if len(text) > MAX_RESULT_CHARS:
        return {"note": f"result of {len(text)} characters not kept", "preview": text[:200]}
    return json.loads(text)


def _run_with_deadline(handler: Any, payload: Any, context: TaskContext) -> Any:
    """Run ``handler`` in a daemon thread; raise :class:`_Timeout` when the deadline passes.

    The thread cannot be killed; on Lambda the sandbox is frozen when the invocation returns,
    locally the worker process ends. What matters is that the outcome is recorded and the lock
    released before the platform kills us.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = handler(payload, context)
        except BaseException as exc:  # noqa: BLE001 - handed back to the calling thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"task-{context.key}", daemon=True)
    thread.start()
    thread.join(timeout=max(0.0, context.deadline - time.monotonic()))
    if thread.is_alive():
        raise _Timeout(f"did not finish within the worker's time limit (attempt {context.attempt})")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _record(claim: Claim, settings: Settings, handler_deadline: float) -> RecordOutcome:
    task = claim.task
    context = TaskContext(
        key=task.key,
        attempt=claim.attempt,
        max_attempts=int(task.max_attempts),
        fencing_token=f"{claim.owner}:{claim.attempt}",
        deadline=handler_deadline,
    )
    try:
        handler = get_handler(task.task_type)
        result = _run_with_deadline(handler, task.payload, context)
    except UnknownTaskTypeError as exc:
        error = lifecycle.error_record(claim.attempt, ErrorKind.UNKNOWN_TYPE, str(exc), utcnow())
        logger.error("unknown task type", extra={"task_type": task.task_type})
        return lifecycle.fail(claim, settings, error)
    except _Timeout as exc:
        error = lifecycle.error_record(claim.attempt, ErrorKind.TIMEOUT, str(exc), utcnow())
        logger.warning("task timed out; recording and releasing the lock")
        return lifecycle.fail(claim, settings, error)
    except TaskFailedError as exc:
        # A business failure is an expected outcome: its message says it all, no traceback.
        error = lifecycle.error_record(claim.attempt, ErrorKind.BUSINESS, str(exc), utcnow())
        logger.info("task failed (business)", extra={"error": str(exc)})
        return lifecycle.fail(claim, settings, error, retryable=exc.retryable)
    except Exception as exc:  # noqa: BLE001 - any handler error is a recorded system error
        error = lifecycle.error_from_exception(claim.attempt, ErrorKind.SYSTEM, exc, utcnow())
        logger.warning("task raised", extra={"error": f"{type(exc).__name__}: {exc}"})
        return lifecycle.fail(claim, settings, error)
    return lifecycle.complete(claim, settings, result=_summarise(result))


_OUTCOME_METRIC = {
    RecordOutcome.FINISHED: MetricName.FINISHED,
    RecordOutcome.FAILED: MetricName.FAILED,
    RecordOutcome.IGNORED: MetricName.IGNORED,
    RecordOutcome.LOST: MetricName.LOST_CLAIM,
}


def process_task(key: str, owner: str, settings: Settings, deadline: float) -> TaskReport:
    """Claim one task and carry it to a recorded outcome; never raises for task errors."""
    handler_deadline = deadline - settings.timeout_margin_seconds
    if handler_deadline - time.monotonic() <= 0:
        return TaskReport(key, TaskOutcome.SKIPPED)
    claim = lifecycle.claim(key, owner, settings)
    if claim is None:
        metrics.add_metric(name=MetricName.NOT_CLAIMED, unit=MetricUnit.Count, value=1)
        logger.info("task not claimed: taken or not due", extra={"task_key": key})
        return TaskReport(key, TaskOutcome.NOT_CLAIMED)
    logger.thread_safe_append_keys(task_key=key, attempt=claim.attempt)
    metrics.add_metric(name=MetricName.CLAIMED, unit=MetricUnit.Count, value=1)
    started = time.monotonic()
    outcome = _record(claim, settings, handler_deadline)
    seconds = time.monotonic() - started
    metrics.add_metric(name=_OUTCOME_METRIC[outcome], unit=MetricUnit.Count, value=1)
    metrics.add_metric(name=MetricName.DURATION, unit=MetricUnit.Milliseconds, value=seconds * 1000)
    if outcome is RecordOutcome.LOST:
        logger.warning("lost the claim before recording: a newer attempt or a cancel owns the task")
    else:
        logger.info("task recorded", extra={"outcome": outcome.value, "seconds": round(seconds, 3)})
    logger.thread_safe_remove_keys(["task_key", "attempt"])
    return TaskReport(key, TaskOutcome(outcome.value), claim.attempt, seconds)


@tracer.capture_method
def run_batch(keys: Sequence[str], owner: str, settings: Settings, deadline: float) -> list[TaskReport]:
    """Process a batch of task keys in parallel threads before ``deadline`` (time.monotonic()).

    ``owner`` identifies this invocation in the lock (e.g. the Lambda request id).
    """
    unique = list(dict.fromkeys(keys))
    if not unique:
        return []
    with ThreadPoolExecutor(max_workers=len(unique), thread_name_prefix="worker") as pool:
        return list(pool.map(lambda key: process_task(key, owner, settings, deadline), unique))
