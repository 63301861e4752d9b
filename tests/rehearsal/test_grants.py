"""Each role's grants, from the synthesized template, against the calls its code makes.

The scenario runs the library as the three functions and the container runner do, one role at a
time (nothing else runs in between, so every request belongs to the role whose turn it is),
against DynamoDB Local: the API puts, reads, lists, redrives, cancels, pauses and limits; the
coordinator supervises (after ``max_concurrency`` was lowered, so it retires extra slots), counts
batches from the stream and starts a runner for container work with ECS RunTask (its
``EcsLauncher`` built from the coordinator's environment in the template; the request is answered
here, as moto's Fargate ``run_task`` fails); the worker runs what was dispatched, with heartbeats,
a concurrency key, follow-ups whose payload goes to the object store, results large and small; the
runner runs what it was started for as ``main()`` does, with the same. Every request is turned
into the IAM action and resource it needs, with its condition keys (``ecs:cluster``,
``iam:PassedToService``, ``dynamodb:LeadingKeys``), and checked against the statements of that
role in the template (the runner's: its task definition's task role): one missing grant is an
AccessDenied on AWS.
"""

from __future__ import annotations

import fnmatch
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import botocore.client
import pytest
from botocore.awsrequest import AWSResponse
from coworker import read_results
from coworker.config import Settings
from coworker.data import layout
from coworker.engine import dispatch, lifecycle, offload, progress, runners
from coworker.engine.handlers import TaskContext, task_handler
from coworker.engine.offload import FolderObjectStore
from coworker.engine.runner import run_runner
from coworker.engine.runners import RunnerRequest
from coworker.engine.worker import WorkerRequest, run_invocation
from coworker.errors import TaskNotFoundError

from tests.rehearsal.template import (
    ROLES,
    RUNNER,
    Grants,
    Targets,
    functions_of,
    logical_id,
    needs,
    rendered,
    request_context,
    role_grants,
    run_task_problem,
)
from tests.support.doubles import Api
from tests.support.registry import registered

pytest.importorskip("aws_cdk")

BIG = "x" * 20_000  # over the 16 KB a payload may take on the record
# Grants no request of the code needs: Lambda's service uses them with the function's role
# (its log lines, to the function's own log group only; X-Ray tracing; the worker's and the
# coordinator's failed asynchronous events sent to the dead-letter queue). The runner's task role
# has none: its logs go through the task definition's execution role, and it has no X-Ray daemon.
_SERVICE = [("logs:CreateLogStream", "{logs}"), ("logs:PutLogEvents", "{logs}"),
            ("xray:PutTelemetryRecords", "*"), ("xray:PutTraceSegments", "*")]
LAMBDA_SERVICE_GRANTS = {"api": sorted(_SERVICE), "coordinator": sorted([("sqs:SendMessage", "{queue}"), *_SERVICE]),
                         "worker": sorted([("sqs:SendMessage", "{queue}"), *_SERVICE])}


@task_handler("rehearsal-spawn")
def _spawn(payload: Any, context: TaskContext) -> dict[str, Any]:
    """A follow-up whose payload is too large for the record, and a result too large for it."""
    context.spawn("quick", {"blob": BIG}, key=f"{context.key}/big-child", inherit_batch=True)
    return {"rows": list(range(2_000))}


@task_handler("rehearsal-spawn-many")
def _spawn_many(payload: Any, context: TaskContext) -> None:
    """More follow-ups than fit in the completion's transaction: the rest are put first, in
    transactions that check the claim."""
    for number in range(110):
        context.spawn("quick", {"n": number}, key=f"{context.key}/{number}")


@task_handler("rehearsal-callback")
def _batch_done(payload: Any, context: TaskContext) -> dict[str, Any]:
    """A batch's callback reading its tasks' results, one of them in the object store."""
    results = read_results(["spawner", "many", "doomed"])
    return {"rows": len(results["spawner"]["rows"]), "finished": payload["batch"]["finished"]}


def _long(payload: Any, context: TaskContext) -> dict[str, Any]:
    """Container work: heartbeats, then a follow-up of its own type whose payload goes to the
    object store (a runner reads it back), and a result too large for the record."""
    time.sleep(float(payload.get("seconds", 0)))
    if payload.get("spawn"):
        context.spawn("rehearsal-long", {"blob": BIG}, key=f"{context.key}/child")
    return {"rows": list(range(2_000)), "blob": len(payload.get("blob", ""))}


@pytest.fixture(autouse=True, scope="module")
def _container_type() -> Iterator[None]:
    """The runner's type, registered for this module only (see tests.support.registry)."""
    with registered(("rehearsal-long", _long, {"runner": "container"})):
        yield


@task_handler("rehearsal-beat")
def _beat(payload: Any, context: TaskContext) -> dict[str, Any]:
    time.sleep(float(payload["seconds"]))
    return {"slept": payload["seconds"]}


# -- what the code calls ---------------------------------------------------------------------------


class Recorder:
    """Every AWS request made while a role has its turn, and every object store access."""

    def __init__(self) -> None:
        self.role: str | None = None  # nothing is recorded before the scenario starts (test setup)
        self.calls: list[tuple[str, str, str, dict[str, Any]]] = []  # (role, service, operation, params)
        self.objects: list[tuple[str, str, str]] = []  # (role, action, object key)
        self._lock = threading.Lock()

    def record_call(self, service: str, operation: str, params: dict[str, Any]) -> None:
        with self._lock:
            if self.role is not None:
                self.calls.append((self.role, service, operation, params))

    def record_object(self, action: str, name: str) -> None:
        with self._lock:
            if self.role is not None:
                self.objects.append((self.role, action, name))


class RecordingStore(FolderObjectStore):
    """The local object store, reporting each access as the S3 request it is on AWS."""

    def __init__(self, folder: str, recorder: Recorder) -> None:
        super().__init__(folder)
        self.recorder = recorder

    def put(self, name: str, body: bytes) -> str:
        self.recorder.record_object("s3:PutObject", name)
        return super().put(name, body)

    def get(self, uri: str) -> bytes:
        self.recorder.record_object("s3:GetObject", uri.split(str(self.folder), 1)[1].lstrip("/"))
        return super().get(uri)


class RecordingInvoker:
    """The worker invocations a role asks for, kept to run in the worker's turn."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.requests: list[WorkerRequest] = []

    def invoke(self, request: WorkerRequest) -> None:
        self.recorder.record_call("lambda", "Invoke", {})
        self.requests.append(request)

    def take(self) -> Iterator[WorkerRequest]:
        while self.requests:
            yield self.requests.pop(0)


class EcsAnswers:
    """ECS's side of the coordinator's RunTask requests (a hook on its client: moto's Fargate
    ``run_task`` fails): each request is checked as ECS checks it (:func:`template.run_task_problem`),
    answered with a task, and the runner it starts kept to run in the runner's turn."""

    def __init__(self, targets: Targets) -> None:
        self.targets = targets
        self.requests: list[RunnerRequest] = []
        self.refused: list[str] = []

    def client(self) -> Any:
        """An ECS client whose RunTask requests (built, validated and signed by botocore as they
        would be sent) are answered here."""
        client = boto3.client("ecs", region_name="us-east-1", aws_access_key_id="rehearsal",
                              aws_secret_access_key="rehearsal")
        client.meta.events.register("before-call.ecs.RunTask", self._answer)
        return client

    def _answer(self, params: dict[str, Any], **kwargs: Any) -> tuple[AWSResponse, dict[str, Any]]:
        sent = json.loads(params["body"])  # the request as it goes on the wire
        problem = run_task_problem(sent, self.targets)
        if problem is not None:
            self.refused.append(problem)
            return AWSResponse(None, 400, {}, None), {
                "Error": {"Code": "InvalidParameterException", "Message": problem},
                "ResponseMetadata": {"HTTPStatusCode": 400}}
        (override,) = sent["overrides"]["containerOverrides"]
        self.requests.append(RunnerRequest.from_environment({v["name"]: v["value"] for v in override["environment"]}))
        task = {"taskArn": f"arn:aws:ecs:us-east-1:000000000000:task/rehearsal/{len(self.requests)}",
                "lastStatus": "PROVISIONING"}
        return AWSResponse(None, 200, {}, None), {"tasks": [task], "failures": [],
                                                  "ResponseMetadata": {"HTTPStatusCode": 200}}

    def take(self) -> Iterator[RunnerRequest]:
        while self.requests:
            yield self.requests.pop(0)


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Recorder:
    recorder = Recorder()
    original = botocore.client.BaseClient._make_api_call

    def recorded(client: Any, operation: str, params: dict[str, Any]) -> Any:
        recorder.record_call(client.meta.service_model.service_name, operation, params)
        return original(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recorded)
    store = RecordingStore(str(tmp_path / "objects"), recorder)
    monkeypatch.setattr(offload, "store_for", lambda settings: store)
    return recorder


# -- the scenario --------------------------------------------------------------------------------


def run_scenario(settings: Settings, recorder: Recorder, ecs: EcsAnswers) -> None:
    invoker = RecordingInvoker(recorder)
    api = Api(settings, invoker)
    launcher = runners.EcsLauncher(settings, ecs.client())

    def as_role(role: str, action: Callable[[], Any]) -> Any:
        recorder.role = role
        return action()

    def supervise(run_settings: Settings) -> None:
        as_role("coordinator", lambda: dispatch.supervise(run_settings, invoker, lambda: 60.0, slack_seconds=0,
                                                          launcher=launcher))

    def work() -> None:
        recorder.role = "worker"
        for request in invoker.take():
            run_invocation(request, "rehearsal-worker", settings, time.monotonic() + settings.worker_timeout_seconds)
        run_runners()

    def run_runners() -> None:
        recorder.role = RUNNER  # each runner started, to its end (when no container work is due)
        for started in ecs.take():
            run_runner(started, f"rehearsal-runner-{started.token[:8]}", settings)
        recorder.role = None  # the test's own reads

    # The coordinator has run with more slots than it has now (maxConcurrency lowered).
    supervise(settings.model_copy(update={"max_concurrency": settings.max_concurrency * 3}))
    recorder.role = "api"
    assert api.call("POST", "/tasks", {"key": "plain", "type": "quick"})[0] == 201
    assert api.call("POST", "/tasks", {"key": "big", "type": "quick", "payload": {"blob": BIG}})[0] == 201
    # container work: a tick starts a runner for it
    assert api.call("POST", "/tasks", {"key": "long", "type": "rehearsal-long",
                                       "payload": {"seconds": 1.5, "spawn": True}})[0] == 201
    assert api.call("POST", "/tasks", {"tasks": [
        {"key": "spawner", "type": "rehearsal-spawn"},
        {"key": "beat", "type": "rehearsal-beat", "payload": {"seconds": 2.5}, "concurrency_key": "site"},
        {"key": "doomed", "type": "always-fail", "max_attempts": 1},
        {"key": "later", "type": "quick", "run_at": "2999-01-01T00:00:00Z"},
        {"key": "many", "type": "rehearsal-spawn-many"},
    ], "batch_id": "rehearsal", "tolerated_failure_count": 5,
        "callbacks": {"complete": {"type": "rehearsal-callback"}}})[0] == 201
    # two starts of one rate key a minute apart: the worker takes a token, then books a wait
    rated = {"type": "quick", "rate_key": "rehearsal-api", "rate_limit": 1, "rate_interval_seconds": 60}
    assert api.call("POST", "/tasks", {"tasks": [{"key": "rated-1", **rated}, {"key": "rated-2", **rated}]})[0] == 201
    for path in ("/tasks/plain", "/tasks?status=todo", "/stats", "/types", "/batches/rehearsal"):
        assert api.call("GET", path)[0] == 200
    assert api.call("PUT", "/types/slow/limit", {"limit": 2})[0] == 200
    assert api.call("PUT", "/rate-limits/type:slow", {"limit": 50, "interval_seconds": 60})[0] == 200
    assert api.call("POST", "/types/slow/pause")[0] == 200
    # parked by the coordinator while its type is paused; after the resume, a tick starts its worker
    assert api.call("POST", "/tasks", {"key": "paused-one", "type": "slow", "payload": {"seconds": 0.1}})[0] == 201
    work()
    supervise(settings)  # a runner started for the container work
    work()
    # The runner ended once nothing more was due, before its task put its follow-up: a tick starts
    # another runner for it (as many ticks as a busy machine needs, bounded by count, not by time).
    for _ in range(10):
        supervise(settings)
        run_runners()
        if _status("long/child") == "finished":
            break
    recorder.role = "api"
    assert api.call("GET", "/tasks/spawner/result")[0] == 200
    assert {_status("rated-1"), _status("rated-2")} == {"finished", "todo"}  # one ran, one waits its turn
    for path in ("/rate-limits", "/rate-limits/key:rehearsal-api"):
        assert api.call("GET", path)[0] == 200, path
    assert api.call("POST", "/tasks/doomed/retry")[0] == 200
    assert api.call("POST", "/tasks/later/cancel")[0] == 200
    assert api.call("POST", "/bulk", {"action": "cancel", "status": "todo"})[0] == 200
    assert api.call("POST", "/batches/rehearsal/retry?status=ignored")[0] == 200
    assert api.call("POST", "/types/slow/resume")[0] == 200
    schedule = {"expression": "rate(1 hour)", "task": {"type": "quick"}}
    assert api.call("PUT", "/schedules/hourly", schedule)[0] == 201
    for method, path in (("GET", "/schedules"), ("GET", "/schedules/hourly"), ("POST", "/schedules/hourly/pause"),
                         ("POST", "/schedules/hourly/resume"), ("DELETE", "/schedules/hourly")):
        assert api.call(method, path)[0] == 200, (method, path)
    # A tick puts the resumed type's parked task back and a later one starts its worker: as many
    # one-second runs as a busy machine needs (bounded by count, not by time).
    for _ in range(30):
        supervise(settings)
        if ("coordinator", "lambda", "Invoke") in {call[:3] for call in recorder.calls}:
            break
    work()
    recorder.role = "coordinator"
    progress.catch_up(settings)
    # Once the batch is counted done, a tick puts its callback and starts its worker.
    for _ in range(30):
        supervise(settings)
        work()
        recorder.role = None  # the test's own reads
        if _status("rehearsal~complete") == "finished":
            break
        recorder.role = "coordinator"
        progress.catch_up(settings)
    assert lifecycle.get_task("rehearsal~complete").result["rows"] == 2_000
    recorder.role = "api"
    code, body, _ = api.call("GET", "/tasks/long%2Fchild/result")  # its payload was read from the store
    assert (code, body["blob"]) == (200, len(BIG)), body


def _status(key: str) -> str | None:
    try:
        return lifecycle.get_task(key).status
    except TaskNotFoundError:
        return None


def test_every_call_of_each_function_and_the_runner_is_granted_to_its_role(make_settings, recorder,
                                                                          synthesize) -> None:
    # Given the stack as deployed with a results bucket and the container runner, and its roles' grants
    stack, assembly = synthesize({"resultsBucket": True, "containerRunner": True})
    template = assembly.get_stack_by_name(stack.stack_name).template
    grants = role_grants(template)
    queue = logical_id(template, "AWS::SQS::Queue")
    log_group = {role: function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
                 for role, function in functions_of(template).items()}
    service_grants = {role: sorted((a, r.format(queue=f"{queue}.Arn", logs=f"{log_group[role]}.Arn"))
                                   for a, r in granted)
                      for role, granted in LAMBDA_SERVICE_GRANTS.items()}
    targets = Targets.of(template)
    table = targets.table.removesuffix(".Arn")
    # Where the coordinator starts runners, as its environment in the template names them (in the
    # template's vocabulary, as the grants are: Ref Id -> Id, GetAtt Id Arn -> Id.Arn)
    coordinator_env = rendered(functions_of(template)["coordinator"]["Properties"]["Environment"]["Variables"])
    where = {name: coordinator_env[field.alias] for name, field in Settings.model_fields.items()
             if name in ("runner_cluster", "runner_task_definition", "runner_subnets", "runner_security_groups",
                         "runner_public_ip", "runner_container") and field.alias}
    # A lock that slow writes on a loaded machine can still keep extended: with 3 s, a CI run under
    # load saw rated-1's lock given up (its token spent, it waited for the next one).
    settings = make_settings(max_concurrency=4, batch_size=2, lock_seconds=10, heartbeat_seconds=0.5,
                             tick_seconds=0.3, supervise_seconds=1.0, worker_timeout_seconds=20,
                             timeout_margin_seconds=1, inline_result_bytes=1024, max_runners=2, **where)

    # When each function's code, and the runner's, runs its part of a task's life
    ecs = EcsAnswers(targets)
    run_scenario(settings, recorder, ecs)

    # Then every request it made is allowed by its own role
    missing = set()
    for role, service, operation, params in recorder.calls:
        for action, resource in needs(service, operation, params, targets):
            if not grants[role].allow(action, resource, request_context(service, operation, params)):
                missing.add((role, action, resource.replace(table, "Table")))
    for role, action, name in recorder.objects:
        if not grants[role].allow(action, f"{targets.bucket}/{name}"):
            missing.add((role, action, name.split("/")[0] + "/..."))
    assert not ecs.refused, ecs.refused  # (and ECS takes the coordinator's RunTask requests as they are)
    assert not missing, "calls the role does not grant (AccessDenied on AWS):\n" + "\n".join(
        f"  {role}: {action} on {resource}" for role, action, resource in sorted(missing))
    # and the scenario did reach what it is meant to prove
    roles_seen = {role for role, *_ in recorder.calls}
    assert roles_seen == {*ROLES, RUNNER}
    operations = {(role, operation) for role, _, operation, _ in recorder.calls}
    assert ("coordinator", "DeleteItem") in operations  # extra slots retired
    assert ("worker", "TransactWriteItems") in operations  # follow-ups put with the completion
    assert ("coordinator", "Invoke") in operations  # a worker started by a tick
    assert ("coordinator", "RunTask") in operations  # a runner started by a tick
    assert {(RUNNER, "UpdateItem"), (RUNNER, "Query"), (RUNNER, "TransactWriteItems")} <= operations  # claims, feeds
    objects = {(r, a, n.split("/")[0]) for r, a, n in recorder.objects}
    assert ("worker", "s3:PutObject", "payloads") in objects
    assert {(RUNNER, "s3:PutObject", "payloads"), (RUNNER, "s3:GetObject", "payloads"),
            (RUNNER, "s3:PutObject", "results")} <= objects
    assert layout.STATUS_INDEX_NAME in {params.get("IndexName") for *_, params in recorder.calls}
    used: dict[str, set[tuple[str, str]]] = {role: set() for role in (*ROLES, RUNNER)}
    for role, service, operation, params in recorder.calls:
        used[role].update(needs(service, operation, params, targets))
    for role, action, name in recorder.objects:
        used[role].add((action, f"{targets.bucket}/{name}"))
    # and each role holds nothing its code does not call, but what Lambda itself does with it
    unused = {role: sorted(_unused_grants(grants[role], used[role])) for role in ROLES}
    assert unused == service_grants
    # (the coordinator's RunTask and PassRole among what it called: its two roles, to ECS tasks only)
    definition = targets.task_definitions[where["runner_task_definition"]]
    assert {("ecs:RunTask", where["runner_task_definition"]), ("iam:PassRole", definition.task_role),
            ("iam:PassRole", definition.execution_role)} <= used["coordinator"]
    # and the runner's task role nothing that the code it shares with the worker does not call
    assert _unused_grants(grants[RUNNER], used[RUNNER] | used["worker"]) == []


def _unused_grants(grants: Grants, used: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each (action, resource) a role's statements grant that no request of the scenario needed."""
    return [(action, resource) for actions, resources, _ in grants.statements for action in actions
            for resource in resources
            if not any(fnmatch.fnmatchcase(a, action) and fnmatch.fnmatchcase(r, resource) for a, r in used)]
