"""Batch counters move with every transition, counted once from the table's stream."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from coworker.data import writes
from coworker.data.layout import COUNTED_THROUGH_KEY
from coworker.data.models import BatchModel, ErrorKind, StreamCheckpointModel, TaskModel, TaskStatus, utcnow
from coworker.engine import batches, lifecycle, progress, submit
from coworker.engine.lifecycle import RecordOutcome
from coworker.engine.submit import PutOutcome
from coworker.engine.tasks import TaskSpec
from coworker.errors import BatchNotFoundError, PartialPutError

# The lifecycle contract: every test runs on DynamoDB Local and on moto.
pytestmark = pytest.mark.both_backends


@pytest.fixture
def counted(settings):
    """Counts as the coordinator leaves them: the stream followed to its end, then the batch read."""
    def read(batch_id="b1"):
        progress.catch_up(settings)
        p = batches.get_batch(batch_id)
        return p.total, p.finished, p.ignored, p.open, p.done
    return read


def _put(settings, key, batch_id="b1", now=None, **kw):
    return submit.put_task(TaskSpec(key=key, type="quick", batch_id=batch_id, **kw), settings, now=now)


def test_put_counts_only_created_tasks(settings, counted):
    assert _put(settings, "a") is PutOutcome.CREATED
    assert _put(settings, "a") is PutOutcome.EXISTS
    created = batches.put_tasks(
        [lifecycle.new_task(TaskSpec(key=k, type="quick", batch_id="b1"), settings, utcnow()) for k in "abc"],
        "b1",
    )
    assert created == [False, True, True]
    assert counted() == (3, 0, 0, 3, False)
    assert TaskModel.get("b").status == "todo"


def _put_resending(tasks, batch_id: str) -> list[bool]:
    """Put as a client does: a put cut short by its request's window (a loaded machine's slow
    writes) is sent again, and stores the rest."""
    for _ in range(20):
        try:
            return batches.put_tasks(tasks, batch_id)
        except PartialPutError:
            continue
    raise AssertionError("20 sends did not store the batch")


def test_put_batch_in_chunks_over_the_transaction_limit(settings, counted):
    tasks = [lifecycle.new_task(TaskSpec(key=f"t{i}", type="quick", batch_id="big"), settings, utcnow())
             for i in range(230)]
    _put_resending(tasks, "big")
    assert counted("big")[0] == 230
    # Re-submitting the same batch counts nothing twice.
    assert not any(_put_resending(tasks, "big"))
    assert counted("big")[0] == 230


def test_complete_fail_cancel_retry_and_reap_move_the_counters(settings, counted):
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    for key in ("done", "bad", "cancelled", "lost", "plain"):
        _put(settings, key, max_attempts=1, now=past)
    submit.put_task(TaskSpec(key="solo", type="quick"), settings)  # no batch: untouched counters

    claim = lifecycle.claim("done", "w", settings)
    assert lifecycle.complete(claim, settings, result={"ok": 1}) is RecordOutcome.FINISHED
    assert counted() == (5, 1, 0, 4, False)

    claim = lifecycle.claim("bad", "w", settings)
    error = lifecycle.error_record(1, ErrorKind.BUSINESS, "no", utcnow())
    assert lifecycle.fail(claim, settings, error) is RecordOutcome.IGNORED
    assert counted() == (5, 1, 1, 3, False)

    assert lifecycle.cancel("cancelled", settings).status == TaskStatus.IGNORED.value
    assert lifecycle.cancel("cancelled", settings) is None  # already ignored: nothing moves
    assert counted() == (5, 1, 2, 2, False)

    claim = lifecycle.claim("lost", "w", settings, now=past)
    assert lifecycle.reap_lost("lost", 1, settings) is True
    assert lifecycle.reap_lost("lost", 1, settings) is False
    assert counted() == (5, 1, 3, 1, False)

    retried = lifecycle.retry("bad", settings)
    assert retried.status == "todo" and retried.attempts == 0 and retried.errors
    assert counted() == (5, 1, 2, 2, False)

    for key in ("bad", "plain"):
        claim = lifecycle.claim(key, "w", settings)
        lifecycle.complete(claim, settings)
    lifecycle.cancel("solo", settings)
    assert counted() == (5, 3, 2, 0, True)


def test_stale_worker_moves_no_counter(settings, counted):
    past = utcnow() - timedelta(seconds=settings.effective_lock_seconds + 5)
    _put(settings, "k", max_attempts=3, now=past)
    stale = lifecycle.claim("k", "old", settings, now=past)
    fresh = lifecycle.claim("k", "new", settings)
    assert lifecycle.complete(stale, settings) is RecordOutcome.LOST
    assert counted() == (1, 0, 0, 1, False)
    assert lifecycle.complete(fresh, settings) is RecordOutcome.FINISHED
    assert counted() == (1, 1, 0, 0, True)


def test_missing_batch(settings, counted):
    with pytest.raises(BatchNotFoundError):
        batches.get_batch("nope")
    assert list(BatchModel.scan(BatchModel.key.startswith("batch#"))) == []


def test_a_redriven_attempt_1_is_not_the_old_attempt_1(settings, counted):
    """Attempts restart at 1 after a redrive; the generation keeps the fencing token unique, even
    for a worker that reuses its owner id."""
    _put(settings, "g", max_attempts=1)
    old = lifecycle.claim("g", "same-owner", settings)
    timeout = lifecycle.error_record(1, ErrorKind.TIMEOUT, "too slow", utcnow())
    assert lifecycle.fail(old, settings, timeout) is RecordOutcome.IGNORED  # its handler still runs
    lifecycle.retry("g", settings)
    new = lifecycle.claim("g", "same-owner", settings)
    assert (new.attempt, new.generation, old.attempt, old.generation) == (1, 1, 1, 0)
    assert new.fencing_token == "same-owner:1.r1" and old.fencing_token == "same-owner:1"
    assert lifecycle.complete(old, settings, result={"from": "old"}) is RecordOutcome.LOST
    assert not lifecycle.extend_lock(old, settings)
    assert lifecycle.complete(new, settings, result={"from": "new"}) is RecordOutcome.FINISHED
    assert lifecycle.get_task("g").result == {"from": "new"}


def test_a_wide_batch_is_counted_without_a_transaction_or_a_hot_item(settings, counted, monkeypatch):
    keys = [f"w{i:03d}" for i in range(40)]
    tasks = [lifecycle.new_task(TaskSpec(key=k, type="quick", batch_id="wide"), settings, utcnow()) for k in keys]

    def no_transaction(*args, **kwargs):
        raise AssertionError("a task of a batch must be written like any task, not in a transaction")

    monkeypatch.setattr(writes, "transact", no_transaction)
    batches.put_tasks(tasks, "wide")
    for key in keys[:30]:
        claim = lifecycle.claim(key, "w", settings)
        lifecycle.complete(claim, settings, result=None)
    for key in keys[30:34]:
        lifecycle.cancel(key, settings)
    assert counted("wide") == (40, 30, 4, 6, False)
    # One counter item per stream shard, listed on the head, each written once per pass.
    items = {item.key: item for item in BatchModel.scan(BatchModel.key.startswith("batch#wide"))}
    head = items.pop("batch#wide")
    assert items and set(items) == {progress.counter_key("wide", shard) for shard in head.counters}
    assert not head.total and not head.finished


def test_counting_again_after_a_crash_counts_nothing_twice(settings, counted):
    """A follower that dies after counting, before saving its place, reads the same records again."""
    for key in "abc":
        submit.put_task(TaskSpec(key=key, type="quick", batch_id="b1"), settings)
    lifecycle.complete(lifecycle.claim("a", "w", settings), settings)
    assert counted() == (3, 1, 0, 2, False)
    # A new process with no checkpoint: it reads the stream from its start.
    for checkpoint in progress.StreamCheckpointModel.scan(progress.StreamCheckpointModel.key.startswith("stream#")):
        checkpoint.delete()
    fresh = progress.StreamFollower(settings)
    report = fresh.follow()
    assert report.records >= 5 and report.changes == 0
    assert counted() == (3, 1, 0, 2, False)
    lifecycle.cancel("b", settings)
    assert fresh.follow().changes == 1
    assert counted() == (3, 1, 1, 1, False)


def test_two_followers_at_once_count_each_change_once(settings, counted):
    import threading

    for index in range(30):
        submit.put_task(TaskSpec(key=f"t{index}", type="quick", batch_id="b1"), settings)
    followers = [progress.StreamFollower(settings) for _ in range(4)]
    counts = []
    start = threading.Barrier(len(followers))

    def run(follower):
        start.wait()
        counts.append(follower.follow().changes)

    threads = [threading.Thread(target=run, args=(f,)) for f in followers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts) == 30
    assert counted() == (30, 0, 0, 30, False)


def test_the_same_changes_applied_twice_count_once(settings, counted):
    submit.put_task(TaskSpec(key="x", type="quick", batch_id="b1"), settings)
    changes = [progress.Change("b9", sequence, total=1) for sequence in (5, 6, 7)]
    BatchModel("batch#b9").save()
    assert progress.apply("shard-a", changes).changes == 3
    assert progress.apply("shard-a", changes).changes == 0
    assert progress.apply("shard-a", [*changes, progress.Change("b9", 8, finished=1)]).changes == 1
    assert progress.apply("shard-b", changes[:1]).changes == 1  # another shard has its own counter
    assert counted("b9") == (4, 1, 0, 3, False)


def test_counting_out_of_time_stops_between_batches_and_the_rest_is_counted_once_later(settings, counted):
    changes = [progress.Change(batch, sequence, total=1) for batch, sequence in (("p", 5), ("q", 6), ("p", 7))]
    for batch in "pq":
        BatchModel(f"batch#{batch}").save()
    first = progress.apply("shard-a", changes, deadline=-math.inf)  # out of time from the start
    assert (first.changes, first.complete) == (2, False)  # the first batch, always: every call counts one
    rest = progress.apply("shard-a", changes)
    assert (rest.changes, rest.complete) == (1, True)
    assert counted("p")[0] == 2 and counted("q")[0] == 1


def test_a_pass_out_of_time_between_counter_writes_reads_its_records_again_next_time(settings, counted,
                                                                                      monkeypatch):
    _put(settings, "a", batch_id="first")
    _put(settings, "b", batch_id="second")
    real = progress.apply
    monkeypatch.setattr(progress, "apply", lambda shard, changes, now, deadline: real(shard, changes, now, -math.inf))
    report = progress.follow(settings)  # its time runs out after the first counter write
    assert (report.changes, report.behind) == (1, True)
    monkeypatch.setattr(progress, "apply", real)
    assert counted("first")[0] == counted("second")[0] == 1  # read again: the rest counted, nothing twice


def _record(name, old=None, new=None, sequence="100"):
    def image(status, batch="b", errors=None):
        item = {"key": {"S": "k"}, "status": {"S": status}}
        if batch:
            item["batch_id"] = {"S": batch}
        if errors:
            item["errors"] = {"L": [{"M": {"kind": {"S": kind}}} for kind in errors]}
        return item
    return {"eventName": name, "dynamodb": {"SequenceNumber": sequence,
                                            **({"OldImage": image(*old)} if old else {}),
                                            **({"NewImage": image(*new)} if new else {})}}


@pytest.mark.parametrize(("record", "expected"), [
    (_record("INSERT", new=("todo",)), (1, 0, 0, False)),
    (_record("MODIFY", old=("todo",), new=("processing",)), None),
    (_record("MODIFY", old=("processing",), new=("finished",)), (0, 1, 0, False)),
    (_record("MODIFY", old=("processing",), new=("ignored", "b", ["system"])), (0, 0, 1, True)),
    (_record("MODIFY", old=("todo",), new=("ignored", "b", ["system", "cancelled"])), (0, 0, 1, False)),
    (_record("MODIFY", old=("ignored", "b", ["system"]), new=("todo", "b", ["system"])), (0, 0, -1, False)),
    (_record("MODIFY", old=("finished",), new=("finished",)), None),  # rewritten, not moved
    (_record("REMOVE", old=("finished",)), None),  # TTL: the batch keeps counting what it ran
    (_record("INSERT", new=("todo", None)), None),  # not in a batch
], ids=["put", "claim", "finish", "fail-for-good", "cancel", "redrive", "no-change", "ttl", "no-batch"])
def test_what_one_record_changes(record, expected):
    change = progress.change_of(record)
    if expected is None:
        assert change is None
    else:
        assert (change.total, change.finished, change.ignored, change.failure) == expected
        assert change.batch_id == "b" and change.sequence == 100


def test_a_batch_counted_by_an_earlier_release_still_adds_up(settings, counted):
    # As releases before the stream left it: total on the head, outcomes on batch#<id>#0..7.
    BatchModel("batch#legacy", total=3).save()
    BatchModel("batch#legacy#5", finished=1).save()
    BatchModel("batch#legacy#2", ignored=1).save()
    assert counted("legacy") == (3, 1, 1, 1, False)


# When a batch may read done: only once every write to it is counted ------------------------------

def _put_batch(settings, batch_id, keys):
    tasks = [lifecycle.new_task(TaskSpec(key=k, type="quick", batch_id=batch_id), settings, utcnow()) for k in keys]
    return batches.put_tasks(tasks, batch_id)


def _finish(settings, *keys):
    for key in keys:
        assert lifecycle.complete(lifecycle.claim(key, "w", settings), settings) is RecordOutcome.FINISHED


def test_a_batch_whose_puts_are_not_counted_yet_does_not_read_done(settings, counted):
    _put_batch(settings, "fresh", ["a", "b"])
    early = batches.get_batch("fresh")
    assert (early.total, early.open, early.done, early.state) == (0, 0, False, "running")
    assert counted("fresh") == (2, 0, 0, 2, False)
    _finish(settings, "a", "b")
    assert counted("fresh") == (2, 2, 0, 0, True)
    assert batches.get_batch("fresh").counted_through >= batches.get_batch("fresh").settled_at


def test_a_batch_is_not_done_before_its_created_tasks_are_counted_whatever_the_watermark(settings, counted):
    # Given a watermark that vouches for every write up to a second from now, with nothing counted
    # (a follower wrong about what it read, or a stream that lost records)
    _put_batch(settings, "vouched", ["a", "b"])
    StreamCheckpointModel(COUNTED_THROUGH_KEY, counted_through=utcnow() + timedelta(seconds=1)).save()
    early = batches.get_batch("vouched")
    # Then it reads open, not done: its put request recorded the two tasks it created
    assert (early.total, early.tasks_created, early.done, early.state) == (0, 2, False, "running")
    _finish(settings, "a", "b")
    assert counted("vouched") == (2, 2, 0, 0, True)


def test_a_put_request_under_way_keeps_its_batch_from_reading_done(settings, counted):
    batches._open("slow", utcnow(), None)  # another request has opened the batch, not yet ended
    _put_batch(settings, "slow", ["a"])
    _finish(settings, "a")
    assert counted("slow") == (1, 1, 0, 0, False)  # its puts may still come, until its promise
    assert batches.get_batch("slow").settled_at > utcnow()
    batches._close("slow", 0)  # the other request created nothing
    assert counted("slow") == (1, 1, 0, 0, True)


def test_done_waits_until_the_stream_is_counted_past_the_last_change(make_settings):
    settings = make_settings(stream_lag_seconds=300)  # a stream that may run minutes late
    _put_batch(settings, "late", ["a"])
    _finish(settings, "a")
    progress.catch_up(settings)
    counts = batches.get_batch("late")
    assert (counts.open, counts.done) == (0, False)
    assert counts.counted_through < counts.settled_at


def test_a_redrive_keeps_its_batch_from_reading_done_until_it_is_counted(settings, counted):
    _put_batch(settings, "again", ["a"])
    lifecycle.cancel("a", settings)
    assert counted("again") == (1, 0, 1, 0, True)
    assert lifecycle.retry("a", settings) is not None
    batches.settle("again")  # as the API's redrive routes do
    stale = batches.get_batch("again")
    assert (stale.ignored, stale.open, stale.done) == (1, 0, False)  # the redrive is not counted yet
    assert counted("again") == (1, 0, 0, 1, False)


def test_each_counter_keeps_the_time_of_the_last_change_it_counted(settings, counted):
    before = utcnow() - timedelta(minutes=1)  # record times are rounded down: to the second on
    # AWS, to the minute on DynamoDB Local
    _put_batch(settings, "timed", ["a"])
    counted("timed")
    (counter,) = [item for item in BatchModel.scan(BatchModel.key.startswith("batch#timed#"))]
    assert before <= counter.last_change_at <= utcnow()


def test_a_follower_out_of_time_reads_nothing_more_and_vouches_for_nothing(settings, counted):
    _put_batch(settings, "budget", ["a"])
    report = progress.follow(settings, budget_seconds=0)  # as a tick with no time left for it
    assert (report.records, report.changes, report.behind) == (0, 0, True)
    assert batches.get_batch("budget").total == 0 and batches.get_batch("budget").counted_through is None
    assert counted("budget") == (1, 0, 0, 1, False)


def test_a_pass_that_could_not_count_leaves_its_records_to_the_next(settings, counted, monkeypatch):
    _put_batch(settings, "retried", ["a", "b"])
    real = progress.apply

    def unavailable(*args, **kwargs):
        raise batches.StorageError("DynamoDB is unavailable")

    monkeypatch.setattr(progress, "apply", unavailable)
    with pytest.raises(batches.StorageError):
        progress.follow(settings)
    monkeypatch.setattr(progress, "apply", real)
    assert counted("retried") == (2, 0, 0, 2, False)


def test_the_follower_reads_records_as_dynamodb_sends_them(settings, counted):
    """GetRecords answers skip botocore's attribute-by-attribute parse (most of the coordinator's
    CPU per task): the records keep the wire shape a Lambda stream event has, and count the same."""
    _put_batch(settings, "wire", ["a", "b"])
    follower = progress.follower(settings)
    arn = follower.stream_arn()
    shard = follower._shards(arn)[0]
    streams = follower._streams()
    iterator = streams.get_shard_iterator(StreamArn=arn, ShardId=shard,
                                          ShardIteratorType="TRIM_HORIZON")["ShardIterator"]
    records = streams.get_records(ShardIterator=iterator)["Records"]
    put = next(r for r in records if r["dynamodb"].get("NewImage", {}).get("key") == {"S": "a"})
    assert isinstance(put["dynamodb"]["ApproximateCreationDateTime"], (int, float))  # botocore: a datetime
    assert progress.change_of(put).total == 1
    assert counted("wire") == (2, 0, 0, 2, False)


def test_the_wire_hook_leaves_errors_to_botocore():
    error = {"status_code": 400, "body": b'{"__type": "ExpiredIteratorException"}', "headers": {}}
    ok = {"status_code": 200, "body": b'{"Records": [], "NextShardIterator": "it"}', "headers": {}}
    custom_error: dict = {}
    custom_ok: dict = {}
    progress.records_as_sent(response_dict=error, customized_response_dict=custom_error)
    progress.records_as_sent(response_dict=ok, customized_response_dict=custom_ok)
    assert custom_error == {} and error["body"] == b'{"__type": "ExpiredIteratorException"}'
    assert custom_ok == {"Records": [], "NextShardIterator": "it"} and ok["body"] == b"{}"
