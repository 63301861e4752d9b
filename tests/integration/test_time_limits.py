"""A task's time is known: a worker claims and starts only what it can finish before its
deadline, and a task's own limit is enforced (recorded as a timeout, retried). Contract tests:
they run on DynamoDB Local and on moto.

Issue 47's repro, at small scale: one slot of one thread, tasks of a second each, a worker
whose handlers' deadline falls in the middle of one. Before time limits, the worker started the
task that straddled its deadline and its attempt ended ``failed``, kind ``timeout``.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from coworker.data.models import ErrorKind, TaskStatus, utcnow
from coworker.engine import budget, durations, lifecycle, submit
from coworker.engine.handlers import TaskContext, declared_timeout, task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import WorkerRequest, process_task, run_invocation

from tests.support.doubles import reserved_request

pytestmark = pytest.mark.both_backends

TASK_SECONDS = 1.0
_overrun_stopped = threading.Event()


@task_handler("test-one-second", timeout_seconds=1.5)
def _one_second(payload, context: TaskContext) -> dict:
    time.sleep(TASK_SECONDS)
    return {"slept": TASK_SECONDS}


@task_handler("test-one-second-undeclared")
def _one_second_undeclared(payload, context: TaskContext) -> dict:
    time.sleep(TASK_SECONDS)
    return {"slept": TASK_SECONDS}


@task_handler("test-overrun")
def _overrun(payload, context: TaskContext) -> str:
    """Runs until told its claim is gone (or 20 s pass)."""
    end = time.monotonic() + 20
    while time.monotonic() < end:
        if context.claim_lost():
            _overrun_stopped.set()
            return "stopped"
        time.sleep(0.02)
    return "never told"


def _put(settings, keys, type_, **kw):
    past = utcnow() - timedelta(seconds=10)
    for key in keys:
        submit.put_task(TaskSpec(key=key, type=type_, **kw), settings, now=past)


def _one_thread_worker(make_settings):
    # A 6-s worker keeping 0.5 s back: handlers must return 5.5 s after it starts.
    return make_settings(max_concurrency=1, batch_size=1, worker_timeout_seconds=6, timeout_margin_seconds=0.5)


def _no_attempt_timed_out(keys):
    tasks = [lifecycle.get_task(key) for key in keys]
    timed_out = [t.key for t in tasks if any(e.kind == ErrorKind.TIMEOUT.value for e in (t.errors or []))]
    assert timed_out == [], f"attempts killed at the worker's deadline: {timed_out}"
    for task in tasks:  # every task either ran to the end or was never started
        assert (task.status, int(task.attempts)) in ((TaskStatus.FINISHED.value, 1), (TaskStatus.TODO.value, 0))
    return tasks


@pytest.mark.parametrize("fed", [True, False], ids=["self-fed", "hinted"])
def test_a_worker_never_starts_a_declared_task_it_cannot_finish(make_settings, fed):
    settings = _one_thread_worker(make_settings)
    keys = [f"t{i}" for i in range(8)]
    _put(settings, keys, "test-one-second")
    request = reserved_request(settings, () if fed else keys)
    reports = run_invocation(request, "w", settings, time.monotonic() + settings.worker_timeout_seconds)
    tasks = _no_attempt_timed_out(keys)
    finished = [t for t in tasks if t.status == TaskStatus.FINISHED.value]
    # Starts need 1.5 s before the handlers' deadline at 5.5 s: at most four (a fifth 1-s run would
    # have fitted, and been killed, before limits). How many is up to the machine's load.
    assert len(finished) <= 4
    # What was not started is still due, at the head of the queue, for a fresh invocation.
    left = [t for t in tasks if t.status == TaskStatus.TODO.value]
    assert left and all(t.due_at <= utcnow() and t.lock_owner is None for t in left)
    assert not any(r.outcome in (TaskOutcome.FAILED, TaskOutcome.IGNORED) for r in reports)


def test_a_task_with_its_own_limit_is_never_started_short_of_it(make_settings):
    settings = _one_thread_worker(make_settings)
    keys = [f"own{i}" for i in range(8)]
    _put(settings, keys, "test-one-second-undeclared", timeout_seconds=1.5)
    run_invocation(reserved_request(settings), "w", settings, time.monotonic() + settings.worker_timeout_seconds)
    tasks = _no_attempt_timed_out(keys)
    assert sum(t.status == TaskStatus.FINISHED.value for t in tasks) <= 4
    assert all(float(t.timeout_seconds) == 1.5 for t in tasks)


def test_a_claim_refuses_a_task_whose_own_limit_is_longer_than_the_time_left(settings):
    _put(settings, ["long"], "quick", timeout_seconds=120)
    before = lifecycle.get_task("long")
    assert lifecycle.claim("long", "w", settings, time_left=60) is None
    untouched = lifecycle.get_task("long")
    assert (untouched.status, untouched.attempts, untouched.due_at) == (before.status, 0, before.due_at)
    assert lifecycle.claim("long", "w", settings, time_left=121) is not None


def test_a_hinted_task_whose_type_is_too_long_for_the_time_left_is_not_claimed(make_settings):
    settings = make_settings(worker_timeout_seconds=30, timeout_margin_seconds=1)
    _put(settings, ["head"], "test-one-second")  # declares 1.5 s
    before = lifecycle.get_task("head")
    report = process_task("head", "w", settings, time.monotonic() + 2.0)  # 1 s left for handlers
    assert report.outcome is TaskOutcome.NOT_CLAIMED
    after = lifecycle.get_task("head")
    assert (after.status, int(after.attempts), after.due_at, after.updated_at) == (
        before.status, 0, before.due_at, before.updated_at)  # the claim's condition refused it: no write
    assert process_task("head", "w2", settings, time.monotonic() + 10.0).outcome is TaskOutcome.FINISHED


def test_a_claim_that_finds_its_task_too_long_gives_it_back_at_the_head_of_the_queue(make_settings, monkeypatch):
    # The claim's condition names at most MAX_CLAIM_TYPES types: past them, the check after the claim.
    monkeypatch.setattr(budget.Budget, "too_long_types", lambda self, now=None: [])
    settings = make_settings(worker_timeout_seconds=30, timeout_margin_seconds=1)
    _put(settings, ["head"], "test-one-second")  # declares 1.5 s
    report = process_task("head", "w", settings, time.monotonic() + 2.0)  # 1 s left for handlers
    assert report.outcome is TaskOutcome.TOO_LONG
    task = lifecycle.get_task("head")
    assert (task.status, int(task.attempts), task.lock_owner) == (TaskStatus.TODO.value, 0, None)
    assert task.due_at <= task.created_at  # due as of its creation: ahead of newer work
    fresh = process_task("head", "w2", settings, time.monotonic() + 10.0)
    assert fresh.outcome is TaskOutcome.FINISHED


def test_a_handler_past_its_own_limit_is_recorded_as_timed_out_and_retried(settings):
    _overrun_stopped.clear()
    _put(settings, ["over"], "test-overrun", timeout_seconds=1)
    reports = run_invocation(WorkerRequest(("over",)), "w", settings, time.monotonic() + 60)
    assert _overrun_stopped.is_set(), "the handler was never told its time was up"
    task = lifecycle.get_task("over")
    assert (task.status, int(task.attempts)) == (TaskStatus.FAILED.value, 1)
    assert task.errors[-1].kind == ErrorKind.TIMEOUT.value
    assert "time limit of 1 s" in task.errors[-1].message  # its own limit, not the worker's deadline
    assert [r.outcome for r in reports] == [TaskOutcome.FAILED]


_seen: dict[str, float] = {}


@task_handler("test-read-deadline", timeout_seconds=7)
def _read_deadline(payload, context: TaskContext) -> None:
    _seen["remaining"] = context.remaining_seconds()
    try:
        context.spawn("test-read-deadline", timeout_seconds=100_000)
    except ValueError as exc:
        _seen["refused"] = str(exc)


def test_the_handler_is_told_its_own_deadline(settings):
    seen = _seen
    seen.clear()
    _put(settings, ["d"], "test-read-deadline")
    run_invocation(WorkerRequest(("d",)), "w", settings, time.monotonic() + 60)
    assert seen["remaining"] <= 7  # its own 7-s limit, not the invocation's 60 s
    assert "longer than a Lambda worker can give" in str(seen["refused"])  # a follow-up is checked too


def test_a_plan_longer_than_any_invocation_still_lets_a_fresh_one_run_the_task(make_settings):
    settings = make_settings(worker_timeout_seconds=6, timeout_margin_seconds=0.5)
    durations.observed.forget()
    for _ in range(20):  # observed runs far past what the worker gives (they were timed out)
        durations.observed.observe("test-one-second-undeclared", 60.0)
    _put(settings, ["planned-long"], "test-one-second-undeclared")
    reports = run_invocation(WorkerRequest(("planned-long",)), "w", settings, time.monotonic() + 6)
    assert [r.outcome for r in reports] == [TaskOutcome.FINISHED]
    durations.observed.forget()


def test_observed_run_times_give_a_p95_that_another_process_reads(settings):
    counted = durations.Durations()
    for seconds in [0.1] * 18 + [2.0, 2.0]:
        counted.observe("test-measured", seconds)
    assert counted.flush() == 1
    reader = durations.Durations()
    p95 = reader.p95("test-measured")
    assert p95 is not None and 2.0 <= p95 <= 2.0 * durations.RATIO
    assert reader.runs("test-measured") == 20
    # A type that declares nothing is planned with it.
    durations.observed.forget()
    counted_again = durations.observed
    for _ in range(20):
        counted_again.observe("test-one-second-undeclared", 3.0)
    assert declared_timeout("test-one-second-undeclared") is None
    planned = budget.planned_seconds("test-one-second-undeclared")
    assert planned is not None and 3.0 <= planned <= 3.0 * durations.RATIO


def test_the_kept_runs_are_halved_past_the_decay_threshold(settings):
    counted = durations.Durations()
    for _ in range(durations.DECAY_RUNS + 2):
        counted.observe("test-many", 0.5)
    counted.flush(force=True)
    assert durations.Durations().runs("test-many") == (durations.DECAY_RUNS + 2) // 2
