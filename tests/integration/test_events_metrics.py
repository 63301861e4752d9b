"""The two figures the events alarms watch (issue 51, item 7): Task Ignored events dropped after
the publisher's attempts (``EventsDropped``), and how far behind the writes the stream follower's
counts are (``StreamFollowerLag``), which batch progress, callbacks and events all wait on."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from coworker.data.models import utcnow
from coworker.engine import batches, events, lifecycle, progress
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch
from coworker.observability import MetricName, metrics


@pytest.fixture(autouse=True)
def fresh_metrics():
    metrics.clear_metrics()
    progress._followers.clear()
    events._publishers.clear()
    yield
    metrics.clear_metrics()
    progress._followers.clear()
    events._publishers.clear()


def published(name: str) -> list[float]:
    """The values of metric ``name`` published since the last clear."""
    return list(metrics.metric_set.get(name, {}).get("Value", []))


def put_failing_batch(settings, batch_id: str = "b", key: str = "bad") -> None:
    now = utcnow() - timedelta(seconds=30)
    task = lifecycle.new_task(TaskSpec(key=key, type="always-fail", batch_id=batch_id, max_attempts=1), settings, now)
    assert all(batches.put_tasks([task], batch_id, now, None, watch=True))
    run_batch([key], "w", settings, time.monotonic() + 30)


class RefusingEventBridge:
    """EventBridge refusing every entry, as in an outage of the bus (or a policy that denies)."""

    def __init__(self) -> None:
        self.calls = 0

    def put_events(self, Entries: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803 - boto3's name
        self.calls += 1
        return {"FailedEntryCount": len(Entries),
                "Entries": [{"ErrorCode": "InternalFailure", "ErrorMessage": "down"} for _ in Entries]}


def test_a_task_ignored_event_refused_after_every_attempt_is_counted_as_dropped(make_settings, monkeypatch):
    # Given events to EventBridge, which refuses every entry
    settings = make_settings(events="eventbridge", event_bus="orders")
    bridge = RefusingEventBridge()
    events.publisher(settings)._client = bridge
    monkeypatch.setattr(events.time, "sleep", lambda _seconds: None)
    put_failing_batch(settings)

    # When the follower reads the task's move to ignored
    progress.catch_up(settings)

    # Then the publisher tried SEND_ATTEMPTS times, gave up, and the event is counted as dropped
    assert bridge.calls == events.SEND_ATTEMPTS
    assert published(MetricName.EVENTS_DROPPED) == [1.0]
    assert published(MetricName.EVENTS_PUBLISHED) == []
    assert batches.get_batch("b").done  # counting did not wait on EventBridge


def test_a_follower_keeping_up_publishes_a_small_lag_then_a_zero_once(make_settings):
    # Given a batch task that ended
    settings = make_settings()
    put_failing_batch(settings)

    # When the follower counts it, and then passes with nothing to count
    first = progress.follow(settings)
    assert first.changes and not first.behind
    after = [progress.follow(settings) for _ in range(3)]

    # Then the counting pass publishes its lag (the age of the oldest record read: seconds), the
    # next one a zero, and the idle ones after it nothing
    values = published(MetricName.STREAM_FOLLOWER_LAG)
    assert len(values) == 2, values
    assert 0 <= values[0] < 120 and values[0] == first.lag_seconds
    assert values[1] == 0 and all(report.lag_seconds == 0 for report in after)


def test_a_follower_that_fails_publishes_a_lag_that_grows_from_its_last_caught_up_pass(make_settings, monkeypatch):
    # Given a follower that caught up
    settings = make_settings()
    put_failing_batch(settings)
    progress.catch_up(settings)
    follower = progress.follower(settings)
    metrics.clear_metrics()

    # When its passes fail (the stream cannot be described: throttled, access denied)
    def refused(_arn: str) -> list[str]:
        raise RuntimeError("DescribeStream refused")

    monkeypatch.setattr(follower, "_shards", refused)
    lags = []
    for _ in range(2):
        with pytest.raises(RuntimeError):
            follower.follow()
        lags.append(published(MetricName.STREAM_FOLLOWER_LAG)[-1])
        time.sleep(0.05)

    # Then each failed pass publishes the time since the last pass that caught up began: growing
    assert 0 < lags[0] < lags[1], lags
