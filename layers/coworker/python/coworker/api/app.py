"""The task API: a Powertools ``APIGatewayRestResolver`` behind API Gateway (REST, Lambda proxy).

:func:`create_app` composes it: the resolver with its request-body checks (:class:`TaskApiResolver`),
the error answers (:mod:`coworker.api.errors`), the route modules, each a Powertools router built
for the app's :class:`~coworker.api.services.Services`, an answer for unknown routes and methods,
and the OpenAPI document.

Routes, by the module that holds them (details, limits and the error format in docs/api.md; the
OpenAPI document is served at ``GET /openapi.json`` and Swagger UI at ``GET /docs``)::

    routes_tasks
    POST /tasks                    one task, or {"tasks": [...]} as a batch (up to 1,000)
    GET  /tasks/{key}              the whole record
    GET  /tasks/{key}/result       the result, from the record or the result store
    GET  /tasks?status=...         a page of the status index (todo, processing, failed, ignored)
    POST /tasks/{key}/retry        redrive a failed or ignored task
    POST /tasks/{key}/cancel       stop a task that is not finished or ignored
    POST /bulk                     retry or cancel every task matching a filter, a page per call
    routes_types
    GET  /types                    task types: registered, paused, held
    POST /types/{type}/pause       stop dispatching and claiming a type (running tasks finish)
    POST /types/{type}/resume      let a paused type run again
    PUT  /types/{type}/limit       set or lift how many tasks of a type run at once
    routes_rates
    GET  /rate-limits              a page of the rate limits set (limit, cursor), with recent starts
    GET  /rate-limits/{group}      one group (key:<rate key> or type:<type>): limit, starts, waiters
    PUT  /rate-limits/{group}      set or lift how many tasks of a group start per interval
    routes_batches
    GET  /batches/{id}             a batch's counters and done flag
    POST /batches/{id}/retry       redrive a batch's ignored (or failed) tasks, a bounded slice per call
    routes_stats
    GET  /stats                    counts by status, bounded
    routes_schedules
    PUT  /schedules/{name}         create or replace a recurring schedule (cron or rate)
    GET  /schedules                a page of schedules (limit, cursor): active by next occurrence, then paused
    GET  /schedules/{name}         one schedule: next and last occurrence
    DELETE /schedules/{name}       delete it (the tasks it put stay)
    POST /schedules/{name}/pause   it puts nothing until resumed
    POST /schedules/{name}/resume  from its next occurrence

Bad input is refused before anything is written. Every error answer has the shape
``{"statusCode", "error", "message", "errors"?}``; domain errors are mapped to HTTP codes in
:data:`coworker.api.errors.ERROR_STATUS`, there and only there.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import ResponseBuilder
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.models import APIKey

from coworker.api import routes_batches, routes_rates, routes_schedules, routes_stats, routes_tasks, routes_types
from coworker.api.errors import error_response, install_error_handlers
from coworker.api.services import Services
from coworker.config import Settings
from coworker.engine import dispatch

API_TITLE = "Coworker task API"
API_VERSION = "1.0.0"
# The route modules, in the order their routes are registered (and listed in the OpenAPI document).
ROUTE_MODULES = (routes_tasks, routes_types, routes_rates, routes_batches, routes_stats, routes_schedules)


# -- the request body: JSON only, UTF-8, numbers DynamoDB and JSON can both keep -----------------

_BODY_METHODS = {"POST", "PUT", "PATCH"}
# Integers longer than this are refused: past it a double (JavaScript's number) cannot hold them.
MAX_INTEGER_DIGITS = 309


def parse_json_strictly(text: str) -> Any:
    """``json.loads`` that refuses what is not portable JSON: NaN and Infinity, numbers too large
    for a float (``1e400``), integers too long to read, nesting deeper than Python can parse.
    Each becomes a ``JSONDecodeError``, which the API answers with 422 and the reason."""

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    def finite(number: str) -> float:
        value = float(number)
        if not math.isfinite(value):
            raise ValueError(f"the number {number[:20]} is too large")
        return value

    def bounded(number: str) -> int:
        # the same bound as for other numbers: what a double holds (1.8e308, 309 digits)
        if len(number.lstrip("-")) > MAX_INTEGER_DIGITS:
            raise ValueError(f"the integer {number[:20]}... has {len(number.lstrip('-'))} digits, at most "
                             f"{MAX_INTEGER_DIGITS} are taken")
        return int(number)

    try:
        return json.loads(text, parse_constant=constant, parse_float=finite, parse_int=bounded)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("arrays or objects nested too deeply", text, 0) from None
    except ValueError as exc:  # NaN, 1e400, or an integer of thousands of digits
        raise json.JSONDecodeError(str(exc).split(";")[0], text, 0) from None


def body_problem(event: Mapping[str, Any]) -> tuple[HTTPStatus, str, str] | None:
    """Why a request's body cannot be read as the API's input, before anything parses it."""
    if str(event.get("httpMethod", "")).upper() not in _BODY_METHODS or not event.get("body"):
        return None
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    content_type = headers.get("content-type", "").strip()
    media_type, _, parameters = content_type.partition(";")
    if content_type and media_type.strip().lower() != content_types.APPLICATION_JSON:
        return (HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type",
                f"the body must be JSON with Content-Type: application/json, not {content_type[:100]!r}")
    charset = parameters.lower().replace(" ", "").partition("charset=")[2].split(";")[0]
    if charset and charset.strip('"') not in ("utf-8", "utf8"):
        return (HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type",
                f"the body must be UTF-8 JSON, not charset {charset[:40]!r}")
    if event.get("isBase64Encoded"):
        try:
            base64.b64decode(str(event["body"]).encode(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return HTTPStatus.BAD_REQUEST, "bad_request", "the body is not UTF-8 text"
    return None


def forget_media_type_of_empty_body(event: dict[str, Any]) -> None:
    """Drop the ``Content-Type`` of a request with no body: there is nothing it describes, and
    Powertools would parse the empty body by it (a multipart type without a boundary raises), so
    the route sees a missing body, as when the header is absent."""
    if event.get("body"):
        return
    for name in ("headers", "multiValueHeaders"):
        headers = event.get(name)
        if headers:
            event[name] = {key: value for key, value in headers.items() if str(key).lower() != "content-type"}


class TaskApiResolver(APIGatewayRestResolver):
    """Powertools' REST resolver with the body checked first: JSON only (415 otherwise, in the
    API's error shape), UTF-8, parsed strictly (see :func:`parse_json_strictly`)."""

    def __init__(self) -> None:
        super().__init__(enable_validation=True, json_body_deserializer=parse_json_strictly)

    def _resolve(self) -> ResponseBuilder:
        event = self.current_event.raw_event
        problem = body_problem(event)
        if problem is not None:
            return ResponseBuilder(error_response(*problem))
        forget_media_type_of_empty_body(event)
        return super()._resolve()


# -- the application ---------------------------------------------------------------------------

def create_app(settings: Settings, invoker: dispatch.Invoker | None = None) -> APIGatewayRestResolver:
    """The task API for ``settings`` (the model must already be bound: see ``bootstrap.configure``).

    With an ``invoker``, tasks due now that a submit creates start at once on free worker slots
    (dispatch on submit); without one they wait for the coordinator.
    """
    app = TaskApiResolver()
    services = Services.of(settings, invoker)
    security_schemes, security = security_of(settings.api_auth)
    app.enable_swagger(path="/docs", title=API_TITLE, version=API_VERSION,
                       description="Submit, inspect, list, retry and cancel Coworker tasks.",
                       security_schemes=security_schemes, security=security)
    install_error_handlers(app)

    @app.not_found
    def _no_route(exc: NotFoundError) -> Response:
        return no_route_response(app)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi_document():  # noqa: ANN202 - a bare Response annotation would be validated as a model
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON,
                        body=app.get_openapi_json_schema(title=API_TITLE, version=API_VERSION,
                                                         security_schemes=security_schemes, security=security))

    for module in ROUTE_MODULES:
        app.include_router(module.router(services))
    return app


def security_of(api_auth: str) -> tuple[dict[str, Any] | None, list[dict[str, list[str]]] | None]:
    """The OpenAPI security schemes of ``api_auth`` and the requirement every route has, so that
    Swagger UI and generated clients send the credentials API Gateway checks."""
    if api_auth == "api-key":
        scheme = APIKey.model_validate({"type": "apiKey", "in": "header", "name": "x-api-key",
                                        "description": "An API key of the stack's usage plan (output ApiKeyId)."})
        return {"apiKey": scheme}, [{"apiKey": []}]
    if api_auth == "iam":
        scheme = APIKey.model_validate({
            "type": "apiKey", "in": "header", "name": "Authorization", "x-amazon-apigateway-authtype": "awsSigv4",
            "description": "AWS Signature Version 4 for service execute-api, with credentials allowed by the "
                           "stack's ApiInvokePolicyArn."})
        return {"sigv4": scheme}, [{"sigv4": []}]
    return None, None


def no_route_response(app: APIGatewayRestResolver) -> Response:
    """405 with ``Allow`` for a path some route serves with other methods, else 404."""
    method = app.current_event.http_method.upper()
    path = app.current_event.path
    allowed = sorted({route.method for route in app._static_routes + app._dynamic_routes
                      if route.rule.match(path)})
    if allowed:
        return error_response(HTTPStatus.METHOD_NOT_ALLOWED, "method_not_allowed",
                              f"{method} is not allowed on {path}; allowed: {', '.join(allowed)}",
                              headers={"Allow": ", ".join(allowed)})
    return error_response(HTTPStatus.NOT_FOUND, "route_not_found",
                          f"no route {method} {path}; see GET /docs for the routes of this API")
