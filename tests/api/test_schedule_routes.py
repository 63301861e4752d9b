"""Schedules through the API: put, read, list, pause, resume, delete, and bad requests that
answer with a reason and change nothing."""

from __future__ import annotations

import pytest
from coworker.engine import schedules

from tests.support.doubles import Api

NIGHTLY = {"expression": "cron(0 3 * * *)", "timezone": "Europe/Berlin",
           "task": {"type": "quick", "payload": {"site": "example.org"}}}


def test_a_schedule_through_the_api(settings):
    api = Api(settings)
    status, answer, _ = api.call("PUT", "/schedules/nightly", NIGHTLY)
    assert status == 201 and answer["created"] is True
    assert (answer["expression"], answer["timezone"], answer["missed"], answer["paused"]) == (
        "cron(0 3 * * *)", "Europe/Berlin", "once", False)
    assert answer["task"] == {"type": "quick", "payload": {"site": "example.org"}}
    assert answer["next_run_at"] is not None and answer["last_run_at"] is None

    status, answer, _ = api.call("PUT", "/schedules/nightly", {**NIGHTLY, "missed": "skip"})
    assert status == 200 and answer["created"] is False and answer["missed"] == "skip"
    assert api.call("GET", "/schedules/nightly")[1]["missed"] == "skip"
    assert [s["name"] for s in api.call("GET", "/schedules")[1]["schedules"]] == ["nightly"]

    status, answer, _ = api.call("POST", "/schedules/nightly/pause")
    assert status == 200 and answer["paused"] is True and answer["changed"] is True and answer["next_run_at"] is None
    assert api.call("POST", "/schedules/nightly/pause")[1]["changed"] is False
    status, answer, _ = api.call("POST", "/schedules/nightly/resume")
    assert status == 200 and answer["paused"] is False and answer["next_run_at"] is not None

    status, answer, _ = api.call("DELETE", "/schedules/nightly")
    assert status == 200 and answer["name"] == "nightly"
    for method, path in (("GET", "/schedules/nightly"), ("DELETE", "/schedules/nightly"),
                         ("POST", "/schedules/nightly/pause"), ("POST", "/schedules/nightly/resume")):
        status, answer, _ = api.call(method, path)
        assert status == 404 and answer["error"] == "schedule_not_found", (method, path, answer)
    assert api.call("GET", "/schedules")[1] == {"schedules": [], "cursor": None, "truncated": False}


@pytest.mark.parametrize(("path", "body", "status", "says"), [
    ("/schedules/nightly", {**NIGHTLY, "expression": "cron(61 * * * *)"}, 400, "not a valid cron expression"),
    ("/schedules/nightly", {**NIGHTLY, "expression": "every night"}, 400, "rate(N minutes|hours|days)"),
    ("/schedules/nightly", {**NIGHTLY, "timezone": "Mars/Olympus"}, 400, "unknown time zone"),
    ("/schedules/nightly", {**NIGHTLY, "timezone": "localtime"}, 400, "unknown time zone"),
    ("/schedules/nightly", {**NIGHTLY, "timezone": "posixrules"}, 400, "unknown time zone"),
    ("/schedules/nightly", {**NIGHTLY, "expression": "rate(\uff15 minutes)"}, 400, "ASCII"),
    ("/schedules/nightly", {**NIGHTLY, "paused": "true"}, 422, "valid boolean"),
    ("/schedules/nightly", {**NIGHTLY, "paused": 1}, 422, "valid boolean"),
    ("/schedules/nightly", {**NIGHTLY, "missed": "burst"}, 422, "missed"),
    ("/schedules/nightly", {**NIGHTLY, "task": {"type": "no-such-type"}}, 422, "no handler is registered"),
    ("/schedules/nightly", {**NIGHTLY, "task": {"type": "quick", "key": "k"}}, 422, "no key or run_at"),
    ("/schedules/nightly", {**NIGHTLY, "task": {"type": "quick", "payload": "x" * 17_000}}, 400, "at most 16 KB"),
    ("/schedules/nightly", {**NIGHTLY, "every": "day"}, 422, "every"),
    ("/schedules/nightly", {"task": {"type": "quick"}}, 422, "expression"),
    ("/schedules/a%20b", NIGHTLY, 400, "schedule names are 1 to 80 characters"),
    ("/schedules/" + "x" * 81, NIGHTLY, 400, "schedule names are 1 to 80 characters"),
])
def test_a_bad_schedule_is_refused_with_a_reason_and_writes_nothing(settings, path, body, status, says):
    api = Api(settings)
    before = api.items()
    got, answer, _ = api.call("PUT", path, body)
    assert got == status, answer
    assert says in answer["message"] + str(answer.get("errors", "")), answer
    assert api.items() == before
    assert schedules.list_all() == ([], False)


def test_dynamodb_failing_is_a_503_with_a_reason(settings, monkeypatch):
    from pynamodb.exceptions import PutError, QueryError

    api = Api(settings)

    def refuse(*args, **kwargs):
        raise PutError("Rate of requests exceeds the allowed throughput")

    monkeypatch.setattr(schedules.ScheduleModel, "save", refuse)
    status, answer, _ = api.call("PUT", "/schedules/nightly", NIGHTLY)
    assert (status, answer["error"]) == (503, "storage_unavailable") and "retry later" in answer["message"]

    def refuse_query(*args, **kwargs):
        raise QueryError("Throughput exceeds the current capacity")

    monkeypatch.setattr(schedules.ScheduleModel.schedule_index, "query", refuse_query)
    status, answer, _ = api.call("GET", "/schedules")
    assert (status, answer["error"]) == (503, "storage_unavailable"), answer
