"""A batch's failure threshold: it stops exactly once when too many of its tasks are ignored,
its open tasks are cancelled (running ones finish), it takes no new tasks, and a redrive
starts it again."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from coworker.data.models import utcnow
from coworker.engine import batches, control, dispatch, lifecycle, progress
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch
from coworker.errors import BatchFailedError

from tests.support.doubles import Api, RecordingInvoker


def _put_batch(settings, batch_id, specs, tolerance=None) -> None:
    now = utcnow() - timedelta(seconds=30)
    items = [lifecycle.new_task(TaskSpec(key=key, type=type_, batch_id=batch_id, max_attempts=1), settings, now)
             for key, type_ in specs]
    assert all(batches.put_tasks(items, batch_id, now, tolerance))


def _counted(settings, batch_id):
    """The batch once the stream follower (the coordinator's, every tick) has counted what
    happened: it is the follower that checks the threshold."""
    progress.catch_up(settings)
    return batches.get_batch(batch_id)


def test_the_batch_stops_once_more_than_the_tolerated_share_is_ignored(make_settings):
    settings = make_settings()
    fails = [f"f{i}" for i in range(3)]
    others = [f"q{i}" for i in range(7)]
    _put_batch(settings, "b", [(k, "always-fail") for k in fails] + [(k, "quick") for k in others],
               batches.Tolerance(percent=25))
    running = lifecycle.claim("q0", "w", settings)  # already running when the batch stops

    run_batch(fails[:2], "w", settings, time.monotonic() + 30)
    assert _counted(settings, "b").state == "running"  # 2 of 10 is within 25%
    run_batch(fails[2:], "w", settings, time.monotonic() + 30)
    assert batches.get_batch("b").state == "running"  # until the failures are counted

    counted = _counted(settings, "b")
    assert counted.state == "failed" and counted.failed_at is not None
    assert counted.failure_reason == "3 of 10 tasks ignored (30.0%), more than the 25% tolerated"
    assert control.read().stopped_batches == frozenset({"b"})

    # its open tasks are not claimed, and the coordinator cancels them; the running one finishes
    assert lifecycle.claim("q1", "w", settings, stopped_batches=control.read().stopped_batches) is None
    invoker = RecordingInvoker()
    report = dispatch.tick(settings, invoker)
    assert report.cancelled == 6 and invoker.keys == []
    assert {lifecycle.get_task(k).errors[-1].message for k in others[1:]} == {dispatch.STOPPED_BATCH_REASON}
    assert lifecycle.complete(running, settings, result=1) is lifecycle.RecordOutcome.FINISHED
    counted = _counted(settings, "b")
    assert (counted.finished, counted.ignored, counted.open, counted.state) == (1, 9, 0, "failed")

    # and it takes no new task
    with pytest.raises(BatchFailedError, match="stopped at its failure threshold"):
        _put_batch(settings, "b", [("late", "quick")])
    # once every open task has ended the coordinator forgets it (it stays failed on its item)
    dispatch.tick(settings, RecordingInvoker(), measure_backlog=True)
    assert control.read().stopped_batches == frozenset()
    assert batches.get_batch("b").state == "failed"


def test_concurrent_failures_stop_the_batch_exactly_once(make_settings):
    settings = make_settings()
    _put_batch(settings, "b", [(f"t{i}", "quick") for i in range(8)], batches.Tolerance(count=1))
    for i in range(8):  # ignored by cancels, which do not check the threshold themselves
        lifecycle.cancel(f"t{i}", settings)
    assert _counted(settings, "b").state == "done"
    # eight workers whose tasks failed at the same moment all check it: one of them stops it
    with ThreadPoolExecutor(8) as pool:
        stopped = list(pool.map(lambda _: batches.stop_if_failing("b"), range(8)))
    assert sorted(stopped) == [False] * 7 + [True]
    assert batches.get_batch("b").failure_reason == "8 of 8 tasks ignored, more than the 1 tolerated"
    assert batches.stop_if_failing("b") is False


def test_a_batch_stops_at_the_moment_the_stop_is_written_not_when_the_count_began(make_settings):
    settings = make_settings()
    _put_batch(settings, "b", [("f0", "always-fail")], batches.Tolerance(count=0))
    run_batch(["f0"], "w", settings, time.monotonic() + 30)
    pass_began = utcnow() - timedelta(seconds=30)  # a counting pass that began long before
    before_write = utcnow()
    progress.follow(settings, now=pass_began)
    assert batches.get_batch("b").failed_at >= before_write


def test_a_redrive_reopens_a_stopped_batch(make_settings):
    settings = make_settings()
    _put_batch(settings, "b", [("f0", "always-fail"), ("q0", "quick"), ("q1", "quick")],
               batches.Tolerance(count=0))
    run_batch(["f0"], "w", settings, time.monotonic() + 30)
    progress.catch_up(settings)  # stops the batch
    dispatch.tick(settings, RecordingInvoker())  # cancels q0, q1
    api = Api(settings)
    status, answer, _ = api.call("GET", "/batches/b")
    assert status == 200 and answer["state"] == "failed" and answer["tolerated_failure_count"] == 0
    assert api.call("POST", "/tasks", {"batch_id": "b", "tasks": [{"key": "n", "type": "quick"}]})[0] == 409

    status, answer, _ = api.call("POST", "/batches/b/retry")
    assert status == 200 and answer["redriven"] == 3
    progress.catch_up(settings)
    assert api.call("GET", "/batches/b")[1]["state"] == "running"
    assert control.read().stopped_batches == frozenset()
    assert {lifecycle.get_task(k).status for k in ("f0", "q0", "q1")} == {"todo"}
    assert lifecycle.claim("q0", "w", settings, stopped_batches=control.read().stopped_batches) is not None


def test_a_batch_without_a_threshold_never_stops(make_settings):
    settings = make_settings()
    _put_batch(settings, "b", [(f"f{i}", "always-fail") for i in range(3)])
    run_batch([f"f{i}" for i in range(3)], "w", settings, time.monotonic() + 30)
    assert _counted(settings, "b").state == "done"
    assert control.read().stopped_batches == frozenset()


def test_a_cancel_does_not_stop_the_batch_by_itself(make_settings):
    settings = make_settings()
    _put_batch(settings, "b", [(f"t{i}", "quick") for i in range(3)], batches.Tolerance(count=0))
    lifecycle.cancel("t0", settings)
    assert _counted(settings, "b").ignored == 1
    assert batches.get_batch("b").state == "running"


@pytest.mark.parametrize(("extra", "where"), [
    ({"tolerated_failure_percent": 150}, "body.tolerated_failure_percent"),
    ({"tolerated_failure_percent": "NaN"}, "body.tolerated_failure_percent"),
    ({"tolerated_failure_count": -1}, "body.tolerated_failure_count"),
    ({"tolerated_failure_count": 2.5}, "body.tolerated_failure_count"),
])
def test_a_bad_threshold_is_refused_and_stores_nothing(make_settings, extra, where):
    api = Api(make_settings())
    before = api.items()
    status, answer, _ = api.call("POST", "/tasks", {"batch_id": "b", "tasks": [{"type": "quick"}], **extra})
    assert status == 422 and any(e["location"] == where for e in answer["errors"]), answer
    assert api.items() == before


def test_stopped_batches_whose_tasks_are_not_due_yet_leave_the_control_record(make_settings):
    """Many batches that stop while a task of theirs waits far in the future: the coordinator
    cancels those tasks too, and each batch then leaves the control record (which would otherwise
    grow with every stop, towards DynamoDB's 400 KB item limit)."""
    settings = make_settings()
    later = utcnow() + timedelta(days=365)
    for number in range(12):
        batch_id = f"b{number}"
        now = utcnow() - timedelta(seconds=30)
        items = [lifecycle.new_task(TaskSpec(key=f"{batch_id}-f", type="always-fail", batch_id=batch_id,
                                             max_attempts=1), settings, now),
                 lifecycle.new_task(TaskSpec(key=f"{batch_id}-later", type="quick", batch_id=batch_id,
                                             run_at=later), settings, now)]
        assert all(batches.put_tasks(items, batch_id, now, batches.Tolerance(count=0)))
        run_batch([f"{batch_id}-f"], "w", settings, time.monotonic() + 30)
    progress.catch_up(settings)
    assert len(control.read().stopped_batches) == 12

    # When the coordinator measures the backlog (and settles stopped batches) and counts
    report = dispatch.tick(settings, RecordingInvoker(), measure_backlog=True)
    progress.catch_up(settings)
    dispatch.tick(settings, RecordingInvoker(), measure_backlog=True)

    # Then the waiting tasks were cancelled and no stopped batch is left in the record
    assert report.cancelled == 12
    assert {lifecycle.get_task(f"b{n}-later").status for n in range(12)} == {"ignored"}
    assert control.read().stopped_batches == frozenset()
    assert {batches.get_batch(f"b{n}").state for n in range(12)} == {"failed"}


def test_no_more_batches_are_listed_as_stopped_than_the_cap_and_the_rest_stop_once_there_is_room(
        make_settings, monkeypatch):
    settings = make_settings()
    monkeypatch.setattr(control, "MAX_STOPPED_BATCHES", 2)
    later = utcnow() + timedelta(days=1)
    for number in range(3):
        now = utcnow() - timedelta(seconds=30)
        items = [lifecycle.new_task(TaskSpec(key=f"c{number}-f", type="always-fail", batch_id=f"c{number}",
                                             max_attempts=1), settings, now),
                 lifecycle.new_task(TaskSpec(key=f"c{number}-later", type="quick", batch_id=f"c{number}",
                                             run_at=later), settings, now)]
        assert all(batches.put_tasks(items, f"c{number}", now, batches.Tolerance(count=0)))
        run_batch([f"c{number}-f"], "w", settings, time.monotonic() + 30)
    progress.catch_up(settings)

    # The record lists two; the third batch is not stopped yet (its tasks are not cancelled)
    assert control.read().stopped_batches == frozenset({"c0", "c1"})
    assert batches.get_batch("c2").state == "running"
    # once the two have settled, the third stops at the next look
    dispatch.tick(settings, RecordingInvoker(), measure_backlog=True)
    progress.catch_up(settings)
    dispatch.tick(settings, RecordingInvoker(), measure_backlog=True)
    assert control.read().stopped_batches == frozenset()
    assert batches.stop_if_failing("c2") is True
    assert control.read().stopped_batches == frozenset({"c2"})
