"""Completion events: what a stream record makes of a task's move to ignored, and how they are
sent to EventBridge (entries it refuses are sent again; a refusal that lasts is an error)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber
from coworker.config import Settings
from coworker.engine import events
from coworker.errors import StorageError


def _record(old_status, new_status, sequence="100", errors=()):
    def image(status):
        if status is None:
            return None
        return {"key": {"S": "k1"}, "type": {"S": "fetch"}, "status": {"S": status}, "attempts": {"N": "3"},
                "max_attempts": {"N": "3"}, "batch_id": {"S": "b"}, "updated_at": {"S": "2026-11-27T00:00:00Z"},
                "errors": {"L": [{"M": {"kind": {"S": kind}, "message": {"S": message}}} for kind, message in errors]}}
    body = {"SequenceNumber": sequence, "NewImage": image(new_status)}
    if old_status is not None:
        body["OldImage"] = image(old_status)
    return {"eventName": "MODIFY", "dynamodb": body}


def test_a_move_to_ignored_is_an_event_with_its_last_error_and_a_stable_id():
    event = events.task_ignored(_record("processing", "ignored", errors=[("system", "first"), ("business", "no")]),
                                "tasks")
    assert event is not None and event.detail_type == events.TASK_IGNORED
    assert event.detail == {"event_id": "task-ignored:k1:100", "table": "tasks", "key": "k1", "type": "fetch",
                            "batch_id": "b", "attempts": 3, "max_attempts": 3, "ignored_at": "2026-11-27T00:00:00Z",
                            "error": {"kind": "business", "message": "no"}}
    assert events.task_ignored(_record("processing", "ignored", errors=[("x", "y")]), "tasks").detail[
        "event_id"] == event.detail["event_id"]  # the same record read again: the same id


@pytest.mark.parametrize(("old", "new"), [("ignored", "ignored"), ("processing", "failed"), (None, "todo"),
                                          ("ignored", "todo"), ("processing", "finished")])
def test_other_writes_are_no_event(old, new):
    assert events.task_ignored(_record(old, new), "tasks") is None


def _publisher(monkeypatch):
    settings = Settings(events="eventbridge", event_bus="orders", region="us-east-1")
    publisher = events.Publisher(settings)
    client = boto3.client("events", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    publisher._client = client
    monkeypatch.setattr(events.time, "sleep", lambda seconds: None)
    return publisher, Stubber(client)


def _event(n):
    return events.Event(events.BATCH_COMPLETED, {"event_id": f"e{n}", "batch_id": f"b{n}"})


def test_eventbridge_gets_ten_entries_a_call_and_refused_ones_again(monkeypatch):
    publisher, stub = _publisher(monkeypatch)
    sent = [_event(n) for n in range(12)]

    def entries(batch):
        return [{"Source": "coworker", "DetailType": "Batch Completed", "EventBusName": "orders",
                 "Detail": json.dumps(event.detail, separators=(",", ":"))} for event in batch]

    refused = [{"ErrorCode": "InternalFailure", "ErrorMessage": "try again"}]
    stub.add_response("put_events", {"FailedEntryCount": 1, "Entries": [{"EventId": "1"}] * 9 + refused},
                      {"Entries": entries(sent[:10])})
    stub.add_response("put_events", {"FailedEntryCount": 0, "Entries": [{"EventId": "2"}]},
                      {"Entries": entries(sent[9:10])})
    stub.add_response("put_events", {"FailedEntryCount": 0, "Entries": [{"EventId": "3"}] * 2},
                      {"Entries": entries(sent[10:])})
    with stub:
        publisher.publish(sent)
    stub.assert_no_pending_responses()


def test_a_refusal_that_lasts_is_an_error_naming_it(monkeypatch):
    publisher, stub = _publisher(monkeypatch)
    for _ in range(events.SEND_ATTEMPTS):
        stub.add_response("put_events", {"FailedEntryCount": 1, "Entries": [
            {"ErrorCode": "AccessDeniedException", "ErrorMessage": "not allowed"}]})
    with stub, pytest.raises(StorageError, match="EventBridge did not take 1 event.*not allowed"):
        publisher.publish([_event(1)])


def test_off_publishes_nothing():
    publisher = events.Publisher(Settings())
    assert not publisher.enabled
    publisher.publish([_event(1)])  # no client is even made
    assert publisher._client is None
