"""Claims that wait to start, and locks a live worker cannot keep (issue 52, items 1 to 3): a task
waiting for its rate token holds no lock it cannot keep and spends no token on a claim it lost;
every warning says what the task was doing (waiting, running, or done: nothing to say); a lock
that lapsed while its worker was alive is recorded as such, not as a dead worker."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from coworker.data.models import ErrorKind, TaskModel, TaskStatus, utcnow
from coworker.engine import control, lifecycle, rates, submit
from coworker.engine.handlers import TaskContext, task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch

from tests.support.waits import wait_until

# Short locks: a beat every second, a lock of 3 s; a claim is given up 2.5 s after the last
# extension that landed.
LOCKS = {"lock_seconds": 3, "heartbeat_seconds": 1}
_ran: list[str] = []


@task_handler("test-waiting-claims")
def _handler(payload: dict, context: TaskContext) -> dict:
    _ran.append(context.key)
    if payload.get("until_taken_over"):
        # runs on after it is told (as user code may), until another worker holds the task
        wait_until(context.claim_lost, what="the handler to be told")
        wait_until(lambda: int(lifecycle.get_task(context.key).attempts) > context.attempt,
                   what="another worker to take the task over")
    return {"ok": True}


@pytest.fixture(autouse=True)
def _fresh():
    control._cache.invalidate()
    _ran.clear()
    yield
    control._cache.invalidate()


def _put(settings, key: str, **extra) -> None:
    submit.put_task(TaskSpec(key=key, type="test-waiting-claims", payload=extra.pop("payload", {}), **extra),
                    settings, now=utcnow() - timedelta(seconds=5))


def _warnings(log_lines, key: str) -> list[str]:
    return [line["message"] for line in log_lines() if line["level"] == "WARNING" and line.get("task_key") == key]


@pytest.fixture
def slow_extensions(monkeypatch):
    """Makes the lock extensions of a key never land in time (every other write is quick): held
    until the test ends, then dropped (the worker's heartbeat has stopped by then)."""
    extend, ended = lifecycle.extend_lock, threading.Event()

    def slowing(key: str) -> None:
        def slow(claim, *args, **kwargs):
            if claim.key != key:
                return extend(claim, *args, **kwargs)
            ended.wait(30)
            return lifecycle.LockExtension(True)

        monkeypatch.setattr(lifecycle, "extend_lock", slow)

    yield slowing
    ended.set()


def test_a_task_waiting_for_its_rate_token_gives_back_a_lock_it_cannot_keep_and_spends_no_token(
        make_settings, monkeypatch, log_lines, slow_extensions):
    # Given a rate-limited task whose lock extensions never land in time, and a token that takes
    # the worker until its lock has nearly lapsed to reach (writes queued behind slow ones)
    settings = make_settings(**LOCKS)
    _put(settings, "waiting", rate_key="site-w", rate_limit=1, rate_interval_seconds=60)
    slow_extensions("waiting")
    admit = rates.admit
    seen: list[tuple[str, bool]] = []

    def late_admit(*args, **kwargs):
        task = lifecycle.get_task("waiting")
        expiry = task.lock_expires_at
        # (either it is given back, or its lock lapses: whichever comes first)
        wait_until(lambda: lifecycle.get_task("waiting").status != "processing" or utcnow() > expiry
                   + timedelta(seconds=0.5), what="the claim to be given back or its lock to lapse")
        seen.append((lifecycle.get_task("waiting").status, utcnow() > expiry))
        return admit(*args, **kwargs)

    monkeypatch.setattr(rates, "admit", late_admit)

    # When a worker claims it and waits for its token
    [report] = run_batch(["waiting"], "w-1", settings, time.monotonic() + 60)

    # Then the heartbeat gave the claim back before its lock lapsed, the attempt not counted ...
    assert seen == [(TaskStatus.TODO.value, False)]
    assert report.outcome is TaskOutcome.NOT_CLAIMED and _ran == []
    task = lifecycle.get_task("waiting")
    assert (task.status, int(task.attempts), task.lock_owner, task.errors) == (TaskStatus.TODO.value, 0, None, None)
    # ... it spent no token of its group on a start it could not make ...
    assert rates.state("key:site-w").started_in_interval == 0
    # ... and the warning says it was waiting to start, and given back: no handler was told
    warnings = _warnings(log_lines, "waiting")
    assert len(warnings) == 1, warnings
    assert "waiting to start" in warnings[0] and "given back unstarted" in warnings[0]
    assert "handler is told" not in warnings[0]


def test_a_deferred_task_is_not_warned_about_as_a_running_handler(make_settings, monkeypatch, log_lines):
    # Given a key whose one token a task has taken, and a second task of the key whose give-back
    # (deferral) is slow to come back: the heartbeat beats meanwhile, on a claim already given back
    settings = make_settings(**LOCKS)
    _put(settings, "first", rate_key="site-d", rate_limit=1, rate_interval_seconds=60)
    _put(settings, "second", rate_key="site-d", rate_limit=1, rate_interval_seconds=60)
    assert run_batch(["first"], "w-1", settings, time.monotonic() + 60)[0].outcome is TaskOutcome.FINISHED
    release = lifecycle.release_unstarted

    def slow_answer(claim, *args, **kwargs):
        given_back = release(claim, *args, **kwargs)
        time.sleep(2 * settings.effective_heartbeat_seconds)  # its answer comes back late
        return given_back

    monkeypatch.setattr(lifecycle, "release_unstarted", slow_answer)

    # When a worker turns the second away (its start booked a minute on)
    [report] = run_batch(["second"], "w-1", settings, time.monotonic() + 60)

    # Then it is deferred, and no warning claims a handler of it was running or told
    assert report.outcome is TaskOutcome.DEFERRED and _ran == ["first"]
    assert _warnings(log_lines, "second") == []


def test_a_finished_task_is_not_warned_about_while_its_result_is_written(make_settings, monkeypatch, log_lines):
    # Given a task whose result write lands at once but whose answer comes back past the point
    # where its lock would have had to be extended
    settings = make_settings(**LOCKS)
    _put(settings, "done")
    complete = lifecycle.complete

    def slow_answer(claim, *args, **kwargs):
        outcome = complete(claim, *args, **kwargs)
        time.sleep(settings.effective_lock_seconds)  # its answer comes back late
        return outcome

    monkeypatch.setattr(lifecycle, "complete", slow_answer)

    # When a worker runs it
    [report] = run_batch(["done"], "w-1", settings, time.monotonic() + 60)

    # Then it finished, and nothing warns that its lock could not be kept or its claim was lost
    assert report.outcome is TaskOutcome.FINISHED
    assert _warnings(log_lines, "done") == []


def test_a_lock_that_lapsed_while_its_worker_was_alive_is_recorded_so(make_settings, log_lines, slow_extensions):
    # Given a task whose handler runs on, and whose lock extensions never land in time (every
    # other write lands)
    settings = make_settings(**LOCKS)
    _put(settings, "lapsed", payload={"until_taken_over": True})
    slow_extensions("lapsed")

    # When its worker runs it, and a second worker takes it over once its lock has lapsed
    reports: list = []
    first = threading.Thread(target=lambda: reports.extend(run_batch(["lapsed"], "w-1", settings,
                                                                     time.monotonic() + 60)))
    first.start()
    wait_until(lambda: lifecycle.get_task("lapsed").lock_owner == "w-1", what="the first worker's claim")
    taken: list = []
    wait_until(lambda: bool(taken.append(lifecycle.claim("lapsed", "w-2", settings)) or taken[-1]),
               what="the second worker's claim of the lapsed task")
    first.join()
    assert lifecycle.complete(taken[-1], settings).value == "finished"

    # Then attempt 1 is recorded as lost with what happened: its worker was alive, its lock
    # extensions did not land in time while its handler ran
    [lost] = lifecycle.get_task("lapsed").errors
    assert (lost.kind, int(lost.attempt)) == (ErrorKind.WORKER_LOST.value, 1)
    assert "its worker was alive" in lost.message and "lock extensions did not land" in lost.message, lost.message
    assert "while its handler is running" in lost.message
    # its worker's own warning named the handler as running
    warnings = _warnings(log_lines, "lapsed")
    assert warnings and all("handler is running" in w for w in warnings), warnings
    assert [r.outcome for r in reports] == [TaskOutcome.LOST]
    assert TaskModel.get("lapsed").lapse_attempt is None  # the note went with the record
