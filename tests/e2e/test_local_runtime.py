"""End to end: tasks submitted over HTTP to ``python -m coworker_local`` run in worker processes
and end in the states, attempts and error histories the lifecycle promises."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime

import pytest

from tests.e2e.conftest import READY_PATTERN, REPO_ROOT, LocalRuntimeProcess, runtime_env

pytestmark = pytest.mark.slow


def _submit(runtime, tasks: list[dict]) -> str:
    response = runtime.post("/tasks", json={"tasks": tasks})
    assert response.status_code == 201, response.text
    return response.json()["batch_id"]


def test_tasks_reach_their_final_states_with_their_histories(runtime):
    """Given quick, flaky, always-fail and too-slow tasks, when they run, then each ends as designed."""
    run = uuid.uuid4().hex[:6]
    quick = [f"{run}-quick-{i}" for i in range(12)]
    tasks = [{"key": key, "type": "quick", "payload": {"n": i}} for i, key in enumerate(quick)]
    tasks += [
        {"key": f"{run}-flaky", "type": "flaky", "payload": {"fail_attempts": 1}},
        {"key": f"{run}-fail", "type": "always-fail", "payload": {"reason": "unknown product"},
         "max_attempts": 3},
        # Longer than the handler's share of the worker timeout (8 s - 2 s margin).
        {"key": f"{run}-too-slow", "type": "slow", "payload": {"seconds": 30}, "max_attempts": 1},
    ]
    # A type with no handler is refused at submit, with the known ones listed.
    refused = runtime.post("/tasks", json={"tasks": [*tasks, {"key": f"{run}-nobody", "type": "no-such-type"}]})
    assert refused.status_code == 422 and "tasks[15].type" in refused.text and "quick" in refused.text
    batch = runtime.wait_batch_done(_submit(runtime, tasks), timeout=60)
    assert (batch["total"], batch["finished"], batch["ignored"]) == (15, 13, 2)

    for key in quick:
        task = runtime.task(key)
        assert (task["status"], task["attempts"], task["errors"]) == ("finished", 1, []), task
        assert task["result"]["sha256"] and task["finished_at"] and task["lock_owner"] is None

    flaky = runtime.task(f"{run}-flaky")
    assert (flaky["status"], flaky["attempts"]) == ("finished", 2)
    assert [(e["attempt"], e["kind"]) for e in flaky["errors"]] == [(1, "system")]
    assert "ConnectionError" in flaky["errors"][0]["message"] and flaky["errors"][0]["traceback"]

    failing = runtime.task(f"{run}-fail")
    assert (failing["status"], failing["attempts"]) == ("ignored", 3)
    assert [(e["attempt"], e["kind"], e["message"]) for e in failing["errors"]] == [
        (n, "business", "unknown product") for n in (1, 2, 3)]

    # The worker's graceful timeout recorded the attempt and released the lock before the
    # process would have been killed at the Lambda-like timeout.
    slow = runtime.task(f"{run}-too-slow")
    assert (slow["status"], slow["attempts"], slow["lock_owner"]) == ("ignored", 1, None)
    assert [e["kind"] for e in slow["errors"]] == ["timeout"]


    workers = runtime.get("/local/info").json()["workers"]
    assert workers.get("timeout-killed", 0) == 0
    assert workers["ok"] >= 1


def _claimed_invocation(runtime, key: str) -> dict | None:
    """The running worker invocation that holds ``key``'s claim, once it is claimed."""
    task = runtime.task(key)
    if task["status"] != "processing":
        return None
    running = runtime.get("/local/invocations").json()["running"]
    return next((i for i in running if i["owner"] == task["lock_owner"] and key in i["keys"]), None)


@pytest.fixture(scope="module")
def long_runtime(start_module_runtime):
    """A runtime whose workers may run a task for 40 s (the shared one's end at 8 s): its victims
    run long enough to be still running when a kill lands on a loaded machine."""
    return start_module_runtime("--no-demo", COWORKER_WORKER_TIMEOUT_SECONDS="40")


def test_a_killed_worker_process_loses_its_task_to_another_after_the_lock_expires(long_runtime):
    """Given a slow task running in a worker process, when that process is SIGKILLed, then after
    the lock expires another worker completes it, as attempt 2 with a worker_lost entry."""
    runtime = long_runtime
    key = f"{uuid.uuid4().hex[:6]}-victim"
    # long enough to be running still when the kill lands on a loaded machine (its retry runs it whole)
    _submit(runtime, [{"key": key, "type": "slow", "payload": {"seconds": 12}}])

    invocation = runtime.wait_for(lambda: _claimed_invocation(runtime, key), 30,
                                  "the task to be claimed by a worker process", interval=0.05)
    os.kill(invocation["pid"], signal.SIGKILL)

    task = runtime.wait_for(lambda: (t := runtime.task(key))["status"] == "finished" and t,
                            90, "the task to finish after its lock expired")
    assert task["attempts"] == 2
    assert task["lock_owner"] is None
    assert [(e["attempt"], e["kind"]) for e in task["errors"]] == [(1, "worker_lost")]
    recent = runtime.get("/local/invocations", params={"recent": 1}).json()["recent"]
    killed = next(i for i in recent if i["seq"] == invocation["seq"])
    assert killed["result"] == "crashed" and killed["pid"] == invocation["pid"]


def test_a_killed_holders_place_in_its_concurrency_group_comes_back_when_its_lock_expires(long_runtime):
    """Given a task of concurrency key K (limit 1) running in a worker process, and a second task
    of K waiting for the place, when that process is SIGKILLed, then the second task stays
    blocked until the dead holder's lock expires, and both then finish, one at a time."""
    runtime = long_runtime
    run = uuid.uuid4().hex[:6]
    victim, waiter = f"{run}-holder", f"{run}-waiter"
    group = {"concurrency_key": f"site-{run}", "concurrency_limit": 1}
    # long enough to hold the place while the waiter is put, dispatched and blocked on a loaded machine
    _submit(runtime, [{"key": victim, "type": "slow", "payload": {"seconds": 20}, **group}])

    invocation = runtime.wait_for(lambda: _claimed_invocation(runtime, victim), 120, "the holder to be claimed",
                                  interval=0.05)
    _submit(runtime, [{"key": waiter, "type": "slow", "payload": {"seconds": 0.2}, **group}])
    runtime.wait_for(lambda: runtime.task(waiter)["blocked"], 120, "the waiter to be blocked", interval=0.05)
    lease_ends = datetime.fromisoformat(runtime.task(victim)["lock_expires_at"])  # (or later: extended since)
    os.kill(invocation["pid"], signal.SIGKILL)
    killed_at = time.monotonic()

    time.sleep(2)
    blocked = runtime.task(waiter)["blocked"]
    if datetime.now(UTC) < lease_ends:  # (a machine too loaded to look in time proves nothing)
        assert blocked is True  # the dead holder's lease has not ended yet
    tasks = runtime.wait_for(lambda: all((t := [runtime.task(victim), runtime.task(waiter)])[i]["status"]
                                         == "finished" for i in (0, 1)) and t, 120, "both tasks to finish")
    assert time.monotonic() - killed_at >= 5  # not before the lock (10 s here, from the claim) expired
    holder, other = tasks
    assert holder["attempts"] == 2 and [e["kind"] for e in holder["errors"]] == ["worker_lost"]
    assert other["attempts"] == 1 and not other["blocked"]


def test_dashboard_and_api_documents_are_served(runtime):
    page = runtime.get("/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["Content-Type"]
    assert '<script src="/dashboard/static/dashboard.js">' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no CDN: works offline
    script = runtime.get("/dashboard/static/dashboard.js")
    assert script.status_code == 200 and "fetch(" in script.text
    assert runtime.get("/openapi.json").json()["paths"]["/tasks"]
    assert runtime.get("/docs").status_code == 200
    info = runtime.get("/local/info").json()
    assert info["settings"]["tick_seconds"] == 0.5  # the environment variable reached the runtime
    assert info["settings"]["dynamodb_endpoint"].startswith("http://127.0.0.1:")
    # the API's handler answered in processes of its own (Lambda's execution environments)
    assert info["api"]["requests"] >= 2 and info["api"]["pids"]  # /openapi.json and /docs at least
    assert runtime.process.pid not in info["api"]["pids"]
    # the coordinator: every tick counted (not the 120 the history keeps), how long ago the last
    # was, and what it does: a run holds the lease while it supervises, and one that finds nothing
    # to do ends (idle exit) and lets it go until the next run a tick later
    deadline = time.monotonic() + 60
    while (info := runtime.get("/local/info").json())["ticks"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    first = info["ticks"]
    assert info["coordinator_state"] in ("supervising", "idle"), info["coordinator_state"]
    assert info["coordinator_holds_lease"] is (info["coordinator_state"] == "supervising")
    assert 0 <= info["last_tick_age_seconds"] < 30
    while runtime.get("/local/info").json()["ticks"] <= first and time.monotonic() < deadline:
        time.sleep(0.2)
    assert runtime.get("/local/info").json()["ticks"] > first


def test_ctrl_c_interrupts_running_workers_and_they_record_their_tasks(start_runtime):
    """Given a task in progress, when the runtime gets Ctrl-C, then the worker records it as an
    interrupted (timeout) attempt and releases the lock before the runtime exits."""
    runtime = start_runtime("--no-demo", "--drain-seconds", "0.5")
    key = "interrupted-1"
    _submit(runtime, [{"key": key, "type": "slow", "payload": {"seconds": 30}}])  # still running at Ctrl-C
    runtime.wait_for(lambda: runtime.task(key)["status"] == "processing", 30, "the task to be claimed",
                     interval=0.05)
    assert runtime.stop(signal.SIGINT) == 0
    output = runtime.text()
    assert re.search(r"Stopped\. .* [1-9]\d* interrupted", output), output
    log = runtime.log_file.read_text()
    assert '"message":"worker interrupted by SIGTERM"' in log and '"recorded":1' in log, log[-2000:]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not a running process.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ", 1)[1][0] != "Z"


def test_the_default_database_is_dynamodb_local_and_dies_with_a_killed_runtime(start_runtime):
    """Given the runtime on its default database, when the runtime alone is SIGKILLed, then its
    DynamoDB Local (a Java child process) and its worker processes do not outlive it."""
    runtime = start_runtime("--no-demo", own_database=True, COWORKER_WORKER_TIMEOUT_SECONDS="300")
    database = runtime.get("/local/info").json()["database"]
    if database["backend"] != "dynamodb-local":
        pytest.skip(f"DynamoDB Local cannot run here: {database['description']}")
    assert database["pid"] and _alive(database["pid"])
    assert "DynamoDB Local (in memory)" in runtime.text()
    # a worker busy with a long task (an idle one would end anyway, at the end of its input)
    _submit(runtime, [{"key": "orphaned-1", "type": "slow", "payload": {"seconds": 240}}])
    runtime.wait_for(lambda: runtime.task("orphaned-1")["status"] == "processing", 30, "the task to start")
    workers = [pid for pid in _children(runtime.process.pid) if pid != database["pid"]]
    assert workers, "the runtime's worker processes"

    os.kill(runtime.process.pid, signal.SIGKILL)
    runtime.process.wait(timeout=10)
    runtime.wait_for(lambda: not _alive(database["pid"]), 15, "DynamoDB Local to exit with its parent")
    # and its worker processes (sessions of their own) end too
    runtime.wait_for(lambda: not any(_alive(pid) for pid in workers), 120, "the workers to exit with their runtime")


def test_data_dir_keeps_tasks_across_a_hard_stop_and_expired_locks_are_taken_over(start_runtime, tmp_path):
    """Given a runtime keeping its data in a folder, a finished task and a task in progress, when
    every process of the runtime is SIGKILLed and it is started again on the same folder, then
    the finished task is still there and the orphaned task is taken over once its lock expires."""
    data_dir = tmp_path / "db"
    first = start_runtime("--no-demo", "--data-dir", str(data_dir), COWORKER_WORKER_TIMEOUT_SECONDS="40")
    if first.get("/local/info").json()["database"]["backend"] != "dynamodb-local":
        pytest.skip("DynamoDB Local cannot run here")
    _submit(first, [{"key": "kept", "type": "quick"}])
    first.wait_for(lambda: first.task("kept")["status"] == "finished", 30, "the quick task to finish")
    _submit(first, [{"key": "orphan", "type": "slow", "payload": {"seconds": 12}}])  # running when killed
    first.wait_for(lambda: first.task("orphan")["status"] == "processing", 30, "the slow task to be claimed",
                   interval=0.05)
    first.kill_group()

    second = start_runtime("--no-demo", "--data-dir", str(data_dir), COWORKER_WORKER_TIMEOUT_SECONDS="40")
    assert "(existing: tasks kept)" in second.text()
    assert second.task("kept")["status"] == "finished"
    task = second.wait_for(lambda: (t := second.task("orphan"))["status"] == "finished" and t,
                           90, "the orphaned task to be taken over after its lock expired")
    assert task["attempts"] == 2
    assert [(e["attempt"], e["kind"]) for e in task["errors"]] == [(1, "worker_lost")]


def test_moto_is_the_fallback_database_and_refuses_a_data_dir(start_runtime, run_local, tmp_path):
    runtime = start_runtime("--no-demo", "--db", "moto")
    assert runtime.get("/local/info").json()["database"]["backend"] == "moto"
    batch = runtime.wait_batch_done(_submit(runtime, [{"key": "on-moto", "type": "quick"}]), timeout=30)
    assert batch["finished"] == 1

    refused = run_local("--no-demo", "--db", "moto", "--data-dir", str(tmp_path))
    assert refused.returncode == 1
    assert "a data folder needs DynamoDB Local" in refused.stderr


def test_your_handlers_package_runs_in_the_worker_processes_without_pythonpath(start_runtime, tmp_path):
    """``--handlers DIR``: the API and every worker process import the package; the banner lists
    its types next to the examples."""
    from tests.support.handler_packages import write_handler_package

    package, name, task_type = write_handler_package(tmp_path)
    runtime = start_runtime("--no-demo", "--handlers", str(package), "--env", "TEAM_GREETING=hello, workers")
    assert runtime.wait_for(lambda: "Task types" in runtime.text(), 10, "the banner")
    banner_types = next(line for line in runtime.text().splitlines() if "Task types" in line)
    assert task_type in banner_types and "quick" in banner_types and str(package) in banner_types
    response = runtime.post("/tasks", json={"key": f"{name}-1", "type": task_type, "payload": {"n": 5}})
    assert response.status_code == 201, response.text
    task = runtime.wait_for(lambda: (t := runtime.task(f"{name}-1"))["status"] == "finished" and t, 30,
                            "the task to finish")
    assert task["result"] == {"doubled": 10, "attempt": 1}

    # A 2 MB result: kept in the result store (a folder here, S3 on AWS), read back whole.
    response = runtime.post("/tasks", json={"key": f"{name}-big", "type": f"{task_type}-big",
                                            "payload": {"bytes": 2_000_000}})
    assert response.status_code == 201, response.text
    big = runtime.wait_for(lambda: (t := runtime.task(f"{name}-big"))["status"] == "finished" and t, 30,
                           "the big task to finish")
    assert big["result"] is None and big["result_ref"]["bytes"] > 2_000_000
    response = runtime.get(f"/tasks/{name}-big/result")
    assert response.status_code == 200 and len(response.content) == big["result_ref"]["bytes"]
    assert response.json() == {"text": "é" * 1_000_000, "attempt": 1}

    # ``--env``: your handlers' own variables reach the worker processes, as a function's environment.
    response = runtime.post("/tasks", json={"key": f"{name}-env", "type": f"{task_type}-env",
                                            "payload": {"name": "TEAM_GREETING"}})
    assert response.status_code == 201, response.text
    told = runtime.wait_for(lambda: (t := runtime.task(f"{name}-env"))["status"] == "finished" and t, 30,
                            "the env task to finish")
    assert told["result"] == {"value": "hello, workers"}


def test_the_repository_handlers_folder_is_picked_up_by_default(runtime):
    key = f"order-{uuid.uuid4().hex[:6]}"
    response = runtime.post("/tasks", json={"key": key, "type": "charge-order",
                                            "payload": {"order": "o-9", "amount_cents": 300}})
    assert response.status_code == 201, response.text
    task = runtime.wait_for(lambda: (t := runtime.task(key))["status"] == "finished" and t, 30, "the order")
    assert task["result"]["charged_cents"] == 300


def test_a_handlers_folder_that_is_not_a_package_is_refused_before_anything_starts(run_local, tmp_path):
    (tmp_path / "my_tasks").mkdir()
    result = run_local("--handlers", str(tmp_path / "my_tasks"), "--no-demo")
    assert result.returncode == 2
    assert "has no __init__.py; add an empty one" in result.stderr
    result = run_local("--example-handlers", "false", "--tasks", "5")
    assert result.returncode == 2 and "the demo submits the example task types" in result.stderr


def test_a_runtime_started_with_ctrl_c_ignored_still_stops_on_it(tmp_path):
    """Given a runtime started by something that ignores SIGINT (a script's background job),
    when it gets Ctrl-C, then it stops in order as usual."""
    runtime = LocalRuntimeProcess(["--no-demo"], runtime_env(), tmp_path / "coworker.log",
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert runtime.stop(signal.SIGINT, timeout=60) == 0
        assert "Stopped." in runtime.text()
    finally:
        runtime.kill_group()


def test_sigterm_during_a_long_start_stops_the_runtime_as_ctrl_c_does(tmp_path):
    """Given a runtime whose start takes long (a kept table of a million tasks is read first),
    when it gets SIGTERM while starting, then it stops what it started and exits, rather than
    finish starting first."""
    script = textwrap.dedent("""
        import sys, time
        from coworker_local import __main__ as command, runtime

        def long_start(self):
            print("starting", flush=True)
            time.sleep(120)

        runtime.LocalRuntime.start = long_start
        runtime.LocalRuntime.stop = lambda self: print("stopped what had started", flush=True)
        sys.exit(command.main(["--no-demo", "--db", "moto", "--api-port", "0"]))
    """)
    process = subprocess.Popen([sys.executable, "-c", script], env=runtime_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "starting"
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130
    assert "Stopped while starting." in out and "stopped what had started" in out


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().split(") ", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def test_a_runtime_whose_parent_dies_stops_with_its_workers_and_database(tmp_path):
    """Given a runtime started by a process (a test, a script, an editor) with its workers and
    its database running, when that process is SIGKILLed, then the runtime, its workers and its
    database all end: nothing it started is left behind."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import subprocess, sys, time
            runtime = subprocess.Popen([sys.executable, "-m", "coworker_local", "--no-demo", "--api-port", "0",
                                        "--log-file", {str(tmp_path / "coworker.log")!r}])
            print("runtime", runtime.pid, flush=True)
            time.sleep(3600)
        """)],
        cwd=REPO_ROOT, env=runtime_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    assert launcher.stdout is not None
    runtime_pid = None
    try:
        for line in launcher.stdout:
            if line.startswith("runtime "):
                runtime_pid = int(line.split()[1])
            if READY_PATTERN.search(line):
                break
        assert runtime_pid is not None
        started = [runtime_pid, *_children(runtime_pid)]
        assert len(started) >= 2, "the runtime's workers and database"

        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)

        end = time.monotonic() + 120
        while time.monotonic() < end and any(_alive(pid) for pid in started):
            time.sleep(0.2)
        assert not [pid for pid in started if _alive(pid)], "left behind by a runtime whose parent died"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        for pid in _children(runtime_pid or -1) + ([runtime_pid] if runtime_pid else []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_runtime_page_shows_no_secret(runtime):
    """/local/info (the dashboard's data) tells that a cursor secret is set, not what it is: with it,
    anyone could sign cursors of their own."""
    settings = runtime.get("/local/info").json()["settings"]
    assert settings["cursor_secret"] == "(set)"


def test_a_host_name_allowed_on_the_command_line_is_answered(start_runtime):
    runtime = start_runtime("--no-demo", "--allow-host", "devbox.example")
    port = runtime.url.rsplit(":", 1)[1]
    assert runtime.get("/stats", headers={"Host": f"devbox.example:{port}"}).status_code == 200
    assert runtime.get("/stats", headers={"Host": f"other.example:{port}"}).status_code == 421


def test_a_container_type_runs_in_a_runner_process_the_dashboard_lists(start_runtime, tmp_path):
    """A type that runs on the container runner: the local coordinator starts a runner process for
    it (RunTask's stand-in), which runs it and exits; /local/info (the dashboard) lists the runner."""
    package = tmp_path / "video_tasks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "video.py").write_text(textwrap.dedent('''
        import os

        from coworker import TaskContext, task_handler

        @task_handler("transcode", timeout_seconds=3600)   # an hour: longer than any Lambda gives
        def transcode(payload: dict, context: TaskContext) -> dict:
            return {"pid": os.getpid(), "attempt": context.attempt}
    '''))
    runtime = start_runtime("--no-demo", "--handlers", str(package))
    response = runtime.post("/tasks", json={"key": "video-1", "type": "transcode"})
    assert response.status_code == 201, response.text
    task = runtime.wait_for(lambda: (t := runtime.task("video-1"))["status"] == "finished" and t, 120,
                            "the container task to finish")
    runners = runtime.get("/local/info").json()["runners"]
    assert runners["started"] >= 1
    assert task["result"]["pid"] in {runner["pid"] for runner in runners["runners"]}  # ran in a runner process
    types = {t["type"]: t["runner"] for t in runtime.get("/types").json()["types"]}
    assert types["transcode"] == "container" and types["quick"] == "lambda"
