"""Rate limits through the API: tasks that carry a rate, limits set per key and type, a group's
state, and bad requests that change nothing."""

from __future__ import annotations

import math
import time
from datetime import datetime

import pytest
from coworker.engine import control, lifecycle, rates
from coworker.engine.control import Rate
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.worker import process_task

from tests.support.doubles import Api


@pytest.fixture(autouse=True)
def _fresh_control_view(monkeypatch):
    control._cache.invalidate()
    # A token is waited for only within worker.RATE_WAIT_SECONDS here, however slow this process's
    # writes were lately (rates.worth_waiting_seconds waits longer then: test_rate_turns.py), so
    # which tasks are turned away does not depend on how loaded the machine is.
    monkeypatch.setattr(rates, "worth_waiting_seconds", lambda lock_seconds: 0.0)
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


def _booked_waiters(api, settings, group_key, count):
    """Put ``count`` + 1 tasks of rate key ``group_key`` and run them: the first starts, the
    others are turned away and booked. Their reports, by key."""
    for number in range(count + 1):
        body = {"key": f"{group_key}-{number}", "type": "quick", "rate_key": group_key}
        assert api.call("POST", "/tasks", body)[0] == 201
    reports = [process_task(f"{group_key}-{n}", "w", settings, time.monotonic() + 30) for n in range(count + 1)]
    assert [r.outcome for r in reports] == [TaskOutcome.FINISHED] + [TaskOutcome.DEFERRED] * count
    return {report.key: report for report in reports[1:]}


def _due(key):
    task = lifecycle.get_task(key)
    assert task.status == "todo" and rates.from_epoch_ms(int(task.rate_booked_at)) == task.due_at  # booked there
    return task.due_at


def test_a_raised_limit_moves_the_waiters_booked_under_the_old_one_and_new_tasks_book_behind_them(settings):
    # (issue 52, item 6: waiters kept their bookings at the old spacing, and new tasks booked behind them)
    api = Api(settings)
    # Given a key limited to 1 start per 10 s, and three of its tasks booked 10 s apart
    assert api.call("PUT", "/rate-limits/key:slow", {"limit": 1, "interval_seconds": 10})[0] == 200
    waiters = _booked_waiters(api, settings, "slow", 3)
    before = [_due(key) for key in waiters]
    assert [round((b - a).total_seconds()) for a, b in zip(before, before[1:], strict=False)] == [10, 10]
    # When the limit is raised to 10 per 10 s
    assert api.call("PUT", "/rate-limits/key:slow", {"limit": 10, "interval_seconds": 10})[0] == 200
    # Then the waiters keep their order, each comes due sooner, spaced by the new limit
    after = [_due(key) for key in waiters]
    spacing = math.ceil((10_000 + rates.MAX_MARGIN_MS) / 10)
    assert [rates.epoch_ms(b) - rates.epoch_ms(a) for a, b in zip(after, after[1:], strict=False)] == [spacing] * 2
    assert all(new < old for new, old in zip(after, before, strict=True)), (after, before)
    # and a new task books right behind them, not behind the old bookings
    assert api.call("POST", "/tasks", {"key": "slow-new", "type": "quick", "rate_key": "slow"})[0] == 201
    report = process_task("slow-new", "w", settings, time.monotonic() + 30)
    assert report.outcome is TaskOutcome.DEFERRED
    assert rates.epoch_ms(report.retry_at) - rates.epoch_ms(after[-1]) == spacing
    booked_until = datetime.fromisoformat(api.call("GET", "/rate-limits/key:slow")[1]["booked_until"])
    assert rates.epoch_ms(booked_until) == rates.epoch_ms(report.retry_at) + spacing


def test_a_lifted_limit_makes_the_booked_waiters_due_together(settings):
    api = Api(settings)
    assert api.call("PUT", "/rate-limits/key:lifted", {"limit": 1, "interval_seconds": 10})[0] == 200
    waiters = _booked_waiters(api, settings, "lifted", 3)
    before = [_due(key) for key in waiters]
    assert api.call("PUT", "/rate-limits/key:lifted", {"limit": None})[0] == 200
    after = [_due(key) for key in waiters]
    assert len(set(after)) == 1 and after[0] < before[0], (after, before)  # no longer spaced: due as one


def test_a_lowered_limit_leaves_the_bookings_as_they_are(settings):
    api = Api(settings)
    assert api.call("PUT", "/rate-limits/key:lowered", {"limit": 1, "interval_seconds": 10})[0] == 200
    waiters = _booked_waiters(api, settings, "lowered", 2)
    before = [_due(key) for key in waiters]
    assert api.call("PUT", "/rate-limits/key:lowered", {"limit": 1, "interval_seconds": 20})[0] == 200
    assert [_due(key) for key in waiters] == before  # none comes due sooner than its spacing allows


def test_a_types_raised_limit_moves_its_waiters_only(settings):
    api = Api(settings)
    # Given waiters of a key and of a type, each group at 1 start per 10 s
    assert api.call("PUT", "/rate-limits/key:other", {"limit": 1, "interval_seconds": 10})[0] == 200
    others = _booked_waiters(api, settings, "other", 1)
    assert api.call("PUT", "/rate-limits/type:quick", {"limit": 1, "interval_seconds": 10})[0] == 200
    for number in range(3):
        assert api.call("POST", "/tasks", {"key": f"q{number}", "type": "quick"})[0] == 201
    outcomes = [process_task(f"q{n}", "w", settings, time.monotonic() + 30).outcome for n in range(3)]
    assert outcomes == [TaskOutcome.FINISHED, TaskOutcome.DEFERRED, TaskOutcome.DEFERRED]
    before = {key: _due(key) for key in ("q1", "q2", *others)}
    # When the type's limit is raised, its waiters come due sooner; the key's waiter stays
    assert api.call("PUT", "/rate-limits/type:quick", {"limit": 10, "interval_seconds": 10})[0] == 200
    assert _due("q1") < before["q1"] and _due("q2") < before["q2"]
    assert [_due(key) for key in others] == [before[key] for key in others]


def test_a_change_that_cannot_read_every_booking_moves_the_first_waiters_and_keeps_the_mark(settings, monkeypatch):
    api = Api(settings)
    assert api.call("PUT", "/rate-limits/key:long", {"limit": 1, "interval_seconds": 10})[0] == 200
    waiters = _booked_waiters(api, settings, "long", 4)
    before = [_due(key) for key in waiters]
    mark = rates.read_log("key:long").booked_until
    monkeypatch.setattr(rates, "REBOOK_READS", 1)  # one index entry per shard
    assert api.call("PUT", "/rate-limits/key:long", {"limit": 10, "interval_seconds": 10})[0] == 200
    moved = [_due(key) < old for key, old in zip(waiters, before, strict=True)]
    assert moved == sorted(moved, reverse=True) and not all(moved)  # the first ones only, in order
    assert rates.read_log("key:long").booked_until == mark  # new tasks book behind those not moved
