"""A task's record carries when its latest attempt was claimed (``started_at``): written by the
claim's own UpdateItem, renewed by every claim (a take-over too), kept through the result, left
as it is when a claim is given back unstarted, and shown by ``GET /tasks/{key}``."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import botocore.client
import pytest
from coworker.data.models import TaskStatus, utcnow
from coworker.engine import lifecycle, submit
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch

from tests.support.doubles import Api

pytestmark = pytest.mark.both_backends


def _put(settings, key: str, ago: float = 0.0) -> None:
    submit.put_task(TaskSpec(key=key, type="quick", payload={"n": 1}), settings,
                    now=utcnow() - timedelta(seconds=ago))


def test_the_claim_stamps_the_attempts_start_in_its_one_update(settings, monkeypatch):
    # Given a task put a minute ago
    _put(settings, "k", ago=60)
    assert lifecycle.get_task("k").started_at is None  # never claimed: no start
    requests: list[tuple[str, str]] = []
    original = botocore.client.BaseClient._make_api_call

    def recorded(client, operation, params):
        requests.append((operation, json.dumps(params.get("Key") or "")))
        return original(client, operation, params)

    # When a worker claims it
    now = utcnow().replace(microsecond=123000)
    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recorded)
    claim = lifecycle.claim("k", "w", settings, now=now)
    monkeypatch.undo()

    # Then the claim's own UpdateItem wrote the start (no other request), and the claim holds it
    assert claim is not None and claim.task.started_at == now
    assert [operation for operation, _ in requests] == ["UpdateItem"]
    assert lifecycle.get_task("k").started_at == now


def test_a_take_over_restamps_the_start_and_a_finished_task_keeps_its_last(settings):
    _put(settings, "k", ago=120)
    lost_at = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 1)
    assert lifecycle.claim("k", "dead", settings, now=lost_at) is not None
    assert lifecycle.get_task("k").started_at == lost_at

    [report] = run_batch(["k"], "alive", settings, time.monotonic() + 30)  # takes the lost attempt over

    task = lifecycle.get_task("k")
    assert report.outcome is TaskOutcome.FINISHED and int(task.attempts) == 2
    assert lost_at < task.started_at <= task.finished_at  # the finishing attempt's claim
    assert task.to_dict()["started_at"] == task.started_at.isoformat().replace("+00:00", "Z")


def test_a_claim_given_back_unstarted_leaves_the_start_of_that_claim(settings):
    # The start says when the task was last claimed: a give-back does not count the attempt, and
    # the earlier attempt's start was already overwritten by the claim, so it is left as it is.
    _put(settings, "k", ago=60)
    claimed_at = utcnow() - timedelta(seconds=5)
    claim = lifecycle.claim("k", "w", settings, now=claimed_at)
    assert claim is not None

    assert lifecycle.release_unstarted(claim)

    task = lifecycle.get_task("k")
    assert (task.status, int(task.attempts)) == (TaskStatus.TODO.value, 0)
    assert task.started_at == claimed_at


def test_the_api_shows_the_start_and_documents_it(settings):
    api = Api(settings)
    _put(settings, "k", ago=60)
    status, task, _ = api.call("GET", "/tasks/k")
    assert status == 200 and task["started_at"] is None

    [report] = run_batch(["k"], "w", settings, time.monotonic() + 30)

    assert report.outcome is TaskOutcome.FINISHED
    task = api.call("GET", "/tasks/k")[1]
    assert task["created_at"] < task["started_at"] <= task["finished_at"]
    document = api.call("GET", "/openapi.json")[1]
    declared = document["components"]["schemas"]["TaskOut"]["properties"]["started_at"]
    assert "claimed" in declared["description"]
