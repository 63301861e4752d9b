"""Pausing a task type: never claimed or dispatched while paused, parked out of the queue so the
other types go on, running tasks finish, and everything comes back on resume."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from coworker.data import connection
from coworker.data.models import TaskStatus, utcnow
from coworker.engine import control, dispatch, lifecycle, submit
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch, run_invocation

from tests.support.doubles import RecordingInvoker, reserved_request

pytestmark = pytest.mark.both_backends


def _put(settings, keys, type_, ago: float) -> None:
    """Tasks due for a while, the first key the oldest."""
    base = utcnow() - timedelta(seconds=ago)
    for i, key in enumerate(keys):
        submit.put_task(TaskSpec(key=key, type=type_), settings, now=base + timedelta(milliseconds=i))


def _entry(key: str) -> tuple[str, str]:
    task = lifecycle.get_task(key)
    return task.status, task.status_shard


def test_a_paused_type_is_never_claimed_even_by_a_worker_handed_its_key(make_settings):
    settings = make_settings()
    _put(settings, ["s1"], "slow", ago=10)
    assert control.pause("slow")
    # A worker whose view is up to date refuses it at the claim ...
    assert lifecycle.claim("s1", "w", settings, paused=control.read().paused) is None
    # ... and once the coordinator has parked it, no claim can take it, whatever its view
    assert dispatch.tick(settings, RecordingInvoker()).parked == 1
    assert _entry("s1") == ("todo", control.held_value("slow", "s1"))
    assert lifecycle.claim("s1", "stale-worker", settings) is None
    reports = run_batch(["s1"], "w2", settings, time.monotonic() + 30)
    assert [r.outcome for r in reports] == [TaskOutcome.NOT_CLAIMED]


def test_a_paused_backlog_at_the_head_does_not_hold_back_other_types(make_settings):
    settings = make_settings(max_concurrency=3, batch_size=3)
    paused = [f"p{i:02d}" for i in range(30)]
    _put(settings, paused, "slow", ago=60)  # older than everything else
    _put(settings, ["q0", "q1", "q2"], "quick", ago=30)
    control.pause("slow")
    invoker = RecordingInvoker()

    report = dispatch.tick(settings, invoker)

    # the quick tasks start at once; the whole paused block was parked in the same tick
    assert sorted(invoker.keys) == ["q0", "q1", "q2"]
    assert report.parked == 30
    assert {_entry(k)[0] for k in paused} == {"todo"}  # still todo, just out of the queue
    assert {_entry(k)[1].startswith("held#slow#") for k in paused} == {True}


def test_running_tasks_of_a_paused_type_finish_and_retries_wait(make_settings):
    settings = make_settings()
    _put(settings, ["run", "fail"], "quick", ago=10)
    running = lifecycle.claim("run", "w", settings)
    failing = lifecycle.claim("fail", "w", settings)
    control.pause("quick")
    assert lifecycle.complete(running, settings, result={"ok": 1}) is lifecycle.RecordOutcome.FINISHED
    assert lifecycle.get_task("run").status == "finished"
    error = lifecycle.error_record(1, lifecycle.ErrorKind.BUSINESS, "boom", utcnow())
    lifecycle.fail(failing, settings, error, retryable=True)
    assert lifecycle.get_task("fail").status == "failed"  # due again at once (no backoff in tests)
    invoker = RecordingInvoker()
    assert dispatch.tick(settings, invoker).parked == 1 and invoker.keys == []
    assert _entry("fail") == ("failed", control.held_value("quick", "fail"))


def test_resume_puts_held_tasks_back_in_their_place_and_they_run(make_settings):
    settings = make_settings(max_concurrency=4, batch_size=4, dispatch_on_submit=False)
    _put(settings, ["a", "b", "c"], "quick", ago=60)
    control.pause("quick")
    dispatch.tick(settings, RecordingInvoker())
    _put(settings, ["later"], "quick", ago=5)  # put while paused (it is parked on sight too)
    assert dispatch.tick(settings, RecordingInvoker()).parked == 1
    assert control.resume("quick") and not control.resume("quick")

    report = dispatch.tick(settings, RecordingInvoker())
    assert report.released == 4
    assert [_entry(k) for k in "abc"] == [("todo", lifecycle.TaskModel.shard_value_of(k, "todo")) for k in "abc"]
    invoker = dispatch.InProcessInvoker(settings)
    dispatch.tick(settings, invoker)
    invoker.wait()
    invoker.shutdown()
    assert {lifecycle.get_task(k).status for k in ["a", "b", "c", "later"]} == {"finished"}
    # Nothing is held any more: the type is forgotten by the next tick
    dispatch.tick(settings, RecordingInvoker())
    assert control.read().held_types == frozenset()


def test_pausing_again_keeps_the_type_held_and_counts_what_is_parked(make_settings):
    settings = make_settings()
    _put(settings, [f"k{i}" for i in range(5)], "slow", ago=20)
    assert control.pause("slow") and not control.pause("slow")
    dispatch.tick(settings, RecordingInvoker())
    assert control.count_held("slow", 100) == (5, False)
    assert control.read().paused == frozenset({"slow"})


def test_self_feeding_workers_skip_a_paused_type(make_settings):
    settings = make_settings(max_concurrency=2, batch_size=2, control_cache_seconds=0)
    _put(settings, ["p1", "p2"], "slow", ago=20)
    _put(settings, ["q1", "q2", "q3"], "quick", ago=10)
    control.pause("slow")
    # A worker started for q1 feeds itself: it takes the other quick tasks, not the paused ones
    reports = run_invocation(reserved_request(settings, ["q1"]), "feeder", settings, time.monotonic() + 60)
    ran = sorted(r.key for r in reports if r.outcome is TaskOutcome.FINISHED)
    assert ran == ["q1", "q2", "q3"]
    assert not [r for r in reports if r.key.startswith("p")]  # not even tried: skipped when feeding
    assert {lifecycle.get_task(k).status for k in ("p1", "p2")} == {TaskStatus.TODO.value}


def test_held_tasks_stay_held_when_the_index_is_resharded(make_settings):
    from coworker_local import migration

    settings = make_settings(status_shards=8)
    keys = [f"h{i:02d}" for i in range(12)]
    _put(settings, keys, "slow", ago=20)
    control.pause("slow")
    assert dispatch.tick(settings, RecordingInvoker()).parked == 12
    connection.bind(settings.model_copy(update={"status_shards": 2}))
    try:
        assert migration.reshard().moved > 0
        assert control.count_held("slow", 100) == (12, False)  # every one found in 2 held shards
        assert {_entry(k)[0] for k in keys} == {"todo"}
    finally:
        connection.bind(settings)
