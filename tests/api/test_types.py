"""Task types through the API: list, pause, resume, and bad requests that change nothing."""

from __future__ import annotations

from coworker.engine import control, lifecycle, submit
from coworker.engine.tasks import TaskSpec

from tests.support.doubles import Api, RecordingInvoker


def test_pause_and_resume_a_type(settings):
    invoker = RecordingInvoker()
    api = Api(settings, invoker)
    status, answer, _ = api.call("POST", "/types/slow/pause")
    assert status == 200 and answer == {"type": "slow", "registered": True, "paused": True, "held": 0,
                                        "limit": None, "running": None, "blocked": None, "changed": True,
                                        "timeout_seconds": None, "runner": "lambda", "observed_p95_seconds": None}
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
    submit.put_task(TaskSpec(key="k", type="quick"), settings)
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


def test_set_and_lift_a_type_limit(settings):
    api = Api(settings)
    status, answer, _ = api.call("PUT", "/types/slow/limit", {"limit": 2})
    assert status == 200 and (answer["limit"], answer["running"], answer["blocked"], answer["changed"]) == (
        2, 0, 0, True)
    assert api.call("PUT", "/types/slow/limit", {"limit": 2})[1]["changed"] is False
    assert control.read().limits == {"slow": 2}
    types = {t["type"]: t for t in api.call("GET", "/types")[1]["types"]}
    assert types["slow"]["limit"] == 2 and types["quick"]["limit"] is None

    status, answer, _ = api.call("PUT", "/types/slow/limit", {"limit": None})
    assert status == 200 and answer["limit"] is None and answer["changed"] is True
    assert control.read().limits == {}


def test_bad_limits_are_refused_and_change_nothing(settings):
    api = Api(settings)
    api.call("PUT", "/types/slow/limit", {"limit": 3})
    for body in ({"limit": 0}, {"limit": -1}, {"limit": "2"}, {"limit": 1001}, {}, {"limit": 2, "extra": 1},
                 [2]):
        status, answer, _ = api.call("PUT", "/types/slow/limit", body)
        assert status == 422, (body, answer)
        assert answer["message"], answer
    status, answer, _ = api.call("PUT", "/types/nope/limit", {"limit": 2})
    assert status == 404 and answer["error"] == "type_not_found"
    assert control.read().limits == {"slow": 3}


def test_a_task_with_a_concurrency_key_and_bad_ones(settings):
    api = Api(settings)
    status, answer, _ = api.call("POST", "/tasks", {"key": "p1", "type": "quick", "concurrency_key": "example.com",
                                                    "concurrency_limit": 4})
    assert status == 201, answer
    task = api.call("GET", "/tasks/p1")[1]
    assert (task["concurrency_key"], task["concurrency_limit"], task["blocked"]) == ("example.com", 4, False)
    assert api.call("POST", "/tasks", {"key": "p2", "type": "quick", "concurrency_key": "x"})[0] == 201
    assert api.call("GET", "/tasks/p2")[1]["concurrency_limit"] == 1  # one at a time unless told

    before = api.items()
    bad = [
        ({"type": "quick", "concurrency_limit": 2}, "needs a concurrency_key"),
        ({"type": "quick", "concurrency_key": "x", "concurrency_limit": 0}, "concurrency_limit"),
        ({"type": "quick", "concurrency_key": "x", "concurrency_limit": 1001}, "concurrency_limit"),
        ({"type": "quick", "concurrency_key": "x", "concurrency_limit": "3"}, "concurrency_limit"),
        ({"type": "quick", "concurrency_key": ""}, "concurrency_key"),
        ({"type": "quick", "concurrency_key": "x" * 257}, "concurrency_key"),
        ({"type": "quick", "concurrency_key": "a\nb"}, "control characters"),
        ({"key": "gate#key:x", "type": "quick"}, "reserved"),
    ]
    for body, words in bad:
        status, answer, _ = api.call("POST", "/tasks", body)
        assert status == 422 and words in answer["message"], (body, answer)
    assert api.items() == before
