"""Task types through the API: list, pause, resume, and bad requests that change nothing."""

from __future__ import annotations

from coworker import control, lifecycle
from coworker.lifecycle import TaskSpec

from tests.support.doubles import Api, RecordingInvoker


def test_pause_and_resume_a_type(settings):
    invoker = RecordingInvoker()
    api = Api(settings, invoker)
    status, answer, _ = api.call("POST", "/types/slow/pause")
    assert status == 200 and answer == {"type": "slow", "registered": True, "paused": True, "held": 0,
                                        "changed": True}
    assert api.call("POST", "/types/slow/pause")[1]["changed"] is False  # idempotent
    assert control.read().paused == frozenset({"slow"})

    # a task of a paused type is stored but not started on submit; another type is
    assert api.call("POST", "/tasks", {"key": "s1", "type": "slow"})[0] == 201
    assert api.call("POST", "/tasks", {"key": "q1", "type": "quick"})[0] == 201
    assert [key for request in invoker.requests for key in request.keys] == ["q1"]
    assert lifecycle.get_task("s1").status == "todo"

    types = {t["type"]: t for t in api.call("GET", "/types")[1]["types"]}
    assert types["slow"]["paused"] and not types["quick"]["paused"]
    assert {"quick", "slow", "flaky", "always-fail"} <= set(types)

    status, answer, _ = api.call("POST", "/types/slow/resume")
    assert status == 200 and (answer["paused"], answer["changed"]) == (False, True)
    assert api.call("POST", "/types/slow/resume")[1]["changed"] is False
    assert control.read().paused == frozenset()


def test_an_unknown_type_is_404_and_changes_nothing(settings):
    api = Api(settings)
    lifecycle.put_task(TaskSpec(key="k", type="quick"), settings)
    before = api.items()
    for path in ("/types/nope/pause", "/types/nope/resume", "/types/qu%0Aick/pause"):
        status, answer, _ = api.call("POST", path)
        assert status == 404 and answer["error"] == "type_not_found", answer
        assert "known: always-fail" in answer["message"]
    assert api.items() == before and control.read().paused == frozenset()


def test_a_type_with_held_tasks_stays_listed_and_resumable_after_its_handler_is_gone(settings):
    api = Api(settings)
    control.pause("retired-type")  # paused before its handler was removed
    status, answer, _ = api.call("POST", "/types/retired-type/resume")
    assert status == 200 and answer["registered"] is False and answer["changed"] is True


def test_task_keys_may_not_use_the_control_prefix(settings):
    status, answer, _ = Api(settings).call("POST", "/tasks", {"key": "control#types", "type": "quick"})
    assert status == 422 and "reserved" in answer["message"]
