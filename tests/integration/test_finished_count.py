"""The local dashboard's count of finished tasks: a table scan that never holds its answer.

Finished tasks leave the status index, so the local runtime counts them with a scan. At a million
tasks that scan took minutes, and ``/local/info`` (the dashboard's refresh) waited for it: the
scale run's refresh timed out after 120 s. The scan now runs on a thread of its own."""

from __future__ import annotations

import threading
import time

from coworker.data.models import TaskModel
from coworker.engine import submit
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch
from coworker_local import runtime as runtime_module
from coworker_local.runtime import LocalRuntime

from tests.support.waits import wait_until


def _finish(settings, keys: list[str]) -> None:
    for key in keys:
        submit.put_task(TaskSpec(key=key, type="quick"), settings)
    run_batch(keys, "w", settings, time.monotonic() + 30)


def test_a_slow_count_of_finished_tasks_does_not_hold_the_dashboards_answer(make_settings, monkeypatch):
    # Given a runtime that counted 3 finished tasks (a small table: counted at once)
    settings = make_settings()
    _finish(settings, ["a", "b", "c"])
    runtime = LocalRuntime(settings)
    assert runtime.finished_count()[0] == 3

    # and a table whose next scan is held (as a million tasks' scan takes minutes)
    _finish(settings, ["d"])
    release, scans = threading.Event(), []
    real_scan = TaskModel.scan

    def held_scan(*args, **kwargs):
        scans.append(1)
        assert release.wait(120), "the test never released the scan"
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(TaskModel, "scan", held_scan)
    monkeypatch.setattr(runtime_module, "FINISHED_COUNT_WAIT_SECONDS", 0.05)
    try:
        # When the dashboard asks again, twice, while that scan is held
        answers = []
        # (a new scan starts once the last one's pause, 4x its duration, is over)
        wait_until(lambda: answers.append(runtime.finished_count(max_age=0)) or scans, "a new scan to start")
        first, second = answers[-1], runtime.finished_count(max_age=0)

        # Then both answer with the last count and its age, and the second starts no other scan
        assert first[0] == second[0] == 3 and first[1] is not None
        assert len(scans) == 1 and not release.is_set()
    finally:
        release.set()

    # and once the scan ends, the count is the new one
    wait_until(lambda: runtime.finished_count(max_age=0)[0] == 4, "the held scan's count")
