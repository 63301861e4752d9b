"""How the task API answers errors: one format, and one mapping from domain errors to HTTP codes.

Every error answer has the shape ``{"statusCode", "error", "message", "errors"?}``
(:func:`error_response`). Domain errors (:mod:`coworker.errors`, and the API's own below) are
mapped to HTTP codes in :data:`ERROR_STATUS`, here and only here; validation errors are listed
with a readable location and message each (:func:`validation_error_response`).
:func:`install_error_handlers` puts these answers on an app.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from botocore.exceptions import BotoCoreError, ClientError
from pynamodb.exceptions import PynamoDBException

from coworker.api.models import ErrorOut
from coworker.errors import (
    BatchCompletedError,
    BatchFailedError,
    BatchNotFoundError,
    ConfigurationError,
    CoworkerError,
    PartialPutError,
    PayloadTooLargeError,
    ScheduleNotFoundError,
    StorageError,
    TaskNotFoundError,
    TooManyPausedTypesError,
    TooManyRateLimitsError,
)
from coworker.observability import logger


class BadRequestError(CoworkerError):
    """The request is well-formed but cannot be answered as asked (a bad cursor, status=finished)."""


class TaskStateConflictError(CoworkerError):
    """The task exists but its state does not allow the operation."""


class TaskTypeNotFoundError(CoworkerError):
    """No handler is registered for the type, and it is neither paused nor held."""


class RateGroupNotFoundError(CoworkerError):
    """No rate limit is set for the group and none of its tasks has started."""


class BatchTooLargeError(CoworkerError):
    """A batch's answer, which lists every key, would be larger than an answer of the API may be."""


class ResultTooLargeError(CoworkerError):
    """A task's result is too large for an answer of the API, and its store gives no link to it."""


# The one mapping from domain errors to HTTP answers: (status, short error name).
ERROR_STATUS: dict[type[CoworkerError], tuple[HTTPStatus, str]] = {
    TaskNotFoundError: (HTTPStatus.NOT_FOUND, "task_not_found"),
    BatchNotFoundError: (HTTPStatus.NOT_FOUND, "batch_not_found"),
    ScheduleNotFoundError: (HTTPStatus.NOT_FOUND, "schedule_not_found"),
    BatchFailedError: (HTTPStatus.CONFLICT, "batch_failed"),
    BatchCompletedError: (HTTPStatus.CONFLICT, "batch_completed"),
    TaskStateConflictError: (HTTPStatus.CONFLICT, "conflict"),
    TaskTypeNotFoundError: (HTTPStatus.NOT_FOUND, "type_not_found"),
    RateGroupNotFoundError: (HTTPStatus.NOT_FOUND, "rate_group_not_found"),
    TooManyPausedTypesError: (HTTPStatus.CONFLICT, "too_many_paused_types"),
    TooManyRateLimitsError: (HTTPStatus.CONFLICT, "too_many_rate_limits"),
    PayloadTooLargeError: (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "payload_too_large"),
    ResultTooLargeError: (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "result_too_large"),
    BatchTooLargeError: (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "batch_too_large"),
    BadRequestError: (HTTPStatus.BAD_REQUEST, "bad_request"),
    StorageError: (HTTPStatus.SERVICE_UNAVAILABLE, "storage_unavailable"),
    ConfigurationError: (HTTPStatus.INTERNAL_SERVER_ERROR, "configuration_error"),
}

# The error answers every route documents in the OpenAPI document.
ERROR_RESPONSES: dict[int, Any] = {
    code: {"description": text, "content": {"application/json": {"model": ErrorOut}}}
    for code, text in (
        (400, "Bad request"),
        (404, "Not found"),
        (409, "The task's or batch's state does not allow this (a batch that completed or stopped takes "
              "no new tasks)"),
        (413, "A payload is too large, even for the object store (payload_too_large), or a batch's keys too long "
              "for its answer to list them (batch_too_large)"),
        (415, "The body is not JSON (Content-Type must be application/json)"),
        (422, "Invalid input: every problem is listed with its location"),
        (503, "DynamoDB or the object store refused or failed (throttling, outage): retry later; a batch "
              "stored part-way lists the keys stored"),
    )
}


def responses(ok: str, status: int = 200, **extra: Any) -> dict[int, Any]:
    """A route's documented answers: its success (schema from the return type) and every error."""
    return {status: {"description": ok}, **ERROR_RESPONSES, **{int(k): v for k, v in extra.items()}}


# Names an error message lists at most (known task types): the list itself is not bounded.
MAX_NAMED = 20


def some_names(names: Sequence[str], where: str = "GET /types lists them") -> str:
    """``names`` for an error message: the first :data:`MAX_NAMED`, and how many more (and where to
    read them all) when there are more; ``none`` when there are none."""
    if not names:
        return "none"
    shown = ", ".join(names[:MAX_NAMED])
    return shown if len(names) <= MAX_NAMED else f"{shown} and {len(names) - MAX_NAMED} more ({where})"


def error_response(status: int, error: str, message: str, errors: list[dict] | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    """An error answer in the API's one error format."""
    body: dict[str, Any] = {"statusCode": int(status), "error": error, "message": message}
    if errors is not None:
        body["errors"] = errors
    return Response(status_code=int(status), content_type=content_types.APPLICATION_JSON,
                    body=json.dumps(body), headers=headers)


# -- validation errors, readable ---------------------------------------------------------------

_TAGS = {"task", "batch"}  # discriminator tags of the POST /tasks body; not part of the field path


def _location(loc: Sequence[Any]) -> tuple[str, int | None]:
    parts: list[str] = []
    entry = None
    items = list(loc)
    if len(items) > 1 and items[0] == "body" and items[1] in _TAGS:
        items.pop(1)
    for position, part in enumerate(items):
        if isinstance(part, int):
            if position > 0 and items[position - 1] == "tasks" and entry is None:
                entry = part
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + str(part))
    return "".join(parts) or "request", entry


def _readable(error: dict[str, Any]) -> dict[str, Any]:
    location, entry = _location(error.get("loc", ()))
    kind = error.get("type", "invalid")
    message = str(error.get("msg", "invalid value"))
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        position = error["loc"][-1]
        where = f" at character {position}" if isinstance(position, int) and position > 0 else ""
        location, message = "body", f"the body is not valid JSON ({detail}{where})"
    elif kind == "extra_forbidden":
        message = "unknown field"
    elif kind == "missing":
        message = "required field is missing"
    elif message.startswith("Value error, "):
        message = message[len("Value error, "):]
    return {"location": location, "message": message, "type": kind, "entry": entry}


# Problems listed in one 422 at most (a batch of 1,000 tasks with 100 bad fields each would
# otherwise answer with megabytes); the message says how many more there were.
MAX_LISTED_ERRORS = 100


def validation_error_response(exc: RequestValidationError) -> Response:
    """422 with the problems listed (location, message; the first MAX_LISTED_ERRORS); a refused
    batch names its bad entries."""
    found = [_readable(e) for e in exc.errors()]
    errors = found[:MAX_LISTED_ERRORS]
    shown = "; ".join(f"{e['location']}: {e['message']}" for e in errors[:5])
    more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
    entries = sorted({e["entry"] for e in found if e["entry"] is not None})
    prefix = (f"the batch was refused as a whole (nothing was written): {len(entries)} bad "
              f"{'entry' if len(entries) == 1 else 'entries'}. " if entries else "")
    unlisted = len(found) - len(errors)
    listed = f" ({len(found)} problems; the first {len(errors)} are listed)" if unlisted else ""
    return error_response(HTTPStatus.UNPROCESSABLE_ENTITY, "validation_error",
                          f"{prefix}Invalid request: {shown}{more}{listed}", errors)


# -- domain errors -----------------------------------------------------------------------------

def partly_stored_response(exc: PartialPutError) -> Response:
    """503 for a batch stored part-way, naming the keys stored: re-sending completes it."""
    logger.exception("batch partly stored", extra={"stored": len(exc.stored)})
    body = ErrorOut(statusCode=503, error="storage_unavailable",
                    message=f"{exc.reason}: re-send the same request to store the rest (tasks already stored are "
                            f"reported as existing, and the batch total counts each task once){_request_id()}",
                    stored=exc.stored)
    return Response(status_code=503, content_type=content_types.APPLICATION_JSON,
                    body=body.model_dump_json(exclude_none=True))


def domain_error_response(exc: CoworkerError) -> Response:
    """The answer :data:`ERROR_STATUS` gives the error (its nearest listed class), else 500."""
    for cls in type(exc).__mro__:
        if cls in ERROR_STATUS:
            status, name = ERROR_STATUS[cls]
            break
    else:
        status, name = HTTPStatus.INTERNAL_SERVER_ERROR, "internal_error"
    if status < 500:
        return error_response(status, name, str(exc))
    # What DynamoDB, S3 or the code said stays in the log: the client is told what to do.
    logger.exception("request failed", extra={"error": name})
    message = (SERVICE_UNAVAILABLE_MESSAGE if status == HTTPStatus.SERVICE_UNAVAILABLE
               else "the request failed inside the API")
    return error_response(status, name, message + _request_id())


SERVICE_UNAVAILABLE_MESSAGE = ("DynamoDB or the object store refused or failed the request (throttling or an "
                               "outage): retry later")


def _request_id() -> str:
    """``; request id <id>`` (API Gateway's, which the logs carry too), when there is one."""
    request_id = logger.get_correlation_id()
    return f"; request id {request_id}" if request_id else ""


def storage_error_response(exc: Exception) -> Response:
    """503 for a DynamoDB or S3 error that reached a route unwrapped (the engine turns the ones it
    expects into :class:`StorageError`): throttling or an outage is the client's to retry, not a
    500. What the service said stays in the log."""
    logger.exception("request failed on a storage error", extra={"error": type(exc).__name__})
    return error_response(HTTPStatus.SERVICE_UNAVAILABLE, "storage_unavailable",
                          SERVICE_UNAVAILABLE_MESSAGE + _request_id())


def install_error_handlers(app: APIGatewayRestResolver) -> None:
    """Answer validation and domain errors raised by any route of ``app`` in the API's format."""
    app.exception_handler(RequestValidationError)(validation_error_response)
    app.exception_handler(PartialPutError)(partly_stored_response)
    app.exception_handler(CoworkerError)(domain_error_response)
    app.exception_handler([PynamoDBException, BotoCoreError, ClientError])(storage_error_response)
