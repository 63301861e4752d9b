"""A task whose record reaches DynamoDB's 400 KB item limit ends with a readable error within its
attempts, instead of failing every write (and every claim) for ever; cancel still works on it."""

from __future__ import annotations

import time

import pytest
from coworker.data.models import TaskModel
from coworker.engine import batches, lifecycle, progress, submit
from coworker.engine.handlers import task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import process_task
from pynamodb.exceptions import PutError

# DynamoDB Local enforces the item size limit as DynamoDB does.
pytestmark = pytest.mark.dynamodb_local

LIMIT = 400 * 1024


@task_handler("test-raise-long")
def _raise_long(payload, context):
    raise RuntimeError("z" * 5000)  # clipped to 1,000 characters, plus a traceback


def _put_near_the_limit(settings, key: str, type_: str, room: int, batch_id: str | None = None) -> None:
    """A task whose item leaves about ``room`` bytes below 400 KB (put around the API's checks,
    as a record that grew, or settings that allow large records, would have it)."""
    submit.put_task(TaskSpec(key=key, type=type_, max_attempts=3, batch_id=batch_id), settings)
    task = TaskModel.get(key, consistent_read=True)
    low, high = LIMIT - 4096, LIMIT  # the largest payload DynamoDB takes, found by trying
    while high - low > 1:
        middle = (low + high) // 2
        task.payload = "p" * middle
        try:
            task.save()
            low = middle
        except PutError:
            high = middle
    task.payload = "p" * (low - room)
    task.save()


def _deadline() -> float:
    return time.monotonic() + 60


def test_a_failure_that_does_not_fit_ends_the_task_with_record_too_large(settings) -> None:
    _put_near_the_limit(settings, "big-fail", "test-raise-long", room=1500, batch_id="sized")
    report = process_task("big-fail", "w", settings, _deadline())
    assert report.outcome is TaskOutcome.IGNORED
    task = lifecycle.get_task("big-fail")
    assert task.status == "ignored" and int(task.attempts) == 1 and task.lock_owner is None
    assert [e.kind for e in task.errors] == ["system", "record_too_large"]
    assert "RuntimeError" in task.errors[0].message and task.errors[0].traceback is None
    assert "400 KB" in task.errors[1].message
    progress.catch_up(settings)  # as the coordinator counts it at its next tick
    counted = batches.get_batch("sized")
    assert (counted.total, counted.ignored, counted.done) == (1, 1, True)


def test_a_task_that_cannot_even_be_claimed_is_ended_not_handed_out_for_ever(settings) -> None:
    _put_near_the_limit(settings, "big-claim", "quick", room=40)
    assert lifecycle.claim("big-claim", "w", settings) is None
    task = lifecycle.get_task("big-claim")
    assert task.status == "ignored" and [e.kind for e in task.errors] == ["record_too_large"]
    assert lifecycle.claim("big-claim", "w", settings) is None  # and nothing is due any more


def test_cancel_works_on_a_task_at_the_limit(settings) -> None:
    _put_near_the_limit(settings, "big-cancel", "quick", room=60)
    cancelled = lifecycle.cancel("big-cancel", settings, "stop it")
    assert cancelled is not None and cancelled.status == "ignored"
    assert [(e.kind, e.message[:7]) for e in cancelled.errors][0] == ("cancelled", "stop it")
    assert cancelled.errors[-1].kind == "record_too_large"
