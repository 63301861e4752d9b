"""The thin Lambda handlers, imported as Lambda imports them, driven with real event shapes."""

from __future__ import annotations

import importlib.util
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from coworker.engine import lifecycle, submit
from coworker.engine.dispatch import InProcessInvoker
from coworker.engine.tasks import TaskSpec

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = ROOT / "cdk" / "coworker_cdk" / "functions"


@dataclass
class FakeLambdaContext:
    function_name: str = "coworker-test"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:coworker-test"
    aws_request_id: str = ""
    remaining_ms: int = 60_000

    def __post_init__(self) -> None:
        self.aws_request_id = self.aws_request_id or str(uuid.uuid4())

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def _load(name: str, settings, monkeypatch):
    for key, value in settings.as_environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("COWORKER_WORKER_FUNCTION", "coworker-worker")
    spec = importlib.util.spec_from_file_location(f"{name}_handler", FUNCTIONS / name / "handler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_worker_handler_processes_its_batch(settings, monkeypatch):
    worker = _load("worker", settings, monkeypatch)
    submit.put_task(TaskSpec(key="a", type="quick"), settings)
    submit.put_task(TaskSpec(key="b", type="always-fail"), settings)
    result = worker.handler({"keys": ["a", "b", "missing"]}, FakeLambdaContext())
    assert result == {"tasks": 3, "outcomes": {"finished": 1, "failed": 1, "not_claimed": 1}}
    assert lifecycle.get_task("a").lock_owner is None


@pytest.mark.parametrize("event", [{"keys": "a"}, {"keys": [1]}, {"keys": ["a"], "slot": "slot#0000"}])
def test_worker_handler_rejects_a_malformed_event_and_touches_nothing(settings, monkeypatch, event):
    from coworker.errors import InvalidEventError

    worker = _load("worker", settings, monkeypatch)
    submit.put_task(TaskSpec(key="a", type="quick"), settings)
    with pytest.raises(InvalidEventError, match="worker event"):
        worker.handler(event, FakeLambdaContext())
    assert lifecycle.get_task("a").status == "todo"


def test_coordinator_handler_dispatches_and_supervises_until_nothing_is_left(make_settings, monkeypatch):
    # A window long enough for a loaded machine: the run ends because its work is done
    settings = make_settings(supervise_seconds=60.0, tick_seconds=0.2, dispatch_on_submit=False)
    coordinator = _load("coordinator", settings, monkeypatch)
    invoker = InProcessInvoker(coordinator.SETTINGS)
    monkeypatch.setattr(coordinator, "INVOKER", invoker)
    for i in range(3):
        submit.put_task(TaskSpec(key=f"t{i}", type="quick"), settings)
    event = {"id": "evt-1", "detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}
    result = coordinator.handler(event, FakeLambdaContext())
    invoker.wait()
    # The first tick started workers; the run went on ticking while they ran, and ended at the
    # first tick that found nothing running or due (not at the end of its minute)
    assert result["started"] >= 1 and result["ticks"] >= 2 and result["last"]["idle"], result
    assert {lifecycle.get_task(f"t{i}").status for i in range(3)} == {"finished"}


def test_coordinator_refuses_to_start_without_a_worker_function(settings, monkeypatch):
    from coworker.errors import ConfigurationError

    monkeypatch.setenv("COWORKER_WORKER_FUNCTION", "")
    for key, value in settings.as_environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("COWORKER_WORKER_FUNCTION")
    spec = importlib.util.spec_from_file_location("coord_bad", FUNCTIONS / "coordinator" / "handler.py")
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(ConfigurationError, match="COWORKER_WORKER_FUNCTION"):
        spec.loader.exec_module(module)
