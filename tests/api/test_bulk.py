"""Bulk actions by filter (``POST /bulk``): what matches, what changes, dry runs, paging,
re-runs after an interruption, and bad requests that change nothing."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from coworker.api import bulk
from coworker.data import writes
from coworker.data.models import TaskStatus, utcnow
from coworker.engine import lifecycle, submit
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch

from tests.support.doubles import Api
from tests.support.waits import wait_until


@pytest.fixture
def api(settings) -> Api:
    return Api(settings)


def _ignored(settings, keys, type_="always-fail", batch_id=None, created=None) -> None:
    """Tasks that failed their only attempt: ignored."""
    for key in keys:
        submit.put_task(TaskSpec(key=key, type=type_, max_attempts=1, batch_id=batch_id), settings,
                           now=created)
    run_batch(list(keys), "w", settings, time.monotonic() + 30)
    assert {lifecycle.get_task(k).status for k in keys} == {TaskStatus.IGNORED.value}


def _statuses(keys) -> dict[str, str]:
    return {key: lifecycle.get_task(key).status for key in keys}


def _run_all(api: Api, body: dict) -> tuple[list[dict], int]:
    """Call the bulk route page after page to the end: (answers, total changed)."""
    answers, cursor = [], None
    while True:
        status, answer, response = api.call("POST", "/bulk", {**body, **({"cursor": cursor} if cursor else {})})
        assert status == 200, response["body"]
        answers.append(answer)
        cursor = answer["cursor"]
        if cursor is None:
            return answers, sum(a["changed"] for a in answers)


def test_bulk_retry_by_type_redrives_only_that_type(api, settings):
    _ignored(settings, [f"a{i}" for i in range(5)], type_="always-fail")
    _ignored(settings, ["other"], type_="quick-fail")
    submit.put_task(TaskSpec(key="todo-one", type="always-fail"), settings)  # not ignored

    answers, changed = _run_all(api, {"action": "retry", "status": "ignored", "type": "always-fail", "limit": 2})

    assert changed == 5 and sum(a["matched"] for a in answers) == 5
    assert len(answers) >= 3  # two at a time
    assert set(_statuses([f"a{i}" for i in range(5)]).values()) == {"todo"}
    task = lifecycle.get_task("a0")
    assert task.attempts == 0 and task.errors  # attempts reset, history kept, as a single retry
    assert _statuses(["other", "todo-one"]) == {"other": "ignored", "todo-one": "todo"}


def test_dry_run_counts_what_would_change_and_changes_nothing(api, settings):
    _ignored(settings, [f"k{i}" for i in range(4)])
    before = api.items()

    answers, changed = _run_all(api, {"action": "retry", "status": "ignored", "dry_run": True})

    assert changed == 0 and sum(a["matched"] for a in answers) == 4
    assert all(a["dry_run"] for a in answers)
    assert api.items() == before


def test_bulk_cancel_by_batch_and_creation_window(api, settings):
    now = utcnow()
    old, new = now - timedelta(hours=2), now - timedelta(minutes=5)
    for i in range(3):
        submit.put_task(TaskSpec(key=f"old{i}", type="quick", batch_id="b1"), settings, now=old)
        submit.put_task(TaskSpec(key=f"new{i}", type="quick", batch_id="b1"), settings, now=new)
        submit.put_task(TaskSpec(key=f"elsewhere{i}", type="quick", batch_id="b2"), settings, now=old)

    body = {"action": "cancel", "status": "todo", "batch_id": "b1",
            "created_before": (now - timedelta(hours=1)).isoformat()}
    dry, would = _run_all(api, {**body, "dry_run": True})
    assert sum(a["matched"] for a in dry) == 3 and would == 0
    answers, changed = _run_all(api, body)

    assert changed == 3
    assert set(_statuses([f"old{i}" for i in range(3)]).values()) == {"ignored"}
    assert set(_statuses([f"new{i}" for i in range(3)] + [f"elsewhere{i}" for i in range(3)]).values()) == {"todo"}
    assert lifecycle.get_task("old0").errors[-1].kind == "cancelled"
    # the batch counts them as ignored, as a single cancel would
    assert api.counted_batch("b1")[1]["ignored"] == 3

    after = (now - timedelta(hours=1)).isoformat()
    _, changed = _run_all(api, {"action": "cancel", "status": "todo", "created_after": after})
    assert changed == 3 and set(_statuses([f"new{i}" for i in range(3)]).values()) == {"ignored"}


def test_a_bulk_action_interrupted_and_run_again_changes_each_task_once(api, settings):
    keys = [f"t{i:02d}" for i in range(12)]
    _ignored(settings, keys)
    # the first page is done, then the caller is interrupted and starts again without the cursor
    status, first, _ = api.call("POST", "/bulk", {"action": "retry", "status": "ignored", "limit": 5})
    assert status == 200 and first["changed"] == 5 and first["cursor"]
    _, again = _run_all(api, {"action": "retry", "status": "ignored", "limit": 5})
    # and resuming from the old cursor afterwards finds nothing left to change
    _, resumed = _run_all(api, {"action": "retry", "status": "ignored", "limit": 5, "cursor": first["cursor"]})
    assert resumed == 0
    assert first["changed"] + again == 12
    assert set(_statuses(keys).values()) == {"todo"}
    assert all(lifecycle.get_task(key).generation == 1 for key in keys)  # each redriven exactly once


def test_skipped_counts_tasks_that_changed_state_before_the_action(settings):
    _ignored(settings, ["gone", "stays"])
    filter_ = bulk.TaskFilter(status="ignored")
    tasks = [lifecycle.get_task("gone"), lifecycle.get_task("stays")]
    assert lifecycle.retry("gone", settings) is not None  # someone else redrove it after the read
    outcome = bulk.apply(bulk.BulkAction.RETRY, tasks, filter_, settings)
    # "gone" is todo now: retry refuses it (only failed or ignored tasks can be retried)
    assert (outcome.matched, outcome.changed, outcome.skipped) == (2, 1, 1)


@pytest.mark.parametrize(("body", "where", "words"), [
    ({"action": "retry", "status": "todo"}, "body", "retry applies to failed or ignored tasks, not todo"),
    ({"action": "cancel", "status": "ignored"}, "body",
     "cancel applies to todo, failed or processing tasks, not ignored"),
    ({"action": "delete", "status": "todo"}, "body.action", "retry"),
    ({"action": "retry", "status": "finished"}, "body.status", "todo"),
    ({"action": "retry", "status": "failed", "created_after": "2026-01-02T00:00:00Z",
      "created_before": "2026-01-01T00:00:00Z"}, "body", "created_after must be earlier than created_before"),
    ({"action": "retry", "status": "failed", "created_after": "yesterday"}, "body.created_after", "datetime"),
    ({"action": "retry", "status": "failed", "created_after": 12}, "body.created_after", "ISO-8601"),
    ({"action": "retry", "status": "failed", "limit": 500}, "body", "limit is at most 200 when acting"),
    ({"action": "retry", "status": "failed", "limit": 0}, "body.limit", "greater than or equal to 1"),
    ({"action": "retry", "status": "failed", "type": "a\nb"}, "body.type", "control characters"),
    ({"action": "retry", "status": "failed", "batch_id": "no spaces"}, "body.batch_id", "pattern"),
    ({"action": "retry", "status": "failed", "colour": "red"}, "body.colour", "unknown field"),
    ({"action": "retry", "status": "failed", "dry_run": "true"}, "body.dry_run", "valid boolean"),
    ({"action": "retry", "status": "failed", "dry_run": 1}, "body.dry_run", "valid boolean"),
    ({"action": "retry"}, "body.status", "required field is missing"),
])
def test_bad_bulk_requests_are_refused_and_change_nothing(api, settings, body, where, words):
    submit.put_task(TaskSpec(key="x", type="quick"), settings)
    before = api.items()
    status, answer, _ = api.call("POST", "/bulk", body)
    assert status == 422, answer
    assert any(where == e["location"] and words in e["message"] for e in answer["errors"]), answer
    assert api.items() == before


def test_a_cursor_of_another_filter_is_refused(api, settings):
    _ignored(settings, [f"c{i}" for i in range(3)])
    status, first, _ = api.call("POST", "/bulk", {"action": "retry", "status": "ignored", "limit": 1,
                                                        "dry_run": True})
    assert first["cursor"]
    status, answer, _ = api.call("POST", "/bulk", {"action": "retry", "status": "ignored", "type": "x",
                                                         "cursor": first["cursor"]})
    assert status == 400 and "cursor" in answer["message"]


@pytest.mark.parametrize("route", ["bulk cancel", "bulk retry", "batch retry"])
def test_with_slow_writes_a_page_answers_in_time_and_its_cursor_reads_it_again(settings, api, monkeypatch, route):
    """Writes that hang (a throttled table): the request still answers, by its own deadline (API
    Gateway would cut it off at 29 s with no answer), counting the tasks it did not reach; its
    cursor reads the same page again, which finishes the rest, none changed twice."""
    keys = [f"slow-bulk-{n:02d}" for n in range(12)]
    action = route.split()[1]
    if action == "retry":
        _ignored(settings, keys, batch_id="slow-bulk")
    else:
        for key in keys:
            submit.put_task(TaskSpec(key=key, type="quick", run_at=utcnow() + timedelta(hours=1)), settings)
    # A start limit a loaded machine meets (every write starts in it), a short wait past it
    monkeypatch.setattr(writes, "REQUEST_START_SECONDS", 5.0)
    monkeypatch.setattr(writes, "REQUEST_ANSWER_SECONDS", 6.0)
    hanging, started, released = set(keys[2::5]), set(), threading.Event()
    real = getattr(lifecycle, action)

    def slow(key, *args, **kwargs):
        if key in hanging:
            started.add(key)
            released.wait(60)  # a guard: released once the request has answered
        return real(key, *args, **kwargs)

    def call(cursor=None):
        if route == "batch retry":
            query = "status=ignored&limit=50" + (f"&cursor={cursor}" if cursor else "")
            code, answer, _ = api.call("POST", f"/batches/slow-bulk/retry?{query}")
            return code, {**answer, "changed": answer.get("redriven"), "matched": len(keys)}
        body = {"action": action, "status": "ignored" if action == "retry" else "todo", "limit": 50}
        return api.call("POST", "/bulk", {**body, **({"cursor": cursor} if cursor else {})})[:2]

    monkeypatch.setattr(lifecycle, action, slow)
    try:
        code, first = call()
        assert not released.is_set()
        assert code == 200 and first["unreached"] >= len(hanging), first
        assert first["changed"] + first["unreached"] + first["skipped"] == first["matched"] == len(keys)
        assert first["cursor"] is not None
        under_way = set(started)
        assert under_way  # the case this test is about: writes still under way when it answered
    finally:
        released.set()
    target = "todo" if action == "retry" else "ignored"
    wait_until(lambda: set(_statuses(under_way).values()) == {target}, "the hung writes landed")
    monkeypatch.setattr(lifecycle, action, real)
    code, again = call(first["cursor"])
    assert code == 200 and again["unreached"] == 0
    assert first["changed"] + again["changed"] == len(keys) - len(under_way)  # those landed on their own
    assert set(_statuses(keys).values()) == {target}
