"""Coordinator ticks: what is dispatched, in what order, how many, and lost-worker recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from coworker.data.models import TaskStatus, utcnow
from coworker.engine import control, dispatch, lifecycle, submit
from coworker.engine.dispatch import InProcessInvoker
from coworker.engine.handlers import TaskContext, task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch, run_invocation
from coworker.observability import MetricName, metrics

from tests.support.doubles import RecordingInvoker
from tests.support.waits import wait_until

# The tests of the lifecycle contract (expired locks, killed or stalled workers, the supervisor's
# lease) run on DynamoDB Local and on moto (``both_backends``); the rest on DynamoDB Local, the
# default: the same code over the same writes, whose backends' differences those tests find.


def _put_many(settings, count, prefix="t", type_="quick", now=None, **kw):
    # Put in the past (beyond the submit grace), spread so "oldest first" has a defined order.
    base = now or utcnow() - timedelta(seconds=10)
    for i in range(count):
        submit.put_task(TaskSpec(key=f"{prefix}{i:03d}", type=type_, **kw), settings,
                           now=base - timedelta(seconds=count - i))


def test_tick_fills_free_slots_oldest_first_never_past_max_concurrency(make_settings):
    settings = make_settings(max_concurrency=7, batch_size=3)  # slots of 3, 3 and 1 threads
    _put_many(settings, 20)
    invoker = RecordingInvoker()
    report = dispatch.tick(settings, invoker)
    assert report.dispatched == 7 and report.invocations == 3
    assert sorted(len(b) for b in invoker.batches) == [1, 3, 3]
    assert sorted(invoker.keys) == [f"t{i:03d}" for i in range(7)]
    assert len({request.slot for request in invoker.requests}) == 3


def test_a_ticks_slot_reservations_are_written_together(make_settings, monkeypatch):
    # Given three free slots' worth of due work, and each reservation write held until all three
    # are under way (a throttled table holding every write for a while)
    settings = make_settings(max_concurrency=9, batch_size=3)
    _put_many(settings, 9)
    together = threading.Barrier(3, timeout=60)  # (a ceiling: the third write releases the others)
    reserve = dispatch.slots.reserve

    def held(*args, **kwargs):
        together.wait()
        return reserve(*args, **kwargs)

    monkeypatch.setattr(dispatch.slots, "reserve", held)
    invoker = RecordingInvoker()

    # When a tick dispatches it
    report = dispatch.tick(settings, invoker)

    # Then the three reservations were in flight at once (one after another, the first would wait
    # for the others for good), and each slot's worker got its keys
    assert not together.broken
    assert report.invocations == 3 and sorted(invoker.keys) == [f"t{i:03d}" for i in range(9)]
    assert sorted(len(batch) for batch in invoker.batches) == [3, 3, 3]


def test_dispatched_but_unclaimed_work_counts_against_capacity(make_settings):
    """The defect: with 2 slots, ticks kept handing out keys whose workers had not claimed yet."""
    settings = make_settings(max_concurrency=2, batch_size=1)
    _put_many(settings, 10, type_="slow")
    invoker = RecordingInvoker()  # the workers never start: nothing is claimed
    reports = [dispatch.tick(settings, invoker) for _ in range(5)]
    assert len(invoker.keys) == 2 and [r.invocations for r in reports] == [2, 0, 0, 0, 0]
    assert (reports[-1].busy_slots, reports[-1].free_slots) == (2, 0)


def test_busy_workers_reduce_what_is_started(make_settings):
    settings = make_settings(max_concurrency=5, batch_size=1)
    _put_many(settings, 10)
    assert len(dispatch.start_workers(settings, RecordingInvoker(), ["t000", "t001", "t002"])) == 3
    invoker = RecordingInvoker()
    report = dispatch.tick(settings, invoker)
    assert (report.busy_slots, report.free_slots, report.invocations) == (3, 2, 2)
    assert dispatch.tick(settings, invoker).invocations == 0  # full


def test_a_lapsed_reservation_frees_the_slot_and_its_late_worker_does_not_start(make_settings):
    settings = make_settings(max_concurrency=1, batch_size=1, reservation_seconds=2)
    _put_many(settings, 1)
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    time.sleep(2.2)  # the worker never started; its reservation lapses
    dispatch.tick(settings, invoker)
    late, fresh = invoker.requests
    assert late.slot == fresh.slot and late.token != fresh.token
    assert run_invocation(late, "late", settings, time.monotonic() + 30) == []
    assert lifecycle.get_task("t000").status == "todo"  # untouched by the late worker
    reports = run_invocation(fresh, "fresh", settings, time.monotonic() + 30)
    assert [r.outcome for r in reports] == [TaskOutcome.FINISHED]


def test_not_yet_due_tasks_are_not_dispatched(settings):
    submit.put_task(TaskSpec(key="later", type="quick", run_at=utcnow() + timedelta(hours=1)), settings)
    submit.put_task(TaskSpec(key="now", type="quick"), settings, now=utcnow() - timedelta(seconds=10))
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    assert invoker.keys == ["now"]


def test_new_tasks_are_left_to_dispatch_on_submit_for_a_moment(make_settings):
    settings = make_settings()
    submit.put_task(TaskSpec(key="fresh", type="quick"), settings)
    assert dispatch.tick(settings, RecordingInvoker()).dispatched == 0
    assert dispatch.tick(settings.model_copy(update={"dispatch_on_submit": False}),
                         RecordingInvoker()).dispatched == 1


def test_a_supervisor_does_not_hand_out_a_key_twice_while_its_worker_starts(make_settings):
    settings = make_settings(max_concurrency=4, batch_size=1)
    _put_many(settings, 2)
    invoker, memory = RecordingInvoker(), dispatch.HintMemory(settings.reservation_seconds)
    dispatch.tick(settings, invoker, memory=memory)
    dispatch.tick(settings, invoker, memory=memory)
    assert sorted(invoker.keys) == ["t000", "t001"]


def test_lost_work_and_due_retries_go_before_new_tasks(make_settings):
    settings = make_settings(max_concurrency=3, batch_size=3)
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    _put_many(settings, 5, prefix="new", now=past)
    submit.put_task(TaskSpec(key="lost", type="quick"), settings, now=past)
    lifecycle.claim("lost", "dead-worker", settings, now=past)
    submit.put_task(TaskSpec(key="retry", type="always-fail"), settings, now=past)
    run_batch(["retry"], "w", settings, time.monotonic() + 30)  # backoff 0 in tests: due now
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    assert invoker.keys == ["lost", "retry", "new000"]


def test_a_tick_with_every_slot_busy_reads_no_queue_yet_retires_lost_work_and_parks(make_settings, monkeypatch):
    # Given every worker slot taken, new and failed work due, a task lost on its last attempt
    settings = make_settings(max_concurrency=2, batch_size=1)
    _put_many(settings, 4)
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    submit.put_task(TaskSpec(key="lost", type="quick", max_attempts=1), settings, now=past)
    lifecycle.claim("lost", "dead-worker", settings, now=past)
    assert len(dispatch.start_workers(settings, RecordingInvoker(), ["t000", "t001"])) == 2
    statuses_read = []
    original_due = dispatch.index.due
    monkeypatch.setattr(dispatch.index, "due", lambda status, *a, **kw: (
        statuses_read.append(status), original_due(status, *a, **kw))[1])

    # When the coordinator ticks, nothing can be handed out: it reads no due todo or failed work
    report = dispatch.tick(settings, RecordingInvoker())
    assert (report.free_slots, report.dispatched, statuses_read) == (0, 0, [])
    # ... and still retires the task lost at its ceiling
    assert report.reaped == 1 and lifecycle.get_task("lost").status == TaskStatus.IGNORED.value

    # And with a type paused, it reads the queue to park that type's tasks, busy slots or not
    assert control.pause("quick")
    assert dispatch.tick(settings, RecordingInvoker()).parked >= 1 and statuses_read


def test_dispatching_the_same_task_twice_is_harmless(settings):
    _put_many(settings, 1)
    first, second = dispatch.tick(settings, RecordingInvoker()), None
    assert first.dispatched == 1
    reports = run_batch(["t000", "t000"], "a", settings, time.monotonic() + 30)  # deduplicated
    reports += run_batch(["t000"], "b", settings, time.monotonic() + 30)
    assert [r.outcome for r in reports] == [TaskOutcome.FINISHED, TaskOutcome.NOT_CLAIMED]
    assert second is None


@pytest.mark.both_backends
def test_expired_lock_is_handed_out_again_and_the_lost_attempt_counted(settings):
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    submit.put_task(TaskSpec(key="k", type="quick"), settings, now=past)
    lifecycle.claim("k", "dead-worker", settings, now=past)  # never records: the worker "died"
    invoker = InProcessInvoker(settings)
    report = dispatch.tick(settings, invoker)
    invoker.wait()
    task = lifecycle.get_task("k")
    assert report.dispatched == 1
    assert (task.status, task.attempts) == ("finished", 2)
    assert [(int(e.attempt), e.kind) for e in task.errors] == [(1, "worker_lost")]


@pytest.mark.both_backends
def test_lost_on_the_last_attempt_becomes_ignored_with_worker_lost(settings):
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    submit.put_task(TaskSpec(key="k", type="quick", max_attempts=1), settings, now=past)
    lifecycle.claim("k", "dead-worker", settings, now=past)
    invoker = RecordingInvoker()
    report = dispatch.tick(settings, invoker)
    task = lifecycle.get_task("k")
    assert (report.reaped, report.dispatched, invoker.keys) == (1, 0, [])
    assert task.status == TaskStatus.IGNORED.value and task.lock_owner is None
    assert task.errors[-1].kind == "worker_lost"


def test_every_task_reaches_a_terminal_state(make_settings):
    settings = make_settings(max_concurrency=8, batch_size=3)
    past = utcnow() - timedelta(seconds=10)
    for i in range(12):
        submit.put_task(TaskSpec(key=f"q{i}", type="quick"), settings, now=past)
        submit.put_task(TaskSpec(key=f"f{i}", type="flaky", payload={"fail_attempts": 1}), settings, now=past)
        submit.put_task(TaskSpec(key=f"x{i}", type="always-fail"), settings, now=past)
    invoker = InProcessInvoker(settings)
    for _ in range(40):
        report = dispatch.tick(settings, invoker)
        invoker.wait()
        if report.due == 0:
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
from coworker.engine.handlers import task_handler
from coworker.engine.worker import run_batch

@task_handler("test-coordinator-doomed")
def doomed(payload, context):
    time.sleep(600)  # killed before it returns

settings = configure(Settings.from_env())
print("started", flush=True)
run_batch([sys.argv[1]], "doomed-worker", settings, time.monotonic() + settings.worker_timeout_seconds)
"""


@task_handler("test-coordinator-doomed")
def _rescued(payload: dict, context: TaskContext) -> dict:
    """The rescuer's run of the task the killed worker held (its run there never returns)."""
    return {"attempt": context.attempt}


@pytest.mark.both_backends
@pytest.mark.slow
def test_killed_worker_process_task_is_completed_by_another_after_lock_expiry(make_settings, tmp_path):
    settings = make_settings(worker_timeout_seconds=600, lock_seconds=5)
    submit.put_task(TaskSpec(key="victim", type="test-coordinator-doomed"), settings)
    env = {**os.environ, **settings.as_environment(),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, "victim"], env=env,
                             stdout=subprocess.PIPE, text=True)
    wait_until(lambda: lifecycle.get_task("victim").status == "processing", what="the child to claim")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    held = lifecycle.get_task("victim")
    assert held.lock_owner == "doomed-worker"

    invoker = RecordingInvoker()
    dispatched = dispatch.tick(settings, invoker).dispatched
    if utcnow() < held.lock_expires_at:  # (a machine too loaded to tick within the lock proves nothing)
        assert dispatched == 0  # lock still live: not handed out
    wait_until(lambda: utcnow() > held.lock_expires_at, what="the dead worker's lock to lapse")
    dispatch.tick(settings, invoker)
    assert invoker.keys == ["victim"]
    # (a deadline no loaded machine reaches: the rescue is what is tested, not its speed)
    reports = run_batch(invoker.keys, "rescuer", settings, time.monotonic() + 60)
    task = lifecycle.get_task("victim")
    assert reports[0].outcome is TaskOutcome.FINISHED
    assert (task.status, task.attempts) == ("finished", 2)
    assert task.errors[0].kind == "worker_lost"


def test_running_count_is_exact_beyond_one_page_of_index_data(make_settings):
    """A single query stops at 1 MB of index data; the tick's count of running tasks (and of
    lost ones) must page on."""
    from coworker.data import index
    from coworker.data.models import TaskModel

    settings = make_settings(status_shards=1)  # one index partition holds them all
    now = utcnow()
    bulky = "x" * 400  # projected into the index: about 0.5 KB per entry, 2,500 entries > 1 MB
    with TaskModel.batch_write() as batch:
        for i in range(2_500):
            task = lifecycle.new_task(TaskSpec(key=f"r{i:05d}", type=bulky), settings, now)
            expires = now + timedelta(minutes=5) if i % 10 else now - timedelta(minutes=1)
            task.status, task.due_at, task.attempts = "processing", expires, 1
            batch.save(task)
    running, lost = index.running_and_lost(utcnow())
    assert (running, len(lost)) == (2_250, 250)


def test_priority_puts_a_task_ahead_of_older_backlog(settings):
    _put_many(settings, 5)  # put 11-15 seconds ago
    submit.put_task(TaskSpec(key="urgent", type="quick", priority=3600), settings)
    submit.put_task(TaskSpec(key="meh", type="quick", priority=-3600), settings)
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    assert invoker.keys == ["urgent", "t000", "t001", "t002", "t003", "t004"]  # "meh" waits an hour


def test_backlog_counts_due_tasks_by_status_and_the_oldest_ones_age(make_settings):
    settings = make_settings(max_concurrency=3, batch_size=3)
    now = utcnow()
    past = now - timedelta(seconds=settings.effective_lock_seconds + 5)
    _put_many(settings, 4, prefix="new", now=now - timedelta(seconds=100))  # due 104 ... 101 s ago
    submit.put_task(TaskSpec(key="later", type="quick", run_at=now + timedelta(hours=1)), settings)
    submit.put_task(TaskSpec(key="lost", type="quick"), settings, now=past)
    lifecycle.claim("lost", "dead-worker", settings, now=past)
    submit.put_task(TaskSpec(key="retry", type="always-fail"), settings, now=past)
    run_batch(["retry"], "w", settings, time.monotonic() + 30)  # backoff 0 in tests: due now

    measured_at = utcnow()
    report = dispatch.tick(settings, RecordingInvoker(), measure_backlog=True)

    backlog = report.backlog
    assert (backlog.todo, backlog.retry, backlog.lost, backlog.due, backlog.capped) == (4, 1, 1, 6, ())
    # new000, due longest ("later" is not due): 104 s before `now`, however long the setup took
    elapsed = (utcnow() - now).total_seconds()
    assert 104 <= backlog.oldest_due_age_seconds <= 104 + elapsed + 1, (backlog, measured_at)
    assert dispatch.tick(settings, RecordingInvoker()).backlog is None  # measured only when asked


def test_backlog_counts_stop_at_the_cap(make_settings):
    settings = make_settings(backlog_count_cap=5)
    _put_many(settings, 12)
    backlog = dispatch.tick(settings, RecordingInvoker(), measure_backlog=True).backlog
    assert (backlog.todo, backlog.capped) == (5, ("todo",))


def test_an_idle_system_has_no_backlog(settings):
    backlog = dispatch.tick(settings, RecordingInvoker(), measure_backlog=True).backlog
    assert (backlog.due, backlog.oldest_due_age_seconds) == (0, 0.0)


def test_the_supervisor_measures_the_backlog_every_backlog_seconds(make_settings):
    clock = [0.0]
    settings = make_settings(tick_seconds=1, backlog_seconds=3, idle_exit=False)  # an empty table, all along
    supervisor = dispatch.Supervisor(settings, RecordingInvoker(), clock=lambda: clock[0])
    ticks = iter(range(7))  # ticks at 1 s, 2 s ... 7 s: measured at the first, then every third

    def remaining() -> float:  # each call is a moment later; seven ticks then stop
        clock[0] += 0.5
        return 10.0 if next(ticks, None) is not None else 0.0

    class NoWait(threading.Event):
        def wait(self, timeout=None):
            clock[0] += timeout or 0.0
            return False

    reports = supervisor.run(remaining, NoWait())
    measured = [report.backlog is not None for report in reports]
    assert measured == [True, False, False, True, False, False, True], measured


def _run_for(supervisor: dispatch.Supervisor, seconds: float) -> list[dispatch.TickReport]:
    end = time.monotonic() + seconds
    return supervisor.run(lambda: end - time.monotonic())


def _run_ticks(supervisor: dispatch.Supervisor, ticks: int) -> list[dispatch.TickReport]:
    """A run whose window closes after ``ticks`` ticks, however long a loaded machine takes."""
    seen: list[object] = []
    supervisor.on_tick = lambda report, error: seen.append(report)
    return supervisor.run(lambda: 60.0 if len(seen) < ticks else 0.0)


def test_a_run_with_nothing_to_do_ends_after_its_first_tick(make_settings, monkeypatch):
    # Given an empty deployment, whose ticks the heartbeat alarm counts
    settings = make_settings(tick_seconds=0.2, supervise_seconds=30)
    published: list[str] = []
    real_publish = dispatch._publish_tick
    monkeypatch.setattr(dispatch, "_publish_tick", lambda report: (published.append("tick"), real_publish(report)))

    # When a scheduled run starts (with a minute's window of 0.2-s ticks)
    reports = _run_for(dispatch.Supervisor(settings, RecordingInvoker()), 60)

    # Then it ends after one tick, which it published (an idle coordinator is not a silent one)
    assert len(reports) == 1 and reports[0].idle and published == ["tick"]


def test_an_idle_coordinator_publishes_its_ticks_and_only_the_gauges_that_changed(make_settings, monkeypatch):
    # Given a coordinator that has supervised work (a task running, its backlog measured); its
    # ticks count batch progress within half a tick, long enough on a loaded machine that no pass
    # is cut short (one cut short rightly publishes the follower's lag, which this is not about)
    settings = make_settings(tick_seconds=10, supervise_seconds=30)
    monkeypatch.setattr(dispatch, "_last_gauges", {}, raising=False)
    metrics.clear_metrics()
    submit.put_task(TaskSpec(key="busy", type="quick"), settings, now=utcnow() - timedelta(seconds=10))
    claim = lifecycle.claim("busy", "a-live-worker", settings)
    assert claim is not None

    def published(**kw) -> set[str]:
        report = dispatch.tick(settings, RecordingInvoker(), **kw)
        names = set(metrics.metric_set)
        metrics.clear_metrics()
        return names if report.idle else {"(not idle)", *names}

    busy = published(measure_backlog=True)
    assert {"(not idle)", MetricName.RUNNING_TASKS, MetricName.DISPATCHED, MetricName.BACKLOG} <= busy, busy

    # When the work ends and the coordinator ticks with nothing to do
    assert lifecycle.complete(claim, settings, result={"ok": True}) is not None
    first = published(measure_backlog=True)
    then = [published(measure_backlog=True) for _ in range(2)]

    # Then the first idle tick publishes the gauges that fell to zero, once, and every idle tick
    # its tick count (the coordinator-silence alarm counts those): nothing else
    assert first == {MetricName.COORDINATOR_TICKS, MetricName.RUNNING_TASKS}, first
    assert then == [{MetricName.COORDINATOR_TICKS}] * 2, then


@pytest.mark.parametrize("what", ["due-soon", "running", "retry-soon"])
def test_a_run_goes_on_while_anything_runs_or_is_due_within_its_window(make_settings, what):
    settings = make_settings(tick_seconds=0.2, supervise_seconds=30)
    now = utcnow()
    if what == "due-soon":  # due in 20 s: within the window a scheduled run covers
        submit.put_task(TaskSpec(key="soon", type="quick", run_at=now + timedelta(seconds=20)), settings)
    elif what == "running":
        submit.put_task(TaskSpec(key="busy", type="quick"), settings, now=now - timedelta(seconds=10))
        assert lifecycle.claim("busy", "a-live-worker", settings) is not None
    else:
        submit.put_task(TaskSpec(key="retry", type="always-fail"), settings)
        run_batch(["retry"], "w", settings, time.monotonic() + 30)
        lifecycle.get_task("retry")  # failed, due again after its backoff
    reports = _run_ticks(dispatch.Supervisor(settings, RecordingInvoker()), 3)
    assert len(reports) == 3 and not any(report.idle for report in reports), reports
