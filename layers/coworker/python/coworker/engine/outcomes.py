"""What a worker did with each task it was handed: the reports an invocation returns."""

from __future__ import annotations

import dataclasses
import enum
from datetime import datetime

from coworker.engine.lifecycle import RecordOutcome
from coworker.observability import MetricName


class TaskSource(str, enum.Enum):
    HINT = "hint"  # handed to the invocation by a dispatcher
    FEED = "feed"  # found by the worker itself


class TaskOutcome(str, enum.Enum):
    """What one worker did with one dispatched key."""

    NOT_CLAIMED = "not_claimed"  # another worker has it, or it is no longer due: nothing to do
    BLOCKED = "blocked"  # its concurrency group was full: it waits for a place, out of the queue
    DEFERRED = "deferred"  # its rate group had no token: it is due again when one frees (retry_at)
    SKIPPED = "skipped"  # too little time left to start it; it stays due for the next dispatch
    TOO_LONG = "too_long"  # its time limit (or p95) is longer than the time left: due for a fresh worker
    FINISHED = "finished"
    FAILED = "failed"
    IGNORED = "ignored"
    LOST = "lost"  # ran, but its claim was taken over or cancelled: the result was discarded
    # The worker's own write or read failed with it (storage out of reach, throttled past the
    # retries): given back if its claim was known to be this worker's, else its lock lapses.
    ERROR = "error"


@dataclasses.dataclass(frozen=True)
class TaskReport:
    key: str
    outcome: TaskOutcome
    attempt: int | None = None
    seconds: float = 0.0
    source: TaskSource = TaskSource.HINT
    woken: tuple[str, ...] = ()  # blocked tasks its release woke: the worker may run them next
    retry_at: datetime | None = None  # a deferred task's booked start


OUTCOME_METRIC = {
    RecordOutcome.FINISHED: MetricName.FINISHED,
    RecordOutcome.FAILED: MetricName.FAILED,
    RecordOutcome.IGNORED: MetricName.IGNORED,
    RecordOutcome.LOST: MetricName.LOST_CLAIM,
}


def outcome_of(recorded: RecordOutcome) -> TaskOutcome:
    """The task outcome of a recorded attempt."""
    return TaskOutcome(recorded.value)
