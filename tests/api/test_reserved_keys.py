"""Keys Coworker derives for the tasks it puts itself (a schedule's occurrence, a batch's callback)
are refused for tasks anyone else puts: a task put first under one would take that task's place."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from coworker.engine.callbacks import CALLBACK_EVENTS, callback_key
from coworker.engine.handlers import TaskContext
from coworker.engine.schedules import occurrence_key
from coworker.engine.tasks import derived_key_problem

from tests.support.doubles import Api

OCCURRENCE = occurrence_key("nightly", datetime(2027, 1, 1, 2, 0, tzinfo=UTC))
CALLBACK = callback_key("b1", "complete")


def test_the_keys_coworker_builds_are_the_shapes_it_reserves():
    assert derived_key_problem(OCCURRENCE) is not None
    assert derived_key_problem(occurrence_key("a.b_c-9" * 11 + "x", datetime(2027, 12, 31, 23, 59, 59, tzinfo=UTC)))
    for event in CALLBACK_EVENTS:
        assert derived_key_problem(callback_key("run:2027.01-x", event)) is not None
    # near misses are anyone's keys
    for free in ("nightly@2027-01-01", "nightly@2027-01-01T02:00:00", "a b@2027-01-01T02:00:00Z", "b1~done",
                 "b1~complete/1", "nightly@2027-01-01T02:00:00Z/1", "~complete", "@2027-01-01T02:00:00Z"):
        assert derived_key_problem(free) is None, free


@pytest.mark.parametrize(("body", "where", "says"), [
    ({"key": OCCURRENCE, "type": "quick"}, "body.key", "reserved for the tasks schedules put"),
    ({"key": CALLBACK, "type": "quick"}, "body.key", "reserved for batch callbacks"),
    ({"tasks": [{"key": "fine", "type": "quick"}, {"key": "b2~stopped", "type": "quick"}]},
     "body.tasks[1].key", "reserved for batch callbacks"),
])
def test_a_reserved_key_is_refused_at_submit_and_nothing_is_written(settings, body, where, says):
    api = Api(settings)
    before = api.items()
    status, answer, _ = api.call("POST", "/tasks", body)
    assert status == 422, answer
    assert any(e["location"] == where and says in e["message"] for e in answer["errors"]), answer
    assert api.items() == before


def test_a_follow_up_may_not_take_a_reserved_key():
    context = TaskContext(key="parent", attempt=1, max_attempts=3, fencing_token="t",
                          deadline=time.monotonic() + 30)
    for key in (OCCURRENCE, CALLBACK):
        with pytest.raises(ValueError, match="follow-up task refused: key: .*reserved"):
            context.spawn("quick", key=key)
    assert context.follow_ups == []
