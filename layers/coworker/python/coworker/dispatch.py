"""The coordinator: each tick finds due work through the status index and fans it out.

Delivery is at-least-once: the GSI is eventually consistent and a tick may see a task that a
worker claimed a moment ago, so the same key can be dispatched twice. That is harmless:
the claim (one conditional write) decides, and at most one live worker ever holds a task.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Any, Protocol

from aws_lambda_powertools.metrics import MetricUnit

from coworker import lifecycle, queries, worker
from coworker.config import Settings
from coworker.model import TaskStatus, utcnow
from coworker.observability import MetricName, logger, metrics, tracer

# Order in which free slots are filled: work lost by dead workers, then due retries, then new.
DISPATCH_ORDER = (TaskStatus.PROCESSING, TaskStatus.FAILED, TaskStatus.TODO)


class Invoker(Protocol):
    """Starts one worker invocation for a batch of task keys, without waiting for it."""

    def invoke(self, keys: Sequence[str]) -> None: ...


class LambdaInvoker:
    """Production invoker: asynchronous ``Invoke`` of the worker function."""

    def __init__(self, function_name: str, region: str, client: Any | None = None) -> None:
        self._function_name = function_name
        self._region = region
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:  # created on first use: no network work at import time
            import boto3

            self._client = boto3.client("lambda", region_name=self._region)
        return self._client

    def invoke(self, keys: Sequence[str]) -> None:
        self.client.invoke(
            FunctionName=self._function_name,
            InvocationType="Event",
            Payload=json.dumps({"keys": list(keys)}).encode(),
        )


class InProcessInvoker:
    """Local and test invoker: each invocation runs ``worker.run_batch`` on a thread pool.

    ``timeout_seconds`` plays the Lambda timeout: the batch gets that deadline.
    """

    def __init__(self, settings: Settings, max_invocations: int | None = None,
                 owner_prefix: str = "local") -> None:
        self._settings = settings
        self._pool = ThreadPoolExecutor(max_workers=max_invocations or settings.max_concurrency,
                                        thread_name_prefix="invocation")
        self._owner_prefix = owner_prefix
        self._count = 0
        self.futures: list[Future] = []

    def invoke(self, keys: Sequence[str]) -> None:
        self._count += 1
        owner = f"{self._owner_prefix}-{self._count}"
        deadline = time.monotonic() + self._settings.worker_timeout_seconds
        self.futures.append(self._pool.submit(worker.run_batch, list(keys), owner, self._settings, deadline))

    def wait(self) -> list[worker.TaskReport]:
        """Wait for every invocation so far; return their reports."""
        reports = [report for future in self.futures for report in future.result()]
        self.futures.clear()
        return reports

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


@dataclasses.dataclass(frozen=True)
class TickReport:
    busy: int
    free: int
    dispatched: int
    invocations: int
    reaped: int


def _chunks(keys: Sequence[str], size: int) -> list[list[str]]:
    return [list(keys[i:i + size]) for i in range(0, len(keys), size)]


@tracer.capture_method
def tick(settings: Settings, invoker: Invoker, now: datetime | None = None) -> TickReport:
    """One coordinator pass: count busy tasks, fill the free slots oldest first, fan out.

    Reads at most ``max_concurrency`` index items to count busy tasks and at most the number of
    free slots per status queried, whatever the size of the backlog.
    """
    now = now or utcnow()
    busy = queries.count_running(now, limit=settings.max_concurrency)
    free = settings.max_concurrency - busy
    keys: list[str] = []
    reaped = 0
    for status in DISPATCH_ORDER:
        if len(keys) >= free:
            break
        for task in queries.due(status, now, free - len(keys)):
            if status is TaskStatus.PROCESSING and task.attempts >= task.max_attempts:
                # Lost on its last allowed attempt: no claim can take it, so retire it here.
                reaped += lifecycle.reap_lost(task.key, int(task.attempts), task.batch_id, settings, now)
                continue
            keys.append(task.key)
    batches = _chunks(keys, settings.batch_size)
    for batch in batches:
        invoker.invoke(batch)
    report = TickReport(busy=busy, free=max(free, 0), dispatched=len(keys),
                        invocations=len(batches), reaped=reaped)
    metrics.add_metric(name=MetricName.BUSY, unit=MetricUnit.Count, value=busy)
    metrics.add_metric(name=MetricName.DISPATCHED, unit=MetricUnit.Count, value=len(keys))
    metrics.add_metric(name=MetricName.WORKER_INVOCATIONS, unit=MetricUnit.Count, value=len(batches))
    if reaped:
        metrics.add_metric(name=MetricName.REAPED, unit=MetricUnit.Count, value=reaped)
    logger.info("coordinator tick", extra=dataclasses.asdict(report))
    return report


def run_ticks(
    settings: Settings,
    invoker: Invoker,
    remaining_seconds: Callable[[], float],
    sleep: Callable[[float], None] = time.sleep,
) -> list[TickReport]:
    """Run ``ticks_per_invocation`` ticks spaced ``tick_seconds`` apart, within the time left.

    EventBridge schedules at most once a minute; several ticks per invocation dispatch sooner.
    """
    reports = []
    for index in range(settings.ticks_per_invocation):
        reports.append(tick(settings, invoker))
        last = index == settings.ticks_per_invocation - 1
        if last or remaining_seconds() < settings.tick_seconds + 5:
            break
        sleep(settings.tick_seconds)
    return reports
