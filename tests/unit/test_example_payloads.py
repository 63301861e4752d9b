"""The example handlers refuse bad input as a business failure that is not retried, their payload
checks are the ones the API and ``context.spawn`` apply, and the example crawl stays small and
keeps its seed's limits unless asked otherwise."""

from __future__ import annotations

import dataclasses

import pytest
from coworker.engine import examples, handlers
from coworker.engine.handlers import TaskLimits
from coworker.errors import TaskFailed
from coworker.testing import make_context, run_handler

SEED_LIMITS = TaskLimits(concurrency_key="example.com", concurrency_limit=2, rate_key="example.com",
                         rate_limit=5, rate_interval_seconds=2.0)


@pytest.mark.parametrize("payload", [[1, 2], "text", 7])
def test_quick_hashes_any_json_payload(payload) -> None:
    assert len(run_handler("quick", payload)["sha256"]) == 16


@pytest.mark.parametrize(("task_type", "payload", "problem"), [
    ("slow", [1], "the payload must be a JSON object, not list"),
    ("slow", {"seconds": -1}, "payload.seconds must be a number of seconds"),
    ("slow", {"seconds": "abc"}, "payload.seconds must be a number of seconds"),
    ("flaky", "text", "the payload must be a JSON object, not str"),
    ("flaky", {"failure_rate": 2}, "payload.failure_rate must be a number from 0 to 1"),
    ("always-fail", [1], "the payload must be a JSON object"),
    ("crawl", [1], "the payload must be a JSON object"),
    ("crawl", {"fanout": 1000, "max_depth": 50}, "payload.fanout must be a whole number from 0 to 10"),
    ("crawl", {"max_depth": 50}, "payload.max_depth must be a whole number from 0 to 4"),
    ("crawl", {"rate_per_second": 0}, "payload.rate_per_second must be a whole number of pages per second"),
    ("crawl-summary", [1], "the payload must be a batch callback's"),
    ("crawl-summary", {"payload": {"fanout": 1000}}, "payload.fanout must be a whole number"),
])
def test_an_example_refuses_bad_input_as_a_business_failure_not_retried(task_type, payload, problem) -> None:
    with pytest.raises(TaskFailed, match=problem) as refused:
        run_handler(task_type, payload)
    assert refused.value.retryable is False


def test_the_crawls_check_names_the_problem_and_lets_a_good_payload_through() -> None:
    assert handlers.payload_problem("crawl", {"url": "https://example.com/", "fanout": 10, "max_depth": 4}) is None
    assert handlers.payload_problem("crawl", None) is None
    assert "fanout" in (handlers.payload_problem("crawl", {"fanout": 1000, "max_depth": 50}) or "")
    assert handlers.payload_problem("quick", [1]) is None  # quick has no check


def test_a_crawl_seed_spawns_a_small_site_of_its_own_and_nothing_else() -> None:
    """A URL with the defaults: 3 links a page, 2 levels deep (13 pages), no home page or parent."""
    context = make_context("seed")
    result = run_handler("crawl", {"url": "https://example.com/docs"}, context=context)
    assert [spec.payload["url"] for spec in context.follow_ups] == [f"https://example.com/docs/{n}" for n in range(3)]
    assert result["links"] == 3
    last = make_context("leaf")
    run_handler("crawl", {"url": "https://example.com/docs/0/1", "depth": 2}, context=last)
    assert last.follow_ups == []
    assert len(examples.crawl_urls(seed="https://example.com/docs")) == 13


def test_a_crawl_links_back_to_its_seed_and_parent_only_when_asked() -> None:
    context = make_context("page")
    run_handler("crawl", {"url": "/a/0/1", "seed": "/a", "depth": 2, "max_depth": 3,
                                   "link_back": True}, context=context)
    assert [(spec.payload["url"], spec.payload["depth"]) for spec in context.follow_ups] == [
        ("/a/0/1/0", 3), ("/a/0/1/1", 3), ("/a/0/1/2", 3), ("/a", 0), ("/a/0", 1)]
    assert [spec.key for spec in context.follow_ups[3:]] == [examples.crawl_key("/a"), examples.crawl_key("/a/0")]


def test_a_crawls_pages_keep_the_seeds_limits() -> None:
    context = dataclasses.replace(make_context("seed"), limits=SEED_LIMITS)
    run_handler("crawl", {"url": "https://example.com/"}, context=context)
    assert len(context.follow_ups) == 3
    assert {(s.concurrency_key, s.concurrency_limit, s.rate_key, s.rate_limit, s.rate_interval_seconds)
            for s in context.follow_ups} == {("example.com", 2, "example.com", 5, 2.0)}


def test_spawn_keeps_the_parents_limits_only_when_asked_and_a_group_named_in_the_call_wins() -> None:
    context = dataclasses.replace(make_context("parent"), limits=SEED_LIMITS)
    context.spawn("quick")
    context.spawn("quick", inherit_limits=True, rate_key="other.org", rate_limit=9)
    plain, inherited = context.follow_ups
    assert (plain.concurrency_key, plain.rate_key) == (None, None)
    assert (inherited.concurrency_key, inherited.concurrency_limit) == ("example.com", 2)
    assert (inherited.rate_key, inherited.rate_limit, inherited.rate_interval_seconds) == ("other.org", 9, None)
    with pytest.raises(ValueError, match="concurrency_limit needs a concurrency_key"):
        context.spawn("quick", inherit_limits=True, concurrency_limit=3)


def test_spawn_refuses_a_payload_its_type_refuses() -> None:
    context = make_context("parent")
    with pytest.raises(ValueError, match="task type 'crawl': payload.fanout must be a whole number"):
        context.spawn("crawl", {"fanout": 1000, "max_depth": 50})
    assert context.follow_ups == []


def test_a_payload_check_that_raises_has_found_a_bad_payload() -> None:
    @handlers.task_handler("test-fussy-check", validate_payload=lambda payload: payload["must"] and None)
    def fussy(payload, context):
        return "ran"

    assert "KeyError" in (handlers.payload_problem("test-fussy-check", {}) or "")
    with pytest.raises(TaskFailed, match="task type 'test-fussy-check': the payload check raised KeyError"):
        run_handler("test-fussy-check", {})
    assert run_handler("test-fussy-check", {"must": 1}) == "ran"
