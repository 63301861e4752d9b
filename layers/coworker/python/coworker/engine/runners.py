"""Which runner runs a task type, and starting container runners.

A task type runs on the **Lambda worker** unless it asks for the **container runner**
(``@task_handler("export", timeout_seconds=7200, runner="container")``) or declares a time limit
longer than a Lambda worker can give (:func:`coworker.engine.timing.lambda_max_task_seconds`, about
14 minutes). The choice is the type's: every task of a type runs on the same runner, so the
status index's entries (which carry the type) tell each side what is theirs, and a task's own
``timeout_seconds`` is checked against its type's runner when it is put.

Container runners (ECS Fargate tasks on AWS, runner processes locally) are started by the
coordinator when such work is due, one per free *runner slot* (``max_runners`` of them, see
:data:`coworker.engine.slots.RUNNERS`): it reserves the slot, then asks its
:class:`Launcher` for a runner carrying the slot, its token and the keys it found
(:class:`RunnerRequest`, passed in the runner's environment). The runner feeds itself on
container work until none is due, then exits (:mod:`coworker.engine.runner`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from aws_lambda_powertools.metrics import MetricUnit

from coworker.config import Settings
from coworker.data import index
from coworker.data.models import TaskModel, TaskStatus
from coworker.engine import control, handlers, slots, timing
from coworker.engine.control import DueAction
from coworker.engine.handlers import Runner
from coworker.errors import InvalidEventError
from coworker.observability import MetricName, logger, metrics

# The runner's start request, in its environment (ECS container overrides, or the process's).
SLOT_VARIABLE = "COWORKER_RUNNER_SLOT"
TOKEN_VARIABLE = "COWORKER_RUNNER_TOKEN"
KEYS_VARIABLE = "COWORKER_RUNNER_KEYS"
# Keys handed to one runner at most, and their size as JSON at most (ECS container overrides
# hold 8 KiB in all): a key left out is found by the runner's own feeding.
MAX_RUNNER_HINTS = 50
MAX_HINT_BYTES = 6000
# Index entries one look for container work reads at most, per status (a filtered query: the
# Lambda workers' entries are read past). Container work further back in a deep backlog is found
# as the backlog ahead of it drains.
CONTAINER_READ_BUDGET = 2000


def runner_of(task_type: str, settings: Settings) -> Runner:
    """The runner that runs ``task_type``'s tasks (see the module's docstring)."""
    if task_type in settings.container_type_list:
        return "container"
    asked = handlers.declared_runner(task_type)
    if asked is not None:
        return asked
    limit = handlers.declared_timeout(task_type)
    if limit is not None and limit > timing.lambda_max_task_seconds(settings):
        return "container"
    return "lambda"


def container_types(settings: Settings) -> list[str]:
    """The task types that run on the container runner: registered here, or named in the
    settings (for processes that do not load the handlers)."""
    registered = [name for name in handlers.registered_types() if runner_of(name, settings) == "container"]
    return sorted({*registered, *settings.container_type_list})


def runner_limit_problem(task_type: str, limit_seconds: float | None, settings: Settings,
                         what: str) -> str | None:
    """Why ``what`` (a task of ``task_type`` with the time limit ``limit_seconds``) cannot run on
    this deployment, or ``None``: a Lambda type's limit must fit the Lambda worker; a container
    type needs runners (``max_runners`` above 0)."""
    if runner_of(task_type, settings) == "container":
        if settings.max_runners == 0:
            return (f"task type {task_type!r} runs on the container runner, and this deployment starts none: "
                    "set COWORKER_MAX_RUNNERS (the stack's maxRunners) above 0")
        return None
    if limit_seconds is None:
        return None
    if limit_seconds > timing.lambda_max_task_seconds(settings):
        return (f"{what} has a time limit of {limit_seconds:g} s, longer than a Lambda worker can give (at most "
                f"{timing.lambda_max_task_seconds(settings):g} s: a Lambda function runs at most "
                f"{timing.LAMBDA_MAX_TIMEOUT_SECONDS} s), and task type {task_type!r} runs on the Lambda worker: "
                f'run it on the container runner (@task_handler("{task_type}", runner="container")), '
                "or split the work into shorter tasks")
    return timing.limit_problem(limit_seconds, settings, what)


def due_container_work(settings: Settings, view: control.ControlView, now: datetime, want: int,
                       lost: Sequence[TaskModel] = (), skip: Collection[str] = (),
                       read_lost: bool = False) -> list[str]:
    """Keys of due container work to run, at most ``want``: lost by dead runners first (from the
    expired ``processing`` entries ``lost`` the caller read, or read here with ``read_lost``),
    then due retries, then new tasks;
    paused types, stopped batches and tasks lost at their ceiling are left to the coordinator's
    rules (:func:`coworker.engine.control.due_action`); keys in ``skip`` are left out."""
    types = container_types(settings)
    if not types or want <= 0:
        return []
    keys: list[str] = []

    def take(task: TaskModel, status: TaskStatus) -> None:
        if len(keys) < want and task.key not in skip and control.due_action(view, task, status) is DueAction.RUN:
            keys.append(task.key)

    for task in lost:
        if task.task_type in types:
            take(task, TaskStatus.PROCESSING)
    statuses = (TaskStatus.PROCESSING,) if read_lost else ()
    for status in (*statuses, TaskStatus.FAILED, TaskStatus.TODO):
        if len(keys) >= want:
            break
        for task in index.due_of_types(status, now, types, want - len(keys) + len(skip), CONTAINER_READ_BUDGET):
            take(task, status)
    return keys


@dataclasses.dataclass(frozen=True)
class RunnerRequest:
    """What one container runner is started with: its reserved slot, the slot's token, and keys
    of due container work to claim first."""

    slot: str
    token: str
    keys: tuple[str, ...] = ()

    def to_environment(self) -> dict[str, str]:
        return {SLOT_VARIABLE: self.slot, TOKEN_VARIABLE: self.token, KEYS_VARIABLE: json.dumps(list(self.keys))}

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> RunnerRequest:
        """Read a runner's request; :class:`InvalidEventError` if it is missing or malformed."""
        slot, token = environ.get(SLOT_VARIABLE, ""), environ.get(TOKEN_VARIABLE, "")
        if not slot.startswith(slots.RUNNERS.prefix) or not token:
            raise InvalidEventError(f"a runner is started with {SLOT_VARIABLE} (a runner slot) and {TOKEN_VARIABLE}; "
                                    "the coordinator sets both")
        try:
            keys = json.loads(environ.get(KEYS_VARIABLE) or "[]")
        except ValueError:
            keys = None
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            raise InvalidEventError(f"{KEYS_VARIABLE} must be a JSON list of task keys")
        return cls(slot, token, tuple(dict.fromkeys(keys))[:MAX_RUNNER_HINTS])


def fitting_hints(keys: Sequence[str]) -> list[str]:
    """The first of ``keys`` that a runner's start request carries: at most
    :data:`MAX_RUNNER_HINTS`, at most :data:`MAX_HINT_BYTES` as JSON."""
    hints: list[str] = []
    for key in keys[:MAX_RUNNER_HINTS]:
        if len(json.dumps([*hints, key])) > MAX_HINT_BYTES:
            break
        hints.append(key)
    return hints


class Launcher(Protocol):
    """Starts one container runner, without waiting for it; raises if it could not be started."""

    def launch(self, request: RunnerRequest) -> None: ...


class EcsLauncher:
    """Production launcher: ``RunTask`` of the runner's task definition on Fargate (arm64), in the
    stack's subnets and security groups, the request in its container's environment."""

    def __init__(self, settings: Settings, client: Any | None = None) -> None:
        if not settings.runner_cluster or not settings.runner_task_definition:
            raise ValueError("an ECS launcher needs COWORKER_RUNNER_CLUSTER and COWORKER_RUNNER_TASK_DEFINITION")
        self._settings = settings
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.client("ecs", region_name=settings.region, endpoint_url=settings.ecs_endpoint,
                                  config=Config(retries={"mode": "standard"}))
        self.client = client

    def launch(self, request: RunnerRequest) -> None:
        settings = self._settings
        network = {"subnets": settings.runner_subnet_list, "securityGroups": settings.runner_security_group_list,
                   "assignPublicIp": "ENABLED" if settings.runner_public_ip else "DISABLED"}
        environment = [{"name": name, "value": value} for name, value in request.to_environment().items()]
        answer = self.client.run_task(
            cluster=settings.runner_cluster,
            taskDefinition=settings.runner_task_definition,
            launchType="FARGATE",
            count=1,
            startedBy=f"coworker-{request.slot[len(slots.RUNNERS.prefix):]}",
            networkConfiguration={"awsvpcConfiguration": network},
            overrides={"containerOverrides": [{"name": settings.runner_container, "environment": environment}]},
        )
        failures = answer.get("failures") or []
        if failures or not answer.get("tasks"):
            reasons = "; ".join(f"{f.get('reason')}: {f.get('detail') or f.get('arn') or ''}" for f in failures)
            raise RuntimeError(f"RunTask started no runner ({reasons or 'no task in the answer'})")


def launcher_from_settings(settings: Settings) -> EcsLauncher | None:
    """The ECS launcher these settings name, or ``None`` without a runner task definition."""
    if not settings.runner_cluster or not settings.runner_task_definition or settings.max_runners == 0:
        return None
    return EcsLauncher(settings)


def start_runners(settings: Settings, launcher: Launcher, keys: Sequence[str],
                  now: datetime | None = None, free: Sequence[str] | None = None) -> list[RunnerRequest]:
    """Start runners for due container work ``keys``: one per ``runner_threads`` keys, as many as
    free runner slots (``free``, else looked up) allow; each reserves its slot for
    ``runner_start_seconds``. A runner that could not be started frees its slot at once. Returns
    the requests of the runners started."""
    if not keys or settings.max_runners == 0:
        return []
    remaining = list(dict.fromkeys(keys))
    wanted = -(-len(remaining) // settings.runner_threads)
    if free is None:
        free = slots.free_slots(settings.max_runners, wanted, now, pool=slots.RUNNERS)
    started: list[RunnerRequest] = []
    for slot in free:
        if not remaining:
            break
        token = slots.new_token()
        if not slots.reserve(slot, token, settings.runner_start_seconds, now):
            continue
        hints = fitting_hints(remaining[:settings.runner_threads])
        remaining = remaining[max(1, len(hints)):]
        request = RunnerRequest(slot, token, tuple(hints))
        try:
            launcher.launch(request)
        except Exception as exc:  # noqa: BLE001 - tried again next tick; the alarm watches the count
            metrics.add_metric(name=MetricName.RUNNER_START_FAILED, unit=MetricUnit.Count, value=1)
            logger.error("could not start a container runner; its slot is freed",
                         extra={"slot": slot, "error": f"{type(exc).__name__}: {exc}"})
            slots.release(slot, token)
            break  # (the next tick tries again: no burst of failing calls)
        started.append(request)
    if started:
        metrics.add_metric(name=MetricName.RUNNERS_STARTED, unit=MetricUnit.Count, value=len(started))
    return started
