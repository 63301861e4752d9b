"""How long a task may take, and how much time a worker must have to start it.

A task's *time limit* is its own ``timeout_seconds`` if it was put with one, else the limit its
type declares (``@task_handler("convert", timeout_seconds=600)``). A worker invocation starts a
task only when the time it has left covers that limit: its deadline, less the margin it keeps
to record a timeout (``timeout_margin_seconds``), must lie at or after the task's start plus the
limit. So a declared limit is never cut short by the invocation's end, and an attempt is never
spent on a start that cannot finish. The arithmetic of one invocation::

    |<----------------------- worker timeout (Lambda's) ----------------------->|
    |<- start ->|<---------------- task time -------------------->|<- margin ->|
      allowance   the longest limit a task may declare on this deployment

``start allowance`` is what the invocation spends before a fresh one's first handler starts
(its slot, its first claim): a limit is accepted only if a fresh invocation can give it after
that. The stack sizes the worker's timeout from the declared limits with the same rule
(:func:`worker_timeout_for`), and the API refuses a task whose limit no runner gives
(:func:`limit_problem`).

Types that declare nothing are planned with their observed durations (a p95 per type, see
:mod:`coworker.engine.durations`), or, with none observed yet, as before: no new claim in the
last tenth of the invocation (:func:`unknown_task_tail`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from coworker.config import Settings

# Lambda's own ceiling on a function's timeout.
LAMBDA_MAX_TIMEOUT_SECONDS = 900
# What a fresh invocation spends before its first handler starts (slot, claim): 2 % of its
# timeout, at least 1 s and at most 10 s.
START_ALLOWANCE_SHARE = 0.02
MIN_START_ALLOWANCE_SECONDS = 1.0
MAX_START_ALLOWANCE_SECONDS = 10.0


def start_allowance(worker_timeout_seconds: float) -> float:
    """Seconds a fresh invocation of this timeout is planned to spend before its first handler."""
    share = START_ALLOWANCE_SHARE * worker_timeout_seconds
    return min(MAX_START_ALLOWANCE_SECONDS, max(MIN_START_ALLOWANCE_SECONDS, share))


def longest_limit(worker_timeout_seconds: float, margin_seconds: float) -> float:
    """The longest time limit a worker of this timeout (and margin) gives a task."""
    return worker_timeout_seconds - margin_seconds - start_allowance(worker_timeout_seconds)


def max_task_seconds(settings: Settings) -> float:
    """The longest time limit this deployment's worker gives a task."""
    return longest_limit(settings.worker_timeout_seconds, settings.timeout_margin_seconds)


def lambda_max_task_seconds(settings: Settings) -> float:
    """The longest limit any Lambda worker (15 minutes) could give, with this margin."""
    return longest_limit(LAMBDA_MAX_TIMEOUT_SECONDS, settings.timeout_margin_seconds)


def worker_timeout_for(limit_seconds: float, margin_seconds: float) -> int | None:
    """The shortest worker timeout (whole seconds) that gives a task ``limit_seconds``, or
    ``None`` when even Lambda's 15 minutes do not."""
    for timeout in range(max(3, math.ceil(limit_seconds + margin_seconds)), LAMBDA_MAX_TIMEOUT_SECONDS + 1):
        if longest_limit(timeout, margin_seconds) >= limit_seconds:
            return timeout
    return None


def fitted_worker_timeout(settings: Settings, declared: Mapping[str, float]) -> int:
    """The worker timeout that gives each ``declared`` limit (type -> seconds) that a Lambda worker
    can give: the one set, or longer (the local runtime's rule; the stack refuses instead when
    its option was set too short)."""
    margin = settings.timeout_margin_seconds
    needed = [worker_timeout_for(limit, margin) for limit in declared.values()]
    return max([settings.worker_timeout_seconds, *(n for n in needed if n is not None)])


def limit_problem(limit_seconds: float, settings: Settings, what: str) -> str | None:
    """Why no runner of this deployment can give ``what`` (a task, a type) ``limit_seconds``, or
    ``None`` when the worker can: a sentence that names the runner and the setting to change."""
    longest = max_task_seconds(settings)
    if limit_seconds <= longest:
        return None
    timeout, margin = settings.worker_timeout_seconds, settings.timeout_margin_seconds
    breakdown = (f"its timeout of {timeout} s, less the {margin:g}-s margin kept to record a timeout and "
                 f"{start_allowance(timeout):g} s to start")
    needed = worker_timeout_for(limit_seconds, margin)
    if needed is None:
        return (f"{what} has a time limit of {limit_seconds:g} s, longer than any runner of this deployment can "
                f"give: the Lambda worker gives a task at most {longest:g} s ({breakdown}), and a Lambda function "
                f"runs at most {LAMBDA_MAX_TIMEOUT_SECONDS} s, which would give "
                f"{lambda_max_task_seconds(settings):g} s; "
                "split the work into shorter tasks")
    return (f"{what} has a time limit of {limit_seconds:g} s, longer than this deployment's Lambda worker gives a "
            f"task: at most {longest:g} s ({breakdown}); deploy with workerTimeoutSeconds of at least {needed} "
            "(COWORKER_WORKER_TIMEOUT_SECONDS locally), or declare the limit on the type so the stack sizes the "
            "worker itself")


def unknown_task_tail(settings: Settings) -> float:
    """How much time must be left to claim a task whose time is not known at all (no limit, none
    observed): a tenth of the worker's timeout, at least twice the margin."""
    return max(2 * settings.timeout_margin_seconds, 0.1 * settings.worker_timeout_seconds)
