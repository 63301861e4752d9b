"""Each role's grants, from the synthesized template, against the calls its code makes: exactly,
both ways, over the option sets that change them.

The scenario runs the library as the three functions and the container runner do, one role at a
time (nothing else runs in between, so every request belongs to the role whose turn it is),
against DynamoDB Local: the API puts, reads, lists, redrives, cancels, pauses and limits; the
coordinator supervises (after ``max_concurrency`` was lowered, so it retires extra slots), counts
batches from the stream, publishes completion events when they are on (EventBridge's PutEvents,
answered here) and starts a runner for container work with ECS RunTask (its ``EcsLauncher`` built
from the coordinator's environment in the template; the request is answered here, as moto's
Fargate ``run_task`` fails); the worker runs what was dispatched, with heartbeats, a concurrency
key, follow-ups whose payload goes to the object store, results large and small; the runner runs
what it was started for as ``main()`` does, with the same. Every request is turned into the IAM
action and resource it needs (:func:`template.needs`), with its condition keys (``ecs:cluster``,
``iam:PassedToService``, ``dynamodb:LeadingKeys``).

The check (:func:`check`) compares each role's statements (the runner's: its task definition's
task role), read wherever the template attaches them (:func:`template.role_grants`), with those
needs both ways:

* every call is allowed by the role's statements (one missing grant is an AccessDenied on AWS);
* every (action, resource) a statement names, literally as written, is one the role's code
  called; a wildcard counts as an over-grant even when a call falls under it, except those in
  :data:`ALLOWANCES`, each with its reason. A managed policy the template does not hold, or a
  ``NotAction``/``NotResource`` statement, is an over-grant too.

It runs for each of :data:`OPTION_SETS`. The scenario's settings come from each template's
environments, and one run serves every set whose functions get the same environments (the
``apiAuth`` option changes only ``COWORKER_API_AUTH``, which chooses the OpenAPI document's
security scheme: API Gateway checks callers, the code calls nothing more).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
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
from coworker.engine.offload import PAYLOAD_PREFIX, RESULT_PREFIX, FolderObjectStore
from coworker.engine.runner import run_runner
from coworker.engine.runners import RunnerRequest
from coworker.engine.worker import WorkerRequest, run_invocation
from coworker.errors import TaskNotFoundError
from coworker_cdk import constants as c

from tests.rehearsal.template import (
    ROLES,
    RUNNER,
    Targets,
    functions_of,
    logical_id,
    needs,
    render,
    rendered,
    request_context,
    role_grants,
    run_task_problem,
    runner_role,
    task_definition_of,
)
from tests.support.doubles import Api
from tests.support.registry import registered

pytest.importorskip("aws_cdk")

BIG = "x" * 20_000  # over the 16 KB a payload may take on the record

# The option sets that change the roles' grants or what the code calls. Each has the container
# runner (by default it is built only when a task type runs on it), so that its task role and the
# coordinator's RunTask are checked in each; without it, the functions' roles hold the same grants
# less RunTask's (test_without_the_runner_the_functions_hold_the_same_grants_but_run_task).
OPTION_SETS: dict[str, dict[str, str]] = {
    "defaults": {},
    "events": {c.CTX_EVENTS: "eventbridge"},
    "no-bucket": {c.CTX_RESULTS_BUCKET: "false"},
    "iam-auth": {c.CTX_API_AUTH: c.API_AUTH_IAM},
    "kms": {c.CTX_KMS_KEY: "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"},
}
WITH_RUNNER = {c.CTX_CONTAINER_RUNNER: "true"}
# Environment variables that change nothing the code calls (see the module's docstring).
NOT_CALLING = {"COWORKER_API_AUTH"}


@dataclass(frozen=True)
class Allowance:
    """A grant the exact check accepts though no call names it literally. ``resource`` is in the
    template's vocabulary, with ``{logs}`` (the function's log group), ``{queue}`` (the dead-letter
    queue), ``{bucket}`` and ``{key}`` (the customer-managed key, option kmsKeyArn; an allowance on
    it counts only in a stack that has one) filled in. ``called``: a wildcard over names the code makes at run time,
    accepted only when some call of the role falls under it; otherwise a grant the code never uses
    but AWS's service does with the role, which every function role must hold as written."""

    action: str
    resource: str
    why: str
    called: bool = False


_LOGS = "Lambda's service writes the function's log lines with its role, to its own log group only"
_XRAY = "Lambda's service sends the function's traces with its role; X-Ray's actions take no resource but *"
_DLQ = "Lambda's service sends a failed asynchronous event to the dead-letter queue with the function's role"
_OBJECTS = ("object names are made at run time (a hash of the task key, then the attempt and the owner): "
            "the object prefix is the narrowest resource that holds them")
_KEY = ("the customer-managed key (kmsKeyArn) encrypts the table, the bucket and the dead-letter queue: DynamoDB, S3 "
        "and SQS (and Lambda's service, for the queue) ask KMS for a data key to write and for its decryption to read "
        "with the caller's rights; the code never calls KMS itself")
KEY_USE = [Allowance(action, "{key}", _KEY) for action in ("kms:Decrypt", "kms:GenerateDataKey")]
LAMBDA_SERVICE = [Allowance("logs:CreateLogStream", "{logs}", _LOGS), Allowance("logs:PutLogEvents", "{logs}", _LOGS),
                  Allowance("xray:PutTraceSegments", "*", _XRAY), Allowance("xray:PutTelemetryRecords", "*", _XRAY)]
OBJECT_PREFIXES = [Allowance(action, f"{{bucket}}/{prefix}*", _OBJECTS, called=True)
                   for action in ("s3:GetObject", "s3:PutObject") for prefix in (RESULT_PREFIX, PAYLOAD_PREFIX)]
# The runner's task role has no service grant: its logs go through the task definition's execution
# role, and it has no X-Ray daemon. The API has no dead-letter queue (API Gateway invokes it).
ALLOWANCES: dict[str, list[Allowance]] = {
    "api": LAMBDA_SERVICE + OBJECT_PREFIXES + KEY_USE,
    "coordinator": [*LAMBDA_SERVICE, Allowance("sqs:SendMessage", "{queue}", _DLQ), *KEY_USE],
    "worker": [*LAMBDA_SERVICE, Allowance("sqs:SendMessage", "{queue}", _DLQ), *OBJECT_PREFIXES, *KEY_USE],
    RUNNER: OBJECT_PREFIXES + KEY_USE,
}
# The runner runs the worker's code (any task type's handler, a batch callback reading results
# too), so whatever the worker calls, the runner may: its grants are held against both.
SAME_CODE = {RUNNER: "worker"}


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
    """A batch's callback reading its tasks' results, one of them in the object store (without
    one, that result was not kept: the record has a note instead)."""
    results = read_results(["spawner", "many", "doomed"])
    rows = results["spawner"].get("rows")
    return {"rows": None if rows is None else len(rows), "finished": payload["batch"]["finished"]}


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
        # Whether the object store is there (the results bucket option): what the code reads from
        # its environment, not its settings (read_results does), so it is told here.
        self.bucket = True
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
    """Every request recorded; EventBridge's PutEvents answered here (every entry taken); the
    object store local (none in a run without the results bucket)."""
    recorder = Recorder()
    original = botocore.client.BaseClient._make_api_call

    def recorded(client: Any, operation: str, params: dict[str, Any]) -> Any:
        service = client.meta.service_model.service_name
        recorder.record_call(service, operation, params)
        if (service, operation) == ("events", "PutEvents"):
            return {"FailedEntryCount": 0,
                    "Entries": [{"EventId": f"rehearsal-{n}"} for n in range(len(params["Entries"]))]}
        return original(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", recorded)
    store = RecordingStore(str(tmp_path / "objects"), recorder)
    monkeypatch.setattr(offload, "store_for", lambda settings: store if recorder.bucket else None)
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
    # A claim waiting for its rate token whose lock a loaded machine could not keep extended is
    # given back unstarted (due again, no token spent): as many rounds as that takes, bounded by count.
    for _ in range(10):
        if "finished" in {_status("rated-1"), _status("rated-2")}:
            break
        supervise(settings)
        work()
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
    kept = settings.result_bucket is not None  # without a bucket, results over the budget are not kept
    assert lifecycle.get_task("rehearsal~complete").result["rows"] == (2_000 if kept else None)
    recorder.role = "api"
    code, body, _ = api.call("GET", "/tasks/long%2Fchild/result")  # its payload was read from the store
    assert (code, body.get("blob")) == (200, len(BIG) if kept else None), body


def _status(key: str) -> str | None:
    try:
        return lifecycle.get_task(key).status
    except TaskNotFoundError:
        return None


# -- one run per environment ---------------------------------------------------------------------


@dataclass
class Run:
    """What the code called in one run of the scenario: (role, service, operation, params), the
    object store's accesses (role, action, object name), and what ECS refused."""

    calls: list[tuple[str, str, str, dict[str, Any]]]
    objects: list[tuple[str, str, str]]
    refused: list[str] = field(default_factory=list)

    def used(self, targets: Targets) -> dict[str, set[tuple[str, str]]]:
        """Each role's (action, resource) needs, in the template's vocabulary."""
        used: dict[str, set[tuple[str, str]]] = {role: set() for role in (*ROLES, RUNNER)}
        for role, service, operation, params in self.calls:
            used[role].update(needs(service, operation, params, targets))
        for role, action, name in self.objects:
            used[role].add((action, f"{targets.bucket}/{name}"))
        return used


def code_environment(template: dict[str, Any]) -> str:
    """The environments the code runs with in this template (the three functions' and the runner
    container's, rendered), less what changes no call: two templates that give the same run the
    scenario the same way."""
    environments = {role: rendered(function["Properties"]["Environment"]["Variables"])
                    for role, function in functions_of(template).items()}
    definition = task_definition_of(template)
    if definition is not None:
        (container,) = definition[1]["ContainerDefinitions"]
        environments[RUNNER] = {variable["Name"]: render(variable["Value"]) for variable in container["Environment"]}
    return json.dumps({role: {name: value for name, value in variables.items() if name not in NOT_CALLING}
                       for role, variables in environments.items()}, sort_keys=True)


def scenario_settings(template: dict[str, Any]) -> dict[str, Any]:
    """The settings of the template that decide what the code calls, in its own vocabulary: the
    results bucket (the worker's and the API's), events and their bus, and where the coordinator
    starts runners (requests made with them name resources as the roles' statements do)."""
    functions = functions_of(template)
    worker = rendered(functions["worker"]["Properties"]["Environment"]["Variables"])
    coordinator = rendered(functions["coordinator"]["Properties"]["Environment"]["Variables"])
    taken = {"result_bucket": worker, "events": coordinator, "event_bus": coordinator, "runner_cluster": coordinator,
             "runner_task_definition": coordinator, "runner_subnets": coordinator,
             "runner_security_groups": coordinator, "runner_public_ip": coordinator, "runner_container": coordinator}
    found = {}
    for name, environment in taken.items():
        alias = Settings.model_fields[name].alias
        assert alias is not None, name
        if alias in environment:
            found[name] = environment[alias]
    return found


@pytest.fixture(scope="module")
def templates(synthesize) -> Callable[[str], dict[str, Any]]:
    """The template of each option set (with the runner), synthesized once: a copy each time."""
    cache: dict[str, dict[str, Any]] = {}

    def of(name: str) -> dict[str, Any]:
        if name not in cache:
            stack, assembly = synthesize({**WITH_RUNNER, **OPTION_SETS[name]})
            cache[name] = assembly.get_stack_by_name(stack.stack_name).template
        return copy.deepcopy(cache[name])

    return of


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """The scenario's runs of this module, by :func:`code_environment`."""
    return {}


@pytest.fixture
def recorded_run(runs: dict[str, Run], recorder: Recorder, make_settings) -> Callable[[dict[str, Any]], Run]:
    """The scenario's run for a template: the one of an earlier test with the same environments,
    or a new one."""

    def run(template: dict[str, Any]) -> Run:
        key = code_environment(template)
        if key not in runs:
            # A lock that slow writes on a loaded machine can still keep extended: with 3 s, a CI
            # run under load saw rated-1's lock given up (its token spent, it waited for the next one).
            settings = make_settings(max_concurrency=4, batch_size=2, lock_seconds=10, heartbeat_seconds=0.5,
                                     tick_seconds=0.3, supervise_seconds=1.0, worker_timeout_seconds=20,
                                     timeout_margin_seconds=1, inline_result_bytes=1024, max_runners=2,
                                     **scenario_settings(template))
            ecs = EcsAnswers(Targets.of(template))
            recorder.calls.clear()
            recorder.objects.clear()
            recorder.bucket = settings.result_bucket is not None
            run_scenario(settings, recorder, ecs)
            recorder.role = None
            runs[key] = Run(list(recorder.calls), list(recorder.objects), list(ecs.refused))
        return runs[key]

    return run


# -- the check -----------------------------------------------------------------------------------


@dataclass
class Findings:
    """(role, action, resource) the code calls and its role does not grant, and the role grants
    and its code does not call (an AWS managed policy, or a statement this check cannot read, as
    ``managed policy``/``unreadable`` with its ARN or text)."""

    missing: set[tuple[str, str, str]] = field(default_factory=set)
    over: set[tuple[str, str, str]] = field(default_factory=set)

    def __str__(self) -> str:
        return "\n".join([*(f"  not granted (AccessDenied on AWS): {role}: {action} on {resource}"
                            for role, action, resource in sorted(self.missing)),
                          *(f"  granted, never called: {role}: {action} on {resource}"
                            for role, action, resource in sorted(self.over))])


def failure_destination(template: dict[str, Any]) -> str:
    """The queue the functions' failed asynchronous invocations go to (their EventInvokeConfig):
    the worker's dead-letter queue, not the events' (a queue for rules on the stack's bus)."""
    (queue,) = {render(body["Properties"]["DestinationConfig"]["OnFailure"]["Destination"])
                for body in template["Resources"].values() if body["Type"] == "AWS::Lambda::EventInvokeConfig"}
    return queue


def allowances_of(template: dict[str, Any], targets: Targets) -> dict[str, dict[tuple[str, str], Allowance]]:
    """:data:`ALLOWANCES` with each role's log group, the dead-letter queue, the bucket and the
    customer-managed key filled in (without a key, those on it are left out)."""
    queue = failure_destination(template)
    (table,) = [body for body in template["Resources"].values() if body["Type"] == "AWS::DynamoDB::GlobalTable"]
    (replica,) = table["Properties"]["Replicas"]
    key = replica.get("SSESpecification", {}).get("KMSMasterKeyId")
    log_group = {role: f"{function['Properties']['LoggingConfig']['LogGroup']['Ref']}.Arn"
                 for role, function in functions_of(template).items()}
    return {role: {(allowance.action, allowance.resource.format(logs=log_group.get(role), queue=queue,
                                                                bucket=targets.bucket, key=key)): allowance
                   for allowance in allowed if key is not None or "{key}" not in allowance.resource}
            for role, allowed in ALLOWANCES.items()}


def check(template: dict[str, Any], run: Run) -> Findings:
    """The template's grants against what the code called in ``run``, both ways (see the module's
    docstring)."""
    grants = role_grants(template)
    targets = Targets.of(template)
    found = Findings()
    for role, service, operation, params in run.calls:
        context = request_context(service, operation, params)
        for action, resource in needs(service, operation, params, targets):
            if not grants[role].allow(action, resource, context):
                found.missing.add((role, action, resource))
    for role, action, name in run.objects:
        if not grants[role].allow(action, f"{targets.bucket}/{name}"):
            found.missing.add((role, action, f"{targets.bucket}/{name}"))
    used = run.used(targets)
    allowances = allowances_of(template, targets)
    for role, granted in grants.items():
        calls = used[role] | used.get(SAME_CODE.get(role, role), set())
        for action, resource in granted.granted() - calls:
            allowance = allowances[role].get((action, resource))
            if allowance is None or (allowance.called and not any(
                    a == action and fnmatchcase(r, resource) for a, r in calls)):
                found.over.add((role, action, resource))
        found.over |= {(role, "managed policy", arn) for arn in granted.managed}
        found.over |= {(role, "unreadable", statement) for statement in granted.unreadable}
    return found


# -- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPTION_SETS)
def test_each_role_holds_exactly_what_its_code_calls(name, templates, recorded_run) -> None:
    # Given the stack synthesized with the option set (and the container runner)
    template = templates(name)
    targets = Targets.of(template)

    # When each function's code, and the runner's, runs its part of a task's life with the
    # template's settings (or did, in an earlier test, with the same environments)
    run = recorded_run(template)

    # Then every request it made is allowed by its own role, and each role grants nothing its
    # code does not call but the allowances
    findings = check(template, run)
    assert findings == Findings(), f"{name}:\n{findings}"
    assert not run.refused, run.refused  # (and ECS takes the coordinator's RunTask requests as they are)
    # and each function's role holds what Lambda's service does with it
    allowances = allowances_of(template, targets)
    grants = role_grants(template)
    for role in ROLES:
        service = {pair for pair, allowance in allowances[role].items() if not allowance.called}
        assert service <= grants[role].granted(), (role, service - grants[role].granted())
    # and the scenario reached what it is meant to prove
    roles_seen = {role for role, *_ in run.calls}
    assert roles_seen == {*ROLES, RUNNER}
    operations = {(role, operation) for role, _, operation, _ in run.calls}
    assert ("coordinator", "DeleteItem") in operations  # extra slots retired
    assert ("worker", "TransactWriteItems") in operations  # follow-ups put with the completion
    assert ("coordinator", "Invoke") in operations  # a worker started by a tick
    assert ("coordinator", "RunTask") in operations  # a runner started by a tick
    assert {(RUNNER, "UpdateItem"), (RUNNER, "Query"), (RUNNER, "TransactWriteItems")} <= operations  # claims, feeds
    assert layout.STATUS_INDEX_NAME in {params.get("IndexName") for *_, params in run.calls}
    events = {role for role, service, *_ in run.calls if service == "events"}
    assert events == ({"coordinator"} if OPTION_SETS[name].get(c.CTX_EVENTS) else set())  # published, by it alone
    objects = {(role, action, object_name.split("/")[0]) for role, action, object_name in run.objects}
    if targets.bucket == "NoBucket.Arn":
        assert not objects
        assert not any(action.startswith("s3:") for grant in grants.values() for action, _ in grant.granted())
    else:
        assert ("worker", "s3:PutObject", "payloads") in objects
        assert {(RUNNER, "s3:PutObject", "payloads"), (RUNNER, "s3:GetObject", "payloads"),
                (RUNNER, "s3:PutObject", "results")} <= objects
    # (the coordinator's RunTask and PassRole among what it called: its two roles, to ECS tasks only)
    definition_id = scenario_settings(template)["runner_task_definition"]
    definition = targets.task_definitions[definition_id]
    assert {("ecs:RunTask", definition_id), ("iam:PassRole", definition.task_role),
            ("iam:PassRole", definition.execution_role)} <= run.used(targets)["coordinator"]


def _table(template: dict[str, Any]) -> dict[str, Any]:
    return {"Fn::GetAtt": [logical_id(template, "AWS::DynamoDB::GlobalTable"), "Arn"]}


def _objects(template: dict[str, Any]) -> dict[str, Any]:
    return {"Fn::Join": ["", [{"Fn::GetAtt": [logical_id(template, "AWS::S3::Bucket"), "Arn"]}, "/*"]]}


# Over-grants a wildcard hides from a check that matches grants against calls as patterns:
# (role, action, resource of the template). Each is a statement added to a role of the default stack.
OVER_GRANTS: dict[str, tuple[str, str, Callable[[dict[str, Any]], Any]]] = {
    "dynamodb-any-action-on-the-table": ("worker", "dynamodb:*", _table),
    "getitem-on-any-resource": ("api", "dynamodb:GetItem", lambda template: "*"),
    "s3-any-action-on-any-object": (RUNNER, "s3:*", _objects),
}


def _role_id(template: dict[str, Any], role: str) -> str:
    if role == RUNNER:
        found = runner_role(template)
        assert found is not None
        return found
    return str(functions_of(template)[role]["Properties"]["Role"]["Fn::GetAtt"][0])


def attach(template: dict[str, Any], role: str, how: str, statement: dict[str, Any]) -> None:
    """Add ``statement`` to ``role``'s grants in ``template``: to the policy the CDK attached to
    it, as an inline policy of the role, or as a managed policy of the template naming the role."""
    role_id = _role_id(template, role)
    resources = template["Resources"]
    if how == "role-policy":
        (policy,) = [body for body in resources.values() if body["Type"] == "AWS::IAM::Policy"
                     and {"Ref": role_id} in body["Properties"]["Roles"]]
        policy["Properties"]["PolicyDocument"]["Statement"].append(statement)
    elif how == "inline-policy":
        resources[role_id]["Properties"].setdefault("Policies", []).append(
            {"PolicyName": "Extra", "PolicyDocument": {"Version": "2012-10-17", "Statement": [statement]}})
    else:
        resources["ExtraManagedPolicy"] = {"Type": "AWS::IAM::ManagedPolicy", "Properties": {
            "PolicyDocument": {"Version": "2012-10-17", "Statement": [statement]}, "Roles": [{"Ref": role_id}]}}


@pytest.mark.parametrize("how", ["role-policy", "inline-policy", "managed-policy"])
@pytest.mark.parametrize("over_grant", OVER_GRANTS)
def test_the_check_reports_a_wildcard_over_grant(over_grant, how, templates, recorded_run) -> None:
    # Given the default stack, whose grants the check passes
    template = templates("defaults")
    run = recorded_run(template)
    assert check(template, run) == Findings()
    # and a statement whose wildcard covers calls the role makes, added to one role's grants
    role, action, resource = OVER_GRANTS[over_grant]
    attach(template, role, how, {"Effect": "Allow", "Action": action, "Resource": resource(template)})

    # When the grants are checked against the same calls
    findings = check(template, run)

    # Then the check reports that grant, and nothing else
    assert findings == Findings(over={(role, action, render(resource(template)))}), findings


@pytest.mark.parametrize("role_property", [
    {"ManagedPolicyArns": ["arn:aws:iam::aws:policy/AmazonDynamoDBFullAccess"]},
    {"Policies": [{"PolicyName": "Extra", "PolicyDocument": {"Statement": [
        {"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}]}}]},
], ids=["aws-managed-policy", "not-action"])
def test_the_check_reports_a_grant_it_cannot_read(role_property, templates, recorded_run) -> None:
    # Given the default stack, and the worker's role given a policy the check cannot hold to calls
    template = templates("defaults")
    run = recorded_run(template)
    template["Resources"][_role_id(template, "worker")]["Properties"].update(role_property)

    # When the grants are checked
    findings = check(template, run)

    # Then that policy is reported as an over-grant
    assert not findings.missing
    ((role, kind, _),) = findings.over
    assert (role, kind) == ("worker", "managed policy" if "ManagedPolicyArns" in role_property else "unreadable")


def test_without_the_runner_the_functions_hold_the_same_grants_but_run_task(templates, synthesize) -> None:
    # Given the default stack as it is synthesized without a task type on the container runner
    stack, assembly = synthesize({})
    plain = assembly.get_stack_by_name(stack.stack_name).template
    assert task_definition_of(plain) is None

    # When its functions' grants are set beside those of the same stack with the runner
    without, with_runner = role_grants(plain), role_grants(templates("defaults"))

    # Then they are the same (held exact by the defaults' check), less the coordinator's RunTask
    # and PassRole, and there is no runner role
    assert set(without) == set(ROLES)
    run_task = {(action, resource) for action, resource in with_runner["coordinator"].granted()
                if action in ("ecs:RunTask", "iam:PassRole")}
    assert len(run_task) == 3, run_task
    for role in ROLES:
        assert without[role].granted() == with_runner[role].granted() - run_task, role
        assert not without[role].managed and not without[role].unreadable, role
