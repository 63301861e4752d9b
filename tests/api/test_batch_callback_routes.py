"""Batch callbacks through the API: named with a batch, refused with a reason when they cannot
be kept (and then nothing is written), and fired once the batch gets there."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from coworker.engine import dispatch
from coworker.engine.dispatch import InProcessInvoker

from tests.support.doubles import Api

TASKS = [{"key": f"t{i}", "type": "quick"} for i in range(3)]


@pytest.fixture
def api(settings) -> Api:
    return Api(settings)


@pytest.mark.parametrize(("callbacks", "where", "says"), [
    ({}, "body.callbacks", "name at least one of complete, success and stopped"),
    ({"complete": {"type": "quick", "key": "mine"}}, "body.callbacks.complete", "a callback task has no key or run_at"),
    ({"success": {"type": "quick", "run_at": "2030-01-01T00:00:00Z"}}, "body.callbacks.success",
     "a callback task has no key or run_at"),
    ({"finished": {"type": "quick"}}, "body.callbacks.finished", "unknown field"),
    ({"complete": {"type": "quick", "payload": "x" * 17_000}}, "body.callbacks", "at most 16 KB"),
    ({"complete": {"type": "no-such-type"}}, "body.callbacks.complete.type",
     "no handler is registered for task type 'no-such-type'"),
])
def test_callbacks_that_cannot_be_kept_are_refused_and_nothing_is_written(api, callbacks, where, says):
    before = api.items()
    status, body, _ = api.call("POST", "/tasks", {"batch_id": "b", "tasks": TASKS, "callbacks": callbacks})
    assert status == 422, body
    (problem,) = body["errors"]
    assert problem["location"] == where and says in problem["message"], body
    assert api.items() == before


def test_named_callbacks_run_once_the_batch_is_done(settings):
    invoker = InProcessInvoker(settings)
    api = Api(settings, invoker)
    try:
        status, body, _ = api.call("POST", "/tasks", {
            "batch_id": "nightly", "tasks": TASKS,
            "callbacks": {"complete": {"type": "quick", "payload": {"report": "daily"}},
                          "stopped": {"type": "quick"}}})
        assert status == 201, body
        assert api.call("GET", "/batches/nightly")[1]["callbacks"] == ["complete", "stopped"]
        key = quote("nightly~complete", safe="")
        for _ in range(20):  # ticks, each followed by the in-process workers it started
            dispatch.tick(settings.model_copy(update={"dispatch_on_submit": False}), invoker)
            invoker.wait()
            found = api.call("GET", f"/tasks/{key}")
            if found[0] == 200 and found[1]["status"] == "finished":
                break
        status, task, _ = api.call("GET", f"/tasks/{key}")
        assert status == 200 and task["status"] == "finished", task
        assert task["payload"]["event"] == "complete" and task["payload"]["payload"] == {"report": "daily"}
        assert task["payload"]["batch"]["finished"] == 3
        batch = api.call("GET", "/batches/nightly")[1]
        assert batch["fired"] == ["complete", "success"] and batch["state"] == "done"
        assert api.call("GET", f"/tasks/{quote('nightly~stopped', safe='')}")[0] == 404
    finally:
        invoker.shutdown()
