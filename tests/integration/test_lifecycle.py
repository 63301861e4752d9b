"""The lifecycle contract, against each embedded DynamoDB backend over HTTP.

Times are moved by passing ``now`` to the lifecycle functions: a lock taken "in the past"
is already expired, without the test sleeping through a lock lifetime.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from coworker.data import index
from coworker.data.models import ErrorKind, TaskModel, TaskStatus, utcnow
from coworker.engine import lifecycle, submit
from coworker.engine.handlers import task_handler
from coworker.engine.lifecycle import RecordOutcome
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.submit import PutOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import process_task, run_batch
from coworker.errors import TaskFailed

# The lifecycle contract: every test runs on DynamoDB Local and on moto.
pytestmark = pytest.mark.both_backends

# Handlers private to these tests: a gate the test opens to let a running task return.
RELEASE = threading.Event()


@task_handler("test-wait-for-release")
def _wait_for_release(payload, context):
    RELEASE.wait(timeout=30)
    return {"released": True}


@task_handler("test-sleep")
def _sleep(payload, context):
    time.sleep(payload["seconds"])
    return {"slept": payload["seconds"]}


@task_handler("test-refuse")
def _refuse(payload, context):
    raise TaskFailed("card declined", retryable=False)


def _past(settings, extra: float = 1.0):
    """A moment far enough back that a lock taken then has already expired."""
    return utcnow() - timedelta(seconds=settings.effective_lock_seconds + extra)


def _put(settings, key="k1", type_="quick", now=None, **kw):
    return submit.put_task(TaskSpec(key=key, type=type_, payload={"n": 1}, **kw), settings, now=now)


def _deadline(seconds: float = 60) -> float:
    return time.monotonic() + seconds


# 6. Idempotent put ---------------------------------------------------------------------------

def test_put_creates_todo_then_reports_exists_without_resetting(settings):
    assert _put(settings) is PutOutcome.CREATED
    claim = lifecycle.claim("k1", "w1", settings)
    assert claim is not None

    assert submit.put_task(TaskSpec(key="k1", type="slow", payload={"x": 2}), settings) is PutOutcome.EXISTS

    task = lifecycle.get_task("k1")
    assert task.status == "processing"
    assert task.task_type == "quick"
    assert task.payload == {"n": 1}
    assert task.attempts == 1
    assert [task.key for task in TaskModel.scan(TaskModel.status.is_in("todo", "processing"))] == ["k1"]


# 1. Claim --------------------------------------------------------------------------------------

def test_claim_sets_processing_owner_expiry_and_counts_the_attempt(settings):
    _put(settings)
    before = utcnow()
    claim = lifecycle.claim("k1", "worker-a", settings)

    task = lifecycle.get_task("k1")
    assert claim is not None and claim.attempt == 1
    assert task.status == TaskStatus.PROCESSING.value
    assert task.lock_owner == "worker-a"
    expected = before + timedelta(seconds=settings.effective_lock_seconds)
    assert abs((task.lock_expires_at - expected).total_seconds()) < 5
    assert task.due_at == task.lock_expires_at
    assert lifecycle.claim("k1", "worker-b", settings) is None


def test_claim_of_missing_finished_or_not_yet_due_task_is_not_claimed(settings):
    assert lifecycle.claim("nope", "w", settings) is None
    _put(settings, key="later", run_at=utcnow() + timedelta(hours=1))
    assert lifecycle.claim("later", "w", settings) is None
    _put(settings, key="done")
    lifecycle.complete(lifecycle.claim("done", "w", settings), settings)
    assert lifecycle.claim("done", "w2", settings) is None


def test_of_many_concurrent_thread_claimers_exactly_one_wins(settings):
    keys = [f"c{i}" for i in range(5)]
    for key in keys:
        _put(settings, key=key)
    for key in keys:
        barrier = threading.Barrier(12)
        winners: list = []

        def contend(index: int, key: str, barrier: threading.Barrier, winners: list) -> None:
            barrier.wait()
            result = lifecycle.claim(key, f"thread-{index}", settings)
            if result is not None:
                winners.append(result.owner)

        threads = [threading.Thread(target=contend, args=(i, key, barrier, winners)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(winners) == 1, winners
        assert lifecycle.get_task(key).lock_owner == winners[0]


def _claim_in_subprocess(settings_env: dict, keys: list[str], start_at: float, queue) -> None:
    from coworker.bootstrap import configure
    from coworker.config import Settings

    settings = configure(Settings.from_env(settings_env))
    while time.time() < start_at:
        time.sleep(0.001)
    import os

    won = [key for key in keys if lifecycle.claim(key, f"pid-{os.getpid()}", settings) is not None]
    queue.put(won)


@pytest.mark.slow
def test_of_concurrent_claimers_in_separate_processes_exactly_one_wins(settings):
    import multiprocessing

    keys = [f"p{i}" for i in range(20)]
    for key in keys:
        _put(settings, key=key)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    start_at = time.time() + 4  # spawned interpreters need a moment to import
    env = settings.as_environment()
    processes = [context.Process(target=_claim_in_subprocess, args=(env, keys, start_at, queue))
                 for _ in range(4)]
    for p in processes:
        p.start()
    results = [queue.get(timeout=600) for _ in processes]  # (a guard: processes start slowly when loaded)
    for p in processes:
        p.join(timeout=30)
    won = [key for result in results for key in result]
    assert sorted(won) == sorted(keys)  # every key claimed exactly once across processes


# 2. Fencing ------------------------------------------------------------------------------------

def test_stale_worker_cannot_overwrite_a_newer_attempt(settings):
    past = _past(settings)
    _put(settings, now=past)
    stale = lifecycle.claim("k1", "worker-a", settings, now=past)  # its lock is already expired
    fresh = lifecycle.claim("k1", "worker-b", settings)
    assert stale is not None and fresh is not None and fresh.attempt == 2

    assert lifecycle.complete(stale, settings, result={"from": "a"}) is RecordOutcome.LOST
    error = lifecycle.error_record(stale.attempt, ErrorKind.SYSTEM, "late", utcnow())
    assert lifecycle.fail(stale, settings, error) is RecordOutcome.LOST
    task = lifecycle.get_task("k1")
    assert (task.status, task.lock_owner, task.attempts, task.result) == ("processing", "worker-b", 2, None)

    assert lifecycle.complete(fresh, settings, result={"from": "b"}) is RecordOutcome.FINISHED
    task = lifecycle.get_task("k1")
    assert task.status == "finished" and task.result == {"from": "b"}
    # The lost first attempt is on record.
    assert [(e.attempt, e.kind) for e in task.errors] == [(1, ErrorKind.WORKER_LOST.value)]


def test_same_owner_with_an_older_attempt_is_fenced_too(settings):
    past = _past(settings)
    _put(settings, now=past)
    first = lifecycle.claim("k1", "same-owner", settings, now=past)
    second = lifecycle.claim("k1", "same-owner", settings)
    assert lifecycle.complete(first, settings) is RecordOutcome.LOST
    assert lifecycle.complete(second, settings) is RecordOutcome.FINISHED


# 3. Success, business failure, system error, backoff, ceiling ---------------------------------

def test_success_finishes_releases_lock_and_leaves_the_status_index(settings):
    _put(settings, key="ok", type_="quick")
    report = process_task("ok", "w", settings, _deadline())
    task = lifecycle.get_task("ok")
    assert report.outcome is TaskOutcome.FINISHED
    assert task.status == "finished" and task.lock_owner is None and task.lock_expires_at is None
    assert task.due_at is None and task.finished_at is not None
    assert "sha256" in task.result
    assert index.count("finished") == 0 and index.count("processing") == 0


def test_business_failure_and_system_error_are_recorded_differently(make_settings):
    settings = make_settings(backoff_base_seconds=30, backoff_max_seconds=60)
    _put(settings, key="biz", type_="always-fail")
    _put(settings, key="sys", type_="flaky", max_attempts=3)
    submit.put_task(TaskSpec(key="sys2", type="flaky", payload={"fail_attempts": 5}), settings)
    before = utcnow()
    assert process_task("biz", "w", settings, _deadline()).outcome is TaskOutcome.FAILED
    assert process_task("sys2", "w", settings, _deadline()).outcome is TaskOutcome.FAILED

    biz, system = lifecycle.get_task("biz"), lifecycle.get_task("sys2")
    assert [e.kind for e in biz.errors] == ["business"]
    assert biz.errors[0].message == "the order references an unknown product"
    assert [e.kind for e in system.errors] == ["system"]
    assert system.errors[0].message.startswith("ConnectionError:")
    assert "Traceback" in system.errors[0].traceback
    for task in (biz, system):
        assert task.status == "failed" and task.lock_owner is None
        # backoff: base 30 s with jitter in [15, 30]
        assert 14 <= (task.due_at - before).total_seconds() <= 31
    # not due yet: a claim now is refused
    assert lifecycle.claim("biz", "w2", settings) is None


def test_retries_run_to_the_ceiling_then_the_task_is_ignored(settings):
    submit.put_task(TaskSpec(key="never", type="always-fail", max_attempts=4), settings)
    outcomes = [process_task("never", f"w{i}", settings, _deadline()).outcome for i in range(5)]
    assert outcomes == [TaskOutcome.FAILED] * 3 + [TaskOutcome.IGNORED, TaskOutcome.NOT_CLAIMED]
    task = lifecycle.get_task("never")
    assert task.status == "ignored" and task.attempts == 4
    assert [int(e.attempt) for e in task.errors] == [1, 2, 3, 4]


def test_flaky_task_finishes_on_a_later_attempt_with_its_errors_kept(settings):
    submit.put_task(TaskSpec(key="f", type="flaky", payload={"fail_attempts": 2}), settings)
    outcomes = [process_task("f", "w", settings, _deadline()).outcome for _ in range(3)]
    assert outcomes == [TaskOutcome.FAILED, TaskOutcome.FAILED, TaskOutcome.FINISHED]
    task = lifecycle.get_task("f")
    assert task.status == "finished" and task.attempts == 3
    assert [e.kind for e in task.errors] == ["system", "system"]


def test_a_failing_tasks_history_keeps_every_message_and_only_the_newest_traceback(settings, log_lines):
    # Given a task whose first three attempts fail with a system error, each with a traceback
    submit.put_task(TaskSpec(key="f3", type="flaky", payload={"fail_attempts": 3}, max_attempts=5), settings)
    outcomes = [process_task("f3", "w", settings, _deadline()).outcome for _ in range(4)]
    assert outcomes == [TaskOutcome.FAILED] * 3 + [TaskOutcome.FINISHED]
    # Then every attempt's message is kept, but only the newest traceback: the record, which every
    # later write pays for by its size, does not grow by up to 2 KB per failure
    errors = lifecycle.get_task("f3").errors
    assert [(int(e.attempt), e.message) for e in errors] == [
        (n, f"ConnectionError: upstream reset the connection (attempt {n})") for n in (1, 2, 3)]
    assert [e.traceback is not None for e in errors] == [False, False, True]
    assert "Traceback" in errors[-1].traceback and "(attempt 3)" in errors[-1].traceback
    # And each attempt's traceback is in the worker's log, by task key and attempt
    raised = [line for line in log_lines() if line["message"] == "task raised" and line.get("task_key") == "f3"]
    assert [(line["attempt"], line["exception_name"]) for line in raised] == [(n, "ConnectionError") for n in (1, 2, 3)]
    assert all(f"(attempt {line['attempt']})" in line["exception"] for line in raised)


def test_non_retryable_business_failure_is_ignored_at_once(settings):
    _put(settings, key="r", type_="test-refuse", max_attempts=5)
    assert process_task("r", "w", settings, _deadline()).outcome is TaskOutcome.IGNORED
    assert lifecycle.get_task("r").attempts == 1


def test_error_history_keeps_only_the_last_n(make_settings):
    settings = make_settings(error_history=2)
    submit.put_task(TaskSpec(key="h", type="always-fail", max_attempts=5), settings)
    for _ in range(5):
        process_task("h", "w", settings, _deadline())
    assert [int(e.attempt) for e in lifecycle.get_task("h").errors] == [4, 5]


def test_unknown_task_type_is_a_recorded_error_not_a_crash(settings):
    _put(settings, key="u", type_="no-such-type")
    report = process_task("u", "w", settings, _deadline())
    task = lifecycle.get_task("u")
    assert report.outcome is TaskOutcome.FAILED
    assert task.errors[0].kind == "unknown_type" and "no-such-type" in task.errors[0].message


# 4. Graceful timeout -----------------------------------------------------------------------------

def test_task_that_cannot_finish_in_time_is_failed_and_unlocked_before_the_deadline(make_settings, monkeypatch):
    settings = make_settings(timeout_margin_seconds=3.0, worker_timeout_seconds=10)
    submit.put_task(TaskSpec(key="t", type="test-sleep", payload={"seconds": 20}), settings)
    recorded_at: list[float] = []
    real_fail = lifecycle.fail

    def fail(*args, **kwargs):
        recorded_at.append(time.monotonic())
        return real_fail(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "fail", fail)
    deadline = _deadline(5.0)
    reports = run_batch(["t"], "w", settings, deadline)
    # The timeout is recorded from the handlers' deadline on (the margin before the invocation's),
    # not before, and not left to the invocation's end.
    [began] = recorded_at
    assert deadline - settings.timeout_margin_seconds <= began < deadline
    task = lifecycle.get_task("t")
    assert reports[0].outcome is TaskOutcome.FAILED
    assert task.status == "failed" and task.lock_owner is None
    assert task.errors[0].kind == "timeout"


def test_worker_with_no_time_left_does_not_claim(settings):
    _put(settings)
    report = process_task("k1", "w", settings, time.monotonic() + settings.timeout_margin_seconds / 2)
    assert report.outcome is TaskOutcome.SKIPPED
    assert lifecycle.get_task("k1").status == "todo"


def test_a_claim_that_used_up_the_time_left_is_given_back_without_burning_the_attempt(settings, monkeypatch):
    """The deadline is checked again after the claim: a slow claim must not start a handler that
    would be recorded as a timeout at once."""
    _put(settings)
    deadline = time.monotonic() + settings.timeout_margin_seconds + 0.3
    real_claim = lifecycle.claim

    def slow_claim(*args, **kwargs):
        claimed = real_claim(*args, **kwargs)
        time.sleep(0.5)  # the claim's answer arrives after the handlers' deadline
        return claimed

    monkeypatch.setattr(lifecycle, "claim", slow_claim)
    report = process_task("k1", "w", settings, deadline)
    assert report.outcome is TaskOutcome.SKIPPED
    task = lifecycle.get_task("k1")
    assert (task.status, int(task.attempts), task.lock_owner, task.errors) == ("todo", 0, None, None)
    assert task.due_at <= utcnow()  # due again at once
    monkeypatch.setattr(lifecycle, "claim", real_claim)
    assert process_task("k1", "w2", settings, _deadline()).outcome is TaskOutcome.FINISHED


def test_every_writer_of_the_error_history_keeps_it_at_the_limit(make_settings):
    """Cancel, and reaping a task lost on its last attempt, trim the history like fail does,
    including over cancel -> retry cycles."""
    settings = make_settings(error_history=2)
    _put(settings, key="cycled", type_="always-fail", max_attempts=1)
    process_task("cycled", "w", settings, _deadline())
    for _ in range(4):
        lifecycle.retry("cycled", settings)
        assert lifecycle.cancel("cycled", settings, "again") is not None
    errors = lifecycle.get_task("cycled").errors
    assert [(e.kind, e.message) for e in errors] == [("redriven", "on request"), ("cancelled", "again")]

    _put(settings, key="lost", type_="always-fail", max_attempts=3)
    process_task("lost", "w", settings, _deadline())
    process_task("lost", "w", settings, _deadline())  # two business errors: the history is full
    claim = lifecycle.claim("lost", "w", settings)  # its worker dies: the lock expires
    assert claim is not None and claim.attempt == 3
    later = utcnow() + timedelta(seconds=settings.effective_lock_seconds + 1)
    assert lifecycle.reap_lost("lost", 3, settings, now=later) is True
    task = lifecycle.get_task("lost")
    assert task.status == "ignored" and [e.kind for e in task.errors] == ["business", "worker_lost"]
    assert lifecycle.cancel("lost", settings) is None  # already ignored: nothing written


# 5. Stale locks ------------------------------------------------------------------------------------

def test_cancel_while_running_is_not_hidden_by_the_late_result(settings):
    RELEASE.clear()
    _put(settings, key="c", type_="test-wait-for-release")
    worker = threading.Thread(target=run_batch, args=(["c"], "w", settings, _deadline()))
    worker.start()
    for _ in range(100):
        if lifecycle.get_task("c").status == "processing":
            break
        time.sleep(0.05)
    assert lifecycle.cancel("c", settings, "operator changed their mind") is not None
    RELEASE.set()
    worker.join(timeout=30)
    task = lifecycle.get_task("c")
    assert task.status == "ignored" and task.result is None
    # the cancellation is numbered with the attempt it stopped
    assert (task.errors[-1].kind, task.errors[-1].attempt, task.attempts) == ("cancelled", 1, 1)
    assert lifecycle.claim("c", "w2", settings) is None


def test_a_task_cancelled_before_it_ran_is_numbered_attempt_0(settings):
    _put(settings, key="never-ran", type_="quick")
    assert lifecycle.cancel("never-ran", settings) is not None
    assert [(e.kind, e.attempt) for e in lifecycle.get_task("never-ran").errors] == [("cancelled", 0)]


def test_retry_redrives_an_ignored_task_keeping_its_history(settings):
    submit.put_task(TaskSpec(key="i", type="always-fail", max_attempts=1), settings)
    process_task("i", "w", settings, _deadline())
    ignored_at = lifecycle.get_task("i").updated_at
    assert lifecycle.retry("i", settings) is not None
    assert lifecycle.get_task("i").updated_at > ignored_at
    task = lifecycle.get_task("i")
    assert (task.status, task.attempts) == ("todo", 0)
    # the history marks where the attempts start again, and with how many before
    assert [(e.kind, e.attempt) for e in task.errors] == [("business", 1), ("redriven", 1)]
    assert lifecycle.retry("i", settings) is None  # todo is not retryable


def test_finished_task_gets_a_ttl_only_when_retention_is_set(make_settings):
    keep = make_settings()
    _put(keep, key="forever")
    process_task("forever", "w", keep, _deadline())
    assert lifecycle.get_task("forever").delete_after_epoch is None

    expiring = make_settings(retention_days=7)
    _put(expiring, key="week")
    process_task("week", "w", expiring, _deadline())
    task = lifecycle.get_task("week")
    assert abs((task.delete_after_epoch - task.finished_at).total_seconds() - 7 * 86400) < 2


def test_a_heartbeat_extends_the_lock_with_the_lean_write_and_names_itself_when_refused(settings, monkeypatch):
    """``extend_lock`` once passed its arguments one place off: every heartbeat asked for the whole
    item back, and a refusal read "could not None task". A beat is one UpdateItem that returns
    nothing, and its errors say what failed."""
    import botocore.client
    from coworker.errors import StorageError

    submit.put_task(TaskSpec(key="beat", type="quick"), settings)
    claim = lifecycle.claim("beat", "w-1", settings)
    sent: list[dict] = []
    original = botocore.client.BaseClient._make_api_call

    def recorded(client, operation, params):
        if operation == "UpdateItem":
            sent.append(params)
        return original(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recorded)
    assert lifecycle.extend_lock(claim, settings)
    assert [params.get("ReturnValues") for params in sent] == ["NONE"]

    def refused(client, operation, params):
        raise botocore.exceptions.ClientError(
            {"Error": {"Code": "AccessDeniedException", "Message": "not authorized to perform: dynamodb:UpdateItem"}},
            operation)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", refused)
    with pytest.raises(StorageError, match=r"could not extend the lock of task 'beat': not authorized"):
        lifecycle.extend_lock(claim, settings)


def test_heartbeats_move_the_index_entry_once_a_lock_lifetime_and_never_behind_the_lock(settings):
    """Moving a running task's index entry (``due_at``, the index key) costs a delete and a put in
    the index: a beat moves only the lock, unless the new lock would pass the entry, and then moves
    the entry half a lock lifetime past it. The entry is never behind the lock, so no reader of
    the index meets a live lock as due, and a lost task shows as due at most half a lock late."""
    lock = timedelta(seconds=settings.effective_lock_seconds)
    beat = timedelta(seconds=settings.effective_heartbeat_seconds + 0.1)
    t0 = utcnow() - 8 * beat  # the beats are "now" as they happen: nothing in the future
    _put(settings, key="long", now=t0 - timedelta(seconds=1))
    claim = lifecycle.claim("long", "w-1", settings, now=t0)
    listed = claim.task.due_at
    assert listed == t0 + lock
    moved = []
    for number in range(1, 8):
        at = t0 + number * beat
        extension = lifecycle.extend_lock(claim, settings, now=at, listed_until=listed)
        assert extension
        if extension.listed_until is not None:
            moved.append(number)
            listed = extension.listed_until
        task = lifecycle.get_task("long")
        assert task.lock_expires_at == at + lock
        assert task.due_at == listed >= task.lock_expires_at
    # At the defaults (three beats a lock lifetime) every other beat moves the entry.
    assert moved == [1, 3, 5, 7]
    last_lock = t0 + 7 * beat + lock

    # The holder dies after its last beat. Its lock lapses; the index shows the task due later.
    lapsed = last_lock + timedelta(seconds=1)
    running, lost = index.running_and_lost(lapsed)
    assert (running, lost) == (1, [])
    assert lifecycle.claim("long", "w-2", settings, now=lapsed) is None
    found = listed + timedelta(seconds=1)
    assert listed - last_lock <= lifecycle.listing_horizon(settings) == lock / 2
    assert [task.key for task in index.running_and_lost(found)[1]] == ["long"]
    taken = lifecycle.claim("long", "w-2", settings, now=found)
    assert taken is not None and taken.took_over_lost_attempt
    assert not lifecycle.extend_lock(claim, settings, now=found)  # the old holder is fenced out


def test_an_extension_that_lands_late_moves_neither_the_lock_nor_the_entry_back(settings):
    """Extensions race when writes are slow: one sent earlier that lands after a later one is
    refused whole, so the entry that the later one moved stays ahead of the lock."""
    t0 = utcnow() - timedelta(seconds=10)
    _put(settings, key="raced", now=t0 - timedelta(seconds=1))
    claim = lifecycle.claim("raced", "w-1", settings, now=t0)
    later = lifecycle.extend_lock(claim, settings, now=t0 + timedelta(seconds=5), listed_until=None)
    assert later and later.listed_until is not None
    earlier = lifecycle.extend_lock(claim, settings, now=t0 + timedelta(seconds=4), listed_until=None)
    assert earlier and earlier.listed_until is None  # still held, nothing written
    task = lifecycle.get_task("raced")
    assert task.lock_expires_at == t0 + timedelta(seconds=5 + settings.effective_lock_seconds)
    assert task.due_at == later.listed_until
