"""Tasks of a type the deployment no longer has (issue 51, item 6c).

An upgrade can leave tasks queued whose type the new code does not register: the previous release
deployed the example types by default, HEAD deploys them only with ``exampleHandlers=true``. The
API refuses new tasks of such a type; the queued ones reach a worker. Decided (docs/deploy.md,
"Upgrading"): such a task is not lost. Each attempt records an ``unknown_type`` error naming the
type; at its attempt ceiling it is ``ignored``, and once a deployment has the type again (deploy
with the option on) a redrive runs it. The better outcome, the task left due without an attempt
burnt until a deployment has its type, needs the worker: the strict xfail below says so.
"""

from __future__ import annotations

import time

import pytest
from coworker.data.models import ErrorKind, TaskStatus
from coworker.engine import handlers, lifecycle, submit
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import process_task

pytestmark = pytest.mark.both_backends
RETIRED = "test-retired-type"


def _run(payload, context):
    return {"ran": payload["n"]}


def _deadline() -> float:
    return time.monotonic() + 60


def _put_retired(settings, key: str, max_attempts: int) -> None:
    # Put as the previous release's API put it: the type was registered then.
    with pytest.MonkeyPatch.context() as then:
        then.setattr(handlers, "_registry", dict(handlers._registry))
        handlers.task_handler(RETIRED)(_run)
        submit.put_task(TaskSpec(key=key, type=RETIRED, payload={"n": 7}, max_attempts=max_attempts), settings)
    assert RETIRED not in handlers.registered_types()


def test_a_task_whose_type_is_gone_is_kept_and_runs_after_a_redrive_once_the_type_is_back(settings, monkeypatch):
    # Given a task queued by the release, of a type this deployment does not register
    _put_retired(settings, "queued-by-release", max_attempts=2)

    # When workers of this deployment reach it until it is not claimed any more
    outcomes = [process_task("queued-by-release", f"w{i}", settings, _deadline()).outcome for i in range(3)]

    # Then it is ignored, not lost: every attempt says which type had no handler
    assert outcomes == [TaskOutcome.FAILED, TaskOutcome.IGNORED, TaskOutcome.NOT_CLAIMED]
    task = lifecycle.get_task("queued-by-release")
    assert task.status == TaskStatus.IGNORED.value
    assert [e.kind for e in task.errors] == [ErrorKind.UNKNOWN_TYPE.value] * 2
    assert all(RETIRED in e.message for e in task.errors)

    # When a deployment has the type again (exampleHandlers=true) and the task is redriven
    monkeypatch.setattr(handlers, "_registry", dict(handlers._registry))
    handlers.task_handler(RETIRED)(_run)
    assert lifecycle.retry("queued-by-release", settings) is not None
    report = process_task("queued-by-release", "w-after", settings, _deadline())

    # Then it runs once, with its payload as queued
    assert report.outcome is TaskOutcome.FINISHED
    task = lifecycle.get_task("queued-by-release")
    assert (task.status, task.result) == (TaskStatus.FINISHED.value, {"ran": 7})


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="needs the worker (coworker/engine/worker.py): a task whose type has no "
                   "handler should be given back due, its attempt not counted, with an error naming the type")
def test_a_task_whose_type_is_gone_stays_due_with_no_attempt_burnt(settings):
    _put_retired(settings, "waits-for-its-type", max_attempts=1)
    process_task("waits-for-its-type", "w", settings, _deadline())
    task = lifecycle.get_task("waits-for-its-type")
    assert (task.status, task.attempts) == (TaskStatus.TODO.value, 0)
    assert RETIRED in task.errors[-1].message
