"""One worker invocation's time: which tasks it may still claim and start, and when each must end.

A task's *limit* (enforced) is its own ``timeout_seconds``, else its type's declared one. Its
*planned* time (what the invocation must have left to start it) is the limit, else the type's
observed p95 (:mod:`coworker.engine.durations`), else unknown. The rules (``D`` the handlers'
deadline, the invocation's deadline less its margin; ``now`` the moment of the check)::

    claim, and start         planned known:   now + min(planned, longest) <= D
    take from the index      planned unknown: now <= deadline - tail (the last tenth of the timeout:
                                              as before limits existed)
    claim (a hint), start    planned unknown: now < D
    the task must end        limit known:     min(start + limit, D); else D

(``longest``: the longest limit a fresh invocation gives, so that no plan makes a task unrunnable.)
A task the invocation may not start stays due, untouched (a claim that finds it too long gives it
back, its attempt not counted), for a fresh invocation to run first. Planning from a p95 only
decides what starts: an undeclared type is never stopped before ``D``.
"""

from __future__ import annotations

import math
import time

from coworker.config import Settings
from coworker.engine import durations, handlers, runners, timing
from coworker.engine.handlers import Runner

# Types one claim's condition names at most (DynamoDB takes up to 100 values in one IN).
MAX_CLAIM_TYPES = 90


def limit_of(task_type: str, own: float | None) -> float | None:
    """The enforced time limit of a task: its own, else its type's declared one."""
    if own is not None:
        return float(own)
    return handlers.declared_timeout(task_type)


def planned_seconds(task_type: str, own: float | None = None) -> float | None:
    """The time a task is planned to take: its limit, else its type's observed p95, else ``None``."""
    limit = limit_of(task_type, own)
    return limit if limit is not None else durations.observed.p95(task_type)


class Budget:
    """The time of one invocation whose deadline is ``deadline`` (``time.monotonic()``; a container
    runner's is infinite), on ``runner``: it takes only its runner's types
    (:func:`coworker.engine.runners.runner_of`)."""

    def __init__(self, settings: Settings, deadline: float, runner: Runner = "lambda") -> None:
        self.deadline = deadline
        self.runner = runner
        self.handler_deadline = deadline - settings.timeout_margin_seconds
        self.unknown_cutoff = deadline - timing.unknown_task_tail(settings)
        # A plan longer than any invocation gives (a p95 past it, a limit from before a redeploy
        # shortened the worker) counts as that long: a fresh invocation still takes the task.
        self.longest_plan = timing.max_task_seconds(settings) if runner == "lambda" else math.inf
        self._container_types = frozenset(runners.container_types(settings))

    def runs_here(self, task_type: str) -> bool:
        """Whether tasks of ``task_type`` run on this invocation's runner."""
        return (task_type in self._container_types) == (self.runner == "container")

    def other_runner_types(self) -> list[str]:
        """The types a claim of this invocation refuses whatever their limit: the container
        runner's, for a Lambda worker (a runner checks after its claim, as it cannot list the rest)."""
        return sorted(self._container_types)[:MAX_CLAIM_TYPES] if self.runner == "lambda" else []

    def stop_by(self, deadline: float) -> None:
        """Bring the handlers' deadline forward to ``deadline`` (a runner told to stop): from now
        on it claims only tasks whose plan ends by then, none of unknown time."""
        self.handler_deadline = min(self.handler_deadline, deadline)
        self.unknown_cutoff = min(self.unknown_cutoff, time.monotonic())

    def left(self, now: float | None = None) -> float:
        """Seconds left for handlers (to the handlers' deadline)."""
        return self.handler_deadline - (time.monotonic() if now is None else now)

    def may_claim(self, planned: float | None, now: float | None = None) -> bool:
        """Whether a task planned to take ``planned`` seconds may be claimed now."""
        now = time.monotonic() if now is None else now
        if planned is None:
            return now <= self.unknown_cutoff
        return now + min(planned, self.longest_plan) <= self.handler_deadline

    def may_start(self, planned: float | None, now: float | None = None) -> bool:
        """Whether its handler may start now (after the claim, its gates and rate tokens)."""
        now = time.monotonic() if now is None else now
        if planned is None:
            return now < self.handler_deadline
        return now + min(planned, self.longest_plan) <= self.handler_deadline

    def too_long_types(self, now: float | None = None) -> list[str]:
        """The types known (declared, or observed) to take longer than the time left: a claim
        refuses their tasks that carry no limit of their own (at most ``MAX_CLAIM_TYPES``; a
        claim past that is checked after it, see :mod:`coworker.engine.worker`)."""
        now = time.monotonic() if now is None else now
        known = {*handlers.declared_timeouts(), *durations.observed.known_types()} - self._container_types
        too_long = []
        for task_type in sorted(known):
            planned = planned_seconds(task_type)
            if planned is not None and not self.may_claim(planned, now):
                too_long.append(task_type)
        return too_long[:MAX_CLAIM_TYPES - len(self.other_runner_types())]

    def may_claim_type(self, task_type: str) -> bool:
        """Whether a task of ``task_type`` with no limit of its own may be claimed now (the
        feeder's test, from the status index's entries, which carry the type)."""
        return self.runs_here(task_type) and self.may_claim(planned_seconds(task_type))

    def ends_at(self, limit: float | None, started: float) -> float:
        """When a handler started at ``started`` must have returned."""
        return self.handler_deadline if limit is None else min(self.handler_deadline, started + limit)

    @property
    def feed_until(self) -> float:
        """When self-feeding ends: the handlers' deadline (each task fed is tested on its own)."""
        return self.handler_deadline
