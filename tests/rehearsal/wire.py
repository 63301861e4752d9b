"""The AWS side of the deploy rehearsal: an endpoint that holds every request of the three
functions and the container runner to the permissions of the caller's role, Lambda execution
environments that run each function from its synthesized asset, and ECS tasks that run the
runner from its image's build context.

Each function (and each runner) runs with the access key ``rehearsal<role>`` and
``AWS_ENDPOINT_URL`` pointing here, so its unchanged code (boto3 and pynamodb resolve the endpoint
themselves, as they resolve AWS's) sends DynamoDB, DynamoDB Streams, S3, Lambda, EventBridge and
ECS requests to :class:`Gateway`. The gateway reads the caller's role from the request's
signature, turns the request into the IAM actions and resources it needs (:func:`template.needs`)
and checks them, with the condition keys the request carries, against that role's statements in
the template: a request the role does not allow gets the ``AccessDenied`` answer AWS gives, and is
recorded. Allowed requests go on to DynamoDB Local, to a moto server (S3), for ``lambda:Invoke``
to the named function's pool of execution environments, and for ``ecs:RunTask`` (moto's Fargate
``run_task`` fails) to :class:`ContainerTasks`, which starts the runner as a process; events
allowed by ``events:PutEvents`` are kept in :attr:`Gateway.events`.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.rehearsal.template import Grants, Targets, needs, request_context, run_task_problem

CONTAINER_SCRIPT = Path(__file__).with_name("lambda_container.py")
_CREDENTIAL = re.compile(r"Credential=rehearsal([a-z]+)/[^/]+/[^/]+/([a-z0-9-]+)/")
_INVOKE = re.compile(r"^/2015-03-31/functions/([^/]+)/invocations$")


def access_key(role: str) -> str:
    """The role's access key (letters only: DynamoDB Local refuses any other)."""
    return f"rehearsal{role}"


@dataclass
class Names:
    """The deployed names the template's references stand for in the rehearsal."""

    table: str
    bucket: str | None
    worker_function: str


@dataclass
class Invocation:
    """One run of a function: its event and what it answered."""

    role: str
    event: dict[str, Any]
    answer: dict[str, Any] | None = None


class Container:
    """One execution environment: a process that imported the function's module and runs events."""

    def __init__(self, role: str, code: Path, layer: Path, env: dict[str, str], handler: str,
                 log: Path) -> None:
        read, write = os.pipe()
        self.log = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, str(CONTAINER_SCRIPT)], cwd=code, stdin=subprocess.PIPE, stdout=self.log,
            stderr=subprocess.STDOUT, pass_fds=(write,), text=True,
            env={**env, "REHEARSAL_RESULT_FD": str(write), "REHEARSAL_HANDLER": handler,
                 "PYTHONPATH": os.pathsep.join([str(code), str(layer / "python")])})
        os.close(write)
        self.answers = os.fdopen(read, "r")
        self.role = role
        self.start = json.loads(self.answers.readline() or '{"init_error": "the process died at start-up"}')

    def run(self, event: dict[str, Any], timeout_ms: int) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"event": event, "timeout_ms": timeout_ms}) + "\n")
        self.process.stdin.flush()
        line = self.answers.readline()
        return json.loads(line) if line else {"error": "the execution environment died"}

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.answers.close()
        self.log.close()


@dataclass
class FunctionPool:
    """The warm execution environments of one function; a new one starts when all are busy."""

    role: str
    code: Path
    layer: Path
    env: dict[str, str]
    handler: str
    timeout_ms: int
    logs: Path
    invocations: list[Invocation] = field(default_factory=list)
    init_errors: list[str] = field(default_factory=list)
    _idle: list[Container] = field(default_factory=list)
    _all: list[Container] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _running: int = 0

    def invoke(self, event: dict[str, Any], timeout_ms: int | None = None) -> dict[str, Any]:
        """Run ``event`` in an idle environment (or a new one) and return its answer."""
        invocation = Invocation(self.role, event)
        with self._lock:
            self.invocations.append(invocation)
            self._running += 1
            container = self._idle.pop() if self._idle else None
        try:
            if container is None:
                container = Container(self.role, self.code, self.layer, self.env, self.handler,
                                      self.logs / f"{self.role}.log")
                with self._lock:
                    self._all.append(container)
                if "init_error" in container.start:
                    self.init_errors.append(container.start["init_error"])
                    invocation.answer = {"error": container.start["init_error"]}
                    return invocation.answer
            invocation.answer = container.run(event, timeout_ms or self.timeout_ms)
            with self._lock:
                self._idle.append(container)
            return invocation.answer
        finally:
            with self._lock:
                self._running -= 1

    def invoke_later(self, event: dict[str, Any]) -> None:
        """An asynchronous (``Event``) invocation: Lambda answers at once and runs it after."""
        threading.Thread(target=self.invoke, args=(event,), daemon=True).start()

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._running > 0

    def imported_files(self) -> list[dict[str, str]]:
        """Where each started environment found the library and the function's module."""
        with self._lock:
            return [container.start["files"] for container in self._all if "files" in container.start]

    def modules_from_code(self) -> set[str]:
        """The top-level modules the started environments imported from the function's code."""
        with self._lock:
            return {name for container in self._all for name in container.start.get("from_code", [])}

    def errors(self) -> list[str]:
        return [f"{self.role}: {i.answer['error']}\n{i.answer.get('trace', '')}" for i in self.invocations
                if i.answer and "error" in i.answer]

    def stop(self) -> None:
        for container in self._all:
            container.stop()


@dataclass
class ContainerTasks:
    """The container runner's ECS tasks: each RunTask starts ``python main.py`` in the image's build
    context (:func:`tests.infra.support.runner_image_context`) as a process of its own, with the
    container's environment ``env`` (the template's, deployed) and the request's container
    overrides on top, as ECS sets them. The library's dependencies are the test environment's own
    (the image's are built for arm64); the code is the context's."""

    context: Path
    env: dict[str, str]
    logs: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, params: dict[str, Any]) -> dict[str, Any]:
        """Start one runner for a RunTask request; ECS's description of the task started."""
        overrides = {variable["name"]: variable["value"]
                     for override in (params.get("overrides") or {}).get("containerOverrides", [])
                     for variable in override.get("environment", [])}
        task = f"arn:aws:ecs:us-east-1:000000000000:task/rehearsal/{uuid.uuid4().hex}"
        with self._lock, (self.logs / "runner.log").open("ab") as log:
            self.processes.append(subprocess.Popen(
                [sys.executable, "main.py"], cwd=self.context, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env={**self.env, **overrides}))
        return {"taskArn": task, "taskDefinitionArn": params["taskDefinition"], "lastStatus": "PROVISIONING",
                "launchType": params.get("launchType"), "startedBy": params.get("startedBy")}

    @property
    def started(self) -> int:
        with self._lock:
            return len(self.processes)

    def exit_codes(self) -> list[int | None]:
        """Each runner's exit status so far (``None`` while it runs)."""
        with self._lock:
            return [process.poll() for process in self.processes]

    def ended(self) -> bool:
        """At least one runner started, and every one has exited."""
        codes = self.exit_codes()
        return bool(codes) and None not in codes

    def errors(self) -> list[str]:
        return [f"runner: exited with status {code} (see {self.logs / 'runner.log'})"
                for code in self.exit_codes() if code not in (None, 0)]

    def stop(self) -> None:
        """Stop what still runs as ECS stops a task: SIGTERM, then SIGKILL after the stop timeout
        (here, shorter: a rehearsal runner has nothing left to finish)."""
        with self._lock:
            running = [process for process in self.processes if process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass
class Decision:
    role: str
    action: str
    resource: str
    allowed: bool


class Gateway:
    """AWS's endpoints, with each role's permissions enforced (see the module's docstring)."""

    def __init__(self, grants: dict[str, Grants], targets: Targets, names: Names, dynamodb_endpoint: str,
                 s3_endpoint: str | None) -> None:
        self.grants = grants
        self.targets = targets
        self.names = names
        self.dynamodb = urlsplit(dynamodb_endpoint).netloc
        self.s3 = urlsplit(s3_endpoint).netloc if s3_endpoint else None
        self.functions: dict[str, FunctionPool] = {}
        self.runners: ContainerTasks | None = None  # the runner's ECS tasks, when the stack has a runner
        self.refused: list[str] = []  # requests a role allowed that the service refused (ECS's checks)
        self.decisions: list[Decision] = []
        self.events: list[dict[str, Any]] = []  # PutEvents entries taken: EventBridge's stand-in
        self._lock = threading.Lock()
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, headers, answer = gateway.handle(self.command, self.path, dict(self.headers), body)
                self.send_response(status)
                for name, value in headers.items():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Gateway:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- the decision -------------------------------------------------------------------------

    def denied(self) -> list[Decision]:
        with self._lock:
            return [d for d in self.decisions if not d.allowed]

    def allowed(self, role: str) -> set[tuple[str, str]]:
        with self._lock:
            return {(d.action, d.resource) for d in self.decisions if d.allowed and d.role == role}

    def _decide(self, role: str, wanted: list[tuple[str, str]], context: dict[str, list[str]] | None = None
                ) -> Decision | None:
        """Record each (action, resource) the request needs (with the condition keys ``context``);
        the first one denied, if any."""
        first_denied = None
        with self._lock:
            for action, resource in wanted:
                decision = Decision(role, action, resource, self.grants[role].allow(action, resource, context))
                self.decisions.append(decision)
                if not decision.allowed and first_denied is None:
                    first_denied = decision
        return first_denied

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, dict[str, str], bytes]:
        found = _CREDENTIAL.search(headers.get("Authorization", ""))
        if found is None or found.group(1) not in self.grants:
            return 403, {}, b'{"message": "the rehearsal knows no role for this request\'s signature"}'
        role, service = found.groups()
        if service == "dynamodb":
            return self._dynamodb(role, headers, body)
        if service == "s3":
            return self._s3(role, method, path, headers, body)
        if service == "lambda":
            return self._lambda(role, path, headers, body)
        if service == "events":
            return self._events(role, headers, body)
        if service == "ecs":
            return self._ecs(role, headers, body)
        return 400, {}, f"the rehearsal does not serve {service}".encode()

    # -- the services ----------------------------------------------------------------------------

    def _dynamodb(self, role: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        prefix, _, operation = headers.get("X-Amz-Target", "").partition(".")
        params = json.loads(body or b"{}")
        service = "dynamodbstreams" if prefix.startswith("DynamoDBStreams") else "dynamodb"
        targets = self.targets
        tables = {params.get("TableName")} | {item[next(iter(item))].get("TableName")
                                               for item in params.get("TransactItems", [])}
        tables |= set(params.get("RequestItems", {}))
        tables.discard(None)
        if tables - {self.names.table}:  # another table than the deployment's: nothing grants it
            targets = replace(targets, table=f"table/{sorted(tables)[0]}")
        denied = self._decide(role, needs(service, operation, params, targets),
                              request_context(service, operation, params))
        if denied is not None:
            return 400, {"Content-Type": "application/x-amz-json-1.0"}, json.dumps({
                "__type": "com.amazon.coral.service#AccessDeniedException",
                "Message": _denial(role, denied)}).encode()
        return _forward(self.dynamodb, "POST", "/", headers, body)

    def _events(self, role: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        """EventBridge's PutEvents: each entry needs ``events:PutEvents`` on its bus (a name is
        the bus of the stack's account and region, as the template renders that ARN)."""
        content = {"Content-Type": "application/x-amz-json-1.1"}
        if headers.get("X-Amz-Target") != "AWSEvents.PutEvents":
            return 400, content, b'{"__type": "UnknownOperationException"}'
        entries = json.loads(body or b"{}").get("Entries", [])
        buses = {entry.get("EventBusName") or "default" for entry in entries}
        in_stack = "arn:AWS::Partition:events:AWS::Region:AWS::AccountId:event-bus/"
        arns = [bus if bus.startswith("arn:") else in_stack + bus for bus in sorted(buses)]
        denied = self._decide(role, [("events:PutEvents", arn) for arn in arns])
        if denied is not None:
            return 400, content, json.dumps({"__type": "AccessDeniedException",
                                             "message": _denial(role, denied)}).encode()
        with self._lock:
            self.events += entries
        return 200, content, json.dumps({"FailedEntryCount": 0, "Entries": [
            {"EventId": f"rehearsal-{n}"} for n in range(len(entries))]}).encode()

    def _s3(self, role: str, method: str, path: str, headers: dict[str, str], body: bytes
            ) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(path)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        resource = f"{self.targets.bucket}/{key}" if bucket == self.names.bucket else f"bucket/{bucket}/{key}"
        action = {"GET": "s3:GetObject", "HEAD": "s3:GetObject", "PUT": "s3:PutObject",
                  "DELETE": "s3:DeleteObject"}.get(method, f"s3:{method}")
        if not key:
            action, resource = "s3:ListBucket", resource.rsplit("/", 1)[0]
        denied = self._decide(role, [(action, resource)])
        if denied is not None or self.s3 is None:
            message = _denial(role, denied) if denied else "no bucket in this deployment"
            return 403, {"Content-Type": "application/xml"}, (
                f"<Error><Code>AccessDenied</Code><Message>{message}</Message></Error>").encode()
        return _forward(self.s3, method, path, headers, body)

    def _ecs(self, role: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        """ECS's RunTask: allowed by ``ecs:RunTask`` on the task definition in that cluster and
        ``iam:PassRole`` on the roles it hands to ECS (:func:`template.needs`); checked as ECS
        checks it; then the runner starts as a process of :class:`ContainerTasks`."""
        content = {"Content-Type": "application/x-amz-json-1.1"}
        operation = headers.get("X-Amz-Target", "").rpartition(".")[2]
        if operation != "RunTask" or self.runners is None:
            return 400, content, json.dumps({"__type": "ClientException",
                                             "message": f"the rehearsal does not serve ecs.{operation}"}).encode()
        params = json.loads(body or b"{}")
        denied = self._decide(role, needs("ecs", operation, params, self.targets),
                              request_context("ecs", operation, params))
        if denied is not None:
            return 400, content, json.dumps({"__type": "AccessDeniedException",
                                             "message": _denial(role, denied)}).encode()
        problem = run_task_problem(params, self.targets)
        if problem is not None:
            with self._lock:
                self.refused.append(f"{role}: ecs.RunTask refused: {problem}")
            return 400, content, json.dumps({"__type": "InvalidParameterException", "message": problem}).encode()
        task = self.runners.run(params)
        return 200, content, json.dumps({"tasks": [task], "failures": []}).encode()

    def _lambda(self, role: str, path: str, headers: dict[str, str], body: bytes
                ) -> tuple[int, dict[str, str], bytes]:
        found = _INVOKE.match(urlsplit(path).path)
        name = unquote(found.group(1)) if found else ""
        resource = self.targets.worker if name.rsplit(":", 1)[-1] == self.names.worker_function \
            else f"function/{name}"
        denied = self._decide(role, [("lambda:InvokeFunction", resource)])
        if denied is not None:
            return 403, {"Content-Type": "application/json", "X-Amzn-ErrorType": "AccessDeniedException"}, \
                json.dumps({"Type": "User", "message": _denial(role, denied)}).encode()
        pool = self.functions["worker"]
        event = json.loads(body or b"{}")
        if headers.get("X-Amz-Invocation-Type") == "Event":
            pool.invoke_later(event)
            return 202, {}, b""
        return 200, {"Content-Type": "application/json"}, json.dumps(pool.invoke(event)).encode()


def _denial(role: str, decision: Decision) -> str:
    return (f"User: arn:aws:sts::000000000000:assumed-role/{role}/rehearsal is not authorized to perform: "
            f"{decision.action} on resource: {decision.resource}")


def _forward(netloc: str, method: str, path: str, headers: dict[str, str], body: bytes
             ) -> tuple[int, dict[str, str], bytes]:
    host, _, port = netloc.partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        sent = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
        connection.request(method, path, body=body, headers=sent)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()
