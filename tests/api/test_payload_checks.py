"""The API refuses a task whose payload its type's check refuses (``validate_payload``): 422 naming
the entry, the task type and the problem, and nothing stored; a callback's payload is its own."""

from __future__ import annotations

import pytest

from tests.support.doubles import Api


@pytest.fixture
def api(settings) -> Api:
    return Api(settings)


def test_a_crawl_asking_for_too_many_pages_is_refused_at_submit(api):
    before = api.items()
    status, answer, _ = api.call("POST", "/tasks", {"key": "huge", "type": "crawl",
                                                    "payload": {"fanout": 1000, "max_depth": 50}})
    assert status == 422 and answer["errors"][0]["location"] == "body.payload"
    assert "task type 'crawl': payload.fanout must be a whole number from 0 to 10" in answer["message"]
    assert api.items() == before


def test_a_batch_with_one_bad_payload_is_refused_whole_naming_the_entry(api):
    before = api.items()
    batch = {"tasks": [{"type": "crawl", "payload": {"url": "https://example.com/"}},
                       {"type": "slow", "payload": [1, 2]}]}
    status, answer, _ = api.call("POST", "/tasks", batch)
    assert status == 422
    assert [(e["location"], e["entry"]) for e in answer["errors"]] == [("body.tasks[1].payload", 1)]
    assert "task type 'slow': the payload must be a JSON object, not list" in answer["message"]
    assert api.items() == before
    status, _, _ = api.call("POST", "/tasks", {"key": "fine", "type": "crawl", "payload": {"fanout": 2}})
    assert status == 201


def test_a_callbacks_payload_is_not_checked_as_its_handler_gets_it_wrapped(api):
    body = {"batch_id": "b", "tasks": [{"key": "q", "type": "quick"}],
            "callbacks": {"complete": {"type": "slow", "payload": [1]}}}
    status, _, _ = api.call("POST", "/tasks", body)
    assert status == 201
