"""The API refuses a task whose time limit, its own or its type's, no runner of the deployment
gives, with a message that names the runner and what to change; and it keeps a task's own limit."""

from __future__ import annotations

import pytest
from coworker.engine import timing
from coworker.engine.handlers import task_handler

from tests.support.doubles import Api


@task_handler("test-declares-ten-minutes", timeout_seconds=600)
def _ten_minutes(payload, context):
    return None


@pytest.fixture
def api(settings) -> Api:
    return Api(settings)  # the default worker: 300 s, less the margin and start allowance


def test_a_task_keeps_its_own_time_limit(api):
    status, _, _ = api.call("POST", "/tasks", {"key": "own", "type": "quick", "timeout_seconds": 90})
    assert status == 201
    status, task, _ = api.call("GET", "/tasks/own")
    assert status == 200 and task["timeout_seconds"] == 90


def test_a_limit_longer_than_the_worker_gives_is_refused_naming_the_setting(api, settings):
    before = api.items()
    longest = timing.max_task_seconds(settings)
    status, answer, _ = api.call("POST", "/tasks", {"type": "quick", "timeout_seconds": longest + 1})
    assert status == 422 and answer["errors"][0]["location"] == "body.timeout_seconds"
    message = answer["message"]
    assert "Lambda worker" in message and f"at most {longest:g} s" in message and "workerTimeoutSeconds" in message
    # Exactly what the worker gives is accepted.
    status, _, _ = api.call("POST", "/tasks", {"key": "fits", "type": "quick", "timeout_seconds": longest})
    assert status == 201
    assert len(api.items()) == len(before) + 1


def test_a_type_declaring_more_than_the_worker_gives_is_refused_in_a_batch_entry(api):
    before = api.items()
    batch = {"tasks": [{"type": "quick"}, {"type": "test-declares-ten-minutes"}]}
    status, answer, _ = api.call("POST", "/tasks", batch)
    assert status == 422
    assert [(e["location"], e["entry"]) for e in answer["errors"]] == [("body.tasks[1].type", 1)]
    assert "task type 'test-declares-ten-minutes' has a time limit of 600 s" in answer["message"]
    # Its own, shorter limit wins over the type's.
    status, _, _ = api.call("POST", "/tasks", {"type": "test-declares-ten-minutes", "timeout_seconds": 60})
    assert status == 201
    assert len(api.items()) == len(before) + 1


def test_beyond_what_any_lambda_gives_the_message_says_so(api):
    status, answer, _ = api.call("POST", "/tasks", {"type": "quick", "timeout_seconds": 3600})
    assert status == 422
    assert "longer than a Lambda worker can give" in answer["message"]
    assert "900 s" in answer["message"] and "run it on the container runner" in answer["message"]


@pytest.mark.parametrize("value", [0, -5, "60", True, None, 7 * 86400 + 1])
def test_a_limit_that_is_not_a_number_of_seconds_is_refused(api, value):
    before = api.items()
    status, answer, _ = api.call("POST", "/tasks", {"type": "quick", "timeout_seconds": value})
    if value is None:  # null: no limit of its own
        assert status == 201
        return
    assert status == 422 and "timeout_seconds" in answer["errors"][0]["location"]
    assert api.items() == before


def test_schedules_and_callbacks_are_held_to_the_same_limit(api, settings):
    too_long = timing.max_task_seconds(settings) + 10
    status, answer, _ = api.call("PUT", "/schedules/nightly", {
        "expression": "rate(1 hour)", "task": {"type": "quick", "timeout_seconds": too_long}})
    assert status == 422 and answer["errors"][0]["location"].endswith("timeout_seconds")
    status, answer, _ = api.call("POST", "/tasks", {
        "tasks": [{"type": "quick"}], "callbacks": {"complete": {"type": "test-declares-ten-minutes"}}})
    assert status == 422 and answer["errors"][0]["location"] == "body.callbacks.complete.type"


def test_types_show_their_declared_limit_and_observed_p95(api):
    from coworker.engine import durations

    for _ in range(durations.MIN_RUNS):
        durations.observed.observe("slow", 2.0)
    status, answer, _ = api.call("GET", "/types")
    assert status == 200
    types = {t["type"]: t for t in answer["types"]}
    assert types["test-declares-ten-minutes"]["timeout_seconds"] == 600
    assert types["test-declares-ten-minutes"]["observed_p95_seconds"] is None
    assert 2.0 <= types["slow"]["observed_p95_seconds"] <= 2.0 * durations.RATIO
    assert types["quick"]["timeout_seconds"] is None
