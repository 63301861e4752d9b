"""Recurring schedules: each occurrence puts its task exactly once, however many coordinators
look at once or however often one dies; missed occurrences are run once or skipped, never
burst-fired; paused schedules put nothing. Contract tests: they run on DynamoDB Local and on moto."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from coworker.data import writes
from coworker.data.models import TaskModel, utcnow
from coworker.engine import dispatch, lifecycle, schedules
from coworker.engine.schedules import create_due_occurrences, occurrence_key
from coworker.engine.tasks import NewTask
from coworker.errors import ScheduleNotFoundError

from tests.support.doubles import RecordingInvoker

pytestmark = pytest.mark.both_backends

TASK = NewTask(type="quick", payload={"site": "example.org"}, max_attempts=2)


def _tasks_of(name: str) -> list[str]:
    return sorted(task.key for task in TaskModel.scan(TaskModel.key.startswith(f"{name}@")))


def test_a_schedule_is_put_read_listed_paused_resumed_and_deleted(settings):
    t0 = utcnow().replace(microsecond=0)
    schedule, created = schedules.put("hourly", "rate(1 hour)", "UTC", "once", TASK, now=t0)
    assert created and schedule.next_run_at == t0 + timedelta(hours=1) and not schedule.paused
    assert schedule.task == {"type": "quick", "payload": {"site": "example.org"}, "max_attempts": 2}
    schedules.put("nightly", "cron(0 3 * * *)", "Europe/Berlin", "skip", TASK, now=t0)
    assert [s.name for s in schedules.list_all()[0]] == ["hourly", "nightly"]

    paused, changed = schedules.set_paused("hourly", True, now=t0)
    assert changed and paused.paused and paused.next_run_at is None
    assert not schedules.set_paused("hourly", True, now=t0)[1]
    assert {s.name: s.paused for s in schedules.list_all()[0]} == {"hourly": True, "nightly": False}
    resumed, changed = schedules.set_paused("hourly", False, now=t0 + timedelta(minutes=90))
    assert changed and resumed.next_run_at == t0 + timedelta(hours=2)  # the first after now

    replaced, created = schedules.put("hourly", "rate(5 minutes)", "UTC", "once", TASK, now=t0 + timedelta(hours=3))
    assert not created and replaced.created_at == t0 and replaced.next_run_at == t0 + timedelta(hours=3, minutes=5)

    schedules.delete("hourly")
    with pytest.raises(ScheduleNotFoundError):
        schedules.get("hourly")
    with pytest.raises(ScheduleNotFoundError):
        schedules.delete("hourly")
    assert [s.name for s in schedules.list_all()[0]] == ["nightly"]


def test_an_invalid_schedule_writes_nothing(settings):
    for expression, timezone, missed in [("rate(0 minutes)", "UTC", "once"), ("cron(0 9 * * *)", "Nowhere/X", "once"),
                                         ("rate(1 hour)", "UTC", "burst")]:
        with pytest.raises(ValueError):
            schedules.put("bad", expression, timezone, missed, TASK)
    with pytest.raises(ValueError, match="at most 16 KB"):
        schedules.put("bad", "rate(1 hour)", "UTC", "once", NewTask(type="quick", payload="x" * 17_000))
    assert schedules.list_all() == ([], False)


def test_each_occurrence_puts_its_task_once_however_many_coordinators_look_at_once(settings):
    t0 = utcnow().replace(microsecond=0)
    schedules.put("every-minute", "rate(1 minute)", "UTC", "once", TASK, now=t0)
    created: list[int] = []
    lock = threading.Lock()
    for minute in range(1, 6):
        now = t0 + timedelta(minutes=minute, seconds=5)
        barrier = threading.Barrier(4)

        def coordinator(now=now, barrier=barrier) -> None:
            barrier.wait()
            report = create_due_occurrences(settings, now)
            with lock:
                created.append(report.created)

        threads = [threading.Thread(target=coordinator) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    expected = [occurrence_key("every-minute", t0 + timedelta(minutes=m)) for m in range(1, 6)]
    assert _tasks_of("every-minute") == expected
    assert sum(created) == 5
    task = lifecycle.get_task(expected[0])
    assert (task.task_type, task.payload, task.max_attempts) == ("quick", {"site": "example.org"}, 2)
    assert task.status == "todo"
    assert schedules.get("every-minute").last_task_key == expected[-1]


def test_a_coordinator_that_died_after_the_put_puts_nothing_twice(settings, monkeypatch):
    t0 = utcnow().replace(microsecond=0)
    schedules.put("nightly", "rate(1 day)", "UTC", "once", TASK, now=t0)
    due = t0 + timedelta(days=1, seconds=30)
    real_update = writes.update

    def dies_moving_the_schedule(item, *args, **kwargs):
        if isinstance(item, schedules.ScheduleModel):
            raise RuntimeError("killed between the put and the move")
        return real_update(item, *args, **kwargs)

    monkeypatch.setattr(writes, "update", dies_moving_the_schedule)
    create_due_occurrences(settings, due)  # put, then "died" (the tick logs it and goes on)
    monkeypatch.setattr(writes, "update", real_update)
    assert _tasks_of("nightly") == [occurrence_key("nightly", t0 + timedelta(days=1))]
    assert schedules.get("nightly").next_run_at == t0 + timedelta(days=1)  # not moved on
    again = create_due_occurrences(settings, due + timedelta(seconds=5))  # the next coordinator
    assert again.created == 0
    assert _tasks_of("nightly") == [occurrence_key("nightly", t0 + timedelta(days=1))]
    assert schedules.get("nightly").next_run_at == t0 + timedelta(days=2)


@pytest.mark.parametrize(("missed", "tasks_after_downtime"), [("once", 1), ("skip", 0)])
def test_occurrences_missed_during_downtime_run_once_or_are_skipped_never_in_a_burst(settings, missed,
                                                                                      tasks_after_downtime):
    t0 = utcnow().replace(microsecond=0)
    schedules.put("hourly", "rate(1 hour)", "UTC", missed, TASK, now=t0)
    # Nothing looked at the schedules for over five hours (the coordinator was down): the latest
    # occurrence is 20 minutes late, past MISSED_AFTER_SECONDS
    back = t0 + timedelta(hours=5, minutes=20)
    report = create_due_occurrences(settings, back)
    assert report.created == tasks_after_downtime and report.skipped == 1 - tasks_after_downtime
    latest = occurrence_key("hourly", t0 + timedelta(hours=5))
    assert _tasks_of("hourly") == ([latest] if tasks_after_downtime else [])
    assert schedules.get("hourly").next_run_at == t0 + timedelta(hours=6)
    assert schedules.get("hourly").skipped == 1 - tasks_after_downtime
    # and from then on, one task per occurrence, on time
    assert create_due_occurrences(settings, t0 + timedelta(hours=6, seconds=2)).created == 1
    # An occurrence a little late (a slow tick) is not missed under either policy
    assert create_due_occurrences(settings, t0 + timedelta(hours=7, minutes=4)).created == 1


def test_a_paused_schedule_puts_nothing_and_resumes_from_the_next_occurrence(settings):
    t0 = utcnow().replace(microsecond=0)
    schedules.put("tick", "rate(1 minute)", "UTC", "once", TASK, now=t0)
    schedules.set_paused("tick", True, now=t0)
    assert create_due_occurrences(settings, t0 + timedelta(minutes=10)).created == 0
    schedules.set_paused("tick", False, now=t0 + timedelta(minutes=10, seconds=30))
    assert create_due_occurrences(settings, t0 + timedelta(minutes=10, seconds=40)).created == 0
    assert create_due_occurrences(settings, t0 + timedelta(minutes=11, seconds=1)).created == 1
    assert _tasks_of("tick") == [occurrence_key("tick", t0 + timedelta(minutes=11))]


def test_the_coordinators_tick_puts_occurrences_and_is_not_idle_while_one_is_due_soon(make_settings):
    settings = make_settings(idle_exit=True, supervise_seconds=60)
    t0 = utcnow().replace(microsecond=0)
    schedules.put("soon", "rate(1 minute)", "UTC", "once", TASK, now=t0)
    invoker = RecordingInvoker()
    waiting = dispatch.tick(settings, invoker, now=t0 + timedelta(seconds=30))
    assert waiting.scheduled == 0 and not waiting.idle  # due within the supervision window
    due = dispatch.tick(settings, invoker, now=t0 + timedelta(minutes=1, seconds=1))
    assert due.scheduled == 1 and not due.idle
    assert _tasks_of("soon") == [occurrence_key("soon", t0 + timedelta(minutes=1))]
    # handed to a worker by the same tick, not left until it is old enough for the queue read
    assert [key for request in invoker.requests for key in request.keys] == _tasks_of("soon")
    schedules.delete("soon")
    lifecycle.cancel(occurrence_key("soon", t0 + timedelta(minutes=1)), settings)
    # (once the slot the hand-out reserved has lapsed: the recording invoker never runs it)
    assert dispatch.tick(settings, invoker, now=t0 + timedelta(minutes=10)).idle


def test_an_occurrence_keeps_its_payload_on_the_record_so_the_coordinator_needs_no_object_store(make_settings,
                                                                                                tmp_path):
    # Given a deployment that moves payloads over 256 bytes to its object store
    settings = make_settings(inline_payload_bytes=256, result_dir=str(tmp_path))
    t0 = utcnow().replace(microsecond=0)
    payload = {"urls": ["https://example.org/" + "p" * 40] * 20}  # about 1 KB
    schedules.put("big", "rate(1 minute)", "UTC", "once", NewTask(type="quick", payload=payload), now=t0)
    # When an occurrence is put
    assert create_due_occurrences(settings, t0 + timedelta(minutes=1, seconds=1)).created == 1
    # Then its payload is on the record (the coordinator's role may not write the object store)
    task = lifecycle.get_task(occurrence_key("big", t0 + timedelta(minutes=1)))
    assert task.payload == payload and task.payload_ref is None
    assert not any(tmp_path.rglob("*.json"))
