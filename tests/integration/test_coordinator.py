"""Coordinator ticks: what is dispatched, in what order, how many, and lost-worker recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import timedelta

import pytest
from coworker import dispatch, lifecycle
from coworker.dispatch import InProcessInvoker
from coworker.lifecycle import TaskSpec
from coworker.model import TaskStatus, utcnow
from coworker.worker import TaskOutcome, run_batch

# Part of the lifecycle contract (expired locks, killed workers): runs on DynamoDB Local and on moto.
pytestmark = pytest.mark.both_backends


class RecordingInvoker:
    """Invoker that only records what it was asked to start (implements dispatch.Invoker)."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def invoke(self, keys: Sequence[str]) -> None:
        self.batches.append(list(keys))

    @property
    def keys(self) -> list[str]:
        return [key for batch in self.batches for key in batch]


def _put_many(settings, count, prefix="t", type_="quick", now=None, **kw):
    base = now or utcnow()
    for i in range(count):
        # Spread put times so "oldest first" has a defined order.
        lifecycle.put_task(TaskSpec(key=f"{prefix}{i:03d}", type=type_, **kw), settings,
                           now=base - timedelta(seconds=count - i))


def test_tick_fills_free_slots_oldest_first_in_batches(make_settings):
    settings = make_settings(max_concurrency=7, batch_size=3)
    _put_many(settings, 20)
    invoker = RecordingInvoker()
    report = dispatch.tick(settings, invoker)
    assert report.dispatched == 7 and report.invocations == 3
    assert [len(b) for b in invoker.batches] == [3, 3, 1]
    assert invoker.keys == [f"t{i:03d}" for i in range(7)]


def test_busy_tasks_reduce_what_is_dispatched(make_settings):
    settings = make_settings(max_concurrency=5, batch_size=10)
    _put_many(settings, 10)
    for key in ("t000", "t001", "t002"):
        assert lifecycle.claim(key, "busy-worker", settings) is not None
    invoker = RecordingInvoker()
    report = dispatch.tick(settings, invoker)
    assert (report.busy, report.free, report.dispatched) == (3, 2, 2)
    assert invoker.keys == ["t003", "t004"]
    for key in ("t003", "t004"):
        lifecycle.claim(key, "w", settings)
    assert dispatch.tick(settings, invoker).dispatched == 0  # full


def test_not_yet_due_tasks_are_not_dispatched(settings):
    lifecycle.put_task(TaskSpec(key="later", type="quick", run_at=utcnow() + timedelta(hours=1)), settings)
    lifecycle.put_task(TaskSpec(key="now", type="quick"), settings)
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    assert invoker.keys == ["now"]


def test_lost_work_and_due_retries_go_before_new_tasks(make_settings):
    settings = make_settings(max_concurrency=3)
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    _put_many(settings, 5, prefix="new", now=past)
    lifecycle.put_task(TaskSpec(key="lost", type="quick"), settings, now=past)
    lifecycle.claim("lost", "dead-worker", settings, now=past)
    lifecycle.put_task(TaskSpec(key="retry", type="always-fail"), settings, now=past)
    run_batch(["retry"], "w", settings, time.monotonic() + 30)  # backoff 0 in tests: due now
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    assert invoker.keys == ["lost", "retry", "new000"]


def test_dispatching_the_same_task_twice_is_harmless(settings):
    _put_many(settings, 1)
    first, second = dispatch.tick(settings, RecordingInvoker()), None
    assert first.dispatched == 1
    reports = run_batch(["t000", "t000"], "a", settings, time.monotonic() + 30)  # deduplicated
    reports += run_batch(["t000"], "b", settings, time.monotonic() + 30)
    assert [r.outcome for r in reports] == [TaskOutcome.FINISHED, TaskOutcome.NOT_CLAIMED]
    assert second is None


def test_expired_lock_is_handed_out_again_and_the_lost_attempt_counted(settings):
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    lifecycle.put_task(TaskSpec(key="k", type="quick"), settings, now=past)
    lifecycle.claim("k", "dead-worker", settings, now=past)  # never records: the worker "died"
    invoker = InProcessInvoker(settings)
    report = dispatch.tick(settings, invoker)
    invoker.wait()
    task = lifecycle.get_task("k")
    assert report.dispatched == 1
    assert (task.status, task.attempts) == ("finished", 2)
    assert [(int(e.attempt), e.kind) for e in task.errors] == [(1, "worker_lost")]


def test_lost_on_the_last_attempt_becomes_ignored_with_worker_lost(settings):
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    lifecycle.put_task(TaskSpec(key="k", type="quick", max_attempts=1), settings, now=past)
    lifecycle.claim("k", "dead-worker", settings, now=past)
    invoker = RecordingInvoker()
    report = dispatch.tick(settings, invoker)
    task = lifecycle.get_task("k")
    assert (report.reaped, report.dispatched, invoker.keys) == (1, 0, [])
    assert task.status == TaskStatus.IGNORED.value and task.lock_owner is None
    assert task.errors[-1].kind == "worker_lost"


def test_every_task_reaches_a_terminal_state(make_settings):
    settings = make_settings(max_concurrency=8, batch_size=3)
    for i in range(12):
        lifecycle.put_task(TaskSpec(key=f"q{i}", type="quick"), settings)
        lifecycle.put_task(TaskSpec(key=f"f{i}", type="flaky", payload={"fail_attempts": 1}), settings)
        lifecycle.put_task(TaskSpec(key=f"x{i}", type="always-fail"), settings)
    invoker = InProcessInvoker(settings)
    for _ in range(40):
        report = dispatch.tick(settings, invoker)
        invoker.wait()
        if report.dispatched == 0 and report.busy == 0:
            break
    statuses = {key: lifecycle.get_task(key) for p in "qfx" for key in (f"{p}{i}" for i in range(12))}
    assert all(statuses[f"q{i}"].status == "finished" for i in range(12))
    assert all(statuses[f"f{i}"].status == "finished" and statuses[f"f{i}"].attempts == 2 for i in range(12))
    assert all(statuses[f"x{i}"].status == "ignored" and statuses[f"x{i}"].attempts == 3 for i in range(12))
    invoker.shutdown()


WORKER_SCRIPT = """
import sys, time
from coworker.bootstrap import configure
from coworker.config import Settings
from coworker.worker import run_batch

settings = configure(Settings.from_env())
print("started", flush=True)
run_batch([sys.argv[1]], "doomed-worker", settings, time.monotonic() + settings.worker_timeout_seconds)
"""


@pytest.mark.slow
def test_killed_worker_process_task_is_completed_by_another_after_lock_expiry(make_settings, tmp_path):
    settings = make_settings(worker_timeout_seconds=3, lock_seconds=5, timeout_margin_seconds=1)
    lifecycle.put_task(TaskSpec(key="victim", type="slow", payload={"seconds": 1.5}), settings)
    env = {**os.environ, **settings.as_environment(),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, "victim"], env=env,
                             stdout=subprocess.PIPE, text=True)
    for _ in range(200):
        if lifecycle.get_task("victim").status == "processing":
            break
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    assert lifecycle.get_task("victim").lock_owner == "doomed-worker"

    invoker = RecordingInvoker()
    assert dispatch.tick(settings, invoker).dispatched == 0  # lock still live: not handed out
    time.sleep(settings.effective_lock_seconds + 0.5)
    dispatch.tick(settings, invoker)
    assert invoker.keys == ["victim"]
    reports = run_batch(invoker.keys, "rescuer", settings, time.monotonic() + 3)
    task = lifecycle.get_task("victim")
    assert reports[0].outcome is TaskOutcome.FINISHED
    assert (task.status, task.attempts) == ("finished", 2)
    assert task.errors[0].kind == "worker_lost"


def test_several_ticks_per_invocation_stop_before_the_time_runs_out(make_settings):
    settings = make_settings(ticks_per_invocation=4, tick_seconds=10)
    invoker, sleeps = RecordingInvoker(), []
    remaining = iter([55.0, 45.0, 12.0])  # seconds left after each tick
    reports = dispatch.run_ticks(settings, invoker, lambda: next(remaining), sleep=sleeps.append)
    assert len(reports) == 3 and sleeps == [10, 10]  # third tick: 12 s left < 10 s + 5 s slack


def test_busy_count_is_one_bounded_read_however_many_tasks_run(make_settings):
    from coworker import queries

    settings = make_settings(max_concurrency=50)
    _put_many(settings, 30)
    for i in range(30):
        lifecycle.claim(f"t{i:03d}", "w", settings)
    assert queries.count_running(utcnow(), limit=100) == 30
    assert queries.count_running(utcnow(), limit=7) == 7


def test_priority_puts_a_task_ahead_of_older_backlog(settings):
    _put_many(settings, 5)  # put 1-5 seconds ago
    lifecycle.put_task(TaskSpec(key="urgent", type="quick", priority=3600), settings)
    lifecycle.put_task(TaskSpec(key="meh", type="quick", priority=-3600), settings)
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    assert invoker.keys == ["urgent", "t000", "t001", "t002", "t003", "t004"]  # "meh" waits an hour
