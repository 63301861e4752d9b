"""Tasks longer than Lambda allows run on the container runner, with the same handlers, claims,
heartbeats, fencing and records as on a Lambda worker; the Lambda workers never take them.

The runner here is the library's (``coworker.engine.runner``), in this process or, for the kill,
as the local runtime starts it (a process of its own, the container's entry point).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
from coworker.data.models import ErrorKind, TaskStatus, utcnow
from coworker.engine import dispatch, handlers, lifecycle, runners, slots, submit
from coworker.engine.handlers import TaskContext, task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.runner import STOPPED_REASON, InProcessLauncher, Runner, run_runner
from coworker.engine.runners import RunnerRequest
from coworker.engine.tasks import NewTask, TaskSpec
from coworker.engine.worker import run_invocation
from coworker.errors import InvalidEventError
from coworker_local.database import FAKE_CREDENTIALS
from coworker_local.runners import ProcessRunnerLauncher

from tests.support.doubles import Api, RecordingInvoker, reserved_request
from tests.support.registry import registered
from tests.support.waits import wait_until

_release = threading.Event()
_started = threading.Event()


def _export(payload, context: TaskContext) -> dict:
    time.sleep(payload.get("seconds", 0.05) if isinstance(payload, dict) else 0.05)
    return {"exported": context.key, "attempt": context.attempt}


def _export_hours(payload, context: TaskContext) -> str:
    return "done"


def _block(payload, context: TaskContext) -> str:
    """Runs until told its claim is gone (its limit, or the runner's stop), or released."""
    _started.set()
    end = time.monotonic() + 30
    while time.monotonic() < end and not context.claim_lost() and not _release.is_set():
        time.sleep(0.02)
    return "stopped" if context.claim_lost() else "released"




def _export_parent(payload, context: TaskContext) -> str:
    context.spawn("test-export", {"seconds": 0.01}, key=f"{context.key}/part")
    return "parent"


@pytest.fixture(autouse=True, scope="module")
def _container_types():
    """The container types of these tests, registered for this module only (see tests.support.registry)."""
    with registered(("test-export", _export, {"runner": "container"}),
                    ("test-export-hours", _export_hours, {"timeout_seconds": 7200}),
                    ("test-export-blocking", _block, {"timeout_seconds": 1, "runner": "container"}),
                    ("test-export-unbounded", _block, {"runner": "container"}),  # no limit: only a stop ends it
                    ("test-export-parent", _export_parent, {"runner": "container"})):
        yield


@task_handler("test-short")
def _short(payload, context: TaskContext) -> str:
    return "short"


def _put(settings, keys, type_, **kw):
    past = utcnow() - timedelta(seconds=10)
    for key in keys:
        submit.put_task(TaskSpec(key=key, type=type_, **kw), settings, now=past)


def _runner_request(settings, keys=()) -> RunnerRequest:
    slots.ensure_slots(settings.max_runners, pool=slots.RUNNERS)
    slot = slots.free_slots(settings.max_runners, 1, pool=slots.RUNNERS)[0]
    token = slots.new_token()
    assert slots.reserve(slot, token, settings.runner_start_seconds)
    return RunnerRequest(slot, token, tuple(keys))


def test_a_type_runs_where_its_time_fits(settings):
    assert runners.runner_of("test-export", settings) == "container"  # asked for it
    assert runners.runner_of("test-export-hours", settings) == "container"  # 2 h: longer than Lambda gives
    assert runners.runner_of("test-short", settings) == "lambda"
    assert runners.runner_of("not-registered-here", settings) == "lambda"
    named = settings.model_copy(update={"container_types": "not-registered-here"})  # the coordinator's view
    assert runners.runner_of("not-registered-here", named) == "container"
    with pytest.raises(Exception, match="runner must be one of"):
        task_handler("test-bad-runner", runner="fargate")  # type: ignore[arg-type]


def test_a_lambda_worker_never_claims_container_work(settings):
    _put(settings, ["long-1"], "test-export")
    _put(settings, ["long-2"], "test-export", timeout_seconds=5)  # a short limit of its own: still a runner's
    _put(settings, ["short-1"], "test-short")
    # handed the keys, and feeding itself
    reports = run_invocation(reserved_request(settings, ["long-1", "long-2"]), "w", settings,
                             time.monotonic() + settings.worker_timeout_seconds)
    outcomes = {report.key: report.outcome for report in reports}
    assert outcomes["long-1"] is outcomes["long-2"] is TaskOutcome.NOT_CLAIMED
    assert outcomes["short-1"] is TaskOutcome.FINISHED
    for key in ("long-1", "long-2"):
        task = lifecycle.get_task(key)
        assert (task.status, int(task.attempts)) == (TaskStatus.TODO.value, 0)


def test_a_runner_runs_its_work_and_exits_when_none_is_due(settings):
    _put(settings, [f"long-{n}" for n in range(3)], "test-export")
    _put(settings, ["short-1"], "test-short")
    request = _runner_request(settings, ["long-0"])
    reports = run_runner(request, "runner-a", settings)
    assert sorted((r.key, r.outcome) for r in reports) == [(f"long-{n}", TaskOutcome.FINISHED) for n in range(3)]
    for n in range(3):
        task = lifecycle.get_task(f"long-{n}")
        assert task.status == TaskStatus.FINISHED.value and task.result == {"exported": f"long-{n}", "attempt": 1}
    assert lifecycle.get_task("short-1").status == TaskStatus.TODO.value  # the Lambda workers' work
    assert slots.free_slots(settings.max_runners, settings.max_runners, pool=slots.RUNNERS).count(request.slot) == 1


def test_a_runner_runs_the_follow_ups_of_its_tasks_before_it_exits(settings):
    _put(settings, ["export-1"], "test-export-parent")
    reports = run_runner(_runner_request(settings, ["export-1"]), "runner-a", settings)
    assert sorted((r.key, r.outcome) for r in reports) == [("export-1", TaskOutcome.FINISHED),
                                                           ("export-1/part", TaskOutcome.FINISHED)]


def test_a_runner_enforces_a_tasks_own_limit(make_settings):
    settings = make_settings(lock_seconds=6, heartbeat_seconds=1)
    _put(settings, ["limited"], "test-export-blocking")
    reports = run_runner(_runner_request(settings, ["limited"]), "runner-a", settings)
    assert [r.outcome for r in reports] == [TaskOutcome.FAILED]
    task = lifecycle.get_task("limited")
    assert task.errors[-1].kind == ErrorKind.TIMEOUT.value and "time limit of 1 s" in task.errors[-1].message


def test_a_stopped_runner_takes_no_more_work_and_records_what_it_could_not_finish(make_settings):
    settings = make_settings(lock_seconds=6, heartbeat_seconds=1, runner_stop_seconds=2,
                             timeout_margin_seconds=0.5)
    _started.clear()
    _release.clear()
    _put(settings, ["running"], "test-export-unbounded")
    runner = Runner(_runner_request(settings, ["running"]), "runner-a", settings)
    result: list = []
    thread = threading.Thread(target=lambda: result.extend(runner.run()))
    thread.start()
    assert _started.wait(60)
    _put(settings, ["behind"], "test-export")  # due while it stops: left for another runner
    runner.stop_soon()  # ECS's SIGTERM
    thread.join(60)
    assert not thread.is_alive()
    task = lifecycle.get_task("running")
    assert (task.status, int(task.attempts)) == (TaskStatus.FAILED.value, 1)  # retried by another runner
    assert task.errors[-1].kind == ErrorKind.TIMEOUT.value and STOPPED_REASON in task.errors[-1].message
    behind = lifecycle.get_task("behind")
    assert (behind.status, int(behind.attempts)) == (TaskStatus.TODO.value, 0)
    assert [r.key for r in result] == ["running"]


def test_the_coordinator_starts_runners_for_due_container_work(make_settings):
    settings = make_settings(max_runners=2)
    _put(settings, ["long-a", "long-b", "long-c"], "test-export")
    _put(settings, ["short-a"], "test-short")
    invoker, launched = RecordingInvoker(), RecordingLauncher()
    supervisor = dispatch.Supervisor(settings, invoker, launcher=launched)
    slots.ensure_slots(settings.max_runners, pool=slots.RUNNERS)
    report = dispatch.tick(settings, invoker, launcher=launched, runner_memory=supervisor.runner_memory,
                           memory=supervisor.memory)
    assert report.runners_started == 2 == len(launched.requests)  # two runner slots: two runners
    hinted = [key for request in launched.requests for key in request.keys]
    assert len(hinted) == 2 and set(hinted) <= {"long-a", "long-b", "long-c"}
    assert "short-a" in {key for request in invoker.requests for key in request.keys}
    assert not {"long-a", "long-b", "long-c"} & {key for request in invoker.requests for key in request.keys}
    assert dispatch.Supervisor(settings, invoker).runner_memory is supervisor.runner_memory  # the next run's too
    # Both slots are reserved until the runners take them: the next tick starts none.
    again = dispatch.tick(settings, invoker, launcher=launched, runner_memory=supervisor.runner_memory,
                          memory=supervisor.memory)
    assert (again.runners_started, again.busy_runners) == (0, 2)


def test_a_runner_that_cannot_be_started_frees_its_slot(make_settings):
    settings = make_settings(max_runners=1)
    _put(settings, ["long-a"], "test-export")
    slots.ensure_slots(settings.max_runners, pool=slots.RUNNERS)

    class Refusing:
        def launch(self, request: RunnerRequest) -> None:
            raise RuntimeError("RunTask refused: no capacity")

    report = dispatch.tick(settings, RecordingInvoker(), launcher=Refusing())
    assert report.runners_started == 0
    assert len(slots.free_slots(settings.max_runners, 1, pool=slots.RUNNERS)) == 1
    assert lifecycle.get_task("long-a").status == TaskStatus.TODO.value


def test_the_api_checks_a_tasks_limit_against_its_types_runner(make_settings):
    settings = make_settings()
    invoker = RecordingInvoker()
    api = Api(settings, invoker)
    status, answer, _ = api.call("POST", "/tasks", {"type": "test-export-hours", "timeout_seconds": 20_000})
    assert status == 201, answer
    assert invoker.requests == []  # no Lambda worker started for it on submit: the coordinator starts runners
    status, answer, _ = api.call("POST", "/tasks", {"type": "test-short"})
    assert status == 201 and len(invoker.requests) == 1
    status, answer, _ = api.call("POST", "/tasks", {"type": "test-short", "timeout_seconds": 7200})
    assert status == 422 and "container runner" in json.dumps(answer)
    none = Api(make_settings(max_runners=0), RecordingInvoker())
    status, answer, _ = none.call("POST", "/tasks", {"type": "test-export", "key": "refused"})
    assert status == 422 and "runs on the container runner, and this deployment starts none" in json.dumps(answer)
    status, answer, _ = api.call("GET", "/types")
    runner = {t["type"]: t["runner"] for t in answer["types"]}
    assert runner["test-export"] == runner["test-export-hours"] == "container" and runner["test-short"] == "lambda"


_callbacks: list[dict] = []


@task_handler("test-batch-callback")
def _batch_callback(payload, context: TaskContext) -> None:
    _callbacks.append(payload["batch"])


def test_a_mixed_batch_runs_once_on_both_runners_and_its_callback_fires_once(make_settings):
    settings = make_settings(max_runners=2, max_concurrency=8, batch_size=4)
    _callbacks.clear()
    specs = [TaskSpec(key=f"s-{n}", type="test-short", batch_id="mixed") for n in range(40)]
    specs += [TaskSpec(key=f"l-{n}", type="test-export", payload={"seconds": 0.2}, batch_id="mixed")
              for n in range(3)]
    submit.put_batch(specs, "mixed", settings,
                     callbacks={"complete": NewTask.model_validate({"type": "test-batch-callback"})})
    invoker, launcher = dispatch.InProcessInvoker(settings), InProcessLauncher(settings)
    slots.ensure_slots(settings.max_runners, pool=slots.RUNNERS)  # as the supervisor does when it starts
    reports = []
    try:
        for _ in range(300):  # ticks, until the callback has run (bounded by looks, not by time)
            dispatch.tick(settings, invoker, launcher=launcher)
            reports += invoker.wait() + launcher.wait()
            if _callbacks and not any(True for _ in dispatch.index.due(TaskStatus.TODO, utcnow(), 1)):
                break
    finally:
        invoker.shutdown()
        launcher.shutdown()
    finished = [r.key for r in reports if r.outcome is TaskOutcome.FINISHED]
    assert sorted(k for k in finished if k != "mixed~complete") == sorted(spec.key for spec in specs)  # once each
    assert finished.count("mixed~complete") == 1 and len(_callbacks) == 1
    assert (_callbacks[0]["total"], _callbacks[0]["finished"], _callbacks[0]["ignored"]) == (43, 43, 0)
    hinted = {key for request in launcher.requests for key in request.keys}
    assert launcher.requests and hinted <= {"l-0", "l-1", "l-2"}  # runners were started for the long ones only
    assert not hinted & {key for request in invoker.requests for key in request.keys}


class RecordingLauncher:
    def __init__(self) -> None:
        self.requests: list[RunnerRequest] = []

    def launch(self, request: RunnerRequest) -> None:
        self.requests.append(request)


def test_a_killed_runners_task_is_taken_over_after_its_lock_lapses_and_finishes_once(make_settings, tmp_path):
    package = tmp_path / "file_tasks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "files.py").write_text(textwrap.dedent('''
        import time
        from pathlib import Path

        from coworker import TaskContext, task_handler

        @task_handler("test-convert-file", timeout_seconds=1200, runner="container")
        def convert(payload: dict, context: TaskContext) -> dict:
            log = Path(payload["log"])
            with log.open("a") as out:
                out.write(f"started {context.attempt}\\n")
            time.sleep(payload["seconds"] if context.attempt == 1 else 0.2)  # the first attempt's runner dies
            with log.open("a") as out:
                out.write(f"done {context.attempt}\\n")
            return {"attempt": context.attempt}
    '''))
    settings = make_settings(lock_seconds=4, heartbeat_seconds=1, max_runners=2)
    sys.path.insert(0, str(tmp_path))
    try:
        handlers.load_handler_modules(["file_tasks"])
        log = tmp_path / "attempts.log"
        _put(settings, ["file-1"], "test-convert-file", payload={"log": str(log), "seconds": 600})
        environment = {**{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}, **FAKE_CREDENTIALS,
                       **settings.as_environment(), "COWORKER_HANDLER_MODULES": "file_tasks",
                       "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
        launcher = ProcessRunnerLauncher(environment, stop_seconds=5)
        launcher.launch(_runner_request(settings, ["file-1"]))
        wait_until(lambda: log.exists() and "started 1" in log.read_text(), "the runner process starts the task")
        first = lifecycle.get_task("file-1")
        assert first.status == TaskStatus.PROCESSING.value and first.lock_owner.startswith("runner-")
        wait_until(lambda: lifecycle.get_task("file-1").lock_expires_at > first.lock_expires_at,
                   "the runner's heartbeat extends the lock")
        [process] = launcher.running()
        launcher.kill(process.process.pid)  # the Fargate task dies with its host: no SIGTERM
        process.process.wait()
        # Nobody records anything: the lock lapses, and the task is another runner's to take.
        # (the index lists a running task until a moment past its lock: due then)
        wait_until(lambda: lifecycle.get_task("file-1").due_at <= utcnow() - timedelta(seconds=0.5),
                   "the dead runner's lock lapses")
        reports = run_runner(_runner_request(settings), "runner-b", settings)
        assert [(r.key, r.outcome) for r in reports] == [("file-1", TaskOutcome.FINISHED)]
        task = lifecycle.get_task("file-1")
        assert (task.status, int(task.attempts), task.result) == (TaskStatus.FINISHED.value, 2, {"attempt": 2})
        assert log.read_text().splitlines() == ["started 1", "started 2", "done 2"]  # finished once
        launcher.shutdown()
    finally:
        sys.path.remove(str(tmp_path))
        handlers._registry.pop("test-convert-file", None)  # noqa: SLF001 - for this test only


def test_the_runners_start_request_is_checked():
    with pytest.raises(InvalidEventError, match="COWORKER_RUNNER_SLOT"):
        RunnerRequest.from_environment({})
    with pytest.raises(InvalidEventError, match="JSON list"):
        RunnerRequest.from_environment({"COWORKER_RUNNER_SLOT": "slot#runner-0001", "COWORKER_RUNNER_TOKEN": "t",
                                        "COWORKER_RUNNER_KEYS": "{"})
    request = RunnerRequest("slot#runner-0001", "t", ("a", "b"))
    assert RunnerRequest.from_environment(request.to_environment()) == request
    long_keys = [f"{n}-" + "k" * 1000 for n in range(10)]  # RunTask's overrides hold 8 KiB in all
    assert runners.fitting_hints(long_keys) == long_keys[:5]


def test_a_backlog_of_container_work_at_the_head_of_the_queue_hides_no_lambda_work(settings):
    # 300 of the runners' tasks due first: more than a worker's look, or a tick, read at once.
    long_ago = utcnow() - timedelta(minutes=10)
    for n in range(300):
        submit.put_task(TaskSpec(key=f"queued-long-{n:03d}", type="test-export"), settings, now=long_ago)
    _put(settings, ["short-fed", "short-ticked"], "test-short")
    invoker = RecordingInvoker()
    dispatch.tick(settings, invoker, now=utcnow())  # the coordinator hands the short ones out
    handed = {key for request in invoker.requests for key in request.keys}
    assert {"short-fed", "short-ticked"} <= handed and not any(key.startswith("queued-long") for key in handed)
    # a self-feeding worker finds them too
    reports = run_invocation(reserved_request(settings), "w", settings,
                             time.monotonic() + settings.worker_timeout_seconds)
    assert sorted(r.key for r in reports if r.outcome is TaskOutcome.FINISHED) == ["short-fed", "short-ticked"]
