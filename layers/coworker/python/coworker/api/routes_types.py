"""Routes of task types (``/types``): list them, pause and resume one, set or lift its
concurrency limit.

The control item (:mod:`coworker.engine.control`) keeps pauses and limits; the concurrency gates
(:mod:`coworker.engine.gates`) say how many tasks of a limited type run or wait.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated
from urllib.parse import unquote

from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from coworker.api.cursors import bad_cursor
from coworker.api.errors import TaskTypeNotFoundError, responses, some_names
from coworker.api.models import DEFAULT_TYPE_PAGE, MAX_CURSOR_CHARS, MAX_TYPE_PAGE, LimitIn, TypeOut, TypesOut
from coworker.api.services import Services
from coworker.config import Settings
from coworker.engine import control, durations, gates, handlers, runners
from coworker.observability import logger

# Held tasks counted per type in GET /types (a count reads the held partitions).
HELD_COUNT_CAP = 1000
# What a GET /types cursor belongs to: a cursor of another listing is refused.
LISTING = ("types",)


def router(services: Services) -> APIGatewayRouter:
    """The task type routes of one app, answering with ``services``."""
    routes = APIGatewayRouter()
    settings = services.settings

    @routes.get("/types", summary="Task types: registered, paused, held, limited; a page at a time",
                tags=["types"], responses=responses("A page of the registered, paused, held or limited task "
                                                    "types, by name"))
    def list_types(
        limit: Annotated[int, Query(ge=1, le=MAX_TYPE_PAGE, description="Types per page.")] = DEFAULT_TYPE_PAGE,
        cursor: Annotated[str | None, Query(description="From the previous page.", max_length=MAX_CURSOR_CHARS)]
        = None,
    ) -> TypesOut:
        after = services.cursors.decode(cursor, LISTING)
        if after is not None and not (isinstance(after, str) and after):
            raise bad_cursor()  # signed by us, but not a type name
        view = control.read(consistent=True)
        # Limits set through the API have no count cap (the control item's 400 KB is the only
        # bound), so the types are paged, by name, from just after the previous page's last.
        listed = [t for t in control.types_listed(view, handlers.registered_types()) if after is None or t > after]
        page = listed[:limit]
        following = services.cursors.encode(page[-1], LISTING) if len(listed) > limit else None
        return TypesOut(types=[type_out(t, view, settings) for t in page], cursor=following,
                        note=f"a pause stops new claims within COWORKER_CONTROL_CACHE_SECONDS "
                             f"({settings.control_cache_seconds:g} s); running tasks finish")

    @routes.post("/types/<task_type>/pause", summary="Pause a task type: its tasks wait, running ones finish",
                 tags=["types"], responses=responses("The type, paused"))
    def pause_type(task_type: str) -> TypeOut:
        return switch_type(task_type, settings, pause=True)

    @routes.post("/types/<task_type>/resume", summary="Resume a paused task type", tags=["types"],
                 responses=responses("The type, resumed"))
    def resume_type(task_type: str) -> TypeOut:
        return switch_type(task_type, settings, pause=False)

    @routes.put("/types/<task_type>/limit", summary="Set or lift a task type's concurrency limit", tags=["types"],
                responses=responses("The type, with its new limit"))
    def limit_type(task_type: str, body: Annotated[LimitIn, Body(description="The new limit, or null")]) -> TypeOut:
        return set_limit(task_type, settings, body.limit)

    return routes


def type_out(task_type: str, view: control.ControlView, settings: Settings, changed: bool | None = None) -> TypeOut:
    """What the API shows of a type: registered, paused, held tasks, and its limit with the tasks
    running and blocked under it."""
    held, _ = control.count_held(task_type, HELD_COUNT_CAP) if task_type in view.held_types else (0, False)
    limit = view.limits.get(task_type)
    running = blocked = None
    if limit is not None:
        running, blocked = gates.occupancy(gates.TYPE_GROUP + task_type, HELD_COUNT_CAP)
    declared = handlers.declared_timeout(task_type)
    p95 = durations.observed.p95(task_type) if declared is None else None
    return TypeOut(type=task_type, registered=task_type in handlers.registered_types(),
                   paused=view.is_paused(task_type), held=held, limit=limit, running=running, blocked=blocked,
                   changed=changed, timeout_seconds=declared, runner=runners.runner_of(task_type, settings),
                   observed_p95_seconds=round(p95, 3) if p95 is not None else None)


def known_type(raw: str, view: control.ControlView) -> str:
    """The type named in the path; 404 for a type nobody knows."""
    task_type = unquote(raw)
    listed = control.types_listed(view, handlers.registered_types())
    if task_type not in listed:
        raise TaskTypeNotFoundError(f"no task type {task_type!r} here (known: {some_names(listed)})")
    return task_type


def switch_type(raw: str, settings: Settings, pause: bool) -> TypeOut:
    """Pause or resume the type named in the path (404 for a type nobody knows)."""
    view = control.read(consistent=True)
    task_type = known_type(raw, view)
    changed = control.pause(task_type) if pause else control.resume(task_type)
    logger.info("task type paused" if pause else "task type resumed",
                extra={"task_type": task_type, "changed": changed})
    after = dataclasses.replace(view, paused=view.paused | {task_type} if pause else view.paused - {task_type},
                                held_types=view.held_types | {task_type} if pause else view.held_types)
    return type_out(task_type, after, settings, changed)


def set_limit(raw: str, settings: Settings, limit: int | None) -> TypeOut:
    """Set (or, with ``None``, lift) the concurrency limit of the type named in the path."""
    view = control.read(consistent=True)
    task_type = known_type(raw, view)
    changed = control.set_limit(task_type, limit)
    logger.info("task type limit set", extra={"task_type": task_type, "limit": limit, "changed": changed})
    return type_out(task_type, control.read(consistent=True), settings, changed)
