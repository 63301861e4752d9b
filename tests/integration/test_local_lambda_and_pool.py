"""The local stand-ins for Lambda: its Invoke API in front of the worker pool, and pre-warmed
worker environments."""

from __future__ import annotations

import json
import subprocess
import time

import boto3
import pytest
from botocore.exceptions import ClientError
from coworker.engine import lifecycle, submit
from coworker.engine.dispatch import LambdaInvoker
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import WorkerRequest
from coworker_local.database import FAKE_CREDENTIALS
from coworker_local.lambda_service import LOCAL_WORKER_FUNCTION, LocalLambdaService
from coworker_local.workers import ProcessWorkerPool


class RecordingPool:
    def __init__(self) -> None:
        self.events: list[dict] = []

    def invoke(self, event: dict) -> None:
        self.events.append(event)


@pytest.fixture
def service():
    pool = RecordingPool()
    service = LocalLambdaService(pool).start()
    yield service, pool
    service.stop()


def _client(endpoint: str):
    return boto3.client("lambda", region_name="us-east-1", endpoint_url=endpoint,
                        aws_access_key_id=FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


def test_the_production_invoker_reaches_the_pool_through_the_local_invoke_api(service, monkeypatch):
    for name, value in FAKE_CREDENTIALS.items():  # as the local runtime sets them
        monkeypatch.setenv(name, value)
    svc, pool = service
    request = WorkerRequest(("a", "b"), "slot#0003", "token-1")
    LambdaInvoker(LOCAL_WORKER_FUNCTION, "us-east-1", endpoint=svc.endpoint).invoke(request)
    assert pool.events == [{"keys": ["a", "b"], "slot": "slot#0003", "token": "token-1"}]
    assert WorkerRequest.from_event(pool.events[0]) == request


def test_a_synchronous_invoke_or_a_bad_payload_is_refused_and_queues_nothing(service):
    svc, pool = service
    client = _client(svc.endpoint)
    with pytest.raises(ClientError, match="InvocationType=Event only"):
        client.invoke(FunctionName=LOCAL_WORKER_FUNCTION, Payload=b"{}")
    with pytest.raises(ClientError, match="not JSON"):
        client.invoke(FunctionName=LOCAL_WORKER_FUNCTION, InvocationType="Event", Payload=b"{nope")
    with pytest.raises(ClientError):
        client.invoke(FunctionName="another-function", InvocationType="Event", Payload=b"{}")
    assert pool.events == []


def test_prewarmed_environments_serve_the_first_invocations_warm(tmp_path):
    environ = {**FAKE_CREDENTIALS, "PATH": "/usr/bin:/bin", "COWORKER_DYNAMODB_ENDPOINT": "http://127.0.0.1:9",
               "POWERTOOLS_METRICS_DISABLED": "true"}
    pool = ProcessWorkerPool(environ, timeout_seconds=10, max_invocations=2, prewarm=2,
                             log=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if pool.stats()["idle_environments"] == 2:
                break
            time.sleep(0.1)
        assert pool.stats()["idle_environments"] == 2 and pool.counts["prewarmed"] == 2
        pool.invoke({"keys": []})  # nothing to run: the environment answers at once
        for _ in range(100):
            if pool.counts["ok"] == 1:
                break
            time.sleep(0.05)
        (invocation,) = pool.recent()
        assert invocation["result"] == "ok" and invocation["cold_start"] is False
        assert pool.counts["cold_starts"] == 0
    finally:
        pool.shutdown(drain_seconds=1)
    assert json.dumps(pool.stats())  # still readable after shutdown


def test_each_outcome_is_counted_when_its_task_ends_not_when_its_invocation_does(make_settings):
    # Given a quick and a slow task, handed to one worker invocation (a thread each)
    settings = make_settings(example_handlers=True, worker_timeout_seconds=60)
    submit.put_task(TaskSpec(key="quick", type="quick"), settings)
    submit.put_task(TaskSpec(key="slow", type="slow", payload={"seconds": 10}), settings)
    environ = {**FAKE_CREDENTIALS, "PATH": "/usr/bin:/bin", "POWERTOOLS_METRICS_DISABLED": "true",
               **settings.as_environment()}
    pool = ProcessWorkerPool(environ, timeout_seconds=60, max_invocations=1, log=subprocess.DEVNULL)
    try:
        pool.invoke({"keys": ["quick", "slow"]})

        # When the quick task has finished
        for _ in range(1200):
            if pool.outcomes["finished"] >= 1 or lifecycle.get_task("slow").status == "finished":
                break
            time.sleep(0.05)

        # Then its outcome is counted (and on the throughput series) while the invocation still runs
        assert pool.outcomes["finished"] == 1
        # (on a loaded machine the slow task's claim may land after the quick one finished)
        assert lifecycle.get_task("slow").status in ("todo", "processing") and pool.running()
        assert sum(finished for _second, finished, *_ in pool.series()) == 1
        (running,) = pool.running()
        assert running["outcomes"] == {"quick": "finished"}
    finally:
        pool.shutdown(drain_seconds=15)
    # and at the end every outcome is counted once
    assert pool.outcomes["finished"] == 2 and pool.recent()[0]["outcomes"] == {"quick": "finished",
                                                                               "slow": "finished"}
