"""Continuous dispatch: self-feeding workers, heartbeats, the supervisor's cadence and lease,
parallel fan-out. Contract tests: they run on DynamoDB Local and on moto."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from coworker.data import connection, layout
from coworker.data.layout import shard_of
from coworker.data.models import LeaseModel, utcnow
from coworker.engine import control, dispatch, lifecycle, schedules, slots, submit
from coworker.engine import feeder as feeder_module
from coworker.engine.dispatch import InProcessInvoker
from coworker.engine.feeder import Feeder
from coworker.engine.handlers import TaskContext, task_handler
from coworker.engine.outcomes import TaskOutcome, TaskSource
from coworker.engine.tasks import NewTask, TaskSpec
from coworker.engine.worker import WorkerRequest, run_invocation

from tests.support.doubles import RecordingInvoker
from tests.support.waits import wait_until

# The tests of the lifecycle contract (expired locks, killed or stalled workers, the supervisor's
# lease) run on DynamoDB Local and on moto (``both_backends``); the rest on DynamoDB Local, the
# default: the same code over the same writes, whose backends' differences those tests find.

_release = threading.Event()
_handler_saw_lost = threading.Event()
_held = threading.Event()


@task_handler("test-held-until-released")
def _held_until_released(payload: dict, context: TaskContext) -> str:
    """Runs until the test sets ``_held`` (at most 120 s)."""
    _held.wait(120)
    return "released"


@task_handler("test-wait-for-lost-claim")
def _wait_for_lost_claim(payload: dict, context: TaskContext) -> str:
    """Runs until its heartbeat reports the claim lost (or 20 s pass)."""
    end = time.monotonic() + 20
    while time.monotonic() < end:
        if context.claim_lost():
            _handler_saw_lost.set()
            return "stopped"
        time.sleep(0.05)
    return "never told"


def _put(settings, keys, type_="quick", **kw):
    past = utcnow() - timedelta(seconds=10)
    for key in keys:
        submit.put_task(TaskSpec(key=key, type=type_, **kw), settings, now=past)


def _reserved_request(settings, keys=()) -> WorkerRequest:
    slot = slots.free_slots(settings.worker_slots, 1)[0]
    token = slots.new_token()
    assert slots.reserve(slot, token, settings.reservation_seconds)
    return WorkerRequest(tuple(keys), slot, token)


def test_a_worker_with_a_slot_feeds_itself_until_the_backlog_is_done(make_settings):
    settings = make_settings(max_concurrency=3, batch_size=3)
    keys = [f"t{i:02d}" for i in range(25)]
    _put(settings, keys)
    reports = run_invocation(_reserved_request(settings, keys[:2]), "w", settings, time.monotonic() + 60)
    finished = [r for r in reports if r.outcome is TaskOutcome.FINISHED]
    assert sorted(r.key for r in finished) == keys
    assert {r.source for r in finished if r.key in keys[:2]} == {TaskSource.HINT}
    assert sum(r.source is TaskSource.FEED for r in finished) == 23
    # The slot is free again once the invocation returns.
    assert slots.free_slots(settings.worker_slots, 10) != []
    assert slots.count_busy_slots(settings.worker_slots) == 0


def test_a_worker_without_a_slot_runs_only_its_keys(settings):
    _put(settings, ["a", "b", "c"])
    reports = run_invocation(WorkerRequest(("a",)), "w", settings, time.monotonic() + 30)
    assert [(r.key, r.outcome) for r in reports] == [("a", TaskOutcome.FINISHED)]
    assert lifecycle.get_task("b").status == "todo"


def test_self_feeding_workers_do_not_all_race_for_the_head_item(make_settings):
    settings = make_settings(max_concurrency=12, batch_size=3)  # four slots
    keys = [f"t{i:03d}" for i in range(120)]
    _put(settings, keys)
    invoker = InProcessInvoker(settings)
    dispatch.start_workers(settings, invoker, ["t000"])  # one hint; the rest is found by feeding
    for _ in range(3):
        dispatch.start_workers(settings, invoker, ["nope"])  # three more workers, nothing to claim
    reports = invoker.wait()
    invoker.shutdown()
    finished = sorted(r.key for r in reports if r.outcome is TaskOutcome.FINISHED)
    assert finished == keys
    fed_conflicts = sum(r.outcome is TaskOutcome.NOT_CLAIMED and r.source is TaskSource.FEED for r in reports)
    assert fed_conflicts < len(keys) * 0.25, f"{fed_conflicts} failed claims for {len(keys)} tasks"


def _first_feed(settings, slot_number: int) -> tuple[Feeder, tuple | None, list[int]]:
    """A self-feeding worker of ``slot_number`` takes its first key: the feeder, the key, and
    how many index entries each of its queries read."""
    entries_read: list[int] = []

    def count(parsed, **_):
        entries_read.append(parsed.get("Count", 0))

    client = connection.shared_client()
    client.meta.events.register("after-call.dynamodb.Query", count)
    try:
        feeder = Feeder(settings, hints=(), self_feed=True, feed_until=time.monotonic() + 60,
                        slot_number=slot_number)
        first = feeder.next()
    finally:
        client.meta.events.unregister("after-call.dynamodb.Query", count)
    return feeder, first, entries_read


def test_a_feeding_worker_reads_one_window_when_its_own_shard_fills_it(make_settings):
    # Given two worker slots over four index shards (each shard holds one stripe's keys) and a
    # backlog much larger than a worker's window (4 x batch size = 8 keys)
    settings = make_settings(max_concurrency=4, batch_size=2, status_shards=4)
    _put(settings, [f"t{i:03d}" for i in range(200)])

    # When the worker of slot 0 looks for work
    feeder, first, entries_read = _first_feed(settings, slot_number=0)

    # Then it took a window of its own stripe's keys and read no index entry beyond them
    assert first is not None and first[1] is TaskSource.FEED
    assert {shard_of(key, 2) for key in [first[0], *feeder._seen]} == {0} and len(feeder._seen) == 8
    assert sum(entries_read) == 8


def test_a_feeding_worker_whose_own_shards_are_empty_reads_the_others_in_one_page(make_settings):
    # Given two worker slots over four index shards, and due work only in stripe 1's shards
    settings = make_settings(max_concurrency=4, batch_size=2, status_shards=4)
    _put(settings, [key for key in (f"t{i:03d}" for i in range(400)) if shard_of(key, 2) == 1][:100])

    # When the worker of slot 0 looks for work
    feeder, first, entries_read = _first_feed(settings, slot_number=0)

    # Then its own shard was empty, and the next one was read in one page of its whole limit
    # (about two windows of every stripe: 8 x 3), not a window at a time (each look: it helps
    # with two keys at a time, so it looked again at once)
    assert first is not None and first[1] is TaskSource.FEED
    assert 24 in entries_read and set(entries_read) <= {0, 24}
    assert {shard_of(key, 2) for key in feeder._seen} == {1}


def test_a_feeding_worker_whose_stripes_mix_in_the_shards_reads_one_page(make_settings):
    # Given three worker slots over four index shards (every shard holds keys of every stripe)
    settings = make_settings(max_concurrency=6, batch_size=2, status_shards=4)
    _put(settings, [f"t{i:03d}" for i in range(200)])

    # When the worker of slot 1 looks for work
    feeder, first, entries_read = _first_feed(settings, slot_number=1)

    # Then one query found its work (a page of about two windows of its stripe), not many small ones
    assert first is not None and first[1] is TaskSource.FEED
    assert len([n for n in entries_read if n]) == 1
    assert {shard_of(key, 3) for key in [first[0], *feeder._seen]} == {1} and len(feeder._seen) == 8


def test_a_feeding_worker_reads_only_the_shard_its_keys_are_in_where_stripes_share_shards(make_settings,
                                                                                          monkeypatch):
    # Given eight worker slots over four index shards (two stripes a shard) and a large backlog
    settings = make_settings(max_concurrency=16, batch_size=2, status_shards=4)
    monkeypatch.setattr(feeder_module, "_quiet_until", {})  # no shard known empty in this process
    _put(settings, [f"t{i:03d}" for i in range(300)])
    partitions: list[str] = []

    def record(params, **_):
        partitions.append(params["ExpressionAttributeValues"][":0"]["S"])

    client = connection.shared_client()
    client.meta.events.register("provide-client-params.dynamodb.Query", record)
    try:
        # When the worker of slot 5 looks for work
        feeder, first, _ = _first_feed(settings, slot_number=5)
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb.Query", record)

    # Then it queried shard 1 alone (5 % 4), and took a window of its own stripe's keys
    assert first is not None and partitions and {value.split("#")[1] for value in partitions} == {"1"}
    assert {shard_of(key, 8) for key in [first[0], *feeder._seen]} == {5} and len(feeder._seen) == 8


def test_workers_without_work_of_their_own_help_with_different_keys(make_settings):
    # Given three worker slots and ripe work, all of it in stripe 0
    settings = make_settings(max_concurrency=6, batch_size=2, status_shards=4)
    _put(settings, [key for key in (f"t{i:03d}" for i in range(400)) if shard_of(key, 3) == 0][:40])

    # When the workers of slots 1 and 2 look for work (neither claims yet)
    helped = {slot: _first_feed(settings, slot_number=slot)[0]._seen for slot in (1, 2)}

    # Then each took the keys it is the helper of, so they do not race each other for them
    assert helped[1] and helped[2] and not helped[1] & helped[2]
    assert all(feeder_module.helper_of(key, 3) == slot for slot, keys in helped.items() for key in keys)


def test_idle_workers_that_are_not_the_helpers_of_the_ripe_work_take_different_keys(make_settings):
    # Given six worker slots and ripe work, all of it in stripe 5 and helped by stripe 4
    settings = make_settings(max_concurrency=12, batch_size=2, status_shards=4)
    keys = [key for key in (f"t{i:04d}" for i in range(3000))
            if shard_of(key, 6) == 5 and feeder_module.helper_of(key, 6) == 4][:40]
    _put(settings, keys)

    # When the workers of slots 0 and 1, with nothing of their own to do, look for work
    taken = {slot: _first_feed(settings, slot_number=slot)[0]._seen for slot in (0, 1)}

    # Then both help, and not with the same keys (they would race each other for them)
    assert taken[0] and taken[1] and taken[0] <= set(keys) and taken[1] <= set(keys)
    assert not taken[0] & taken[1]


def test_a_worker_with_no_work_of_its_own_helps_in_the_other_shards_in_turn(make_settings, monkeypatch):
    # Given four worker slots over four shards (a shard a stripe), and ripe work in every shard
    # but worker 0's own
    settings = make_settings(max_concurrency=8, batch_size=2, status_shards=4)
    _put(settings, [key for key in (f"t{i:03d}" for i in range(120)) if shard_of(key, 4) != 0])
    monkeypatch.setattr(feeder_module, "_quiet_until", {})
    helped_in: list[int] = []
    original = feeder_module.index.due_in_shard

    def recording(status, now, limit, shard, page_size):
        for task in original(status, now, limit, shard, page_size):
            if status.value == "todo" and shard != 0 and helped_in[-1:] != [shard]:
                helped_in.append(shard)
            yield task

    monkeypatch.setattr(feeder_module.index, "due_in_shard", recording)

    # When worker 0 looks three times
    feeder = Feeder(settings, hints=(), self_feed=True, feed_until=time.monotonic() + 60, slot_number=0)
    taken = [feeder._fetch() for _ in range(3)]

    # Then each look helped in the next shard with work, not the same one again
    assert helped_in == [1, 2, 3] and all(taken)


def test_a_helper_goes_on_past_a_shard_whose_due_entries_it_cannot_run(make_settings, monkeypatch):
    # Given four worker slots over four shards, a paused type's task due in shard 1 (not parked
    # yet: the coordinator has not ticked) and runnable ripe work in shard 2 only
    settings = make_settings(max_concurrency=8, batch_size=2, status_shards=4)
    monkeypatch.setattr(feeder_module, "_quiet_until", {})
    keys = [f"t{i:03d}" for i in range(200)]
    _put(settings, [next(key for key in keys if shard_of(key, 4) == 1)], type_="slow")
    runnable = next(key for key in keys if shard_of(key, 4) == 2)
    _put(settings, [runnable])
    assert control.pause("slow")
    control._cache.invalidate()

    # When worker 0, with nothing of its own, looks for work
    feeder = Feeder(settings, hints=(), self_feed=True, feed_until=time.monotonic() + 60, slot_number=0)

    # Then it reads on to shard 2 and takes the task there, instead of ending its feeding
    assert feeder.next() == (runnable, TaskSource.FEED)


def test_a_feeding_worker_leaves_fresh_work_of_other_stripes_to_their_own_workers(make_settings):
    # Given two worker slots and work due just now, all of it in stripe 1
    settings = make_settings(max_concurrency=4, batch_size=2, status_shards=4)
    keys = [key for key in (f"t{i:03d}" for i in range(400)) if shard_of(key, 2) == 1][:20]
    put_at = utcnow()
    for key in keys:
        submit.put_task(TaskSpec(key=key, type="quick"), settings, now=put_at)

    # When the worker of slot 0 looks for work
    feeder, first, _ = _first_feed(settings, slot_number=0)

    # Then it took none of it until it had been due for a while (its own worker would have taken
    # it first), kept looking in paced steps instead of ending, and then helped
    assert first is not None and first[0] in keys and first[1] is TaskSource.FEED
    assert utcnow() - put_at >= timedelta(seconds=feeder_module.HELP_AFTER_SECONDS)
    unpaced = feeder_module.HELP_AFTER_SECONDS / feeder_module.FEED_POLL_SECONDS
    assert 2 <= feeder.pages <= unpaced + 1


def test_a_feeding_worker_ends_when_nothing_is_due(make_settings):
    settings = make_settings(max_concurrency=4, batch_size=2, status_shards=4)
    _put(settings, ["later"], run_at=utcnow() + timedelta(hours=1))
    feeder, first, _ = _first_feed(settings, slot_number=0)
    assert first is None and feeder.pages == 1


@pytest.mark.both_backends
def test_heartbeat_keeps_a_long_task_locked_past_its_lock_lifetime(make_settings):
    # 6-s locks, a beat every 0.5 s: a loaded machine may stall a beat for seconds, not for 5.5
    settings = make_settings(lock_seconds=6, heartbeat_seconds=0.5)
    _put(settings, ["long"], type_="test-held-until-released")
    _held.clear()
    result: list = []
    worker = threading.Thread(target=lambda: result.extend(
        run_invocation(WorkerRequest(("long",)), "a", settings, time.monotonic() + 120)))
    worker.start()
    try:
        wait_until(lambda: lifecycle.get_task("long").status == "processing", "the task claimed")
        first_expiry = lifecycle.get_task("long").lock_expires_at
        wait_until(lambda: utcnow() > first_expiry + timedelta(seconds=0.5), "past the lock first seen")
        assert lifecycle.claim("long", "b", settings) is None  # still held: no takeover
        task = lifecycle.get_task("long")
        assert task.lock_owner == "a" and task.lock_expires_at > first_expiry  # its beats extended it
    finally:
        _held.set()
        worker.join()
    assert [r.outcome for r in result] == [TaskOutcome.FINISHED]
    assert lifecycle.get_task("long").attempts == 1


@pytest.mark.both_backends
def test_a_heartbeat_that_finds_its_claim_taken_tells_the_handler(make_settings):
    settings = make_settings(lock_seconds=3, heartbeat_seconds=0.3)
    _handler_saw_lost.clear()
    _put(settings, ["c"], type_="test-wait-for-lost-claim")
    result: list = []
    worker = threading.Thread(target=lambda: result.extend(
        run_invocation(WorkerRequest(("c",)), "a", settings, time.monotonic() + 30)))
    worker.start()
    for _ in range(100):
        if lifecycle.get_task("c").status == "processing":
            break
        time.sleep(0.05)
    lifecycle.cancel("c", settings, reason="operator")
    worker.join(timeout=15)
    assert _handler_saw_lost.is_set()
    assert [r.outcome for r in result] == [TaskOutcome.LOST]
    task = lifecycle.get_task("c")
    assert task.status == "ignored" and task.errors[-1].kind == "cancelled"


@pytest.mark.both_backends
def test_a_stalled_worker_loses_its_lock_and_cannot_overwrite_the_newer_attempt(make_settings):
    settings = make_settings(lock_seconds=3, heartbeat_seconds=1)
    _put(settings, ["k"])
    stale = lifecycle.claim("k", "stalled", settings)  # no heartbeat: this worker stalls
    time.sleep(3.2)
    fresh = run_invocation(WorkerRequest(("k",)), "fresh", settings, time.monotonic() + 30)
    assert [r.outcome for r in fresh] == [TaskOutcome.FINISHED]
    assert not lifecycle.extend_lock(stale, settings)
    assert lifecycle.complete(stale, settings, result="stale") is lifecycle.RecordOutcome.LOST
    task = lifecycle.get_task("k")
    assert (task.status, task.attempts) == ("finished", 2) and task.result != "stale"


def test_a_worker_whose_slot_was_taken_over_stops_taking_work(make_settings):
    settings = make_settings(max_concurrency=1, batch_size=1, lock_seconds=3, heartbeat_seconds=0.3)
    _put(settings, ["a"], type_="slow", payload={"seconds": 1.0})
    _put(settings, ["b", "c"])
    request = _reserved_request(settings, ["a"])
    result: list = []
    worker = threading.Thread(target=lambda: result.extend(
        run_invocation(request, "w", settings, time.monotonic() + 30)))
    worker.start()
    wait_until(lambda: lifecycle.get_task("a").status == "processing", "the worker claimed its task", pause=0.05)
    # Someone else now holds the slot (as after a stall past the lease).
    LeaseModel(request.slot).update(actions=[LeaseModel.holder.set("intruder")])
    worker.join(timeout=15)
    assert [r.key for r in result] == ["a"]  # finished its task, fed on nothing more
    assert lifecycle.get_task("b").status == "todo"
    assert LeaseModel.get(request.slot).holder == "intruder"  # not released by the worker


def test_fan_out_sends_invocations_in_parallel(settings):
    class SlowInvoker:
        def __init__(self) -> None:
            self.active = self.peak = 0
            self.lock = threading.Lock()

        def invoke(self, request: WorkerRequest) -> None:
            with self.lock:
                self.active += 1
                self.peak = max(self.peak, self.active)
            time.sleep(0.2)
            with self.lock:
                self.active -= 1

    invoker = SlowInvoker()
    requests = [WorkerRequest((f"k{i}",)) for i in range(8)]
    assert dispatch.fan_out(invoker, requests) == 8
    assert invoker.peak > 1


def test_one_failed_invocation_does_not_stop_the_others(settings):
    sent: list[WorkerRequest] = []

    class FlakyInvoker:
        def invoke(self, request: WorkerRequest) -> None:
            if request.keys == ("bad",):
                raise RuntimeError("throttled")
            sent.append(request)

    requests = [WorkerRequest((key,)) for key in ("a", "bad", "c")]
    assert dispatch.fan_out(FlakyInvoker(), requests) == 2
    assert sorted(r.keys[0] for r in sent) == ["a", "c"]


class FakeClock:
    """A clock and stop event for the supervisor: waiting advances time, ticks cost time."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(round(seconds, 6))
        self.now += seconds
        return False

    def is_set(self) -> bool:
        return False


def test_supervisor_ticks_on_a_fixed_cadence_not_after_each_ticks_work(settings, monkeypatch):
    clock = FakeClock()
    starts: list[float] = []

    def slow_tick(*args, **kwargs):
        starts.append(clock.now)
        clock.now += 0.4  # each tick's work takes 0.4 s
        return dispatch.TickReport(0, 0, 0, 0, 0, 0, 0)

    monkeypatch.setattr(dispatch, "tick", slow_tick)
    supervisor = dispatch.Supervisor(settings.model_copy(update={"tick_seconds": 1.0}), None, clock=clock)
    reports = supervisor.run(lambda: 5.5 - clock.now, stop=clock)
    assert starts == [0.0, 1.0, 2.0, 3.0, 4.0]  # no drift: waits are 1 s minus the work
    assert len(reports) == 5 and set(clock.waits) == {0.6}


def test_supervisor_skips_missed_beats_after_an_overrun(settings, monkeypatch):
    clock = FakeClock()
    starts: list[float] = []
    costs = iter([2.5, 0.1, 0.1, 0.1])

    def tick(*args, **kwargs):
        starts.append(clock.now)
        clock.now += next(costs)
        return dispatch.TickReport(0, 0, 0, 0, 0, 0, 0)

    monkeypatch.setattr(dispatch, "tick", tick)
    supervisor = dispatch.Supervisor(settings.model_copy(update={"tick_seconds": 1.0}), None, clock=clock)
    supervisor.run(lambda: 5.5 - clock.now, stop=clock)
    assert starts == [0.0, 3.0, 4.0]  # beats at 1 and 2 were missed, the phase is kept


def test_the_supervisor_renews_its_lease_every_half_lease_and_stops_at_the_renewal_that_finds_it_taken(
        settings, monkeypatch):
    # Given a supervisor of 1-s ticks (a 10-s lease) whose ticks cost 0.1 s, and whose lease
    # another coordinator takes at 22 s (as after a stall)
    clock = FakeClock()
    starts: list[float] = []
    renewals: list[float] = []
    real_extend = slots.extend

    def tick(*args, **kwargs):
        starts.append(clock.now)
        if clock.now >= 22:
            LeaseModel(layout.COORDINATOR_LEASE).update(actions=[LeaseModel.holder.set("another")])
        clock.now += 0.1
        return dispatch.TickReport(0, 0, 0, 0, 0, 0, 0)

    def extend(key, *args, **kwargs):
        renewals.append(clock.now)
        return real_extend(key, *args, **kwargs)

    monkeypatch.setattr(dispatch, "tick", tick)
    monkeypatch.setattr(slots, "extend", extend)
    supervisor = dispatch.Supervisor(settings.model_copy(update={"tick_seconds": 1.0}), None, clock=clock)

    # When it runs for up to a minute
    supervisor.run(lambda: 60 - clock.now, stop=clock)

    # Then it wrote its lease every 5 s, not every tick, and stopped at the renewal after 22 s
    assert renewals == [5.0, 10.0, 15.0, 20.0, 25.0]
    assert starts[-1] == 24.0
    assert _lease_holder() == "another"  # (a lost lease is not released)


def _lease_holder() -> str | None:
    try:
        return LeaseModel.get(layout.COORDINATOR_LEASE, consistent_read=True).holder
    except LeaseModel.DoesNotExist:
        return None


@pytest.mark.both_backends
def test_only_one_supervisor_holds_the_lease(make_settings):
    settings = make_settings(tick_seconds=0.2, idle_exit=False)  # supervising an empty table
    first = dispatch.Supervisor(settings, InProcessInvoker(settings), holder="first")
    second = dispatch.Supervisor(settings, InProcessInvoker(settings), holder="second")
    stop = threading.Event()
    running = threading.Thread(target=first.run, args=(lambda: 60.0, stop))
    running.start()
    wait_until(lambda: _lease_holder() == "first", what="the first supervisor to take the lease")
    end = time.monotonic() + 1.0
    assert second.run(lambda: end - time.monotonic()) == []  # waited, never got the lease
    stop.set()
    running.join()
    assert _lease_holder() is None  # released on the way out
    ticks: list = []
    for _ in range(60):  # (each run may end before its first tick on a loaded machine)
        end = time.monotonic() + 0.5
        ticks = second.run(lambda end=end: end - time.monotonic())
        if ticks:
            break
    assert ticks != []  # taken
    assert LeaseModel.get(layout.COORDINATOR_LEASE).holder is None


def test_supervisor_creates_missing_slots_when_it_starts(make_settings):
    settings = make_settings(max_concurrency=30, batch_size=10, tick_seconds=0.2)
    bigger = settings.model_copy(update={"max_concurrency": 50})  # raised: two new slots
    assert slots.count_busy_slots(bigger.worker_slots) == 0
    assert len(slots.free_slots(bigger.worker_slots, 10)) == 3
    end = time.monotonic() + 0.3
    dispatch.Supervisor(bigger, InProcessInvoker(bigger)).run(lambda: end - time.monotonic())
    assert len(slots.free_slots(bigger.worker_slots, 10)) == 5


def test_slots_left_from_a_larger_concurrency_neither_hide_free_slots_nor_linger(make_settings):
    settings = make_settings(max_concurrency=50, batch_size=10, tick_seconds=0.2)  # five slots
    smaller = settings.model_copy(update={"max_concurrency": 10})  # now one
    token = slots.new_token()  # slot#0000 freed last: the four extra slots come first in the index
    assert slots.reserve("slot#0000", token, 30)
    assert slots.release("slot#0000", token)
    assert slots.free_slots(smaller.worker_slots, 1) == ["slot#0000"]
    end = time.monotonic() + 0.3
    dispatch.Supervisor(smaller, InProcessInvoker(smaller)).run(lambda: end - time.monotonic())
    left = [item.key for item in LeaseModel.scan(LeaseModel.key.startswith(layout.SLOT_KEY_PREFIX))]
    assert left == ["slot#0000"]


class _HeldWrite:
    """A write the table holds: calls of ``owner.name`` (those ``only`` picks) wait until
    ``let_go`` is set; ``ticks`` are the reports of a supervisor's ticks meanwhile."""

    def __init__(self, monkeypatch, owner, name: str, only=lambda *args: True) -> None:
        self.held, self.let_go = threading.Event(), threading.Event()
        self.calls: list[tuple] = []
        self.ticks: list = []
        real = getattr(owner, name)

        def hold(*args, **kwargs):
            self.calls.append(args)
            if only(*args):
                self.held.set()
                self.let_go.wait(120)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, hold)

    def count(self, report) -> None:
        if self.held.is_set() and not self.let_go.is_set():
            self.ticks.append(report)


@contextlib.contextmanager
def _supervising(settings, write: _HeldWrite, on_tick=None) -> Iterator[RecordingInvoker]:
    """A supervisor ticking in a thread, its workers recorded, stopped (and the write let go) on the way out."""
    invoker = RecordingInvoker()
    supervisor = dispatch.Supervisor(settings, invoker)

    def ticked(report, error):
        write.count(report)
        if on_tick is not None:
            on_tick(report)

    supervisor.on_tick = ticked
    stop = threading.Event()
    thread = threading.Thread(target=supervisor.run, args=(lambda: 60.0, stop))
    thread.start()
    try:
        yield invoker
    finally:
        write.let_go.set()
        stop.set()
        thread.join()


def test_a_held_slot_reservation_holds_no_tick_and_its_worker_starts_when_it_lands(make_settings, monkeypatch):
    # Given due work for two workers, and a table that holds the reservation of slot 0
    settings = make_settings(max_concurrency=4, batch_size=2, tick_seconds=0.2, idle_exit=False)
    _put(settings, [f"k{i}" for i in range(4)])
    write = _HeldWrite(monkeypatch, slots, "reserve", only=lambda slot, *args: slot == slots.slot_key(0))

    # When the coordinator supervises
    with _supervising(settings, write) as invoker:
        # Then it goes on ticking while the reservation is held, the other slot's worker started
        wait_until(lambda: len(write.ticks) >= 3, "three ticks while a reservation is held", attempts=150)
        assert [request.slot for request in invoker.requests] == [slots.slot_key(1)]
        # and work due meanwhile (ahead of the keys in flight) is not planned onto the slot whose
        # reservation is in flight
        for key in ("k4", "k5"):
            submit.put_task(TaskSpec(key=key, type="quick"), settings, now=utcnow() - timedelta(minutes=5))
        seen = len(write.ticks)
        wait_until(lambda: len(write.ticks) >= seen + 3, "three more ticks while it is held", attempts=150)
        assert [args[0] for args in write.calls].count(slots.slot_key(0)) == 1
        # and once the write lands, slot 0's worker starts with keys no other worker was given
        write.let_go.set()
        wait_until(lambda: len(invoker.requests) == 2, "the held reservation's worker to start")
    handed = [key for request in invoker.requests for key in request.keys]
    assert sorted(handed) == ["k0", "k1", "k2", "k3"]
    assert invoker.requests[1].slot == slots.slot_key(0)


def test_a_held_occurrence_put_holds_no_tick_and_its_task_is_handed_out_when_it_lands(make_settings, monkeypatch):
    # Given a schedule falling due, and a table that holds its occurrence's put
    settings = make_settings(max_concurrency=4, batch_size=2, tick_seconds=0.2, idle_exit=False)
    t0 = utcnow()
    schedules.put("every-minute", "rate(1 minute)", "UTC", "once", NewTask(type="quick"), now=t0 - timedelta(minutes=1))
    write = _HeldWrite(monkeypatch, schedules, "_run_occurrence")

    # When the coordinator supervises
    with _supervising(settings, write) as invoker:
        # Then it goes on ticking while the put is held
        wait_until(lambda: len(write.ticks) >= 3, "three ticks while the occurrence's put is held", attempts=150)
        assert invoker.requests == []
        # and once the put lands, the occurrence's task is handed out (once)
        write.let_go.set()
        wait_until(lambda: invoker.requests, "the occurrence's task to be handed out")
    handed = [key for request in invoker.requests for key in request.keys]
    assert len(handed) == 1 and handed[0].startswith("every-minute@")


def test_held_park_writes_hold_no_tick_and_the_other_types_start_meanwhile(make_settings, monkeypatch):
    # Given a paused type's tasks at the head of the queue, a table that holds their park writes,
    # and tasks of another type behind them
    settings = make_settings(max_concurrency=4, batch_size=2, tick_seconds=0.2, idle_exit=False)
    for key in ("p0", "p1"):
        submit.put_task(TaskSpec(key=key, type="slow"), settings, now=utcnow() - timedelta(minutes=5))
    control.pause("slow")
    write = _HeldWrite(monkeypatch, control, "park")
    parked: list[int] = []

    # When the coordinator supervises, and the other type's tasks arrive
    with _supervising(settings, write, on_tick=lambda report: parked.append(report.parked if report else 0)) as invoker:
        wait_until(write.held.is_set, "a park write to be held")
        _put(settings, ["q0", "q1"])
        # Then it goes on ticking while the parks are held, and hands out the other type's tasks
        wait_until(lambda: len(write.ticks) >= 3, "three ticks while the parks are held", attempts=150)
        wait_until(lambda: sorted(invoker.keys) == ["q0", "q1"], "the other type's tasks to be handed out")
        # and once the writes land, both are parked (and counted once)
        write.let_go.set()
        wait_until(lambda: sum(parked) == 2, "both parks to be counted")
    assert {lifecycle.get_task(key).status_shard.startswith("held#slow#") for key in ("p0", "p1")} == {True}
    assert "p0" not in invoker.keys and "p1" not in invoker.keys
