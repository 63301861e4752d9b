"""Run one handler in a test, with a real :class:`~coworker.engine.handlers.TaskContext`.

::

    from coworker.testing import run_handler

    def test_charge_refuses_zero():
        with pytest.raises(TaskFailed):
            run_handler("charge-order", {"order": "o-1", "amount": 0})

The handler runs in a thread, as in a worker, under the same deadline rule: past
``timeout_seconds`` the call raises :class:`HandlerTimeout` (the worker would record a timeout).
``lose_claim_after`` plays a heartbeat that finds the claim taken over, so a test can check that a
long handler stops when ``context.claim_lost()`` turns true. For the whole path (put, claim, run,
record against an embedded database) see :mod:`coworker_local.testing`.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from coworker.engine.handlers import Handler, TaskContext, get_handler

TEST_OWNER = "test-worker"


class HandlerTimeout(TimeoutError):
    """The handler did not return within its time: a worker would record kind ``timeout``."""


def make_context(
    key: str = "test-task", *, attempt: int = 1, max_attempts: int = 3, timeout_seconds: float = 60.0,
    owner: str = TEST_OWNER,
) -> TaskContext:
    """A context as a worker builds it: fencing token ``<owner>:<attempt>``, deadline from now."""
    return TaskContext(
        key=key, attempt=attempt, max_attempts=max_attempts, fencing_token=f"{owner}:{attempt}",
        deadline=time.monotonic() + timeout_seconds,
    )


def run_handler(
    handler: str | Handler,
    payload: Any = None,
    *,
    key: str = "test-task",
    attempt: int = 1,
    max_attempts: int = 3,
    timeout_seconds: float = 60.0,
    lose_claim_after: float | None = None,
    context: TaskContext | None = None,
) -> Any:
    """Run ``handler`` (a task type or the function itself) once and return its result as the
    task's record would keep it (JSON; what JSON cannot hold becomes its text).

    The handler's own exception is raised as is (``TaskFailed`` is a business failure, anything
    else a system error). Register a task type by importing its module first. The follow-up
    tasks it asked for are in ``context.follow_ups``: pass a ``context`` from :func:`make_context`
    to look at them (then ``key``, ``attempt``, ``max_attempts`` and ``timeout_seconds`` are its own).
    """
    function = get_handler(handler) if isinstance(handler, str) else handler
    if context is None:
        context = make_context(key, attempt=attempt, max_attempts=max_attempts, timeout_seconds=timeout_seconds)
    key, timeout_seconds = context.key, context.remaining_seconds()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = function(payload, context)
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"handler-{key}", daemon=True)
    thread.start()
    if lose_claim_after is not None:
        thread.join(lose_claim_after)
        context.lost.set()
    thread.join(max(0.0, context.deadline - time.monotonic()))
    if thread.is_alive():
        context.lost.set()  # as a worker does at the deadline: the claim is gone
        raise HandlerTimeout(f"handler of {key!r} still running after {timeout_seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return json.loads(json.dumps(outcome.get("result"), default=str))
