"""Follow-ups put into their parent's batch (``inherit_batch``) whose keys already exist: the
batch counts each task of it exactly once, whatever the existing task was (outside any batch, in
another batch, in this batch and finished, asked for by two parents), and however often the
parent's completion is tried. ``open`` never goes below zero, ``finished`` never passes
``total``, and the batch's completion fires once.

A key that exists is left as it is (``put if new``): the follow-up is not created, so it is not
counted, and the existing task stays in its own batch, or none. Its put cancels the transaction
it is in, which is then tried without it: a cancelled transaction must leave nothing in the
stream. (On moto, the local runtime's fallback database, it did: the writes moto applies before
cancelling were undone but their stream records stayed, and the follower counted the parent's
completion twice, "total 1 / finished 2 / open -1".)"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from coworker.data import writes
from coworker.data.models import TaskModel, utcnow
from coworker.engine import batches, callbacks, dispatch, lifecycle, progress
from coworker.engine.handlers import task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import NewTask, TaskSpec
from coworker.engine.worker import process_task, run_batch
from coworker.errors import StorageError

from tests.support.doubles import RecordingInvoker

# The lifecycle contract: every test runs on DynamoDB Local and on moto.
pytestmark = pytest.mark.both_backends

SPAWN = "test-spawn-into-batch"
COMPLETE = {"complete": NewTask(type="quick")}


@task_handler(SPAWN)
def spawn_into_batch(payload: dict, context) -> dict:
    """Spawn a follow-up in this task's batch for each key of the payload."""
    for key in payload["keys"]:
        context.spawn("quick", {"from": context.key}, key=key, inherit_batch=True)
    return {"spawned": len(payload["keys"])}


def _put(settings, key, batch_id=None, task_type="quick", payload=None, named=None, max_attempts=3):
    spec = TaskSpec(key=key, type=task_type, payload=payload, batch_id=batch_id, max_attempts=max_attempts)
    task = lifecycle.new_task(spec, settings, utcnow() - timedelta(seconds=30))
    if batch_id is None:
        assert writes.put_if_new(task, key)
    else:
        assert batches.put_tasks([task], batch_id, callbacks=named) == [True]


def _run(settings, *keys):
    reports = run_batch(list(keys), "w", settings, time.monotonic() + 60)
    assert [report.outcome for report in reports] == [TaskOutcome.FINISHED] * len(keys)


def _counts(settings, batch_id):
    progress.catch_up(settings)  # what the coordinator's follow does every tick
    p = batches.get_batch(batch_id)
    assert p.open >= 0 and p.finished + p.ignored <= p.total, p
    return p.total, p.finished, p.ignored, p.open, p.done


def _fires_complete_once(settings, batch_id, counts) -> None:
    """The coordinator's ticks fire the batch's completion once, with its exact counts."""
    invoker = RecordingInvoker()
    made = sum(dispatch.tick(settings, invoker).callbacks for _ in range(3))
    assert made == 1
    complete = TaskModel.get(callbacks.callback_key(batch_id, "complete"), consistent_read=True)
    batch = complete.payload["batch"]
    assert (batch["total"], batch["finished"], batch["ignored"], batch["done"]) == (*counts, True)
    assert "complete" in batches.get_batch(batch_id).fired


def _stream_records_of(settings, *keys) -> list[tuple[str, str, str | None]]:
    """(event, key, status written) of every stream record of ``keys``, in order, read from the
    start of each shard."""
    follower = progress.follower(settings)
    arn, streams = follower.stream_arn(), follower._streams()
    found = []
    for shard in follower._shards(arn):
        iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard,
                                              ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
        while iterator:
            answer = streams.get_records(ShardIterator=iterator)
            for record in answer["Records"]:
                image = record["dynamodb"].get("NewImage", {})
                if image.get("key", {}).get("S") in keys:
                    found.append((record["eventName"], image["key"]["S"], image.get("status", {}).get("S")))
            if not answer["Records"]:
                break
            iterator = answer.get("NextShardIterator")
    return found


def test_a_cancelled_transaction_leaves_no_record_in_the_stream(settings) -> None:
    """A completion's transaction cancelled by a follow-up key that exists writes nothing, so the
    stream, which the batch counts follow, shows only the transaction that then went through."""
    _put(settings, "outside")
    _put(settings, "parent", "b")
    claim = lifecycle.claim("parent", "w", settings)
    assert claim is not None
    follow_ups = [TaskSpec(key=key, type="quick", batch_id="b", parent="parent") for key in ("parent/1", "outside")]
    assert lifecycle.complete(claim, settings, follow_ups=follow_ups) is lifecycle.RecordOutcome.FINISHED
    assert _stream_records_of(settings, "parent", "parent/1", "outside") == [
        ("INSERT", "outside", "todo"), ("INSERT", "parent", "todo"), ("MODIFY", "parent", "processing"),
        ("INSERT", "parent/1", "todo"), ("MODIFY", "parent", "finished")]
    assert _counts(settings, "b") == (2, 1, 0, 1, False)


def _batch_of(key):
    return TaskModel.get(key, consistent_read=True).batch_id


@pytest.mark.parametrize("existing_status", ["todo", "finished"])
def test_a_follow_up_whose_key_exists_outside_any_batch_is_not_counted(settings, existing_status) -> None:
    _put(settings, "outside")
    if existing_status == "finished":
        _run(settings, "outside")
    _put(settings, "parent", "b", SPAWN, {"keys": ["outside"]}, COMPLETE)
    assert _counts(settings, "b") == (1, 0, 0, 1, False)
    _run(settings, "parent")
    assert _counts(settings, "b") == (1, 1, 0, 0, True)
    assert _batch_of("outside") is None
    if existing_status == "todo":  # it runs outside the batch: the batch does not move
        _run(settings, "outside")
        assert _counts(settings, "b") == (1, 1, 0, 0, True)
    _fires_complete_once(settings, "b", (1, 1, 0))


def test_a_follow_up_whose_key_exists_in_another_batch_stays_counted_there(settings) -> None:
    _put(settings, "theirs", "other")
    _put(settings, "parent", "b", SPAWN, {"keys": ["theirs", "new"]}, COMPLETE)
    _run(settings, "parent")
    assert _counts(settings, "b") == (2, 1, 0, 1, False)
    assert _counts(settings, "other") == (1, 0, 0, 1, False)
    assert (_batch_of("theirs"), _batch_of("new")) == ("other", "b")
    _run(settings, "theirs", "new")
    assert _counts(settings, "b") == (2, 2, 0, 0, True)
    assert _counts(settings, "other") == (1, 1, 0, 0, True)
    _fires_complete_once(settings, "b", (2, 2, 0))


def test_a_follow_up_whose_key_is_a_finished_task_of_the_same_batch_is_not_counted_again(settings) -> None:
    _put(settings, "sibling", "b", named=COMPLETE)
    _put(settings, "parent", "b", SPAWN, {"keys": ["sibling", "parent/new"]})
    _run(settings, "sibling")
    assert _counts(settings, "b") == (2, 1, 0, 1, False)
    _run(settings, "parent")
    assert _counts(settings, "b") == (3, 2, 0, 1, False)
    _run(settings, "parent/new")
    assert _counts(settings, "b") == (3, 3, 0, 0, True)
    _fires_complete_once(settings, "b", (3, 3, 0))


def test_a_follow_up_that_names_an_open_task_of_the_same_batch_is_not_counted_again(settings) -> None:
    _put(settings, "sibling", "b", named=COMPLETE)
    _put(settings, "parent", "b", SPAWN, {"keys": ["sibling"]})
    _run(settings, "parent")
    assert _counts(settings, "b") == (2, 1, 0, 1, False)
    _run(settings, "sibling")
    assert _counts(settings, "b") == (2, 2, 0, 0, True)
    _fires_complete_once(settings, "b", (2, 2, 0))


def test_one_follow_up_asked_for_by_two_parents_is_counted_once(settings) -> None:
    for parent in ("p1", "p2"):
        _put(settings, parent, "b", SPAWN, {"keys": ["shared", f"{parent}/own"]}, COMPLETE)
    _run(settings, "p1")
    assert _counts(settings, "b") == (4, 1, 0, 3, False)
    _run(settings, "p2")
    assert _counts(settings, "b") == (5, 2, 0, 3, False)
    _run(settings, "shared")
    _run(settings, "p1/own", "p2/own")
    assert _counts(settings, "b") == (5, 5, 0, 0, True)
    _fires_complete_once(settings, "b", (5, 5, 0))


def test_many_existing_and_new_follow_ups_in_one_completion_count_exactly(settings) -> None:
    """Existing keys among new ones, in the completion's own transaction: 13 tasks of the batch."""
    _put(settings, "outside")
    _put(settings, "theirs", "other")
    _put(settings, "sibling", "b", named=COMPLETE)
    new = [f"parent/{n}" for n in range(10)]
    keys = ["outside", *new[:5], "theirs", "sibling", *new[5:], "parent"]  # its own key is skipped
    _put(settings, "parent", "b", SPAWN, {"keys": keys})
    _run(settings, "sibling")
    _run(settings, "parent")
    assert _counts(settings, "b") == (12, 2, 0, 10, False)
    _run(settings, *new)
    assert _counts(settings, "b") == (12, 12, 0, 0, True)
    _fires_complete_once(settings, "b", (12, 12, 0))


@pytest.mark.parametrize("new", [3, 120], ids=["folded", "chunked-then-folded"])
def test_a_parent_retried_after_its_follow_ups_were_put_counts_each_once(settings, monkeypatch, new) -> None:
    """The completion fails after (some of) its follow-ups were put; the retry finds them, with
    an existing task outside the batch among them."""
    _put(settings, "outside")
    keys = ["outside", *(f"parent/{n}" for n in range(new))]
    _put(settings, "parent", "b", SPAWN, {"keys": keys}, COMPLETE)
    calls = []
    real = writes.update_task_and_put

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise StorageError("DynamoDB is throttling")
        return real(*args, **kwargs)

    monkeypatch.setattr(writes, "update_task_and_put", failing_once)
    report = process_task("parent", "w-1", settings, deadline=time.monotonic() + 60)
    assert report.outcome is TaskOutcome.FAILED
    put_before = max(0, new + 1 - writes.FOLD_ROOM)  # "outside" is among the first ones, not put
    assert _counts(settings, "b") == (1 + max(0, put_before - 1), 0, 0, 1 + max(0, put_before - 1), False)
    _run(settings, "parent")
    assert _counts(settings, "b") == (1 + new, 1, 0, new, False)
    _run(settings, *keys[1:])
    assert _counts(settings, "b") == (1 + new, 1 + new, 0, 0, True)
    assert _batch_of("outside") is None
    _fires_complete_once(settings, "b", (1 + new, 1 + new, 0))
