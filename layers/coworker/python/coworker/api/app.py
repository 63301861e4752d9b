"""The task API: a Powertools ``APIGatewayRestResolver`` behind API Gateway (REST, Lambda proxy).

Routes (details, limits and the error format in docs/api.md; the OpenAPI document is served at
``GET /openapi.json`` and Swagger UI at ``GET /docs``)::

    POST /tasks                    one task, or {"tasks": [...]} as a batch (up to 1,000)
    GET  /tasks/{key}              the whole record
    GET  /tasks/{key}/result       the result, from the record or the result store
    GET  /tasks?status=...         a page of the status index (todo, processing, failed, ignored)
    POST /tasks/{key}/retry        redrive a failed or ignored task
    POST /tasks/{key}/cancel       stop a task that is not finished or ignored
    POST /bulk                     retry or cancel every task matching a filter, a page per call
    GET  /batches/{id}             a batch's counters and done flag
    POST /batches/{id}/retry       redrive a batch's ignored (or failed) tasks, a bounded slice per call
    GET  /stats                    counts by status, bounded
    GET  /types                    task types: registered, paused, held
    POST /types/{type}/pause       stop dispatching and claiming a type (running tasks finish)
    POST /types/{type}/resume      let a paused type run again
    PUT  /types/{type}/limit       set or lift how many tasks of a type run at once

Bad input is refused before anything is written. Every error answer has the shape
``{"statusCode", "error", "message", "errors"?}``; domain errors are mapped to HTTP codes in
:data:`ERROR_STATUS`, here and only here.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import json
import math
import uuid
import zlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from http import HTTPStatus
from typing import Annotated, Any
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import ResponseBuilder
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from pydantic import BaseModel

from coworker.api import bulk
from coworker.api.models import (
    DEFAULT_PAGE_SIZE,
    MAX_CURSOR_CHARS,
    MAX_PAGE_SIZE,
    MAX_REDRIVE_PER_REQUEST,
    BatchIn,
    BatchOut,
    BulkIn,
    BulkOut,
    ErrorOut,
    IndexedStatus,
    LimitIn,
    Order,
    PutResult,
    RedriveOut,
    RedriveStatus,
    StatsOut,
    StatusCount,
    Submission,
    SubmitBatchOut,
    SubmitTaskOut,
    TaskIn,
    TaskOut,
    TaskPage,
    TaskSummary,
    TypeOut,
    TypesOut,
)
from coworker.config import Settings
from coworker.data import index, layout
from coworker.data.layout import BATCH_KEY_PREFIX
from coworker.data.models import TaskModel, TaskStatus, iso_utc, status_shards, utcnow
from coworker.engine import batches, control, dispatch, gates, handlers, lifecycle, offload, redrive, submit
from coworker.engine.submit import PutOutcome
from coworker.engine.tasks import TaskSpec
from coworker.errors import (
    BatchFailedError,
    BatchNotFoundError,
    ConfigurationError,
    CoworkerError,
    PartialPutError,
    PayloadTooLargeError,
    StorageError,
    TaskNotFoundError,
    TooManyPausedTypesError,
)
from coworker.observability import logger

API_TITLE = "Coworker task API"
API_VERSION = "1.0.0"
# Index entries one listing or redrive request may read, whatever filters drop: bounds the
# cost and the latency of a request (API Gateway gives up after 29 s).
MAX_SCANNED_PER_REQUEST = 1000
# Larger stored results are answered with a redirect to their presigned link where there is one:
# a Lambda response holds at most 6 MB, and base64 or escaping can grow a body.
MAX_RESULT_RESPONSE_BYTES = 4 * 1024 * 1024
DEFAULT_STATS_CAP = 1000
# At most 4 statuses x 2,500 index entries (a few hundred bytes each): about 10,000 entries and a
# few hundred read units per request, whatever the backlog.
MAX_STATS_CAP = 2_500
INDEXED_STATUSES = (TaskStatus.TODO, TaskStatus.PROCESSING, TaskStatus.FAILED, TaskStatus.IGNORED)
FINISHED_NOT_LISTED = (
    "finished tasks leave the status index (that keeps the coordinator's queries and the index "
    "small), so they cannot be listed: read one with GET /tasks/{key}, or a batch's finished "
    "count with GET /batches/{id}"
)


class BadRequestError(CoworkerError):
    """The request is well-formed but cannot be answered as asked (a bad cursor, status=finished)."""


class TaskStateConflictError(CoworkerError):
    """The task exists but its state does not allow the operation."""


class TaskTypeNotFoundError(CoworkerError):
    """No handler is registered for the type, and it is neither paused nor held."""


# Held tasks counted per type in GET /types (a count reads the held partitions).
HELD_COUNT_CAP = 1000


# The one mapping from domain errors to HTTP answers: (status, short error name).
ERROR_STATUS: dict[type[CoworkerError], tuple[HTTPStatus, str]] = {
    TaskNotFoundError: (HTTPStatus.NOT_FOUND, "task_not_found"),
    BatchNotFoundError: (HTTPStatus.NOT_FOUND, "batch_not_found"),
    BatchFailedError: (HTTPStatus.CONFLICT, "batch_failed"),
    TaskStateConflictError: (HTTPStatus.CONFLICT, "conflict"),
    TaskTypeNotFoundError: (HTTPStatus.NOT_FOUND, "type_not_found"),
    TooManyPausedTypesError: (HTTPStatus.CONFLICT, "too_many_paused_types"),
    PayloadTooLargeError: (HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "payload_too_large"),
    BadRequestError: (HTTPStatus.BAD_REQUEST, "bad_request"),
    StorageError: (HTTPStatus.SERVICE_UNAVAILABLE, "storage_unavailable"),
    ConfigurationError: (HTTPStatus.INTERNAL_SERVER_ERROR, "configuration_error"),
}

_ERROR_RESPONSES: dict[int, Any] = {
    code: {"description": text, "content": {"application/json": {"model": ErrorOut}}}
    for code, text in (
        (400, "Bad request"),
        (404, "Not found"),
        (409, "The task's state does not allow this"),
        (413, "A payload is too large, even for the object store"),
        (415, "The body is not JSON (Content-Type must be application/json)"),
        (422, "Invalid input: every problem is listed with its location"),
        (503, "DynamoDB or the object store refused or failed (throttling, outage): retry later; a batch "
              "stored part-way lists the keys stored"),
    )
}


def _responses(ok: str, status: int = 200, **extra: Any) -> dict[int, Any]:
    """A route's documented answers: its success (schema from the return type) and every error."""
    return {status: {"description": ok}, **_ERROR_RESPONSES, **{int(k): v for k, v in extra.items()}}


def error_response(status: int, error: str, message: str, errors: list[dict] | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    """An error answer in the API's one error format."""
    body: dict[str, Any] = {"statusCode": int(status), "error": error, "message": message}
    if errors is not None:
        body["errors"] = errors
    return Response(status_code=int(status), content_type=content_types.APPLICATION_JSON,
                    body=json.dumps(body), headers=headers)


def _json(status: int, body: BaseModel) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)


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


def validation_error_response(exc: RequestValidationError) -> Response:
    errors = [_readable(e) for e in exc.errors()]
    shown = "; ".join(f"{e['location']}: {e['message']}" for e in errors[:5])
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    entries = sorted({e["entry"] for e in errors if e["entry"] is not None})
    prefix = (f"the batch was refused as a whole (nothing was written): {len(entries)} bad "
              f"{'entry' if len(entries) == 1 else 'entries'}. " if entries else "")
    return error_response(HTTPStatus.UNPROCESSABLE_ENTITY, "validation_error",
                          f"{prefix}Invalid request: {shown}{more}", errors)


# -- cursors -----------------------------------------------------------------------------------

# Cursors name the index layout they read: a cursor of another layout is refused, not misread.
CURSOR_VERSION = "sharded-1"
_BAD_CURSOR = "the cursor is not valid: pass back the cursor of a previous answer unchanged"


class CursorCodec:
    """Opaque, tamper-evident cursors: URL-safe base64 of the (deflated) read state -- where each
    index shard stopped -- and of the listing it belongs to, plus an HMAC-SHA256 of both under
    ``secret``. A cursor that was edited, comes from another deployment or release, or belongs to
    another listing (status, filters, order, shard count) is refused with 400 before it reaches
    DynamoDB."""

    def __init__(self, secret: str) -> None:
        self._key = hashlib.sha256(b"coworker-cursor|" + secret.encode()).digest()

    def _sign(self, data: bytes) -> str:
        return _b64(hmac.new(self._key, data, hashlib.sha256).digest()[:16])

    def encode(self, state: Any, listing: Sequence[Any]) -> str | None:
        if state is None:
            return None
        data = zlib.compress(json.dumps({"k": state, "q": [CURSOR_VERSION, *listing]}, separators=(",", ":"),
                                        sort_keys=True, ensure_ascii=False).encode(), 9)
        return f"{_b64(data)}.{self._sign(data)}"

    def decode(self, cursor: str | None, listing: Sequence[Any]) -> Any:
        """The read state a cursor stands for; :class:`BadRequestError` if it is not one of
        ours, or not for this listing."""
        if not cursor:
            return None
        encoded, _, signature = cursor.partition(".")
        try:
            data = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        except (binascii.Error, ValueError):
            raise BadRequestError(_BAD_CURSOR) from None
        if not signature or not hmac.compare_digest(signature, self._sign(data)):
            raise BadRequestError(_BAD_CURSOR)
        try:
            value = json.loads(zlib.decompress(data))
        except (zlib.error, ValueError):  # signed by a release whose cursors were not deflated
            raise BadRequestError("the cursor comes from an earlier release: start again without "
                                  "a cursor") from None
        listing = [CURSOR_VERSION, *listing]
        if value.get("q") != list(listing):
            raise BadRequestError("the cursor belongs to another listing (status, filters or order): "
                                  "start again without a cursor")
        return value["k"]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def cursor_secret(settings: Settings) -> str:
    """The cursor signing secret: the setting (the stack sets one per deployment), else one
    derived from the table name (tamper-evident, not secret)."""
    return settings.cursor_secret or f"table:{settings.table_name}"


# -- index reads (bounded) ---------------------------------------------------------------------

def read_index(status: str, *, want: int, start: list[Any] | None = None, forward: bool = True,
               batch_id: str | None = None, task_type: str | None = None,
               budget: int = MAX_SCANNED_PER_REQUEST) -> tuple[list[TaskModel], list[Any] | None, int]:
    """Up to ``want`` index entries of ``status`` matching the filters, its shards merged by
    ``due_at``, reading at most about ``budget`` entries.

    Returns ``(tasks, state, scanned)``; ``state`` (where each shard stopped, packed for a cursor)
    is ``None`` when every shard is exhausted. Filters on projected attributes (``type``,
    ``batch_id``) are applied by DynamoDB after reading, so they cut the answer, not the read:
    hence the budget.
    """
    condition = None
    if task_type is not None:
        condition = TaskModel.task_type == task_type
    if batch_id is not None:
        by_batch = TaskModel.batch_id == batch_id
        condition = by_batch if condition is None else condition & by_batch
    read = index.MergedRead(status, want=want, filter_condition=condition, forward=forward,
                              starts=_unpack_positions(status, start), budget=budget)
    found: list[TaskModel] = []
    for task in read:
        found.append(task)
        if len(found) >= want:
            break
    state = None if read.complete else _pack_positions(read.positions())
    return found, state, read.scanned


def _pack_positions(positions: list[Any]) -> list[Any]:
    """Shard positions as a cursor keeps them: ``[key, due_at]``, ``None`` (from the start) or
    ``0`` (nothing left); the shard's partition key value is implied by its place."""
    return [0 if p is False else None if p is None
            else [p[layout.PARTITION_KEY]["S"], p[layout.STATUS_INDEX_SORT_KEY]["S"]] for p in positions]


def _unpack_positions(status: str, packed: list[Any] | None) -> list[Any] | None:
    if packed is None:
        return None
    if len(packed) != status_shards():
        raise BadRequestError("the cursor was made with another number of index shards: start again "
                              "without a cursor")
    return [False if p == 0 else None if p is None else {
        layout.PARTITION_KEY: {"S": p[0]},
        layout.STATUS_INDEX_PARTITION_KEY: {"S": layout.shard_value(status, shard)},
        layout.STATUS_INDEX_SORT_KEY: {"S": p[1]},
    } for shard, p in enumerate(packed)]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _summary(task: TaskModel) -> dict[str, Any]:
    return TaskSummary(
        key=task.key,
        type=task.task_type,
        status=task.status,
        due_at=_iso(task.due_at),
        attempts=int(task.attempts) if task.attempts is not None else None,
        max_attempts=int(task.max_attempts) if task.max_attempts is not None else None,
        updated_at=_iso(task.updated_at),
        batch_id=task.batch_id,
        lock_owner=task.lock_owner,
    ).model_dump()


def _task_key(raw: str) -> str:
    """The task key of a path parameter (REST APIs pass the path percent-encoded)."""
    key = unquote(raw)
    if batches.is_batch_key(key):
        raise TaskNotFoundError(f"no task with key {key!r} (keys starting with "
                                f"{BATCH_KEY_PREFIX!r} are reserved for batches)")
    return key


def check_task_types(tasks: Sequence[TaskIn], batch: bool) -> None:
    """Refuse tasks whose type has no registered handler (422, each entry named, the known types
    listed): the API imports the same handler modules as the workers."""
    known = handlers.registered_types()
    errors = [
        {"type": "unknown_task_type", "loc": ("body", "tasks", index, "type") if batch else ("body", "type"),
         "msg": f"no handler is registered for task type {task.type!r}; known types: {', '.join(known) or 'none'}",
         "input": task.type}
        for index, task in enumerate(tasks) if task.type not in known
    ]
    if errors:
        raise RequestValidationError(errors)


# -- the application ---------------------------------------------------------------------------

# -- the request body: JSON only, UTF-8, numbers DynamoDB and JSON can both keep -----------------

_BODY_METHODS = {"POST", "PUT", "PATCH"}


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

    try:
        return json.loads(text, parse_constant=constant, parse_float=finite)
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


class TaskApiResolver(APIGatewayRestResolver):
    """Powertools' REST resolver with the body checked first: JSON only (415 otherwise, in the
    API's error shape), UTF-8, parsed strictly (see :func:`parse_json_strictly`)."""

    def __init__(self) -> None:
        super().__init__(enable_validation=True, json_body_deserializer=parse_json_strictly)

    def _resolve(self) -> ResponseBuilder:
        problem = body_problem(self.current_event.raw_event)
        if problem is not None:
            return ResponseBuilder(error_response(*problem))
        return super()._resolve()


def create_app(settings: Settings, invoker: dispatch.Invoker | None = None) -> APIGatewayRestResolver:
    """The task API for ``settings`` (the model must already be bound: see ``bootstrap.configure``).

    With an ``invoker``, tasks due now that a submit creates start at once on free worker slots
    (dispatch on submit); without one they wait for the coordinator.
    """
    app = TaskApiResolver()
    cursors = CursorCodec(cursor_secret(settings))

    def start_due(specs: Sequence[TaskSpec], now: datetime) -> None:
        submit.start_due(specs, settings, invoker, now)

    app.enable_swagger(path="/docs", title=API_TITLE, version=API_VERSION,
                       description="Submit, inspect, list, retry and cancel Coworker tasks.")

    @app.exception_handler(RequestValidationError)
    def _invalid(exc: RequestValidationError) -> Response:
        return validation_error_response(exc)

    @app.exception_handler(PartialPutError)
    def _partly_stored(exc: PartialPutError) -> Response:
        logger.exception("batch partly stored", extra={"stored": len(exc.stored)})
        body = ErrorOut(statusCode=503, error="storage_unavailable",
                        message=f"{exc}: re-send the same request to store the rest (tasks already stored are "
                                "reported as existing, and the batch total counts each task once)",
                        stored=exc.stored)
        return Response(status_code=503, content_type=content_types.APPLICATION_JSON,
                        body=body.model_dump_json(exclude_none=True))

    @app.exception_handler(CoworkerError)
    def _domain_error(exc: CoworkerError) -> Response:
        for cls in type(exc).__mro__:
            if cls in ERROR_STATUS:
                status, name = ERROR_STATUS[cls]
                break
        else:
            status, name = HTTPStatus.INTERNAL_SERVER_ERROR, "internal_error"
        if status >= 500:
            logger.exception("request failed", extra={"error": name})
        return error_response(status, name, str(exc))

    @app.not_found
    def _no_route(exc: NotFoundError) -> Response:
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

    @app.get("/openapi.json", include_in_schema=False)
    def openapi_document():  # noqa: ANN202 - a bare Response annotation would be validated as a model
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON,
                        body=app.get_openapi_json_schema(title=API_TITLE, version=API_VERSION))

    @app.post("/tasks", summary="Submit one task or a batch", tags=["tasks"],
              responses={201: {"description": "Created (at least one task)", "content": {
                  "application/json": {"schema": {"oneOf": [
                      {"$ref": "#/components/schemas/SubmitTaskOut"},
                      {"$ref": "#/components/schemas/SubmitBatchOut"}]}}}},
                  200: {"description": "Every task existed already (left untouched)",
                        "content": {"application/json": {"model": SubmitTaskOut}}},
                  **_ERROR_RESPONSES})
    def submit_tasks(body: Annotated[Submission, Body(description="A task, or {\"tasks\": [...]} for a batch")]
               ) -> Response[SubmitTaskOut | SubmitBatchOut]:
        now = utcnow()
        if settings.validate_task_types:
            check_task_types([body] if isinstance(body, TaskIn) else body.tasks, batch=isinstance(body, BatchIn))
        if isinstance(body, TaskIn):
            spec = body.to_spec()
            outcome = submit.put_task(spec, settings, now=now)
            answer = SubmitTaskOut(key=spec.key, outcome=outcome.value)
            if outcome is PutOutcome.CREATED:
                start_due([spec], now)
            status = 201 if outcome is PutOutcome.CREATED else 200
            return _json(status, answer)
        assert isinstance(body, BatchIn)
        batch_id = body.batch_id or uuid.uuid4().hex
        specs = [task.to_spec(batch_id=batch_id) for task in body.tasks]
        tolerance = (batches.Tolerance(body.tolerated_failure_percent, body.tolerated_failure_count)
                     if body.tolerated_failure_percent is not None or body.tolerated_failure_count is not None
                     else None)
        created = submit.put_batch(specs, batch_id, settings, tolerance, now)
        results = [PutResult(key=spec.key, outcome="created" if made else "exists")
                   for spec, made in zip(specs, created, strict=True)]
        made_count = sum(created)
        start_due([spec for spec, made in zip(specs, created, strict=True) if made], now)
        answer = SubmitBatchOut(batch_id=batch_id, created=made_count, existing=len(specs) - made_count,
                                results=results)
        # "created" is a LogRecord attribute: logging refuses it as an extra key (KeyError -> 502).
        logger.info("batch submitted", extra={"batch_id": batch_id, "tasks_created": made_count,
                                              "tasks_existing": len(specs) - made_count})
        return _json(201 if made_count else 200, answer)

    @app.get("/tasks/<key>", summary="Read a task", tags=["tasks"], responses=_responses("The task's record"))
    def read_task(key: str) -> TaskOut:
        record = lifecycle.get_task(_task_key(key)).to_dict()
        if record["result_ref"] is not None:
            store = offload.store_for(settings)
            link = store.link(record["result_ref"]["uri"]) if store is not None else None
            record["result_ref"] = {**record["result_ref"], "url": link}
        return TaskOut.model_validate(record)

    @app.get("/tasks/<key>/result", summary="Read a finished task's result, wherever it is kept",
             tags=["tasks"], responses={
                 **_ERROR_RESPONSES,
                 200: {"description": "The result: the JSON value the handler returned",
                       "content": {"application/json": {"schema": {}}}},
                 303: {"description": "The result is larger than an API response may be: "
                                      "fetch it from the presigned link in Location"},
             })
    def read_result(key: str) -> Response[Any]:
        task = lifecycle.get_task(_task_key(key))
        if task.status != TaskStatus.FINISHED.value:
            raise TaskStateConflictError(f"task {task.key!r} is {task.status}: only a finished task has a result")
        if task.result_ref is None:
            return Response(status_code=200, content_type=content_types.APPLICATION_JSON,
                            body=json.dumps(task.result))
        store = offload.store_for(settings)
        size = int(task.result_ref.get("bytes", 0))
        link = store.link(task.result_ref["uri"]) if store is not None else None
        if size > MAX_RESULT_RESPONSE_BYTES and link:
            return Response(status_code=303, content_type=content_types.APPLICATION_JSON, headers={"Location": link},
                            body=json.dumps({"location": link, "bytes": size}))
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON,
                        body=offload.read(task.result_ref, store).decode())

    @app.get("/tasks", summary="List tasks of one status (a page of the status index)", tags=["tasks"],
             responses=_responses("A page of tasks, oldest (or newest) due first"))
    def list_tasks(
        status: Annotated[IndexedStatus, Query(description="todo, processing, failed or ignored. "
                                                           "finished tasks are not in the index: 400.")],
        type: Annotated[str | None, Query(description="Only tasks of this type.", max_length=128)] = None,  # noqa: A002
        batch: Annotated[str | None, Query(description="Only tasks of this batch.", max_length=128)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE,
        cursor: Annotated[str | None, Query(description="From the previous page.", max_length=MAX_CURSOR_CHARS)] = None,
        order: Annotated[Order, Query(description="By due_at: oldest (default) or newest first.")]
        = Order.OLDEST,
    ) -> TaskPage:
        if status is IndexedStatus.FINISHED:
            raise BadRequestError(FINISHED_NOT_LISTED)
        listing = ("tasks", status.value, type, batch, order.value, status_shards())
        start = cursors.decode(cursor, listing)
        tasks, last_key, scanned = read_index(status.value, want=limit, start=start,
                                              forward=order is Order.OLDEST, batch_id=batch, task_type=type)
        return TaskPage(items=[TaskSummary(**_summary(t)) for t in tasks], count=len(tasks),
                        cursor=cursors.encode(last_key, listing), scanned=scanned)

    @app.post("/tasks/<key>/retry", summary="Redrive a failed or ignored task", tags=["tasks"],
              responses=_responses("The redriven task"))
    def retry_task(key: str) -> TaskOut:
        key = _task_key(key)
        task = redrive.retry(key)
        if task is None:
            current = lifecycle.get_task(key)  # TaskNotFoundError -> 404
            raise TaskStateConflictError(f"task {key!r} is {current.status}; "
                                         "only failed or ignored tasks can be retried")
        return TaskOut.model_validate(task.to_dict())

    @app.post("/tasks/<key>/cancel", summary="Cancel a task that is not finished", tags=["tasks"],
              responses=_responses("The cancelled task"))
    def cancel_task(key: str) -> TaskOut:
        key = _task_key(key)
        task = lifecycle.cancel(key, settings, reason="cancelled through the API")
        if task is None:
            current = lifecycle.get_task(key)
            raise TaskStateConflictError(f"task {key!r} is already {current.status}; "
                                         "only todo, failed or processing tasks can be cancelled")
        return TaskOut.model_validate(task.to_dict())

    @app.post("/bulk", summary="Retry or cancel every task matching a filter, a page per call",
              tags=["tasks"], responses=_responses("What this page matched and changed"))
    def bulk_action(body: Annotated[BulkIn, Body(description="The action, the filter, and the cursor of the "
                                                             "previous page")]) -> BulkOut:
        task_filter = bulk.TaskFilter(status=body.status.value, task_type=body.type, batch_id=body.batch_id,
                                      created_after=body.created_after, created_before=body.created_before)
        listing = ("bulk", body.action.value, body.status.value, body.type, body.batch_id,
                   iso_utc(body.created_after), iso_utc(body.created_before), status_shards())
        start = cursors.decode(body.cursor, listing)
        tasks, last_key, scanned = read_index(body.status.value, want=body.limit, start=start,
                                              batch_id=body.batch_id, task_type=body.type)
        outcome = bulk.apply(body.action, tasks, task_filter, settings, dry_run=body.dry_run,
                             reason="cancelled in bulk through the API")
        if not body.dry_run:
            logger.info("bulk action", extra={"action": body.action.value, "filter": dataclasses.asdict(task_filter),
                                              "changed": outcome.changed, "skipped": outcome.skipped})
        return BulkOut(action=body.action, status=body.status, dry_run=body.dry_run, matched=outcome.matched,
                       changed=outcome.changed, skipped=outcome.skipped, scanned=scanned,
                       cursor=cursors.encode(last_key, listing))

    def type_out(task_type: str, view: control.ControlView, changed: bool | None = None) -> TypeOut:
        held, _ = control.count_held(task_type, HELD_COUNT_CAP) if task_type in view.held_types else (0, False)
        limit = view.limits.get(task_type)
        running = blocked = None
        if limit is not None:
            running, blocked = gates.occupancy(gates.TYPE_GROUP + task_type, HELD_COUNT_CAP)
        return TypeOut(type=task_type, registered=task_type in handlers.registered_types(),
                       paused=view.is_paused(task_type), held=held, limit=limit, running=running, blocked=blocked,
                       changed=changed)

    def known_type(raw: str, view: control.ControlView) -> str:
        """The type named in the path; 404 for a type nobody knows."""
        task_type = unquote(raw)
        listed = control.types_listed(view, handlers.registered_types())
        if task_type not in listed:
            raise TaskTypeNotFoundError(f"no task type {task_type!r} here (known: {', '.join(listed) or 'none'})")
        return task_type

    def switch_type(raw: str, pause: bool) -> TypeOut:
        """Pause or resume the type named in the path (404 for a type nobody knows)."""
        view = control.read(consistent=True)
        task_type = known_type(raw, view)
        changed = control.pause(task_type) if pause else control.resume(task_type)
        logger.info("task type paused" if pause else "task type resumed",
                    extra={"task_type": task_type, "changed": changed})
        after = dataclasses.replace(view, paused=view.paused | {task_type} if pause else view.paused - {task_type},
                                    held_types=view.held_types | {task_type} if pause else view.held_types)
        return type_out(task_type, after, changed)

    @app.get("/types", summary="Task types: registered, paused, held", tags=["types"],
             responses=_responses("Every registered, paused or held task type"))
    def list_types() -> TypesOut:
        view = control.read(consistent=True)
        return TypesOut(types=[type_out(t, view) for t in control.types_listed(view, handlers.registered_types())],
                        note=f"a pause stops new claims within COWORKER_CONTROL_CACHE_SECONDS "
                             f"({settings.control_cache_seconds:g} s); running tasks finish")

    @app.post("/types/<task_type>/pause", summary="Pause a task type: its tasks wait, running ones finish",
              tags=["types"], responses=_responses("The type, paused"))
    def pause_type(task_type: str) -> TypeOut:
        return switch_type(task_type, pause=True)

    @app.post("/types/<task_type>/resume", summary="Resume a paused task type", tags=["types"],
              responses=_responses("The type, resumed"))
    def resume_type(task_type: str) -> TypeOut:
        return switch_type(task_type, pause=False)

    @app.put("/types/<task_type>/limit", summary="Set or lift a task type's concurrency limit", tags=["types"],
             responses=_responses("The type, with its new limit"))
    def limit_type(task_type: str, body: Annotated[LimitIn, Body(description="The new limit, or null")]) -> TypeOut:
        view = control.read(consistent=True)
        task_type = known_type(task_type, view)
        changed = control.set_limit(task_type, body.limit)
        logger.info("task type limit set", extra={"task_type": task_type, "limit": body.limit, "changed": changed})
        return type_out(task_type, control.read(consistent=True), changed)

    @app.get("/batches/<batch_id>", summary="A batch's progress", tags=["batches"],
             responses=_responses("The batch's counters"))
    def read_batch(batch_id: str) -> BatchOut:
        return BatchOut(**batches.get_batch(unquote(batch_id)).to_dict())

    @app.post("/batches/<batch_id>/retry", summary="Redrive a batch's ignored or failed tasks",
              tags=["batches"], responses=_responses("What this slice of the batch redrove"))
    def retry_batch(
        batch_id: str,
        status: Annotated[RedriveStatus, Query()] = RedriveStatus.IGNORED,
        limit: Annotated[int, Query(ge=1, le=MAX_REDRIVE_PER_REQUEST)] = 100,
        cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS)] = None,
    ) -> RedriveOut:
        batch_id = unquote(batch_id)
        if batches.get_batch(batch_id).failed_at is not None:  # BatchNotFoundError -> 404
            batches.reopen(batch_id)  # a stopped batch runs again: its redriven tasks are claimable
            logger.info("stopped batch reopened for a redrive", extra={"batch_id": batch_id})
        listing = ("redrive", status.value, batch_id, status_shards())
        start = cursors.decode(cursor, listing)
        tasks, last_key, scanned = read_index(status.value, want=limit, start=start, batch_id=batch_id)
        redriven = len(redrive.retry_all([task.key for task in tasks]))
        logger.info("batch redrive", extra={"batch_id": batch_id, "status": status.value,
                                            "redriven": redriven})
        return RedriveOut(batch_id=batch_id, status=status, redriven=redriven, skipped=len(tasks) - redriven,
                          scanned=scanned, cursor=cursors.encode(last_key, listing))

    @app.get("/stats", summary="Counts by status (bounded)", tags=["stats"],
             responses=_responses("Counts by status"))
    def stats(
        cap: Annotated[int, Query(ge=1, le=MAX_STATS_CAP,
                                  description="Most entries counted per status.")] = DEFAULT_STATS_CAP,
    ) -> StatsOut:
        counts: dict[str, StatusCount] = {}
        for status in INDEXED_STATUSES:
            count, capped = index.count_capped(status.value, cap)
            counts[status.value] = StatusCount(count=count, capped=capped)
        counts[TaskStatus.FINISHED.value] = StatusCount(count=None, capped=False)
        return StatsOut(counts=counts, cap=cap, note=(
            "todo, processing, failed and ignored are counted from the status index (eventually "
            f"consistent), at most {cap} each: capped means 'at least count'. finished tasks are not "
            "in the index and are not counted here; see GET /batches/{id} for a batch's finished count."))

    return app
