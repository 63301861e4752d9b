"""Rate limits through the API: tasks that carry a rate, limits set per key and type, a group's
state, and bad requests that change nothing."""

from __future__ import annotations

import time

import pytest
from coworker.engine import control, rates
from coworker.engine.control import Rate
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.worker import process_task

from tests.support.doubles import Api


@pytest.fixture(autouse=True)
def _fresh_control_view():
    control._cache.invalidate()
    yield
    control._cache.invalidate()


def test_a_task_put_with_a_rate_shows_it_and_its_group_is_readable(settings):
    api = Api(settings)
    status, _, _ = api.call("POST", "/tasks", {"key": "p1", "type": "quick", "rate_key": "example.com",
                                               "rate_limit": 2, "rate_interval_seconds": 0.5})
    assert status == 201
    task = api.call("GET", "/tasks/p1")[1]
    assert (task["rate_key"], task["rate_limit"], task["rate_interval_seconds"]) == ("example.com", 2, 0.5)
    assert api.call("GET", "/rate-limits/key:example.com")[0] == 404  # nothing started yet

    assert process_task("p1", "w", settings, time.monotonic() + 30).outcome is TaskOutcome.FINISHED
    status, group, _ = api.call("GET", "/rate-limits/key%3Aexample.com")
    assert status == 200
    assert (group["limit"], group["interval_seconds"], group["source"]) == (2, 0.5, "last start")
    assert group["started_in_interval"] in (0, 1)  # 1 unless the half second has passed


def test_set_read_and_lift_a_keys_and_a_types_limit(settings):
    api = Api(settings)
    status, answer, _ = api.call("PUT", "/rate-limits/key:tenant-7", {"limit": 100, "interval_seconds": 60})
    assert status == 200
    assert (answer["limit"], answer["interval_seconds"], answer["source"]) == (100, 60.0, "set")
    assert answer["changed"] is True
    assert api.call("PUT", "/rate-limits/key:tenant-7", {"limit": 100, "interval_seconds": 60})[1]["changed"] is False
    status, answer, _ = api.call("PUT", "/rate-limits/type:quick", {"limit": 5})
    assert status == 200 and (answer["limit"], answer["interval_seconds"]) == (5, 1.0)
    assert control.read().rate_limits == {"key:tenant-7": Rate(100, 60_000), "type:quick": Rate(5, 1000)}

    def one_by_one(name):
        raise AssertionError(f"the listing read {name!r} on its own")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rates, "read_log", one_by_one)  # every listed group's log comes in one read
        listed = api.call("GET", "/rate-limits")[1]
    assert [entry["group"] for entry in listed["limits"]] == ["key:tenant-7", "type:quick"]
    assert api.call("GET", "/rate-limits/type:quick")[1]["source"] == "set"

    status, answer, _ = api.call("PUT", "/rate-limits/key:tenant-7", {"limit": None})
    assert status == 200 and answer["changed"] is True and answer["limit"] is None
    assert control.read().rate_limits == {"type:quick": Rate(5, 1000)}


@pytest.mark.parametrize(("path", "body", "status", "error"), [
    ("/rate-limits/tenant-7", {"limit": 5}, 400, "bad_request"),  # no key: or type:
    ("/rate-limits/key:", {"limit": 5}, 400, "bad_request"),
    ("/rate-limits/key:a%0Ab", {"limit": 5}, 400, "bad_request"),
    ("/rate-limits/type:no-such-type", {"limit": 5}, 404, "type_not_found"),
    ("/rate-limits/key:k", {"limit": 0}, 422, "validation_error"),
    ("/rate-limits/key:k", {"limit": 1001}, 422, "validation_error"),
    ("/rate-limits/key:k", {"limit": "5"}, 422, "validation_error"),
    ("/rate-limits/key:k", {"limit": 5, "interval_seconds": 0}, 422, "validation_error"),
    ("/rate-limits/key:k", {"limit": 5, "interval_seconds": "1"}, 422, "validation_error"),
    ("/rate-limits/key:k", {"limit": 5, "interval_seconds": 1e9}, 422, "validation_error"),
    ("/rate-limits/key:k", {"limit": 5, "per": 1}, 422, "validation_error"),
    ("/rate-limits/key:k", {}, 422, "validation_error"),
    ("/rate-limits/key:k", [5], 422, "validation_error"),
])
def test_bad_rate_limits_are_refused_and_change_nothing(settings, path, body, status, error):
    api = Api(settings)
    before = api.items()
    got, answer, _ = api.call("PUT", path, body)
    assert (got, answer["error"]) == (status, error), answer
    assert answer["message"]
    assert api.items() == before


@pytest.mark.parametrize("task", [
    {"rate_limit": 5},  # no key
    {"rate_key": "k", "rate_interval_seconds": 2},  # an interval without a limit
    {"rate_key": "k", "rate_limit": 5000},
    {"rate_key": "k", "rate_limit": 5, "rate_interval_seconds": -1},
    {"rate_key": "x" * 257},
])
def test_a_task_with_a_bad_rate_is_422_and_not_stored(settings, task):
    api = Api(settings)
    before = api.items()
    status, answer, _ = api.call("POST", "/tasks", {"key": "bad", "type": "quick", **task})
    assert status == 422 and answer["errors"], answer
    assert api.items() == before


def test_the_number_of_limits_set_is_bounded(settings, monkeypatch):
    monkeypatch.setattr(control, "MAX_RATE_LIMITS", 2)
    api = Api(settings)
    assert api.call("PUT", "/rate-limits/key:a", {"limit": 1})[0] == 200
    assert api.call("PUT", "/rate-limits/key:b", {"limit": 1})[0] == 200
    status, answer, _ = api.call("PUT", "/rate-limits/key:c", {"limit": 1})
    assert status == 409 and answer["error"] == "too_many_rate_limits" and "lift one" in answer["message"]
    assert api.call("PUT", "/rate-limits/key:a", {"limit": 3})[0] == 200  # changing one that is set is fine
    assert set(control.read().rate_limits) == {"key:a", "key:b"}


def test_a_lifted_limit_is_shown_lifted_and_a_carried_one_as_carried_not_set(settings):
    # (issue 52, item 4: a lifted limit was shown as the last start's, still in force)
    api = Api(settings)

    def run(key, **rate):
        assert api.call("POST", "/tasks", {"key": key, "type": "quick", "rate_key": "site-a", **rate})[0] == 201
        assert process_task(key, "w", settings, time.monotonic() + 30).outcome is TaskOutcome.FINISHED

    def shown():
        status, answer, _ = api.call("GET", "/rate-limits/key:site-a")
        assert status == 200, answer
        return answer["limit"], answer["interval_seconds"], answer["source"]

    # Given a limit set for a key, and a task of the key started under it
    assert api.call("PUT", "/rate-limits/key:site-a", {"limit": 5})[0] == 200
    run("s1", rate_limit=3, rate_interval_seconds=0.5)  # the limit set wins over the one it carries
    assert shown() == (5, 1.0, "set")
    # When the limit is lifted, the answer and the group say so: nothing limits its tasks now
    status, answer, _ = api.call("PUT", "/rate-limits/key:site-a", {"limit": None})
    assert status == 200 and answer["changed"] is True
    assert (answer["limit"], answer["interval_seconds"], answer["source"]) == (None, None, "lifted")
    assert shown() == (None, None, "lifted")
    assert api.call("GET", "/rate-limits")[1]["limits"] == []
    # A task that carries its own limit starts under it: shown as carried, not set
    run("c1", rate_limit=3, rate_interval_seconds=0.5)
    assert shown() == (3, 0.5, "last start")
    # Set and lifted again after a start under the limit set: lifted, not the carried one of before
    assert api.call("PUT", "/rate-limits/key:site-a", {"limit": 5})[0] == 200
    run("s2")
    assert api.call("PUT", "/rate-limits/key:site-a", {"limit": None})[1]["source"] == "lifted"
    assert shown() == (None, None, "lifted")
    # A type's limit lifted after its tasks started is lifted too
    assert api.call("PUT", "/rate-limits/type:quick", {"limit": 5})[0] == 200
    run("t1")
    assert api.call("PUT", "/rate-limits/type:quick", {"limit": None})[1]["source"] == "lifted"
    assert api.call("GET", "/rate-limits/type:quick")[1]["source"] == "lifted"
