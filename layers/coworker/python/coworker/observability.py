"""Powertools Logger, Metrics and Tracer shared by the library and the Lambda handlers.

Service name, namespace and log level come from the standard Powertools environment
variables (POWERTOOLS_SERVICE_NAME, POWERTOOLS_METRICS_NAMESPACE, POWERTOOLS_LOG_LEVEL).
The tracer disables itself outside Lambda (and then does not load the X-Ray SDK); set
POWERTOOLS_METRICS_DISABLED=true to keep EMF lines out of a local terminal.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.logging.formatter import LambdaPowertoolsFormatter
from aws_lambda_powertools.logging.types import PowertoolsLogRecord
from aws_lambda_powertools.tracing.base import BaseProvider, BaseSegment

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "coworker")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Coworker")
# A log line keeps at most this much of any one field (a handler's exception message can be
# megabytes); tracebacks get more room. The task record clips errors the same way.
MAX_LOG_FIELD_CHARS = 2000
MAX_LOG_EXCEPTION_CHARS = 8000


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters not logged]"


def _clip_all(value: Any, limit: int) -> Any:
    """Every string inside ``value`` (dicts and lists included) clipped to ``limit``."""
    if isinstance(value, str):
        return clip(value, limit)
    if isinstance(value, dict):
        return {key: _clip_all(item, limit) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clip_all(item, limit) for item in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return clip(str(value), limit)  # e.g. the exception object in a stack trace


# The logger's keys of the invocation running in this thread, where several functions share a
# process (the local runtime); unset, every thread shares the process's keys, as on Lambda.
_INVOCATION_KEYS: ContextVar[dict[str, Any] | None] = ContextVar("coworker_invocation_log_keys", default=None)


class ClippingFormatter(LambdaPowertoolsFormatter):
    """Powertools' JSON log format, with every text field clipped (see MAX_LOG_FIELD_CHARS), and
    its keys (``log_format``: service, the Lambda context, the correlation id) kept per invocation
    inside :func:`invocation_scope`."""

    _process_keys: dict[str, Any]

    @property  # type: ignore[override]
    def log_format(self) -> dict[str, Any]:
        keys = _INVOCATION_KEYS.get()
        return self._process_keys if keys is None else keys

    @log_format.setter
    def log_format(self, value: dict[str, Any]) -> None:
        if _INVOCATION_KEYS.get() is None:
            self._process_keys = value
        else:
            _INVOCATION_KEYS.set(value)

    def serialize(self, log: dict[str, Any] | PowertoolsLogRecord) -> str:
        clipped = {
            name: _clip_all(value, MAX_LOG_EXCEPTION_CHARS if name == "exception" else MAX_LOG_FIELD_CHARS)
            for name, value in dict(log).items()
        }
        return super().serialize(clipped)


class ThreadSafeMetrics(Metrics):
    """Powertools Metrics, safe to use from many threads at once.

    A worker's threads all add metrics, and Powertools serialises the whole metric set (and
    prints it) from whichever thread adds the hundredth value of a metric: without a lock,
    another thread adding a metric meanwhile made that thread fail with "dictionary changed
    size during iteration".
    """

    _lock = threading.RLock()

    def add_metric(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            super().add_metric(*args, **kwargs)

    def flush_metrics(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            super().flush_metrics(*args, **kwargs)

    def clear_metrics(self) -> None:
        with self._lock:
            super().clear_metrics()


logger = Logger(service=SERVICE, logger_formatter=ClippingFormatter())


@contextmanager
def invocation_scope() -> Iterator[None]:
    """Run one function's invocation (or a long-running loop) in this thread with logger keys of
    its own: what ``inject_lambda_context`` sets inside (request id, correlation id) is seen by
    this thread's log lines only, and gone afterwards. For processes that host several functions
    (the local runtime); on Lambda each function has its process and needs none."""
    formatter = logger.registered_formatter
    assert isinstance(formatter, ClippingFormatter)
    token = _INVOCATION_KEYS.set(dict(formatter.log_format))
    try:
        yield
    finally:
        _INVOCATION_KEYS.reset(token)


metrics = ThreadSafeMetrics(service=SERVICE, namespace=NAMESPACE)


class _UntracedSegment(BaseSegment):
    """What a disabled tracer's decorators write to: nothing is kept."""

    def close(self, end_time: int | None = None) -> None: ...
    def add_subsegment(self, subsegment: Any) -> None: ...
    def remove_subsegment(self, subsegment: Any) -> None: ...
    def put_annotation(self, key: str, value: Any) -> None: ...
    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None: ...
    def add_exception(self, exception: BaseException, stack: Any, remote: bool = False) -> None: ...


class _Untraced(BaseProvider):
    """The tracer's provider where Powertools turns tracing off (outside Lambda): the X-Ray
    SDK's recorder, its default, costs about 0.4 s of CPU to import in every process (each
    local worker and API environment), only to record nothing."""

    @contextmanager
    def in_subsegment(self, name: Any = None, **kwargs: Any) -> Iterator[BaseSegment]:
        yield _UntracedSegment()

    @asynccontextmanager
    async def in_subsegment_async(self, name: Any = None, **kwargs: Any) -> Any:
        yield _UntracedSegment()

    def put_annotation(self, key: str, value: Any) -> None: ...
    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None: ...
    def patch(self, modules: Any) -> None: ...
    def patch_all(self) -> None: ...


# Powertools' own rule decides (no LAMBDA_TASK_ROOT, SAM local, or POWERTOOLS_TRACE_DISABLED).
tracer = Tracer(service=SERVICE, provider=_Untraced() if Tracer._is_tracer_disabled() else None)


def publish_metrics() -> None:
    """Write the metrics gathered so far (an EMF line on stdout) and start afresh; a long-running
    Lambda (the coordinator) calls it after each step so CloudWatch sees figures as they happen."""
    if metrics.metric_set:
        metrics.flush_metrics()
    metrics.clear_metrics()  # flush keeps them when POWERTOOLS_METRICS_DISABLED is set


class MetricName:
    """Metric names, shared with the CloudWatch dashboard of coworker_cdk."""

    CLAIMED = "TaskClaimed"
    NOT_CLAIMED = "TaskNotClaimed"
    FINISHED = "TaskFinished"
    FAILED = "TaskFailed"
    IGNORED = "TaskIgnored"
    LOST_CLAIM = "LostClaim"
    LOST_CLAIM_SIGNALLED = "LostClaimSignalled"  # a heartbeat found the claim taken over
    SLOT_TAKEN_OVER = "WorkerSlotTakenOver"  # a dispatched worker found its slot given away
    FEED_PAGES = "WorkerFeedQueries"
    DURATION = "TaskDuration"
    TOO_LONG = "TaskLeftForFreshWorker"  # its time limit was longer than the worker's time left
    TIMED_OUT = "TaskTimedOut"  # an attempt still running at its time limit (or the worker's deadline)
    WORKER_ERRORS = "WorkerTaskErrors"  # a worker's own write or read failed with a task (see TaskOutcome.ERROR)
    DISPATCHED = "TasksDispatched"
    WORKER_INVOCATIONS = "WorkerInvocations"
    BUSY_SLOTS = "BusyWorkerSlots"
    RUNNING_TASKS = "RunningTasks"  # tasks holding a live lock, counted exactly by each tick
    # Backlog, measured by the coordinator every backlog_seconds (see queries.backlog).
    BACKLOG = "DueTasks"  # due tasks of every kind below (each counted up to backlog_count_cap)
    DUE_TODO = "DueNewTasks"  # todo tasks whose time has come
    DUE_RETRY = "DueRetryTasks"  # failed tasks whose retry time has come
    LOST_TASKS = "LostTasks"  # processing tasks whose lock expired (their worker died)
    OLDEST_DUE_AGE = "OldestDueTaskAge"  # seconds the longest-waiting due task has been due
    BLOCKED_TASKS = "BlockedTasks"  # not due: waiting for a place in a concurrency group
    COORDINATOR_TICKS = "CoordinatorTicks"  # one per tick: the heartbeat alarm watches it
    REAPED = "TasksReaped"
    PARKED = "TasksParked"  # due tasks of a paused type moved out of the queue
    RELEASED = "TasksReleased"  # held tasks of a resumed type put back
    BLOCKED = "TasksBlocked"  # claimed, but the concurrency group was full: waits out of the queue
    RATE_LIMITED = "TasksRateLimited"  # claimed, but its rate group had no token: due again when one frees
    WOKEN = "BlockedTasksWoken"  # blocked tasks the coordinator's sweep put back (places no release announced)
    DISPATCHED_ON_SUBMIT = "WorkersStartedOnSubmit"
    RUNNERS_STARTED = "RunnersStarted"  # container runners the coordinator started (RunTask accepted)
    RUNNER_START_FAILED = "RunnerStartFailed"  # RunTask refused or failed: its slot freed, tried next tick
    BUSY_RUNNERS = "BusyRunnerSlots"  # runner slots reserved or held, counted by each tick
    SLOT_UPKEEP_FAILED = "SlotUpkeepFailed"  # a run could not create or delete worker/runner slots at its start
    # Completion events (engine.events) and the stream follower they, batch counts and callbacks depend on.
    EVENTS_PUBLISHED = "EventsPublished"
    EVENTS_DROPPED = "EventsDropped"  # Task Ignored events still refused after the publisher's attempts
    STREAM_FOLLOWER_LAG = "StreamFollowerLag"  # seconds: how far behind the writes the follower's counts are

