"""The deploy rehearsal's scenario and the deployment it runs on (see test_on_the_wire).

What stands in for AWS: DynamoDB Local (tables and streams), a moto server (S3), the rehearsal's
own Lambda environments (one process per warm environment, the code and the layer's ``python/``
on the path, as Lambda puts them) and ECS tasks (one process per runner, ``python main.py`` in the
image's build context). The layer's and the image's third-party dependencies are the test
environment's own: theirs are built for arm64 and Python 3.13.
"""

from __future__ import annotations

import json
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
from coworker.config import Settings
from coworker_local.gateway import build_proxy_event

from tests.infra.support import runner_environment, runner_image_context
from tests.rehearsal.template import (
    RUNNER,
    Targets,
    environment_of,
    functions_of,
    layer_dir,
    render,
    resolved,
    role_grants,
    task_definition_of,
)
from tests.rehearsal.wire import ContainerTasks, FunctionPool, Gateway, Names, access_key
from tests.support.waits import wait_until

BIG_BYTES = 20_000  # over the 16 KB a payload may take on the record
# How long a wait goes on: at least this many coordinator runs and this many seconds.
WAIT_RUNS = 40
WAIT_SECONDS = 180.0
# Timings shortened so that heartbeats, ticks and supervision happen within seconds.
FAST = {"workerTimeoutSeconds": "30", "lockSeconds": "6", "heartbeatSeconds": "1", "tickSeconds": "0.5",
        "superviseSeconds": "3", "maxAttempts": "2"}
SCHEDULED_EVENT = {"version": "0", "id": "rehearsal", "detail-type": "Scheduled Event", "source": "aws.events",
                   "account": "000000000000", "time": "2026-11-25T00:00:00Z", "region": "us-east-1",
                   "resources": [], "detail": {}}


def write_rehearsal_handlers(root: Path, requirements: str = "", init: str = "") -> tuple[Path, str]:
    """A team's handlers package: the task types the rehearsal's scenario runs, its
    ``requirements`` and the package's ``__init__`` code (``init``)."""
    name = f"rehearsal_tasks_{uuid.uuid4().hex[:8]}"
    package = root / name
    (package / "reports").mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    (package / "tasks.py").write_text(textwrap.dedent('''
        import time
        from coworker import task_handler

        @task_handler("r-quick")
        def quick(payload, context):
            return {"ok": True, "size": len(str(payload))}

        @task_handler("r-callback")
        def batch_done(payload, context):
            """A batch's callback: reads its tasks' results (one kept in the object store)."""
            from coworker import read_results

            results = read_results(payload["payload"]["keys"])
            return {"event": payload["event"], "finished": payload["batch"]["finished"],
                    "rows": len(results["spawner"].get("rows", ())), "read": sorted(results)}

        @task_handler("r-spawn")
        def spawn(payload, context):
            """A follow-up (large enough for the object store when there is a bucket), a large result."""
            context.spawn("r-quick", {"blob": "x" * payload["blob_bytes"]}, key=f"{context.key}/child",
                          inherit_batch=True)
            return {"rows": list(range(2_000))}

        @task_handler("r-many")
        def many(payload, context):
            """More follow-ups than fit in the completion's transaction."""
            for number in range(110):
                context.spawn("r-quick", {"n": number}, key=f"{context.key}/{number}")

        @task_handler("r-beat")
        def beat(payload, context):
            time.sleep(payload["seconds"])  # several heartbeats
            return {"slept": payload["seconds"]}

        @task_handler("r-fail")
        def fail(payload, context):
            raise RuntimeError("always fails")

        @task_handler("r-slow")
        def slow(payload, context):
            time.sleep(0.1)
    '''))
    (package / "reports" / "__init__.py").write_text("")
    (package / "reports" / "summary.py").write_text(textwrap.dedent('''
        from coworker import task_handler

        @task_handler("r-summary")
        def summary(payload, context):
            return {"lines": len(payload or [])}
    '''))
    (package / "requirements.txt").write_text(requirements)
    return package, name


# Where the coordinator starts runners: the runner's ECS names, deployed as the template renders
# them (no ECS stands behind them; requests naming them meet the statements' names).
RUNNER_NAMES = ("COWORKER_RUNNER_CLUSTER", "COWORKER_RUNNER_TASK_DEFINITION")


class Deployment:
    """The rehearsed deployment: its gateway, its three functions (and its runner's ECS tasks, with
    a container runner) and what to call them with."""

    def __init__(self, template: dict[str, Any], assembly_dir: Path, names: Names, gateway: Gateway,
                 logs: Path, layer: Path | None = None) -> None:
        self.gateway = gateway
        self.names = names
        # How long a pause takes to reach every environment's claims (the functions' setting).
        worker_env = functions_of(template)["worker"]["Properties"]["Environment"]["Variables"]
        self.events_on = worker_env.get("COWORKER_EVENTS") == "eventbridge"
        self.control_cache_seconds = float(worker_env.get(
            "COWORKER_CONTROL_CACHE_SECONDS", Settings.model_fields["control_cache_seconds"].default))
        stand_ins = {Targets.of(template).table.removesuffix(".Arn"): names.table,
                     Targets.of(template).worker.removesuffix(".Arn"): names.worker_function,
                     "AWS::Region": "us-east-1"}
        if names.bucket:
            stand_ins[Targets.of(template).bucket.removesuffix(".Arn")] = names.bucket
        coordinator_env = functions_of(template)["coordinator"]["Properties"]["Environment"]["Variables"]
        stand_ins.update({render(coordinator_env[name]): render(coordinator_env[name])
                          for name in RUNNER_NAMES if name in coordinator_env})
        layer = layer or layer_dir(template, assembly_dir)
        self.pools: dict[str, FunctionPool] = {}
        for role, function in functions_of(template).items():
            properties = function["Properties"]
            env = {
                "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": access_key(role), "AWS_SECRET_ACCESS_KEY": "rehearsal",
                "AWS_ENDPOINT_URL": gateway.endpoint,
                "AWS_LAMBDA_FUNCTION_NAME": names.worker_function if role == "worker" else f"rehearsal-{role}",
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(properties.get("MemorySize", 128)),
                "POWERTOOLS_TRACE_DISABLED": "true",  # no X-Ray daemon here
                **environment_of(function, stand_ins),
            }
            code = assembly_dir / f"asset.{properties['Code']['S3Key'].removesuffix('.zip')}"
            self.pools[role] = FunctionPool(role, code, layer, env, properties["Handler"],
                                            int(properties.get("Timeout", 3)) * 1000, logs)
        gateway.functions = self.pools
        self.runners: ContainerTasks | None = None
        if task_definition_of(template) is not None:
            self.runners = gateway.runners = ContainerTasks(runner_image_context(assembly_dir, template), {
                "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
                "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",  # as the image's Dockerfile sets them
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": access_key(RUNNER), "AWS_SECRET_ACCESS_KEY": "rehearsal",
                "AWS_ENDPOINT_URL": gateway.endpoint,
                **resolved(runner_environment(template), stand_ins),
            }, logs)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request through API Gateway's proxy integration to the API function."""
        event = build_proxy_event(method, path, {"Content-Type": "application/json"},
                                  json.dumps(body) if body is not None else None, stage="prod")
        answer = self.pools["api"].invoke(event)
        assert "result" in answer, answer
        return answer["result"]["statusCode"], json.loads(answer["result"]["body"] or "null")

    def supervise(self) -> dict[str, Any]:
        answer = self.pools["coordinator"].invoke(SCHEDULED_EVENT)
        assert "result" in answer, answer
        return answer["result"]

    def status(self, key: str) -> str | None:
        code, body = self.call("GET", f"/tasks/{key.replace('/', '%2F')}")
        return body["status"] if code == 200 else None

    def wait(self, condition: Callable[[], bool], what: str, *, supervise: bool = True,
             describe: Callable[[], Any] | None = None) -> None:
        """Wait for ``condition``, with a coordinator run between looks; a denied request or a
        failed function ends the wait at once, with what went wrong. Bounded by both a number of
        runs and a time (a run with nothing to do ends after one tick, so runs alone would make
        a loaded machine's slow cold start look like a failure); neither is a budget of the code.
        A wait that ends unmet says what ``describe`` finds then, and which tasks are running."""
        runs, started, last = 0, time.monotonic(), None
        while runs < WAIT_RUNS or time.monotonic() - started < WAIT_SECONDS:
            if self.problems():
                raise AssertionError(f"while waiting for {what}:\n" + "\n".join(self.problems()))
            if condition():
                return
            if supervise:
                last = self.supervise()
            else:
                time.sleep(0.5)
            runs += 1
        found = describe() if describe is not None else None
        running = self.call("GET", "/tasks?status=processing")[1]
        raise AssertionError(f"never happened after {runs} coordinator runs: {what}; the last run: {last}; "
                             f"found: {found}; running: {running}")

    def workers_idle(self) -> bool:
        return not self.pools["worker"].busy

    def problems(self) -> list[str]:
        found = [f"{d.role}: AccessDenied {d.action} on {d.resource}" for d in self.gateway.denied()]
        found += self.gateway.refused
        for pool in self.pools.values():
            found += [f"{pool.role} could not start: {error}" for error in pool.init_errors]
            found += pool.errors()
        if self.runners is not None:
            found += self.runners.errors()
        return found

    def stop(self) -> None:
        for pool in self.pools.values():
            pool.stop()
        if self.runners is not None:
            self.runners.stop()


def template_env(template: dict[str, Any], name: str) -> str:
    return functions_of(template)["worker"]["Properties"]["Environment"]["Variables"][name]


def run_lifecycle(deployment: Deployment) -> None:
    """Put, dispatch on submit, claim, heartbeats, follow-ups, offload both ways, failures, retry,
    cancel, bulk, pause and resume, type limits, batch counting: each step through its function."""
    has_bucket = deployment.names.bucket is not None
    blob_bytes = BIG_BYTES if has_bucket else 100
    deployment.supervise()  # the first run after the deploy: it retires the extra slots
    assert deployment.call("POST", "/tasks", {"key": "plain", "type": "r-quick"})[0] == 201
    if has_bucket:
        assert deployment.call("POST", "/tasks", {"key": "big", "type": "r-quick",
                                                  "payload": {"blob": "x" * BIG_BYTES}})[0] == 201
    code, body = deployment.call("POST", "/tasks", {"tasks": [
        {"key": "spawner", "type": "r-spawn", "payload": {"blob_bytes": blob_bytes}},
        {"key": "beat", "type": "r-beat", "payload": {"seconds": 3}, "concurrency_key": "site"},
        {"key": "doomed", "type": "r-fail", "max_attempts": 1},
        {"key": "later", "type": "r-quick", "run_at": "2999-01-01T00:00:00Z"},
        {"key": "many", "type": "r-many"},
    ], "batch_id": "rehearsal", "tolerated_failure_count": 5,
        "callbacks": {"complete": {"type": "r-callback", "payload": {"keys": ["spawner", "many", "doomed"]}}}})
    assert code == 201, body
    # two starts of one rate key a minute apart: a worker takes a token, then books a wait
    rated = {"type": "r-quick", "rate_key": "rehearsal-api", "rate_limit": 1, "rate_interval_seconds": 60}
    code, body = deployment.call("POST", "/tasks", {"tasks": [{"key": f"rated-{n}", **rated} for n in (1, 2)]})
    assert code == 201, body
    for path in ("/tasks/plain", "/tasks?status=todo", "/stats", "/types", "/batches/rehearsal"):
        assert deployment.call("GET", path)[0] == 200, path
    assert deployment.call("PUT", "/types/r-slow/limit", {"limit": 2})[0] == 200
    assert deployment.call("PUT", "/rate-limits/type:r-slow", {"limit": 50, "interval_seconds": 60})[0] == 200
    assert deployment.call("POST", "/types/r-slow/pause")[0] == 200
    paused_at = time.monotonic()
    # A pause reaches every environment's claims within COWORKER_CONTROL_CACHE_SECONDS (documented):
    # a task put sooner may still be dispatched and run by an API or worker environment whose view
    # is older, and never parked. At least that long, then (a lower bound: load only lengthens it).
    time.sleep(max(0.0, deployment.control_cache_seconds - (time.monotonic() - paused_at)) + 0.5)
    assert deployment.call("POST", "/tasks", {"key": "paused-one", "type": "r-slow"})[0] == 201

    def held(task_type: str) -> int:
        return next(t["held"] for t in deployment.call("GET", "/types")[1]["types"] if t["type"] == task_type)

    # a coordinator run parks it (before the bulk cancel below, which would otherwise find it in
    # the queue: on a loaded machine every other wait can be over before its first look)
    deployment.wait(lambda: held("r-slow") == 1, "the paused type's task parked")

    expected = {"plain": "finished", "spawner": "finished", "spawner/child": "finished", "beat": "finished",
                "doomed": "ignored", "many": "finished", "many/109": "finished"}
    for key, status in expected.items():
        # the API started workers on submit; a coordinator run starts more while work is due
        deployment.wait(lambda key=key, status=status: deployment.status(key) == status, f"{key} {status}")
    assert deployment.call("GET", "/tasks/spawner/result")[0] == 200
    # one ran; the other waits its turn in the queue (booked a minute on), not in a worker; on a
    # machine slow enough that the minute has passed by now, both ran, their starts a minute apart
    def rated_one_at_a_time() -> bool:
        tasks = [deployment.call("GET", f"/tasks/rated-{n}")[1] for n in (1, 2)]
        statuses = sorted(task["status"] for task in tasks)
        if statuses == ["finished", "todo"]:
            return True
        if statuses == ["finished", "finished"]:
            first, second = sorted(datetime.fromisoformat(task["started_at"]) for task in tasks)
            assert (second - first).total_seconds() >= 59, tasks  # (the token's stamp, less a claim's skew)
            return True
        return False

    deployment.wait(rated_one_at_a_time, "one rate-limited task run, the other waiting",
                    describe=lambda: [deployment.call("GET", f"/tasks/rated-{n}")[1] for n in (1, 2)])
    for path in ("/rate-limits", "/rate-limits/key:rehearsal-api"):
        assert deployment.call("GET", path)[0] == 200, path
    assert deployment.call("POST", "/tasks/doomed/retry")[0] == 200
    assert deployment.call("POST", "/tasks/later/cancel")[0] == 200
    assert deployment.call("POST", "/bulk", {"action": "cancel", "status": "todo"})[0] == 200
    assert deployment.call("POST", "/batches/rehearsal/retry?status=ignored")[0] == 200
    assert deployment.call("POST", "/types/r-slow/resume")[0] == 200
    # schedules: put, listed, paused and deleted by the API's own role (DeleteItem of schedule#...)
    schedule = {"expression": "rate(1 hour)", "task": {"type": "r-quick"}}
    assert deployment.call("PUT", "/schedules/r-hourly", schedule)[0] == 201
    for method, path in (("GET", "/schedules"), ("POST", "/schedules/r-hourly/pause"),
                         ("DELETE", "/schedules/r-hourly")):
        assert deployment.call(method, path)[0] == 200, (method, path)
    # the resumed type's parked task: a coordinator run puts it back and one starts its worker
    deployment.wait(lambda: deployment.status("paused-one") == "finished", "the resumed task finished")
    deployment.wait(lambda: deployment.status("doomed") == "ignored" and deployment.workers_idle(),
                    "the retried task ignored again")
    # a coordinator run counts the batch from the table's stream
    deployment.wait(lambda: deployment.call("GET", "/batches/rehearsal")[1].get("done") is True,
                    "the batch counted done")
    # and puts its callback, whose handler reads the batch's results from the worker's role
    deployment.wait(lambda: deployment.status("rehearsal~complete") == "finished", "the batch's callback finished")
    summary = deployment.call("GET", "/tasks/rehearsal~complete/result")[1]
    if deployment.events_on:  # the coordinator published the batch's completion and the ignored task
        def sent(kind: str, field: str, value: str) -> bool:
            return any(entry["DetailType"] == kind and json.loads(entry["Detail"]).get(field) == value
                       for entry in deployment.gateway.events)
        deployment.wait(lambda: sent("Batch Completed", "batch_id", "rehearsal"), "the batch's event sent")
        assert sent("Task Ignored", "key", "doomed"), deployment.gateway.events
        assert {entry["EventBusName"] for entry in deployment.gateway.events} == {"rehearsal-bus"}
    # (the spawner's result is kept in the object store when there is one; without, only a preview)
    assert summary == {"event": "complete", "finished": summary["finished"], "rows": 2_000 if has_bucket else 0,
                       "read": ["many", "spawner"]}, summary


def run_smoke(deployment: Deployment) -> None:
    """The shortest walk through every function (the whole lifecycle is :func:`run_lifecycle`'s):
    a batch put through the API, run by workers it started, one task putting a follow-up, and the
    batch counted by the coordinator, whose callback reads the tasks' results."""
    deployment.supervise()  # the first run after the deploy
    code, body = deployment.call("POST", "/tasks", {"tasks": [
        {"key": "spawner", "type": "r-spawn", "payload": {"blob_bytes": 100}},
        {"key": "plain", "type": "r-quick"},
    ], "batch_id": "smoke",
        "callbacks": {"complete": {"type": "r-callback", "payload": {"keys": ["spawner", "plain"]}}}})
    assert code == 201, body
    for key in ("spawner", "spawner/child", "plain", "smoke~complete"):
        deployment.wait(lambda key=key: deployment.status(key) == "finished", f"{key} finished")
    summary = deployment.call("GET", "/tasks/smoke~complete/result")[1]
    assert summary == {"event": "complete", "finished": 3, "rows": 2_000, "read": ["plain", "spawner"]}, summary


@contextmanager
def deployed(template: dict[str, Any], assembly_dir: Path, make_settings: Callable[..., Any], logs: Path,
             layer: Path | None = None) -> Iterator[Deployment]:
    """The synthesized ``template`` stood up on the local services, torn down on the way out."""
    targets = Targets.of(template)
    # The table, with the slots an earlier deploy's coordinator made before maxConcurrency was lowered.
    settings = make_settings(status_shards=int(template_env(template, "COWORKER_STATUS_SHARDS")),
                             max_concurrency=3 * int(template_env(template, "COWORKER_MAX_CONCURRENCY")),
                             batch_size=int(template_env(template, "COWORKER_BATCH_SIZE")))
    server = bucket = s3_endpoint = None
    if not targets.bucket.startswith("NoBucket"):
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(port=0, verbose=False)
        server.start()
        s3_endpoint = f"http://127.0.0.1:{server._server.server_port}"
        bucket = f"rehearsal-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id="x",
                     aws_secret_access_key="x").create_bucket(Bucket=bucket)
    names = Names(table=settings.table_name, bucket=bucket, worker_function="rehearsal-worker")
    gateway = Gateway(role_grants(template), targets, names, settings.dynamodb_endpoint or "", s3_endpoint).start()
    deployment = Deployment(template, assembly_dir, names, gateway, logs, layer)
    try:
        yield deployment
    finally:
        wait_until(deployment.workers_idle, "the workers ended")
        deployment.stop()
        gateway.stop()
        if server is not None:
            server.stop()
