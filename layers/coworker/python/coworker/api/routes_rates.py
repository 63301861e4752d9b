"""Routes of rate limits (``/rate-limits``): list the limits set, read one group's state, set or
lift a group's limit.

A group is ``key:<rate key>`` (tasks that carry that ``rate_key``) or ``type:<task type>``. The
control item (:mod:`coworker.engine.control`) keeps the limits set here; each group's start log
(:mod:`coworker.engine.rates`) says how many started lately and when the next may, and the limit
its last start's task carried, if it did. So a group's ``source`` is ``set`` (in the control
record), ``last start`` (none set: the limit the task that started last carried), ``lifted``
(none set or carried: its last start ran under a limit set here and lifted since; its tasks now
start unlimited) or ``none``.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import unquote

from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from coworker.api.cursors import bad_cursor
from coworker.api.errors import BadRequestError, RateGroupNotFoundError, responses
from coworker.api.models import (
    DEFAULT_RATE_PAGE,
    MAX_CURSOR_CHARS,
    MAX_RATE_PAGE,
    RateLimitIn,
    RateLimitOut,
    RateLimitsOut,
)
from coworker.api.routes_types import known_type
from coworker.api.services import Services
from coworker.data.models import iso_utc
from coworker.engine import control, rates
from coworker.engine.tasks import MAX_CONCURRENCY_KEY_CHARS, MAX_TYPE_CHARS, no_control_characters
from coworker.observability import logger

# What a GET /rate-limits cursor belongs to: a cursor of another listing is refused.
LISTING = ("rate-limits",)


def router(services: Services) -> APIGatewayRouter:
    """The rate limit routes of one app, answering with ``services``."""
    routes = APIGatewayRouter()
    settings = services.settings

    @routes.get("/rate-limits", summary="The rate limits set, with their groups' recent starts; a page at a time",
                tags=["rate limits"], responses=responses("A page of the rate limits set through the API or CLI, by "
                                                          "group"))
    def list_rate_limits(
        limit: Annotated[int, Query(ge=1, le=MAX_RATE_PAGE, description="Groups per page.")] = DEFAULT_RATE_PAGE,
        cursor: Annotated[str | None, Query(description="From the previous page.", max_length=MAX_CURSOR_CHARS)]
        = None,
    ) -> RateLimitsOut:
        after = services.cursors.decode(cursor, LISTING)
        if after is not None and not (isinstance(after, str) and after):
            raise bad_cursor()  # signed by us, but not a group name
        view = control.read(consistent=True)
        # By name, from just after the previous page's last: a group set or lifted meanwhile
        # shows or not by where it sorts, and no other moves.
        listed = [group for group in sorted(view.rate_limits) if after is None or group > after]
        page = listed[:limit]
        found = rates.states({group: view.rate_limits[group] for group in page})  # the page's logs, one read
        following = services.cursors.encode(page[-1], LISTING) if len(listed) > limit else None
        return RateLimitsOut(
            limits=[rate_out(group, view, state=found[group]) for group in page], cursor=following,
            note="keys whose tasks carry their own rate_limit are not listed: read one with "
                 f"GET /rate-limits/key:<key>. A change reaches claimers within COWORKER_CONTROL_CACHE_SECONDS "
                 f"({settings.control_cache_seconds:g} s)")

    @routes.get("/rate-limits/<group>", summary="One rate group: its limit, recent starts and waiters",
                tags=["rate limits"], responses=responses("The group"))
    def read_rate_limit(group: str) -> RateLimitOut:
        name = checked_group(group)
        view = control.read(consistent=True)
        answer = rate_out(name, view)
        if answer.source == NO_SOURCE:
            raise RateGroupNotFoundError(f"no rate limit is set for {name!r} and none of its tasks has started")
        return answer

    @routes.put("/rate-limits/<group>", summary="Set or lift a rate group's limit", tags=["rate limits"],
                responses=responses("The group, with its new limit"))
    def set_rate_limit(group: str, body: Annotated[RateLimitIn, Body(description="The limit, or null")]
                       ) -> RateLimitOut:
        name = checked_group(group)
        view = control.read(consistent=True)
        if name.startswith(rates.TYPE_GROUP):
            known_type(name[len(rates.TYPE_GROUP):], view)
        rate = control.Rate(body.limit, rates.interval_ms(body.interval_seconds)) if body.limit is not None else None
        changed = control.set_rate(name, rate)
        # Waiters booked under the old limit come due by the new one (and so does a new task):
        # on every request, so one that set the limit already moves any its read budget left.
        rebooked = rates.rebook(name, rate, settings.control_cache_seconds)
        logger.info("rate limit set", extra={"rate_group": name, "limit": body.limit,
                                             "interval_seconds": body.interval_seconds, "changed": changed,
                                             "waiters_moved": rebooked.moved, "waiters_all_seen": rebooked.complete})
        return rate_out(name, control.read(consistent=True), changed, lifted=changed and rate is None)

    return routes


def checked_group(raw: str) -> str:
    """The group named in the path (percent-decoded); 400 for a name no group can have."""
    name = unquote(raw)
    for prefix, longest, what in ((rates.KEY_GROUP, MAX_CONCURRENCY_KEY_CHARS, "rate key"),
                                  (rates.TYPE_GROUP, MAX_TYPE_CHARS, "task type")):
        if name.startswith(prefix):
            rest = name[len(prefix):]
            if not rest or len(rest) > longest:
                raise BadRequestError(f"the {what} in {prefix}<{what}> must be 1-{longest} characters")
            try:
                no_control_characters(rest, f"the {what}")
            except ValueError as exc:
                raise BadRequestError(str(exc)) from None
            return name
    raise BadRequestError("a rate group is key:<rate key> or type:<task type> (percent-encoded in the path), "
                          f"not {name[:80]!r}")


SET, CARRIED, LIFTED, NO_SOURCE = "set", "last start", "lifted", "none"


def rate_out(group: str, view: control.ControlView, changed: bool | None = None,
             state: rates.RateState | None = None, lifted: bool = False) -> RateLimitOut:
    """What the API shows of a rate group: the limit in force and what its log says (read here
    unless given). ``lifted``: this request lifted the limit set (the log may not know it yet)."""
    set_here = view.rate_limits.get(group)
    state = state or rates.states({group: set_here})[group]
    rate = state.rate
    source = (SET if set_here is not None else CARRIED if state.carried
              else LIFTED if state.logged or lifted else NO_SOURCE)
    return RateLimitOut(group=group, limit=rate.limit if rate else None,
                        interval_seconds=rate.interval_seconds if rate else None, source=source,
                        started_in_interval=state.started_in_interval, next_free_at=iso_utc(state.next_free_at),
                        booked_until=iso_utc(state.booked_until), changed=changed)
