"""Concurrency limits (keys and task types): never more holders than the limit, even with
concurrent and killed workers; a full group's tasks wait out of the queue, so other keys go on;
a dead holder's place comes back when its lock expires; tasks without a group pay nothing."""

from __future__ import annotations

import collections
import json
import threading
import time
from datetime import timedelta

import botocore.client
import pytest
from coworker.data.models import GateModel, TaskModel, utcnow
from coworker.engine import control, dispatch, gates, lifecycle, submit
from coworker.engine.gates import Entry, Group
from coworker.engine.handlers import TaskContext, task_handler
from coworker.engine.heartbeat import Heartbeat
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import process_task, run_batch
from coworker_local import migration

from tests.support.doubles import RecordingInvoker

pytestmark = pytest.mark.both_backends

_running: collections.Counter[str] = collections.Counter()
_peak: collections.Counter[str] = collections.Counter()
_guard = threading.Lock()


@task_handler("test-limited-type")
@task_handler("test-limited")
def _limited(payload, context: TaskContext):
    """Counts how many tasks of each concurrency key run at this moment, and the peak."""
    group = payload["group"]
    with _guard:
        _running[group] += 1
        _peak[group] = max(_peak[group], _running[group])
    time.sleep(payload.get("seconds", 0.03))
    with _guard:
        _running[group] -= 1
    return {"ok": True}


def _put(settings, key, ckey=None, limit=None, type_="test-limited", ago=10.0, **payload):
    spec = TaskSpec(key=key, type=type_, payload={"group": ckey or type_, **payload}, concurrency_key=ckey,
                    concurrency_limit=limit)
    submit.put_task(spec, settings, now=utcnow() - timedelta(seconds=ago))


def _holding(group_name: str, at=None) -> int:
    gate = gates.read_gate(group_name)
    return gates.holding(gate, at or utcnow()) if gate else 0


def _enter(key, owner, settings, now=None):
    claim = lifecycle.claim(key, owner, settings, now=now)
    assert claim is not None
    groups = gates.groups_of(claim.task, control.read().limits)
    entry = gates.enter(claim, groups, now=now)
    return claim.__class__(claim.task, claim.owner, claim.attempt, groups), entry


def test_a_keyed_task_takes_a_place_while_it_runs_and_gives_it_back(make_settings):
    settings = make_settings()
    _put(settings, "k1", ckey="site-a", limit=2)
    task = lifecycle.get_task("k1")
    assert (task.concurrency_key, int(task.concurrency_limit)) == ("site-a", 2)

    claim, entry = _enter("k1", "w", settings)
    assert entry is Entry.ENTERED and _holding("key:site-a") == 1
    gates.leave(claim)
    assert _holding("key:site-a") == 0

    _put(settings, "k2", ckey="site-a", limit=2)
    [report] = run_batch(["k2"], "w2", settings, time.monotonic() + 30)
    assert report.outcome is TaskOutcome.FINISHED and _holding("key:site-a") == 0


def test_a_full_group_blocks_the_task_out_of_the_queue_and_a_release_wakes_it(make_settings):
    settings = make_settings()
    _put(settings, "first", ckey="tenant-1", limit=1, ago=20)
    _put(settings, "second", ckey="tenant-1", limit=1, ago=10)
    holder, entry = _enter("first", "w1", settings)
    assert entry is Entry.ENTERED

    [report] = run_batch(["second"], "w2", settings, time.monotonic() + 30)

    assert report.outcome is TaskOutcome.BLOCKED
    blocked = lifecycle.get_task("second")
    assert (blocked.status, blocked.status_shard, int(blocked.attempts)) == ("todo", "blocked#key:tenant-1", 0)
    assert blocked.lock_owner is None and blocked.to_dict()["blocked"] is True
    assert lifecycle.claim("second", "stale-hint", settings) is None  # nobody claims a blocked task
    assert "second" not in RecordingInvoker_keys(settings)  # nor does the coordinator see it

    gates.leave(holder)  # the holder finishes: the oldest waiter goes back to the queue

    woken = lifecycle.get_task("second")
    assert (woken.status, woken.status_shard) == ("todo", TaskModel.shard_value_of("second", "todo"))
    assert "second" in RecordingInvoker_keys(settings)
    [report] = run_batch(["second"], "w3", settings, time.monotonic() + 30)
    assert report.outcome is TaskOutcome.FINISHED


def RecordingInvoker_keys(settings) -> list[str]:  # noqa: N802 - reads like the double it wraps
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    return invoker.keys


def test_the_limit_holds_under_concurrent_workers_and_every_task_finishes(make_settings, monkeypatch):
    monkeypatch.setattr(gates, "SWEEP_INTERVAL_SECONDS", 0.0)
    settings = make_settings()
    keys = {"site-a": 3, "site-b": 1}
    tasks = [(f"{site}-{i:02d}", site) for site in keys for i in range(12)]
    for number, (key, site) in enumerate(tasks):
        _put(settings, key, ckey=site, limit=keys[site], ago=100 - number, seconds=0.15)
    # and a type limited to 2, its tasks without a key
    control.set_limit("test-limited-type", 2)
    typed = [(f"typed-{i:02d}", None) for i in range(10)]
    for number, (key, _) in enumerate(typed):
        _put(settings, key, type_="test-limited-type", ago=50 - number, seconds=0.15)
    tasks += typed
    _peak.clear()
    outcomes: collections.Counter[TaskOutcome] = collections.Counter()
    deadline = time.monotonic() + 180  # a ceiling for a loaded machine: the loop ends once all are finished
    finished: set[str] = set()  # (only these threads finish tasks: each report says so)

    def work(owner: str) -> None:
        while time.monotonic() < deadline:
            with _guard:
                open_keys = [key for key, _ in tasks if key not in finished]
            if not open_keys:
                return
            for key in open_keys:
                report = process_task(key, owner, settings, time.monotonic() + 30)
                with _guard:
                    outcomes[report.outcome] += 1
                    if report.outcome is TaskOutcome.FINISHED:
                        finished.add(key)
            gates.sweep(control.read().limits)  # what the coordinator does each tick

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert {lifecycle.get_task(key).status for key, _ in tasks} == {"finished"}
    assert 2 <= _peak["site-a"] <= 3  # never passed; and more than one ran at once
    assert _peak["site-b"] == 1
    assert 1 <= _peak["test-limited-type"] <= 2
    assert outcomes[TaskOutcome.BLOCKED] > 0  # the limit was really in the way
    assert _holding("key:site-a") == 0 and _holding("key:site-b") == 0 and _holding("type:test-limited-type") == 0


def test_a_dead_holders_place_comes_back_when_its_lock_expires(make_settings):
    settings = make_settings()
    _put(settings, "dead", ckey="api", limit=1, ago=600)
    _put(settings, "next", ckey="api", limit=1, ago=300)
    # The holder claimed and entered long ago, then died: its lock (and so its lease) has ended.
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    dead, entry = _enter("dead", "dead-worker", settings, now=past)
    assert entry is Entry.ENTERED and _holding("key:api", past) == 1 and _holding("key:api") == 0

    taker, entry = _enter("next", "w", settings)

    assert entry is Entry.ENTERED and _holding("key:api") == 1
    # The dead worker wakes up: its heartbeat is refused, so it learns its place is gone.
    assert gates.extend(dead, settings, utcnow()) is False
    assert gates.extend(taker, settings, utcnow()) is True


def test_a_leaving_holder_takes_the_places_of_dead_holders_with_it(make_settings):
    # Given a gate of 3 places: two holders died long ago (their leases ended), one lives
    settings = make_settings()
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    for number in range(2):
        _put(settings, f"dead-{number}", ckey="site", limit=3, ago=600)
        assert _enter(f"dead-{number}", f"dead-worker-{number}", settings, now=past)[1] is Entry.ENTERED
    _put(settings, "alive", ckey="site", limit=3, ago=300)
    alive, entry = _enter("alive", "w", settings)
    assert entry is Entry.ENTERED and len(gates.read_gate("key:site").holders.as_dict()) == 3

    # When the live one leaves (the gate was never full, so no entry pruned the dead ones)
    gates.leave(alive)

    # Then no place is left held: the dead holders' entries went with it
    assert gates.read_gate("key:site").holders.as_dict() == {}


def test_a_dead_holders_place_in_a_type_limit_comes_back_too(make_settings):
    settings = make_settings()
    control.set_limit("test-limited-type", 1)
    _put(settings, "dead", type_="test-limited-type", ago=600)
    _put(settings, "next", type_="test-limited-type", ago=300)
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    assert _enter("dead", "dead-worker", settings, now=past)[1] is Entry.ENTERED

    taker, entry = _enter("next", "w", settings)

    assert entry is Entry.ENTERED and [g.name for g in taker.groups] == ["type:test-limited-type"]
    assert _holding("type:test-limited-type") == 1


def test_the_sweep_wakes_a_waiter_when_a_holder_dies_without_a_release(make_settings):
    settings = make_settings()
    _put(settings, "holder", ckey="db", limit=1, ago=60)
    _put(settings, "waiter", ckey="db", limit=1, ago=30)
    _enter("holder", "w1", settings)
    _, entry = _enter("waiter", "w2", settings)
    assert entry is Entry.BLOCKED

    assert gates.sweep({}) == 0  # the holder is alive: nothing to wake
    assert lifecycle.get_task("waiter").status_shard == "blocked#key:db"
    # The holder dies; once its lock has expired, the coordinator's sweep lets the waiter go.
    later = utcnow() + timedelta(seconds=settings.effective_lock_seconds + 1)
    assert gates.sweep({}, now=later) == 1
    assert lifecycle.get_task("waiter").status_shard == TaskModel.shard_value_of("waiter", "todo")


def test_a_block_that_races_a_release_is_refused_and_the_task_enters_instead(make_settings):
    settings = make_settings()
    _put(settings, "a", ckey="x", limit=1, ago=20)
    _put(settings, "b", ckey="x", limit=1, ago=10)
    holder, _ = _enter("a", "w1", settings)
    claim = lifecycle.claim("b", "w2", settings)
    gates.leave(holder)  # a place frees after "b" read the gate as full

    assert gates._block(claim, Group("key:x", 1), utcnow()) is None
    assert lifecycle.get_task("b").status == "processing"  # untouched: it may enter now
    assert gates.enter(claim, [Group("key:x", 1)]) is Entry.ENTERED


def test_other_keys_and_unkeyed_tasks_are_not_held_back_by_a_full_key(make_settings):
    settings = make_settings(max_concurrency=10, batch_size=10)
    big = [f"big-{i:02d}" for i in range(30)]
    for number, key in enumerate(big):
        _put(settings, key, ckey="big.example", limit=1, ago=600 - number)  # the oldest work
    _put(settings, "small-0", ckey="small.example", limit=1, ago=60)
    _put(settings, "plain-0", ago=60)
    holder, _ = _enter(big[0], "w0", settings)

    # The coordinator hands out the oldest: the big key's tasks are turned away and leave the queue.
    reports = run_batch(big[1:], "w1", settings, time.monotonic() + 30)
    assert {r.outcome for r in reports} == {TaskOutcome.BLOCKED}

    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    assert sorted(invoker.keys) == ["plain-0", "small-0"]  # nothing of big.example in the way
    reports = run_batch(invoker.keys, "w2", settings, time.monotonic() + 30)
    assert {r.outcome for r in reports} == {TaskOutcome.FINISHED}
    gates.leave(holder)


def test_tasks_in_no_group_pay_nothing(make_settings, monkeypatch):
    settings = make_settings()
    _put(settings, "plain")
    control.cached(0)  # the process's view of the control record is fresh (as a warm worker's is)
    requests: list[tuple[str, str]] = []
    original = botocore.client.BaseClient._make_api_call

    def recorded(client, operation, params):
        requests.append((operation, json.dumps(params.get("Key") or params.get("TransactItems") or "")))
        return original(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recorded)
    [report] = run_batch(["plain"], "w", settings, time.monotonic() + 30)
    monkeypatch.undo()

    assert report.outcome is TaskOutcome.FINISHED
    on_the_task = [operation for operation, keys in requests if '"plain"' in keys]
    assert on_the_task == ["UpdateItem", "UpdateItem"]  # claim, complete
    # Besides: the type's run times, read and written once a minute per process (engine.durations).
    others = {keys for _, keys in requests if '"plain"' not in keys}
    assert all("control#durations#" in keys for keys in others), others
    assert not any("gate#" in keys for _, keys in requests)
    assert [item.key for item in GateModel.scan() if item.key.startswith("gate#")] == []


def test_a_type_limit_is_set_live_and_lifting_it_lets_the_blocked_go(make_settings):
    settings = make_settings()
    for number in range(3):
        _put(settings, f"t{number}", ago=30 - number)
    assert control.set_limit("test-limited", 1) and not control.set_limit("test-limited", 1)
    assert control.read().limits == {"test-limited": 1}
    holder, entry = _enter("t0", "w0", settings)
    assert entry is Entry.ENTERED
    assert [r.outcome for r in run_batch(["t1", "t2"], "w1", settings, time.monotonic() + 30)] == [
        TaskOutcome.BLOCKED, TaskOutcome.BLOCKED]

    assert control.set_limit("test-limited", None)
    assert control.read().limits == {}
    later = utcnow() + timedelta(seconds=gates.SWEEP_INTERVAL_SECONDS + 1)
    assert gates.sweep(control.read().limits, now=later) == 2
    reports = run_batch(["t1", "t2"], "w2", settings, time.monotonic() + 30)
    assert {r.outcome for r in reports} == {TaskOutcome.FINISHED}
    gates.leave(holder)


def test_a_task_in_two_groups_needs_a_place_in_both(make_settings):
    settings = make_settings()
    control.set_limit("test-limited", 1)
    _put(settings, "one", ckey="tenant-a", limit=5, ago=20)
    _put(settings, "two", ckey="tenant-b", limit=5, ago=10)
    holder, entry = _enter("one", "w1", settings)
    assert entry is Entry.ENTERED and [g.name for g in holder.groups] == ["type:test-limited", "key:tenant-a"]

    _, entry = _enter("two", "w2", settings)

    assert entry is Entry.BLOCKED
    assert lifecycle.get_task("two").status_shard == "blocked#type:test-limited"
    assert _holding("key:tenant-b") == 0  # the place it took there was given back


def test_the_heartbeat_extends_the_lease_with_the_lock(make_settings):
    settings = make_settings()
    _put(settings, "long", ckey="k", limit=1)
    claim, _ = _enter("long", "w", settings)
    before = gates.read_gate("key:k").holders.as_dict()[gates.holder_token(claim)]
    heartbeat = Heartbeat(settings)
    heartbeat.watch(claim, TaskContext(key="long", attempt=1, max_attempts=3, fencing_token="t",
                                       deadline=time.monotonic() + 30))
    time.sleep(0.01)
    heartbeat.beat()
    after = gates.read_gate("key:k").holders.as_dict()[gates.holder_token(claim)]
    lock = lifecycle.get_task("long").lock_expires_at
    assert after > before and after == int(lock.timestamp() * 1000)


def test_a_cancelled_blocked_task_ends_and_its_gate_stops_waiting(make_settings):
    settings = make_settings()
    _put(settings, "a", ckey="c", limit=1, ago=20)
    _put(settings, "b", ckey="c", limit=1, ago=10)
    holder, _ = _enter("a", "w1", settings)
    assert _enter("b", "w2", settings)[1] is Entry.BLOCKED
    assert lifecycle.cancel("b", settings).status == "ignored"
    gates.leave(holder)

    quiet = utcnow() + timedelta(seconds=gates.QUIET_SECONDS + 1)
    assert gates.sweep({}, now=quiet) == 0
    assert gates.read_gate("key:c").status_shard is None  # out of gates#waiting


def test_a_blocked_task_stays_blocked_through_a_reshard(make_settings):
    settings = make_settings()
    _put(settings, "a", ckey="m", limit=1, ago=20)
    _put(settings, "b", ckey="m", limit=1, ago=10)
    _enter("a", "w1", settings)
    assert _enter("b", "w2", settings)[1] is Entry.BLOCKED

    migration.reshard()

    assert lifecycle.get_task("b").status_shard == "blocked#key:m"


def test_the_worker_that_frees_a_place_runs_the_waiter_it_woke(make_settings):
    settings = make_settings()
    for number, key in enumerate(["w-a", "w-b", "w-c"]):
        _put(settings, key, ckey="serial", limit=1, ago=30 - number, seconds=1.0)
    _peak.clear()

    # One invocation, a thread per key: one runs, two are blocked; each release hands the next
    # waiter to the releasing thread, so the invocation ends with all three done, one at a time.
    reports = run_batch(["w-a", "w-b", "w-c"], "w", settings, time.monotonic() + 30)

    finished = [r.key for r in reports if r.outcome is TaskOutcome.FINISHED]
    assert sorted(finished) == ["w-a", "w-b", "w-c"]
    assert sum(r.outcome is TaskOutcome.BLOCKED for r in reports) == 2
    assert _peak["serial"] == 1


def test_a_task_cancelled_while_it_waits_to_enter_is_left_as_the_cancel_made_it(make_settings, monkeypatch):
    settings = make_settings()
    _put(settings, "a", ckey="q", limit=1, ago=20)
    _put(settings, "b", ckey="q", limit=1, ago=10)
    _enter("a", "w1", settings)
    claim = lifecycle.claim("b", "w2", settings)
    assert lifecycle.cancel("b", settings) is not None  # an operator cancels it after the claim
    blocks = []
    real = gates._block
    monkeypatch.setattr(gates, "_block", lambda *args: blocks.append(real(*args)) or blocks[-1])

    assert gates.enter(claim, [Group("key:q", 1)]) is Entry.LOST

    assert blocks == [Entry.LOST]  # told at once by the transaction, not after retries
    task = lifecycle.get_task("b")
    assert (task.status, task.status_shard) == ("ignored", TaskModel.shard_value_of("b", "ignored"))


def test_the_backlog_counts_tasks_waiting_for_a_place(make_settings):
    settings = make_settings()
    _put(settings, "a", ckey="bk", limit=1, ago=30)
    for key in ("b", "c"):
        _put(settings, key, ckey="bk", limit=1, ago=20)
    _enter("a", "w1", settings)
    assert [_enter(key, "w2", settings)[1] for key in ("b", "c")] == [Entry.BLOCKED, Entry.BLOCKED]

    report = dispatch.tick(settings, RecordingInvoker(), measure_backlog=True)

    assert report.backlog.blocked == 2 and report.backlog.due == 0
    assert gates.count_blocked(1) == (1, True)  # counted up to the cap


def test_the_heartbeat_moves_the_index_entry_only_when_the_lock_would_pass_it(make_settings):
    """The heartbeat keeps the due time it last wrote: its first beat moves the entry half a lock
    lifetime past the lock; a beat soon after moves the lock alone (1 write unit, not 3)."""
    settings = make_settings()
    _put(settings, "long")
    claim = lifecycle.claim("long", "w", settings)
    heartbeat = Heartbeat(settings)
    heartbeat.watch(claim, TaskContext(key="long", attempt=1, max_attempts=3, fencing_token="t",
                                       deadline=time.monotonic() + 30))
    time.sleep(0.01)
    heartbeat.beat()
    first = lifecycle.get_task("long")
    assert first.due_at == first.lock_expires_at + lifecycle.listing_horizon(settings)
    time.sleep(0.01)
    heartbeat.beat()
    second = lifecycle.get_task("long")
    assert second.lock_expires_at > first.lock_expires_at
    assert second.due_at == first.due_at
