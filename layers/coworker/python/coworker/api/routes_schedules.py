"""Routes of recurring schedules (``/schedules``): put, read, list, pause, resume, delete.

The engine (:mod:`coworker.engine.schedules`) keeps them; the coordinator puts their occurrences.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from coworker.api.cursors import bad_cursor
from coworker.api.errors import ERROR_RESPONSES, BadRequestError, responses
from coworker.api.models import (
    DEFAULT_SCHEDULE_PAGE,
    MAX_CURSOR_CHARS,
    MAX_SCHEDULE_PAGE,
    ScheduleIn,
    ScheduleOut,
    SchedulesOut,
)
from coworker.api.routes_tasks import check_tasks
from coworker.api.services import Services
from coworker.engine import schedules

_SCHEDULE_ANSWER = {"application/json": {"schema": {"$ref": "#/components/schemas/ScheduleOut"}}}
PUT_RESPONSES: dict[int, Any] = {
    201: {"description": "The schedule, created", "content": _SCHEDULE_ANSWER},
    200: {"description": "The schedule, replaced", "content": _SCHEDULE_ANSWER},
    **ERROR_RESPONSES,
}


# What a GET /schedules cursor belongs to: a cursor of another listing is refused.
LISTING = ("schedules",)


def router(services: Services) -> APIGatewayRouter:
    """The schedule routes of one app, answering with ``services``."""
    routes = APIGatewayRouter()
    settings = services.settings

    @routes.put("/schedules/<name>", summary="Create or replace a recurring schedule", tags=["schedules"],
                responses=PUT_RESPONSES)
    def put_schedule(name: str, body: Annotated[ScheduleIn, Body(description="When it fires and what it puts")]
                     ) -> Response[ScheduleOut]:
        schedule_name = checked_name(name)
        check_tasks([body.task], settings, batch=False, location=("body", "task"))
        try:
            schedule, created = schedules.put(schedule_name, body.expression, body.timezone, body.missed, body.task,
                                              paused=body.paused)
        except ValueError as exc:
            raise BadRequestError(str(exc)) from None
        return Response(status_code=201 if created else 200, content_type=content_types.APPLICATION_JSON,
                        body=out(schedule, created=created))

    @routes.get("/schedules", summary="List the schedules, a page at a time", tags=["schedules"],
                responses=responses("A page of schedules: active ones by next occurrence, then paused ones"))
    def list_schedules(
        limit: Annotated[int, Query(ge=1, le=MAX_SCHEDULE_PAGE, description="Schedules per page.")]
        = DEFAULT_SCHEDULE_PAGE,
        cursor: Annotated[str | None, Query(description="From the previous page.", max_length=MAX_CURSOR_CHARS)]
        = None,
    ) -> SchedulesOut:
        start = services.cursors.decode(cursor, LISTING)
        try:
            found, position = schedules.list_page(limit, start)
        except ValueError:  # signed by us, but not a position of this listing
            raise bad_cursor() from None
        following = services.cursors.encode(position, LISTING)
        return SchedulesOut(schedules=[out(schedule) for schedule in found], cursor=following,
                            truncated=following is not None)

    @routes.get("/schedules/<name>", summary="Read a schedule", tags=["schedules"], responses=responses("The schedule"))
    def read_schedule(name: str) -> ScheduleOut:
        return out(schedules.get(checked_name(name)))

    @routes.delete("/schedules/<name>", summary="Delete a schedule (the tasks it put stay)", tags=["schedules"],
                   responses=responses("The schedule as it was"))
    def delete_schedule(name: str) -> ScheduleOut:
        return out(schedules.delete(checked_name(name)))

    @routes.post("/schedules/<name>/pause", summary="Pause a schedule: it puts nothing until resumed",
                 tags=["schedules"], responses=responses("The schedule, paused"))
    def pause_schedule(name: str) -> ScheduleOut:
        schedule, changed = schedules.set_paused(checked_name(name), True)
        return out(schedule, changed=changed)

    @routes.post("/schedules/<name>/resume", summary="Resume a schedule from its next occurrence",
                 tags=["schedules"], responses=responses("The schedule, resumed"))
    def resume_schedule(name: str) -> ScheduleOut:
        schedule, changed = schedules.set_paused(checked_name(name), False)
        return out(schedule, changed=changed)

    return routes


def checked_name(raw: str) -> str:
    """The schedule name in the path; 400 for a name no schedule can have (404 is for reads)."""
    name = unquote(raw)
    problem = schedules.name_problem(name)
    if problem:
        raise BadRequestError(problem)
    return name


def out(schedule: schedules.Schedule, created: bool | None = None, changed: bool | None = None) -> ScheduleOut:
    return ScheduleOut(name=schedule.name, expression=schedule.expression, timezone=schedule.timezone,
                       missed=schedule.missed, paused=schedule.paused, task=schedule.task,
                       next_run_at=schedule.next_run_at, last_run_at=schedule.last_run_at,
                       last_task_key=schedule.last_task_key, skipped=schedule.skipped,
                       created_at=schedule.created_at, updated_at=schedule.updated_at, created=created,
                       changed=changed)

