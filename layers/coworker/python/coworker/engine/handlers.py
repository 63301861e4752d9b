"""Task handlers: user code registered per task type.

A module of your own, in your handlers package (``handlers/`` next to app.py by default)::

    from coworker import TaskContext, TaskFailed, task_handler

    @task_handler("resize-image")
    def resize(payload: dict, context: TaskContext) -> dict:
        ...
        return {"width": 800}          # stored as the task's result

    @task_handler("convert", timeout_seconds=240)   # its time limit (see docs/time.md)
    def convert(payload: dict, context: TaskContext) -> dict:
        ...

    @task_handler("export", timeout_seconds=7200)   # longer than Lambda allows: a container runner
    def export(payload: dict, context: TaskContext) -> dict:
        ...

    def order_problem(payload: Any) -> str | None:   # the problem in words, or None
        return None if isinstance(payload, dict) and "order" in payload else "needs an order"

    @task_handler("ship-order", validate_payload=order_problem)   # refused at submit (422)
    def ship(payload: dict, context: TaskContext) -> dict:
        ...

The stack bundles the package into the worker and the local runtime imports it; every module in
it is imported at start-up (test modules excepted), so the engine needs no change.
"""

from __future__ import annotations

import dataclasses
import importlib
import keyword
import pkgutil
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import ValidationError

from coworker.engine.tasks import MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS, NewTask, TaskSpec
from coworker.errors import ConfigurationError, TaskFailed, UnknownTaskTypeError

# Most follow-up tasks one attempt may spawn (each is a transactional put when it finishes).
MAX_FOLLOW_UPS = 1000


@dataclasses.dataclass(frozen=True)
class TaskLimits:
    """The concurrency and rate limits a task carries (``None``: not in that group); a follow-up
    spawned with ``inherit_limits=True`` carries its parent's."""

    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_key: str | None = None
    rate_limit: int | None = None
    rate_interval_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """What a handler knows about the attempt it runs."""

    key: str
    attempt: int
    max_attempts: int
    # "<owner>:<attempt>" (".r<n>" added after n redrives): unique per attempt; pass it to downstream
    # systems that refuse writes from an attempt that is no longer current.
    fencing_token: str
    # time.monotonic() value by which the handler must return: its start plus its time limit, or the
    # worker's deadline if sooner
    deadline: float
    batch_id: str | None = None  # the batch the task belongs to, if any
    limits: TaskLimits = TaskLimits()  # the limits the task carries (its follow-ups may inherit them)
    # Why a follow-up of a type with a time limit cannot run on this deployment (None: it can); the
    # worker sets it from its settings (see coworker.engine.runners.runner_limit_problem).
    follow_up_problem: Callable[[str, float | None], str | None] | None = dataclasses.field(
        default=None, compare=False, repr=False)
    # Set by the worker's heartbeat when this attempt's claim was taken over or cancelled.
    lost: threading.Event = dataclasses.field(default_factory=threading.Event, compare=False, repr=False)
    # Follow-up tasks asked for by this attempt, put when it is recorded as finished.
    follow_ups: list[TaskSpec] = dataclasses.field(default_factory=list, compare=False, repr=False)

    def spawn(self, task_type: str, payload: Any = None, *, key: str | None = None,
              max_attempts: int | None = None, run_at: datetime | None = None, priority: int | None = None,
              inherit_batch: bool = False, inherit_limits: bool = False, concurrency_key: str | None = None,
              concurrency_limit: int | None = None, rate_key: str | None = None,
              rate_limit: int | None = None, rate_interval_seconds: float | None = None,
              timeout_seconds: float | None = None) -> str:
        """Ask for a follow-up task; returns its key.

        Nothing is written until this attempt finishes: then the follow-ups are put with the
        task's completion, in its transaction as far as DynamoDB's limits allow, fenced by this
        attempt's claim (a stale attempt puts none). A failed attempt's follow-ups are dropped
        (its retry asks again). Keys make it idempotent:
        a key that exists is left as it is, so a retried parent, or two parents naming the same
        page, put it once. Default key ``<this key>/<n>``. ``inherit_batch`` puts it in this
        task's batch (its total grows, so the batch is done when the follow-ups are).
        ``concurrency_key`` / ``concurrency_limit`` and ``rate_key`` / ``rate_limit`` /
        ``rate_interval_seconds`` limit it like a task put through the API; ``inherit_limits``
        gives it this task's concurrency group and rate group (:attr:`limits`), each unless the
        call names any of that group's fields itself (a crawl's pages keep the seed's limit on
        the site). ``timeout_seconds`` is its own time limit (default: its type's).
        Raises ``ValueError`` for a task the API would refuse (its payload included), or past
        ``MAX_FOLLOW_UPS``.
        """
        if task_type not in _registry:
            raise ValueError(f"follow-up task refused: no handler is registered for task type {task_type!r}")
        if len(self.follow_ups) >= MAX_FOLLOW_UPS:
            raise ValueError(f"one attempt may spawn at most {MAX_FOLLOW_UPS} follow-up tasks")
        problem = payload_problem(task_type, payload)
        if problem is not None:
            raise ValueError(f"follow-up task refused: task type {task_type!r}: {problem}")
        key = key if key is not None else f"{self.key}/{len(self.follow_ups) + 1}"
        if inherit_limits and concurrency_key is None and concurrency_limit is None:
            concurrency_key, concurrency_limit = self.limits.concurrency_key, self.limits.concurrency_limit
        if inherit_limits and rate_key is None and rate_limit is None and rate_interval_seconds is None:
            rate_key, rate_limit = self.limits.rate_key, self.limits.rate_limit
            rate_interval_seconds = self.limits.rate_interval_seconds
        try:
            task = NewTask(key=key, type=task_type, payload=payload, max_attempts=max_attempts,
                           run_at=run_at, priority=priority, concurrency_key=concurrency_key,
                           concurrency_limit=concurrency_limit, rate_key=rate_key, rate_limit=rate_limit,
                           rate_interval_seconds=rate_interval_seconds, timeout_seconds=timeout_seconds)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'task'}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"follow-up task refused: {problems}") from None
        limit = task.timeout_seconds if task.timeout_seconds is not None else declared_timeout(task_type)
        problem = self.follow_up_problem(task_type, limit) if self.follow_up_problem is not None else None
        if problem is not None:
            raise ValueError(f"follow-up task refused: {problem}")
        self.follow_ups.append(task.to_spec(batch_id=self.batch_id if inherit_batch else None, parent=self.key))
        return key

    def remaining_seconds(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def claim_lost(self) -> bool:
        """True once this attempt no longer owns the task (its lock was taken over or it was
        cancelled): whatever the handler returns now is discarded, so it may as well stop."""
        return self.lost.is_set()


Handler = Callable[[Any, TaskContext], Any]
# A type's payload check: the problem with a payload in words (``None``: it is fine).
PayloadCheck = Callable[[Any], str | None]
# Where a type's tasks run: on the Lambda worker, or on the container runner (ECS Fargate).
Runner = Literal["lambda", "container"]
RUNNERS: tuple[str, ...] = get_args(Runner)


@dataclasses.dataclass(frozen=True)
class Registration:
    """A task type's handler, its declared time limit (seconds; ``None``: not declared), the
    runner it asks for (``None``: the one its limit needs, see :mod:`coworker.engine.runners`)
    and its payload check (``None``: any payload)."""

    function: Handler
    timeout_seconds: float | None = None
    runner: Runner | None = None
    validate_payload: PayloadCheck | None = None


_registry: dict[str, Registration] = {}


def task_handler(task_type: str, *, timeout_seconds: float | None = None, runner: Runner | None = None,
                 validate_payload: PayloadCheck | None = None) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``task_type``.

    ``timeout_seconds`` declares how long one attempt may take: a worker starts the task only
    with that much time left, and an attempt still running after it is recorded as timed out
    (and retried). The stack sizes the worker's timeout from the declared limits, and the API
    refuses a task whose limit no runner of the deployment can give. A limit longer than a
    Lambda worker gives (about 14 minutes) runs the type on the container runner; ``runner``
    asks for one: ``"container"`` (ECS Fargate, no time limit but the task's own) or
    ``"lambda"``.

    ``validate_payload(payload)`` says what is wrong with a payload (``None``: nothing): the API
    refuses such a task with 422 and stores nothing, ``context.spawn`` raises ``ValueError``, and
    a task that got in anyway (put before the check existed) fails at once as a business failure
    without calling the handler.
    """
    limit = check_timeout(timeout_seconds, f"task type {task_type!r}")
    check_runner(runner, f"task type {task_type!r}")

    def register(function: Handler) -> Handler:
        existing = _registry.get(task_type)
        if existing is not None and existing.function is not function:
            raise ConfigurationError(f"task type {task_type!r} already has a handler: {existing.function!r}")
        _registry[task_type] = Registration(function, limit, runner, validate_payload)
        return function

    return register


def check_timeout(value: Any, what: str) -> float | None:
    """``value`` as a time limit in seconds (a positive number, at most
    :data:`~coworker.engine.tasks.MAX_TIMEOUT_SECONDS`), or :class:`ConfigurationError`."""
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not MIN_TIMEOUT_SECONDS <= value <= MAX_TIMEOUT_SECONDS:
        raise ConfigurationError(f"{what}: timeout_seconds must be a number of seconds from {MIN_TIMEOUT_SECONDS:g} "
                                 f"to {MAX_TIMEOUT_SECONDS:g}, not {value!r}")
    return float(value)


def check_runner(value: Any, what: str) -> Runner | None:
    """``value`` as a runner's name, or :class:`ConfigurationError`."""
    if value is not None and value not in RUNNERS:
        raise ConfigurationError(f"{what}: runner must be one of {', '.join(map(repr, RUNNERS))}, not {value!r}")
    return value  # type: ignore[no-any-return]


# Names a handlers package may not take: they would shadow the library, the functions' own
# ``handler`` module in the Lambda code, or this repository's packages in a local run.
RESERVED_PACKAGE_NAMES = frozenset({"coworker", "coworker_local", "coworker_cdk", "handler", "functions", "tests"})


def _is_test_module(name: str) -> bool:
    last = name.rpartition(".")[2]
    return last.startswith("test_") or last in ("tests", "test", "conftest")


def load_handler_modules(modules: Iterable[str]) -> None:
    """Import the modules whose decorators register handlers.

    A package is imported with all its submodules, except tests (``test_*``, ``tests``,
    ``conftest``), so adding a module to a handlers package is enough to register its types.
    """
    for name in modules:
        module = _import(name)
        if hasattr(module, "__path__"):  # a package: import what it contains
            for info in pkgutil.walk_packages(module.__path__, prefix=f"{name}.", onerror=_walk_error):
                if not _is_test_module(info.name):
                    _import(info.name)


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import handler module {name!r}: {exc}") from exc


def _walk_error(name: str) -> None:
    raise ConfigurationError(f"cannot import handler package {name!r}")


def handler_package(path: str | Path) -> tuple[Path, str]:
    """Check that ``path`` is an importable handlers package: ``(folder to put on sys.path, name)``.

    Raises :class:`ConfigurationError` saying what to fix. The stack (bundling) and the local
    runtime (``--handlers``) both use this, so a package that deploys also runs locally.
    """
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigurationError(f"handlers package {str(path)!r} is not a folder")
    name = folder.name
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ConfigurationError(
            f"handlers package {str(path)!r}: the folder name {name!r} must be a Python identifier "
            "(letters, digits and underscores), because it is imported by that name"
        )
    if name in RESERVED_PACKAGE_NAMES:
        raise ConfigurationError(
            f"handlers package {str(path)!r}: {name!r} is taken by Coworker itself; rename the folder"
        )
    if not (folder / "__init__.py").is_file():
        raise ConfigurationError(
            f"handlers package {str(path)!r} has no __init__.py; add an empty one to make it a package"
        )
    return folder.parent, name


def get_handler(task_type: str) -> Handler:
    """The handler registered for ``task_type``, or :class:`UnknownTaskTypeError`; with a payload
    check, a payload it refuses raises ``TaskFailed`` (not retryable) instead of calling the handler."""
    try:
        registration = _registry[task_type]
    except KeyError:
        raise UnknownTaskTypeError(
            f"no handler registered for task type {task_type!r} (known: {', '.join(sorted(_registry)) or 'none'})"
        ) from None
    if registration.validate_payload is None:
        return registration.function

    def checked(payload: Any, context: TaskContext) -> Any:
        problem = payload_problem(task_type, payload)
        if problem is not None:
            raise TaskFailed(f"task type {task_type!r}: {problem}", retryable=False)
        return registration.function(payload, context)

    return checked


def payload_problem(task_type: str, payload: Any) -> str | None:
    """What the payload check of ``task_type`` finds wrong with ``payload``, or ``None`` (also for
    a type without a check, or not registered)."""
    registration = _registry.get(task_type)
    if registration is None or registration.validate_payload is None:
        return None
    try:
        return registration.validate_payload(payload)
    except Exception as exc:  # noqa: BLE001 - a check that breaks on a payload has found it bad
        return f"the payload check raised {type(exc).__name__}: {exc}"


def registered_types() -> list[str]:
    """The task types that have a handler, sorted."""
    return sorted(_registry)


def declared_timeout(task_type: str) -> float | None:
    """The time limit ``task_type`` declares where its handler is registered, or ``None``."""
    registration = _registry.get(task_type)
    return registration.timeout_seconds if registration is not None else None


def declared_timeouts() -> dict[str, float]:
    """Every registered type that declares a time limit, with its limit."""
    return {name: r.timeout_seconds for name, r in sorted(_registry.items()) if r.timeout_seconds is not None}


def declared_runner(task_type: str) -> Runner | None:
    """The runner ``task_type`` asks for where its handler is registered, or ``None``."""
    registration = _registry.get(task_type)
    return registration.runner if registration is not None else None
