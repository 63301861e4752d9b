"""Batch callbacks and completion events: each fires exactly once per batch, however many
coordinators look, and after a coordinator killed between the put and what follows."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from coworker.data import layout
from coworker.data.models import BatchModel, TaskModel, utcnow
from coworker.engine import batches, callbacks, dispatch, events, lifecycle, progress, redrive
from coworker.engine.tasks import NewTask, TaskSpec
from coworker.engine.worker import run_batch
from coworker.errors import StorageError

from tests.support.doubles import RecordingInvoker

pytestmark = pytest.mark.both_backends

ALL_THREE = {"complete": NewTask(type="quick", payload={"note": "all ran"}),
             "success": NewTask(type="quick"), "stopped": NewTask(type="quick", max_attempts=2)}


def _put_batch(settings, batch_id, specs, named=None, tolerance=None, watch=False):
    now = utcnow() - timedelta(seconds=30)
    items = [lifecycle.new_task(TaskSpec(key=key, type=type_, batch_id=batch_id, max_attempts=1), settings, now)
             for key, type_ in specs]
    assert all(batches.put_tasks(items, batch_id, now, tolerance, callbacks=named, watch=watch))


def _run(settings, keys):
    run_batch(list(keys), "w", settings, time.monotonic() + 30)
    progress.catch_up(settings)  # what the coordinator's follow does every tick


def _callback_tasks(batch_id):
    return {event: task for event in callbacks.CALLBACK_EVENTS
            if (task := _maybe(callbacks.callback_key(batch_id, event))) is not None}


def _maybe(key):
    try:
        return TaskModel.get(key, consistent_read=True)
    except TaskModel.DoesNotExist:
        return None


def _head(batch_id):
    return BatchModel.get(batches.batch_key(batch_id), consistent_read=True)


def _watched():
    return {item.key for item in BatchModel.watched_index.query(layout.WATCHED_BATCHES_PARTITION)}


def test_complete_and_success_fire_once_with_the_counts_and_the_batch_is_let_go(settings):
    _put_batch(settings, "b", [(f"t{i}", "quick") for i in range(4)], ALL_THREE)
    assert _watched() == {"batch#b"}
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker)
    assert _callback_tasks("b") == {}  # nothing ran yet

    _run(settings, [f"t{i}" for i in range(4)])
    report = dispatch.tick(settings, invoker)
    made = _callback_tasks("b")
    assert set(made) == {"complete", "success"} and report.callbacks == 2
    complete = made["complete"]
    assert complete.key == "b~complete" and complete.task_type == "quick" and complete.batch_id is None
    assert complete.payload["event"] == "complete" and complete.payload["payload"] == {"note": "all ran"}
    counts = complete.payload["batch"]
    assert (counts["batch_id"], counts["total"], counts["finished"], counts["ignored"], counts["done"]) == (
        "b", 4, 4, 0, True)
    assert {"b~complete", "b~success"} <= set(invoker.keys)  # handed to workers at once
    assert _watched() == set()
    assert batches.get_batch("b").fired == ("complete", "success")

    for _ in range(3):  # later ticks put nothing more
        assert dispatch.tick(settings, invoker).callbacks == 0
    assert set(_callback_tasks("b")) == {"complete", "success"}


def test_a_batch_with_ignored_tasks_completes_and_succeeds_only_after_a_redrive_ends_well(settings):
    _put_batch(settings, "b", [("ok", "quick"), ("bad", "always-fail")], ALL_THREE)
    _run(settings, ["ok", "bad"])
    dispatch.tick(settings, RecordingInvoker())
    assert set(_callback_tasks("b")) == {"complete"}
    assert _watched() == set()  # let go: success needs a redrive, which watches it again

    TaskModel(key="bad").update(actions=[TaskModel.task_type.set("quick")])  # the bug is fixed
    redrive.retry("bad", settings)
    assert _watched() == {"batch#b"}
    dispatch.tick(settings, RecordingInvoker())
    assert set(_callback_tasks("b")) == {"complete"}  # the redriven task has not run yet
    _run(settings, ["bad"])
    dispatch.tick(settings, RecordingInvoker())
    made = _callback_tasks("b")
    assert set(made) == {"complete", "success"}
    assert made["success"].payload["batch"]["ignored"] == 0
    assert made["complete"].payload["batch"]["ignored"] == 1  # complete fired once, the first time


def test_a_stopped_batch_fires_stopped_then_complete_once_its_open_tasks_are_cancelled(settings):
    _put_batch(settings, "b", [("f1", "always-fail"), ("f2", "always-fail")] + [(f"q{i}", "quick") for i in range(3)],
               ALL_THREE, tolerance=batches.Tolerance(count=1))
    _run(settings, ["f1", "f2"])
    assert batches.get_batch("b").state == "failed"
    dispatch.tick(settings, RecordingInvoker())  # cancels the open tasks and fires stopped
    made = _callback_tasks("b")
    assert "stopped" in made and made["stopped"].max_attempts == 2
    assert made["stopped"].payload["batch"]["state"] == "failed"
    progress.catch_up(settings)
    dispatch.tick(settings, RecordingInvoker())
    assert set(_callback_tasks("b")) == {"stopped", "complete"}  # never success
    assert _watched() == set()


def test_racing_coordinators_put_each_callback_once(settings):
    for n in range(6):
        _put_batch(settings, f"b{n}", [(f"b{n}-t", "quick")], ALL_THREE)
    _run(settings, [f"b{n}-t" for n in range(6)])
    start = threading.Barrier(4)
    reports: list[callbacks.CallbackReport] = []

    def coordinator():
        start.wait()
        reports.append(callbacks.fire_due(settings))

    threads = [threading.Thread(target=coordinator) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reports.append(callbacks.fire_due(settings))
    put = [key for report in reports for key, _ in report.put]  # what each coordinator would hand out
    assert sorted(put) == sorted(f"b{n}~{event}" for n in range(6) for event in ("complete", "success"))
    assert _watched() == set()


def test_a_coordinator_killed_after_the_put_leaves_nothing_to_put_twice(settings, monkeypatch):
    _put_batch(settings, "b", [("t", "quick")], {"complete": NewTask(type="quick")})
    _run(settings, ["t"])

    def killed(*args, **kwargs):
        raise SystemExit("killed after the put")

    real_update = callbacks.writes.update

    def killed_at_the_record(item, actions, condition, what, **kwargs):
        if what.startswith("record batch"):  # dies before recording "fired" (closing the batch went through)
            killed()
        return real_update(item, actions, condition, what, **kwargs)

    monkeypatch.setattr(callbacks, "_let_go", killed)
    monkeypatch.setattr(callbacks.writes, "update", killed_at_the_record)
    with pytest.raises(SystemExit):
        callbacks._fire("b", settings, utcnow(), rotate=False)
    assert set(_callback_tasks("b")) == {"complete"}
    monkeypatch.undo()
    before = TaskModel.get("b~complete").updated_at
    report = callbacks.fire_due(settings)
    assert report.created == 0 and TaskModel.get("b~complete").updated_at == before
    assert batches.get_batch("b").fired == ("complete", "success") and _watched() == set()


def test_events_are_published_once_each_with_ids_that_survive_a_reread(make_settings, tmp_path):
    events_file = tmp_path / "events.jsonl"
    settings = make_settings(events="log", events_file=str(events_file))
    _put_batch(settings, "b", [("ok", "quick"), ("bad", "always-fail")], watch=True)
    assert _watched() == {"batch#b"}  # watched for its events, with no callback named
    _run(settings, ["ok", "bad"])
    for _ in range(3):
        dispatch.tick(settings, RecordingInvoker())
    sent = [json.loads(line) for line in events_file.read_text().splitlines()]
    kinds = [(event["detail-type"], event["detail"].get("key") or event["detail"]["batch_id"]) for event in sent]
    assert kinds == [(events.TASK_IGNORED, "bad"), (events.BATCH_COMPLETED, "b")]
    ignored = sent[0]["detail"]
    assert (ignored["type"], ignored["batch_id"], ignored["attempts"], ignored["error"]["kind"]) == (
        "always-fail", "b", 1, "business")
    completed = sent[1]["detail"]
    assert (completed["total"], completed["finished"], completed["ignored"], completed["succeeded"]) == (2, 1, 1, False)

    # a follower that starts afresh from its checkpoint re-reads nothing; one from the stream's
    # start sends the same event again, with the same id, so a consumer can drop it
    progress._followers.clear()
    progress.catch_up(settings)
    assert len(events_file.read_text().splitlines()) == 2
    for item in progress.StreamCheckpointModel.scan(progress.StreamCheckpointModel.key.startswith(
            layout.STREAM_KEY_PREFIX)):
        item.delete()  # the follower's places: it reads the stream from its start
    progress._followers.clear()
    progress.catch_up(settings)
    again = [json.loads(line) for line in events_file.read_text().splitlines()[2:]]
    assert [event["detail"]["event_id"] for event in again if event["detail-type"] == events.TASK_IGNORED] == [
        ignored["event_id"]]


def test_read_results_gives_the_finished_tasks_results_by_key(make_settings, tmp_path):
    settings = make_settings(result_dir=str(tmp_path), inline_result_bytes=256)
    for key, value in (("small", {"n": 1}), ("large", {"text": "x" * 2000})):
        task = lifecycle.new_task(TaskSpec(key=key, type="quick"), settings, utcnow())
        task.save()
        claim = lifecycle.claim(key, "w", settings)
        assert lifecycle.complete(claim, settings, result=value) is lifecycle.RecordOutcome.FINISHED
    lifecycle.new_task(TaskSpec(key="waiting", type="quick"), settings, utcnow()).save()
    found = callbacks.read_results(["small", "large", "waiting", "missing", "small"], settings)
    assert found == {"small": {"n": 1}, "large": {"text": "x" * 2000}}


def test_an_event_bridge_outage_does_not_hold_batch_counting_back(make_settings, monkeypatch, log_lines):
    settings = make_settings(events="log")
    _put_batch(settings, "b", [("bad", "always-fail")], watch=True)

    def refused(self, sent):
        if sent:
            raise StorageError("EventBridge did not take 1 event(s): down")

    monkeypatch.setattr(events.Publisher, "publish", refused)
    _run(settings, ["bad"])  # the follower reads the move to ignored: its event cannot be sent
    assert batches.get_batch("b").done  # counted all the same
    dropped = [line for line in log_lines() if line["message"] == "could not publish task events; dropped"]
    assert [event["key"] for line in dropped for event in line["events"]] == ["bad"]


def test_a_pass_over_many_watched_batches_reads_the_followers_watermark_once(settings, monkeypatch):
    for n in range(5):
        _put_batch(settings, f"w{n}", [(f"w{n}-t", "quick")], {"complete": NewTask(type="quick")})
    progress.catch_up(settings)  # counted, not run: each batch is read through the watermark
    reads = []
    original = batches.counted_through
    monkeypatch.setattr(batches, "counted_through", lambda: reads.append(1) or original())
    assert callbacks.fire_due(settings).watched == 5
    assert len(reads) == 1


def test_a_batch_whose_last_open_task_is_cancelled_fires_complete(settings):
    # Given a batch with a complete callback whose tasks all ran but one, not yet due
    _put_batch(settings, "b", [("t0", "quick"), ("t1", "quick"), ("later", "quick")], ALL_THREE)
    _run(settings, ["t0", "t1"])
    dispatch.tick(settings, RecordingInvoker())
    assert _callback_tasks("b") == {}
    # When that last open task is cancelled
    lifecycle.cancel("later", settings)
    progress.catch_up(settings)
    dispatch.tick(settings, RecordingInvoker())
    # Then the batch is done and its complete callback is put, once
    assert batches.get_batch("b").done
    assert "complete" in _callback_tasks("b")


def test_a_put_request_that_never_recorded_its_end_holds_completion_back_only_until_its_promise(
        settings, monkeypatch):
    # Given a batch whose put request was killed before it recorded its end (puts_in_flight stays
    # 1; its promise, shortened here to 1 s, stands in for the end)
    monkeypatch.setattr(batches, "PUT_WINDOW_SECONDS", 1)
    with monkeypatch.context() as killed:
        killed.setattr(batches, "_close", lambda batch_id, created: None)
        _put_batch(settings, "b", [("t0", "quick"), ("t1", "quick")], ALL_THREE)
    assert int(_head("b").puts_in_flight) == 1
    # When its tasks finish and the promise has passed
    _run(settings, ["t0", "t1"])
    for _ in range(40):  # looks, not a time budget: each waits for the promise and the follower
        progress.catch_up(settings)
        dispatch.tick(settings, RecordingInvoker())
        if "complete" in _callback_tasks("b"):
            break
        time.sleep(0.25)
    # Then the batch completes: its callbacks fire once, and it is let go
    assert set(_callback_tasks("b")) == {"complete", "success"}
    assert batches.get_batch("b").fired == ("complete", "success")
    assert _watched() == set()


def test_a_put_request_opened_after_the_batch_was_read_done_keeps_it_open(settings, monkeypatch):
    # Given a batch read done, with a leftover put request whose promise has passed
    monkeypatch.setattr(batches, "PUT_WINDOW_SECONDS", 0)
    with monkeypatch.context() as killed:
        killed.setattr(batches, "_close", lambda batch_id, created: None)
        _put_batch(settings, "b", [("t0", "quick")], ALL_THREE)
    _run(settings, ["t0"])
    head = _head("b")
    # When another put request opens before the coordinator closes the batch
    monkeypatch.setattr(batches, "PUT_WINDOW_SECONDS", 30)
    with monkeypatch.context() as open_only:
        open_only.setattr(batches, "_close", lambda batch_id, created: None)
        _put_batch(settings, "b", [("t1", "quick")])
    # Then closing on the old read is refused: the new request's tasks count
    assert batches.close(head, "b", utcnow()) is None
