"""A batch whose completion has fired (its complete callback put, its Batch Completed event sent)
takes no new tasks: they are refused with 409, nothing written, rather than joining a batch whose
callback and event already gave its final counts."""

from __future__ import annotations

import time

import pytest
from coworker.data.models import BatchModel
from coworker.engine import batches, callbacks, dispatch, progress
from coworker.engine.worker import run_batch

from tests.support.doubles import Api, RecordingInvoker


def _complete(api: Api, batch_id: str, keys: list[str]) -> None:
    """Run the batch's tasks, count them and let the coordinator fire what happened."""
    run_batch(keys, "w", api.settings, time.monotonic() + 30)
    progress.catch_up(api.settings)
    callbacks.fire_due(api.settings)


@pytest.fixture
def api(settings) -> Api:
    return Api(settings.model_copy(update={"dispatch_on_submit": False}))


def test_a_task_added_after_the_complete_callback_fired_is_refused_and_nothing_changes(api):
    # Given a batch of one task whose complete callback has fired with total 1
    status, body, _ = api.call("POST", "/tasks", {"batch_id": "b", "tasks": [{"key": "t1", "type": "quick"}],
                                                 "callbacks": {"complete": {"type": "quick"}}})
    assert status == 201, body
    _complete(api, "b", ["t1"])
    fired = api.call("GET", "/tasks/b~complete")[1]["payload"]["batch"]
    assert fired["total"] == 1 and fired["completed_at"] is not None
    before = api.items()

    # When a task is added to it, alone or with a batch, (also naming callbacks)
    for body in ({"batch_id": "b", "tasks": [{"key": "t2", "type": "quick"}]},
                 {"batch_id": "b", "tasks": [{"key": "t1", "type": "quick"}, {"key": "t2", "type": "quick"}],
                  "callbacks": {"complete": {"type": "quick"}}}):
        status, answer, _ = api.call("POST", "/tasks", body)

        # Then it is refused with 409, saying the batch completed, when, and to use a new batch
        assert status == 409 and answer["error"] == "batch_completed", answer
        assert "batch 'b' completed at " + fired["completed_at"] in answer["message"]
        assert "new batch" in answer["message"]
    # and nothing was written: the batch keeps the counts its callback gave
    assert api.items() == before
    assert api.counted_batch("b")[1]["total"] == 1


def test_resending_the_tasks_of_a_completed_batch_is_still_idempotent(api):
    body = {"batch_id": "b", "tasks": [{"key": "t1", "type": "quick"}], "callbacks": {"complete": {"type": "quick"}}}
    assert api.call("POST", "/tasks", body)[0] == 201
    _complete(api, "b", ["t1"])
    before = api.items()
    status, answer, _ = api.call("POST", "/tasks", body)
    assert status == 200 and answer["results"] == [{"key": "t1", "outcome": "exists"}], answer
    assert api.items() == before


def test_a_put_that_opens_while_the_completion_is_read_holds_the_completion_back(api, monkeypatch):
    # Given a batch that reads done, and a put request that opens between that read and the firing
    assert api.call("POST", "/tasks", {"batch_id": "b", "tasks": [{"key": "t1", "type": "quick"}],
                                       "callbacks": {"complete": {"type": "quick"}}})[0] == 201
    run_batch(["t1"], "w", api.settings, time.monotonic() + 30)
    progress.catch_up(api.settings)
    real_read = batches.read_batch

    def read_then_put(batch_id, watermark=None):
        read = real_read(batch_id, watermark)
        monkeypatch.setattr(batches, "read_batch", real_read)
        assert api.call("POST", "/tasks", {"batch_id": "b", "tasks": [{"key": "t2", "type": "quick"}]})[0] == 201
        return read

    monkeypatch.setattr(batches, "read_batch", read_then_put)
    callbacks.fire_due(api.settings)

    # Then the completion did not fire on the stale read: it fires once t2 is done, with total 2
    assert BatchModel.get("batch#b", consistent_read=True).completed_at is None
    assert api.call("GET", "/tasks/b~complete")[0] == 404
    _complete(api, "b", ["t2"])
    dispatch.tick(api.settings, RecordingInvoker())
    assert api.call("GET", "/tasks/b~complete")[1]["payload"]["batch"]["total"] == 2
