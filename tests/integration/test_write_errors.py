"""Writes that fail on the wire, not in DynamoDB (a connection closed or timed out, an endpoint
out of reach): the write becomes the library's StorageError, and the worker thread that met it
says so, settles that task as far as it knows, and goes on with the invocation's other tasks.
Contract tests: they run on DynamoDB Local and on moto."""

from __future__ import annotations

import time
from datetime import timedelta

import botocore.client
import pytest
from botocore.exceptions import ConnectionClosedError, EndpointConnectionError, ReadTimeoutError
from coworker.data import layout, writes
from coworker.data.models import TaskModel, TaskStatus, utcnow
from coworker.engine import lifecycle, slots, submit
from coworker.engine.handlers import TaskContext, task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import WorkerRequest, run_invocation
from coworker.errors import StorageError

KEYS = ["a", "b", "c", "d"]


@task_handler("test-write-errors")
def _handler(payload: dict, context: TaskContext) -> dict:
    return {"ok": True}


def _put(settings, keys) -> None:
    for key in keys:
        submit.put_task(TaskSpec(key=key, type="test-write-errors", payload={}), settings,
                        now=utcnow() - timedelta(seconds=5))


def _fail_once(monkeypatch, operation: str, key: str, error: Exception, *, after_sending: bool) -> list[str]:
    """Make the first ``operation`` call on task ``key`` fail with ``error`` (a botocore error of
    the connection, with no DynamoDB answer), before it is sent or once it has landed; returns a
    list that records the failure."""
    real = botocore.client.BaseClient._make_api_call
    failed: list[str] = []

    def make_api_call(self, operation_name, api_params):
        if not failed and operation_name == operation and api_params.get("Key") == {"key": {"S": key}}:
            failed.append(key)
            if after_sending:
                real(self, operation_name, api_params)
            raise error
        return real(self, operation_name, api_params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", make_api_call)
    return failed


@pytest.mark.both_backends
@pytest.mark.parametrize("error", [
    ConnectionClosedError(endpoint_url="http://db.invalid"),
    ReadTimeoutError(endpoint_url="http://db.invalid"),
    EndpointConnectionError(endpoint_url="http://db.invalid"),
], ids=["closed", "timed-out", "unreachable"])
def test_a_write_that_fails_on_the_wire_is_a_storage_error(make_settings, monkeypatch, error):
    # Given a task, and an UpdateItem on it that fails with a connection error (no answer at all)
    settings = make_settings()
    _put(settings, ["k"])
    _fail_once(monkeypatch, "UpdateItem", "k", error, after_sending=False)

    # When the data layer writes it, Then it raises the library's storage error, naming the write
    with pytest.raises(StorageError, match="could not touch task 'k'"):
        writes.update(TaskModel("k"), [TaskModel.updated_at.set(utcnow())], None, "touch task 'k'")


@pytest.mark.both_backends
@pytest.mark.parametrize("after_sending", [False, True], ids=["not-sent", "landed"])
def test_a_thread_whose_claim_fails_on_the_wire_goes_on_with_the_invocations_other_tasks(
        make_settings, monkeypatch, log_lines, after_sending):
    # Given a worker invocation of one thread, handed four tasks, whose claim of the second fails
    # with a connection error: before it is sent, or once it has landed (its answer lost)
    settings = make_settings(max_concurrency=1, batch_size=1)
    _put(settings, KEYS)
    failed = _fail_once(monkeypatch, "UpdateItem", "b", ReadTimeoutError(endpoint_url="http://db.invalid"),
                        after_sending=after_sending)
    slot, token = slots.free_slots(settings.worker_slots, 1)[0], slots.new_token()
    assert slots.reserve(slot, token, settings.reservation_seconds)

    # When the invocation runs
    reports = run_invocation(WorkerRequest(tuple(KEYS), slot, token), "w", settings, time.monotonic() + 60)

    # Then the thread said what went wrong with that task and went on: every task finished in this
    # invocation, the one whose claim failed too (given back if its claim had landed, then found
    # again), each on its first counted attempt, with no lost work in its history
    assert failed == ["b"]
    # (the invocation's threads list their reports apart: b's are its error, then its finish)
    assert sorted(r.outcome.value for r in reports if r.key == "b") == sorted(
        [TaskOutcome.ERROR.value, TaskOutcome.FINISHED.value])
    assert sorted(r.key for r in reports if r.outcome is TaskOutcome.FINISHED) == KEYS
    for key in KEYS:
        task = lifecycle.get_task(key)
        assert (task.status, int(task.attempts), task.errors, task.lock_owner) == (
            TaskStatus.FINISHED.value, 1, None, None), key
    errors = [line for line in log_lines() if line["level"] == "ERROR"]
    assert [line.get("task_key") for line in errors] == ["b"], errors


@pytest.mark.both_backends
@pytest.mark.parametrize("after_sending", [False, True], ids=["not-sent", "landed"])
def test_a_claim_whose_rate_token_write_fails_on_the_wire_is_given_back_and_run_later(
        make_settings, monkeypatch, after_sending):
    # Given four tasks of a rate key with room to spare, run by one thread, and the first token
    # write of the key failing with a connection error (before it is sent, or once it has landed)
    settings = make_settings(max_concurrency=1, batch_size=1)
    for key in KEYS:
        submit.put_task(TaskSpec(key=key, type="test-write-errors", payload={}, rate_key="site-e", rate_limit=100,
                                 rate_interval_seconds=1), settings, now=utcnow() - timedelta(seconds=5))
    failed = _fail_once(monkeypatch, "UpdateItem", layout.RATE_GATE_PREFIX + "key:site-e",
                        ConnectionClosedError(endpoint_url="http://db.invalid"), after_sending=after_sending)
    slot, token = slots.free_slots(settings.worker_slots, 1)[0], slots.new_token()
    assert slots.reserve(slot, token, settings.reservation_seconds)

    # When the invocation runs
    reports = run_invocation(WorkerRequest(tuple(KEYS), slot, token), "w", settings, time.monotonic() + 60)

    # Then the claim that met it was given back unstarted (its attempt not counted), and handed out
    # again: every task finished in this invocation, on its first counted attempt
    assert failed == [layout.RATE_GATE_PREFIX + "key:site-e"]
    assert [r.outcome for r in reports].count(TaskOutcome.ERROR) == 1
    assert sorted(r.key for r in reports if r.outcome is TaskOutcome.FINISHED) == KEYS
    for key in KEYS:
        task = lifecycle.get_task(key)
        assert (task.status, int(task.attempts), task.errors) == (TaskStatus.FINISHED.value, 1, None), key
