"""Task handlers: user code registered per task type.

A handlers module of your own::

    from coworker.handlers import task_handler, TaskContext
    from coworker.errors import TaskFailed

    @task_handler("resize-image")
    def resize(payload: dict, context: TaskContext) -> dict:
        ...
        return {"width": 800}          # stored as the task's result summary

List the module in ``COWORKER_HANDLER_MODULES``; the engine needs no change.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from coworker.errors import ConfigurationError, UnknownTaskTypeError


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """What a handler knows about the attempt it runs."""

    key: str
    attempt: int
    max_attempts: int
    fencing_token: str  # "<owner>:<attempt>": pass it to downstream systems that dedupe writes
    deadline: float  # time.monotonic() value by which the handler must return
    # Set by the worker's heartbeat when this attempt's claim was taken over or cancelled.
    lost: threading.Event = dataclasses.field(default_factory=threading.Event, compare=False, repr=False)

    def remaining_seconds(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def claim_lost(self) -> bool:
        """True once this attempt no longer owns the task (its lock was taken over or it was
        cancelled): whatever the handler returns now is discarded, so it may as well stop."""
        return self.lost.is_set()


Handler = Callable[[Any, TaskContext], Any]

_registry: dict[str, Handler] = {}


def task_handler(task_type: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``task_type``."""

    def register(function: Handler) -> Handler:
        existing = _registry.get(task_type)
        if existing is not None and existing is not function:
            raise ConfigurationError(f"task type {task_type!r} already has a handler: {existing!r}")
        _registry[task_type] = function
        return function

    return register


def load_handler_modules(modules: Iterable[str]) -> None:
    """Import the modules whose decorators register handlers."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import handler module {name!r}: {exc}") from exc


def get_handler(task_type: str) -> Handler:
    """The handler registered for ``task_type``, or :class:`UnknownTaskTypeError`."""
    try:
        return _registry[task_type]
    except KeyError:
        raise UnknownTaskTypeError(
            f"no handler registered for task type {task_type!r} (known: {', '.join(sorted(_registry)) or 'none'})"
        ) from None


def registered_types() -> list[str]:
    return sorted(_registry)
