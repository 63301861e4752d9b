"""Batch counters move with every terminal transition, in the task's own transaction."""

from __future__ import annotations

from datetime import timedelta

import pytest
from coworker import batches, lifecycle
from coworker.lifecycle import PutOutcome, RecordOutcome, TaskSpec
from coworker.model import BatchModel, ErrorKind, TaskModel, TaskStatus, utcnow

# The lifecycle contract: every test runs on DynamoDB Local and on moto.
pytestmark = pytest.mark.both_backends


def _progress(batch_id="b1"):
    p = batches.get_batch(batch_id)
    return p.total, p.finished, p.ignored, p.open, p.done


def _put(settings, key, batch_id="b1", now=None, **kw):
    return lifecycle.put_task(TaskSpec(key=key, type="quick", batch_id=batch_id, **kw), settings, now=now)


def test_put_counts_only_created_tasks(settings):
    assert _put(settings, "a") is PutOutcome.CREATED
    assert _put(settings, "a") is PutOutcome.EXISTS
    created = batches.put_tasks(
        [lifecycle.new_task(TaskSpec(key=k, type="quick", batch_id="b1"), settings, utcnow()) for k in "abc"],
        "b1",
    )
    assert created == [False, True, True]
    assert _progress() == (3, 0, 0, 3, False)
    assert TaskModel.get("b").status == "todo"


def test_put_batch_in_chunks_over_the_transaction_limit(settings):
    tasks = [lifecycle.new_task(TaskSpec(key=f"t{i}", type="quick", batch_id="big"), settings, utcnow())
             for i in range(230)]
    assert all(batches.put_tasks(tasks, "big"))
    assert _progress("big")[0] == 230
    # Re-submitting the same batch counts nothing twice.
    assert not any(batches.put_tasks(tasks, "big"))
    assert _progress("big")[0] == 230


def test_complete_fail_cancel_retry_and_reap_move_the_counters(settings):
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    for key in ("done", "bad", "cancelled", "lost", "plain"):
        _put(settings, key, max_attempts=1, now=past)
    lifecycle.put_task(TaskSpec(key="solo", type="quick"), settings)  # no batch: untouched counters

    claim = lifecycle.claim("done", "w", settings)
    assert lifecycle.complete(claim, settings, result={"ok": 1}) is RecordOutcome.FINISHED
    assert _progress() == (5, 1, 0, 4, False)

    claim = lifecycle.claim("bad", "w", settings)
    error = lifecycle.error_record(1, ErrorKind.BUSINESS, "no", utcnow())
    assert lifecycle.fail(claim, settings, error) is RecordOutcome.IGNORED
    assert _progress() == (5, 1, 1, 3, False)

    assert lifecycle.cancel("cancelled", settings).status == TaskStatus.IGNORED.value
    assert lifecycle.cancel("cancelled", settings) is None  # already ignored: nothing moves
    assert _progress() == (5, 1, 2, 2, False)

    claim = lifecycle.claim("lost", "w", settings, now=past)
    assert lifecycle.reap_lost("lost", 1, claim.task.batch_id, settings) is True
    assert lifecycle.reap_lost("lost", 1, claim.task.batch_id, settings) is False
    assert _progress() == (5, 1, 3, 1, False)

    retried = lifecycle.retry("bad")
    assert retried.status == "todo" and retried.attempts == 0 and retried.errors
    assert _progress() == (5, 1, 2, 2, False)

    for key in ("bad", "plain"):
        claim = lifecycle.claim(key, "w", settings)
        lifecycle.complete(claim, settings)
    lifecycle.cancel("solo", settings)
    assert _progress() == (5, 3, 2, 0, True)


def test_stale_worker_moves_no_counter(settings):
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    _put(settings, "k", max_attempts=3, now=past)
    stale = lifecycle.claim("k", "old", settings, now=past)
    fresh = lifecycle.claim("k", "new", settings)
    assert lifecycle.complete(stale, settings) is RecordOutcome.LOST
    assert _progress() == (1, 0, 0, 1, False)
    assert lifecycle.complete(fresh, settings) is RecordOutcome.FINISHED
    assert _progress() == (1, 1, 0, 0, True)


def test_missing_batch(settings):
    with pytest.raises(batches.BatchNotFoundError):
        batches.get_batch("nope")
    assert list(BatchModel.scan(BatchModel.key.startswith("batch#"))) == []


def test_a_redrive_racing_a_move_to_ignored_still_takes_it_back_from_the_ignored_count(settings, monkeypatch):
    """retry reads the status, then writes: a task that moved failed -> processing -> ignored in
    between must be taken back from the batch's ignored count, or the batch never completes."""
    _put(settings, "r", max_attempts=2)
    error = lifecycle.error_record(1, ErrorKind.SYSTEM, "boom", utcnow())
    assert lifecycle.fail(lifecycle.claim("r", "w", settings), settings, error) is RecordOutcome.FAILED
    real_membership = batches.membership
    reads = []

    def read_then_race(key):
        answer = real_membership(key)
        if not reads:  # the first read says "failed"; the task is ignored right after it
            last = lifecycle.error_record(2, ErrorKind.SYSTEM, "boom", utcnow())
            assert lifecycle.fail(lifecycle.claim("r", "w2", settings), settings, last) is RecordOutcome.IGNORED
        reads.append(answer)
        return answer

    monkeypatch.setattr(batches, "membership", read_then_race)
    assert _progress() == (1, 0, 0, 1, False)
    redriven = lifecycle.retry("r")
    assert redriven is not None and redriven.status == "todo"
    assert [status for _, status in reads] == ["failed", "ignored"]
    assert _progress() == (1, 0, 0, 1, False)  # ignored went 1 -> 0 with the redrive
    claim = lifecycle.claim("r", "w3", settings)
    assert lifecycle.complete(claim, settings) is RecordOutcome.FINISHED
    assert _progress() == (1, 1, 0, 0, True)


def test_a_redriven_attempt_1_is_not_the_old_attempt_1(settings):
    """Attempts restart at 1 after a redrive; the generation keeps the fencing token unique, even
    for a worker that reuses its owner id."""
    _put(settings, "g", max_attempts=1)
    old = lifecycle.claim("g", "same-owner", settings)
    timeout = lifecycle.error_record(1, ErrorKind.TIMEOUT, "too slow", utcnow())
    assert lifecycle.fail(old, settings, timeout) is RecordOutcome.IGNORED  # its handler still runs
    lifecycle.retry("g")
    new = lifecycle.claim("g", "same-owner", settings)
    assert (new.attempt, new.generation, old.attempt, old.generation) == (1, 1, 1, 0)
    assert new.fencing_token == "same-owner:1.r1" and old.fencing_token == "same-owner:1"
    assert lifecycle.complete(old, settings, result={"from": "old"}) is RecordOutcome.LOST
    assert lifecycle.extend_lock(old, settings) is False
    assert lifecycle.complete(new, settings, result={"from": "new"}) is RecordOutcome.FINISHED
    assert lifecycle.get_task("g").result == {"from": "new"}


def test_outcomes_spread_over_the_counter_shards_and_sum_exactly(settings):
    keys = [f"w{i:03d}" for i in range(40)]
    tasks = [lifecycle.new_task(TaskSpec(key=k, type="quick", batch_id="wide"), settings, utcnow()) for k in keys]
    batches.put_tasks(tasks, "wide")
    for key in keys[:30]:
        claim = lifecycle.claim(key, "w", settings)
        lifecycle.complete(claim, settings, result=None)
    for key in keys[30:34]:
        lifecycle.cancel(key, settings)
    assert _progress("wide") == (40, 30, 4, 6, False)
    # the outcomes went to several items, each keyed by a hash of the task key: no single hot item
    items = {item.key: item for item in BatchModel.scan(BatchModel.key.startswith("batch#wide"))}
    shards = {key for key in items if key != "batch#wide"}
    assert len(shards) >= 5 and all(key.rsplit("#", 1)[1].isdigit() for key in shards)
    assert int(items["batch#wide"].total) == 40 and not items["batch#wide"].finished
    for key in keys[:30]:
        assert batches.counter_key("wide", key) in shards


def test_a_batch_counted_on_its_head_item_by_an_earlier_release_still_adds_up(settings):
    _put(settings, "old-1", batch_id="legacy")
    _put(settings, "old-2", batch_id="legacy")
    BatchModel("batch#legacy").update(actions=[BatchModel.finished.add(1)])  # as releases before sharding did
    claim = lifecycle.claim("old-2", "w", settings)
    lifecycle.complete(claim, settings, result=None)
    assert _progress("legacy") == (2, 2, 0, 0, True)
