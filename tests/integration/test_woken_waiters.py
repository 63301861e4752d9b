"""A task that waited for a place in its concurrency group goes back to the head of the queue,
ahead of newer work, however it gets back: woken by a holder leaving, by the sweep once its
type's limit is lifted, or given back because the gate kept changing while it tried to enter."""

from __future__ import annotations

import dataclasses
import time
from datetime import timedelta

import pytest
from coworker.data import index
from coworker.data.models import TaskStatus, utcnow
from coworker.engine import control, gates, lifecycle, submit
from coworker.engine.gates import Entry
from coworker.engine.handlers import TaskContext, task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch

pytestmark = pytest.mark.both_backends

NEWER = 30  # due tasks put after the waiter


@task_handler("test-woken-limited")
def _limited(payload, context: TaskContext) -> dict:
    return {"ok": True}


def _enter(key: str, owner: str, settings):
    """Claim ``key`` and enter its gates: the claim with its groups, and the entry."""
    claim = lifecycle.claim(key, owner, settings)
    assert claim is not None
    groups = gates.groups_of(claim.task, control.read().limits)
    entry = gates.enter(claim, groups)
    return dataclasses.replace(claim, groups=groups), entry


def _put(settings, key: str, ago: float, ckey: str | None = None, type_: str = "test-woken-limited") -> None:
    spec = TaskSpec(key=key, type=type_, payload={"group": ckey or type_}, concurrency_key=ckey,
                    concurrency_limit=1 if ckey else None)
    submit.put_task(spec, settings, now=utcnow() - timedelta(seconds=ago))


def _put_newer(settings) -> None:
    for number in range(NEWER):
        _put(settings, f"newer-{number:02}", ago=60 - number, type_="quick")


def _queue_head(count: int = 3) -> list[str]:
    return [task.key for task in index.due(TaskStatus.TODO, utcnow(), count)]


def test_a_waiter_woken_by_a_leaving_holder_is_first_in_the_queue(make_settings):
    # Given a waiter blocked behind a holder, and many newer tasks due
    settings = make_settings()
    _put(settings, "holder", ago=120, ckey="site")
    _put(settings, "waiter", ago=100, ckey="site")
    holder, entry = _enter("holder", "w1", settings)
    assert entry is Entry.ENTERED
    assert [r.outcome for r in run_batch(["waiter"], "w2", settings, time.monotonic() + 30)] == [
        TaskOutcome.BLOCKED]
    _put_newer(settings)
    assert _queue_head() == ["newer-00", "newer-01", "newer-02"]

    # When the holder leaves
    assert gates.leave(holder) == ["waiter"]

    # Then the waiter is due first, ahead of every newer task
    assert _queue_head() == ["waiter", "newer-00", "newer-01"]


def test_waiters_let_go_when_a_type_limit_is_lifted_are_first_in_the_queue(make_settings):
    settings = make_settings()
    _put(settings, "holder", ago=120)
    _put(settings, "waiter-a", ago=110)
    _put(settings, "waiter-b", ago=100)
    assert control.set_limit("test-woken-limited", 1)
    holder, entry = _enter("holder", "w1", settings)
    assert entry is Entry.ENTERED
    assert [r.outcome for r in run_batch(["waiter-a", "waiter-b"], "w2", settings, time.monotonic() + 30)] == [
        TaskOutcome.BLOCKED, TaskOutcome.BLOCKED]
    _put_newer(settings)

    assert control.set_limit("test-woken-limited", None)
    later = utcnow() + timedelta(seconds=gates.SWEEP_INTERVAL_SECONDS + 1)
    assert gates.sweep(control.read().limits, now=later) == 2

    assert _queue_head() == ["waiter-a", "waiter-b", "newer-00"]
    gates.leave(holder)


def test_a_waiter_given_back_because_the_gate_kept_changing_keeps_its_place(make_settings, monkeypatch):
    # Given a waiter whose group is full, and many newer tasks due
    settings = make_settings()
    _put(settings, "holder", ago=120, ckey="site")
    _put(settings, "waiter", ago=100, ckey="site")
    holder, entry = _enter("holder", "w1", settings)
    assert entry is Entry.ENTERED
    _put_newer(settings)
    # and a holder that leaves just as the waiter blocks, and takes its place again right after,
    # every time: the block's transaction finds the gate not full, the next entry finds it full
    block = gates._block
    races = []

    def racing_block(claim, group, now):
        gates.leave(holder)
        try:
            return block(claim, group, now)
        finally:
            assert gates.enter(holder, holder.groups) is Entry.ENTERED
            races.append(claim.key)

    monkeypatch.setattr(gates, "_block", racing_block)

    # When the waiter is claimed and tries to enter until it gives up
    claim = lifecycle.claim("waiter", "w2", settings)
    assert claim is not None
    entry = gates.enter(claim, gates.groups_of(claim.task, {}))

    # Then it is given back, not counted, at the head of the queue (where it stood), not behind
    # the newer tasks
    assert entry is Entry.GIVEN_BACK and len(races) == gates.RACE_RETRIES
    task = lifecycle.get_task("waiter")
    assert (task.status, int(task.attempts), task.lock_owner) == ("todo", 0, None)
    assert task.due_at == lifecycle.head_of_queue(task, utcnow())
    assert _queue_head() == ["waiter", "newer-00", "newer-01"]
    monkeypatch.undo()
    gates.leave(holder)
