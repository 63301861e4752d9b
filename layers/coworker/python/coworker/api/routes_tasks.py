"""Routes of tasks (``/tasks``, ``/bulk``): submit one task or a batch, read a task or its result,
list a status, retry, cancel, and retry or cancel in bulk (the list is in :mod:`coworker.api.app`).

Each route parses its input and answers; the work is done by the functions below it, which call
the engine (``submit``, ``redrive``, ``lifecycle``, ``offload``) and :mod:`coworker.api.bulk`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from aws_lambda_powertools.event_handler.router import APIGatewayRouter
from pydantic import BaseModel

from coworker.api import bulk
from coworker.api.cursors import CursorCodec, read_index, start_state
from coworker.api.errors import (
    ERROR_RESPONSES,
    BadRequestError,
    BatchTooLargeError,
    ResultTooLargeError,
    TaskStateConflictError,
    responses,
    some_names,
)
from coworker.api.models import (
    DEFAULT_PAGE_SIZE,
    LAMBDA_RESPONSE_BYTES,
    MAX_CURSOR_CHARS,
    MAX_PAGE_SIZE,
    BatchIn,
    BulkIn,
    BulkOut,
    ErrorOut,
    IndexedStatus,
    Order,
    PutResult,
    ResultLinkOut,
    Submission,
    SubmitBatchOut,
    SubmitTaskOut,
    TaskIn,
    TaskOut,
    TaskPage,
    TaskSummary,
)
from coworker.api.services import Services
from coworker.config import Settings
from coworker.data import writes
from coworker.data.models import TaskModel, TaskStatus, iso_utc, status_shards, utcnow
from coworker.engine import batches, handlers, lifecycle, offload, redrive, runners, submit
from coworker.engine.submit import PutOutcome
from coworker.engine.tasks import NewTask, key_problem
from coworker.errors import TaskNotFoundError
from coworker.observability import logger

# A result answered as the body must fit in Lambda's answer (6 MB), with room for the status and
# headers. The answer carries the body as a JSON string, escaped once more, and a stored result
# (JSON written with ensure_ascii=False) can grow up to threefold there: "é" (2 bytes) becomes
# "\u00e9" (6), an astral character (4 bytes) "\ud83d\ude00" (12), a quote in a string (2: \")
# 4. The answer's JSON is the Lambda runtime's; runtimes before 3.12 escape every non-ASCII character.
RESULT_ANSWER_BYTES = LAMBDA_RESPONSE_BYTES - 64 * 1024
# Stored results above this size are answered with a redirect (303) to their presigned link
# without being read, where there is one: no result up to it can outgrow the answer. One is
# always answered the same way, whatever characters it holds.
MAX_RESULT_RESPONSE_BYTES = RESULT_ANSWER_BYTES // 3
FINISHED_NOT_LISTED = (
    "finished tasks leave the status index (that keeps the coordinator's queries and the index "
    "small), so they cannot be listed: read one with GET /tasks/{key}, or a batch's finished "
    "count with GET /batches/{id}"
)

# A task or a batch, either answer: the batch's shape also when every task of a re-sent batch existed.
_SUBMIT_ANSWER = {"application/json": {"schema": {"oneOf": [
    {"$ref": "#/components/schemas/SubmitTaskOut"}, {"$ref": "#/components/schemas/SubmitBatchOut"}]}}}
SUBMIT_RESPONSES: dict[int, Any] = {
    201: {"description": "Created (at least one task)", "content": _SUBMIT_ANSWER},
    200: {"description": "Every task existed already (left untouched)", "content": _SUBMIT_ANSWER},
    **ERROR_RESPONSES,
}

RESULT_RESPONSES: dict[int, Any] = {
    **ERROR_RESPONSES,
    200: {"description": "The result: the JSON value the handler returned",
          "content": {"application/json": {"schema": {}}}},
    303: {"description": "The result is kept in the result store and is larger than an answer of the API "
                         f"carries whatever it holds (over {MAX_RESULT_RESPONSE_BYTES:,} bytes of JSON): fetch it "
                         "from the presigned link in Location (also in the body, with its size), without the "
                         "API's credentials",
          "content": {"application/json": {"model": ResultLinkOut}}},
    413: {"description": "The result is too large for an answer of the API (Lambda's 6 MB) and there is no "
                         "link to it (no results bucket): the message says where it is kept",
          "content": {"application/json": {"model": ErrorOut}}},
}


def router(services: Services) -> APIGatewayRouter:
    """The task routes of one app, answering with ``services``."""
    routes = APIGatewayRouter()
    settings = services.settings

    @routes.post("/tasks", summary="Submit one task or a batch", tags=["tasks"], responses=SUBMIT_RESPONSES)
    def submit_tasks(body: Annotated[Submission, Body(description="A task, or {\"tasks\": [...]} for a batch")]
                     ) -> Response[SubmitTaskOut | SubmitBatchOut]:
        now = utcnow()
        check_tasks([body] if isinstance(body, TaskIn) else body.tasks, settings, batch=isinstance(body, BatchIn))
        if isinstance(body, BatchIn) and body.callbacks is not None:
            for event, task in body.callbacks.named().items():
                check_tasks([task], settings, batch=False, location=("body", "callbacks", event), payloads=False)
        if isinstance(body, TaskIn):
            return submit_one(body, services, now)
        assert isinstance(body, BatchIn)
        check_answer_fits(body.tasks)
        return submit_batch(body, services, now)

    @routes.get("/tasks/<key>", summary="Read a task", tags=["tasks"], responses=responses("The task's record"))
    def read_task(key: str) -> TaskOut:
        return task_record(task_key(key), settings)

    @routes.get("/tasks/<key>/result", summary="Read a finished task's result, wherever it is kept",
                tags=["tasks"], responses=RESULT_RESPONSES)
    def read_result(key: str) -> Response[Any]:
        return result_response(task_key(key), settings)

    @routes.get("/tasks", summary="List tasks of one status (a page of the status index)", tags=["tasks"],
                responses=responses("A page of tasks, oldest (or newest) due first"))
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
        return task_page(services.cursors, status, task_type=type, batch_id=batch, limit=limit, cursor=cursor,
                         order=order)

    @routes.post("/tasks/<key>/retry", summary="Redrive a failed or ignored task", tags=["tasks"],
                 responses=responses("The redriven task"))
    def retry_task(key: str) -> TaskOut:
        return redrive_one(task_key(key), settings)

    @routes.post("/tasks/<key>/cancel", summary="Cancel a task that is not finished", tags=["tasks"],
                 responses=responses("The cancelled task"))
    def cancel_task(key: str) -> TaskOut:
        return cancel_one(task_key(key), settings)

    @routes.post("/bulk", summary="Retry or cancel every task matching a filter, a page per call",
                 tags=["tasks"], responses=responses("What this page matched and changed"))
    def bulk_action(body: Annotated[BulkIn, Body(description="The action, the filter, and the cursor of the "
                                                             "previous page")]) -> BulkOut:
        return bulk_page(body, services)

    return routes


# -- submit ------------------------------------------------------------------------------------

def check_tasks(tasks: Sequence[NewTask], settings: Settings, batch: bool,
                location: tuple[str | int, ...] = ("body",), payloads: bool = True) -> None:
    """Refuse (422, each entry named) tasks whose type has no registered handler (with
    ``validate_task_types``; the API imports the same handler modules as the workers, the known
    types are listed), tasks whose payload their type's check refuses (``validate_payload``), and
    tasks whose time limit, their own or their type's, no runner of this deployment gives (the
    message names the runner and the setting). ``location`` is where a single task sits in the
    request; ``payloads=False`` leaves payloads unchecked (a callback's handler gets its payload
    wrapped with the batch's counts, see :mod:`coworker.engine.callbacks`)."""
    known = handlers.registered_types()
    errors: list[dict[str, Any]] = []
    for index, task in enumerate(tasks):
        where = ("body", "tasks", index) if batch else location
        if settings.validate_task_types and task.type not in known:
            errors.append({"type": "unknown_task_type", "loc": (*where, "type"), "input": task.type,
                           "msg": f"no handler is registered for task type {task.type!r}; known types: "
                                  f"{some_names(known)}"})
            continue
        payload_problem = handlers.payload_problem(task.type, task.payload) if payloads else None
        if payload_problem is not None:
            errors.append({"type": "invalid_payload", "loc": (*where, "payload"), "input": task.type,
                           "msg": f"task type {task.type!r}: {payload_problem}"})
        own = task.timeout_seconds
        limit = own if own is not None else handlers.declared_timeout(task.type)
        what = "the task" if own is not None else f"task type {task.type!r}"
        problem = runners.runner_limit_problem(task.type, limit, settings, what)
        if problem is not None:
            errors.append({"type": "time_limit_too_long", "msg": problem,
                           "loc": (*where, "timeout_seconds" if own is not None else "type"),
                           "input": own if own is not None else task.type})
    if errors:
        raise RequestValidationError(errors)


# A batch's answer lists every task's key and outcome: room for it in Lambda's answer, beside the
# status, the headers, the batch id and the counts.
BATCH_ANSWER_BYTES = LAMBDA_RESPONSE_BYTES - 64 * 1024
_GENERATED_KEY = "00000000-0000-0000-0000-000000000000"  # what a task without a key gets (a UUID)


def batch_answer_bytes(keys: Sequence[str]) -> int:
    """Bytes the results of a batch with ``keys`` take in the Lambda answer: each entry as the
    serializer writes it (compact, ASCII), its quotes and backslashes escaped once more."""
    total = 0
    for key in keys:
        entry = json.dumps({"key": key, "outcome": "created"}, separators=(",", ":"))
        total += len(entry) + entry.count('"') + entry.count("\\") + 1  # and its comma
    return total


def check_answer_fits(tasks: Sequence[TaskIn]) -> None:
    """Refuse (413, before anything is written) a batch whose answer could not be given: 1,000
    keys of 512 characters, each 12 bytes once escaped (an emoji), list 7.2 MB, past Lambda's
    6 MB, and the tasks would be stored with no answer (a 502). Keys that long are rare: the
    estimate at 14 bytes a character skips the exact count for every other batch."""
    keys = [task.key or _GENERATED_KEY for task in tasks]
    if sum(len(key) for key in keys) * 14 + 64 * len(keys) <= BATCH_ANSWER_BYTES:
        return
    size = batch_answer_bytes(keys)
    if size <= BATCH_ANSWER_BYTES:
        return
    fitting, total = 0, 0
    for key in keys:
        total += batch_answer_bytes([key])
        if total > BATCH_ANSWER_BYTES:
            break
        fitting += 1
    raise BatchTooLargeError(
        f"the answer to this batch lists every key, and with these keys it would be {size:,} bytes, more than an "
        f"answer of the API carries (Lambda's 6 MB): nothing was written; send these tasks in smaller batches "
        f"(the first {fitting} fit in one)")


def submit_one(body: TaskIn, services: Services, now: datetime) -> Response:
    """Create one task (201), or leave the existing task of its key (200); start it if it is due."""
    spec = body.to_spec()
    outcome = submit.put_task(spec, services.settings, now=now)
    answer = SubmitTaskOut(key=spec.key, outcome=outcome.value)
    if outcome is PutOutcome.CREATED:
        submit.start_due([spec], services.settings, services.invoker, now)
    status = 201 if outcome is PutOutcome.CREATED else 200
    return _json(status, answer)


def submit_batch(body: BatchIn, services: Services, now: datetime) -> Response:
    """Create a batch's new tasks (201 if any, else 200) and start those that are due."""
    batch_id = body.batch_id or uuid.uuid4().hex
    specs = [task.to_spec(batch_id=batch_id) for task in body.tasks]
    tolerance = (batches.Tolerance(body.tolerated_failure_percent, body.tolerated_failure_count)
                 if body.tolerated_failure_percent is not None or body.tolerated_failure_count is not None
                 else None)
    created = submit.put_batch(specs, batch_id, services.settings, tolerance, now,
                               callbacks=body.callbacks.named() if body.callbacks is not None else None)
    results = [PutResult(key=spec.key, outcome="created" if made else "exists")
               for spec, made in zip(specs, created, strict=True)]
    made_count = sum(created)
    submit.start_due([spec for spec, made in zip(specs, created, strict=True) if made], services.settings,
                     services.invoker, now)
    answer = SubmitBatchOut(batch_id=batch_id, created=made_count, existing=len(specs) - made_count,
                            results=results)
    # "created" is a LogRecord attribute: logging refuses it as an extra key (KeyError -> 502).
    logger.info("batch submitted", extra={"batch_id": batch_id, "tasks_created": made_count,
                                          "tasks_existing": len(specs) - made_count})
    return _json(201 if made_count else 200, answer)


def _json(status: int, body: BaseModel) -> Response:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)


# -- read --------------------------------------------------------------------------------------

def task_key(raw: str) -> str:
    """The task key of a path parameter (REST APIs pass the path percent-encoded); 404 for a key
    no task can have (too long, reserved for Coworker's own items, not text), before any read."""
    key = unquote(raw)
    problem = key_problem(key)
    if problem is not None:
        shown = key if len(key) <= 100 else f"{key[:100]}... ({len(key)} characters)"
        raise TaskNotFoundError(f"no task with key {shown!r} ({problem})")
    return key


def task_record(key: str, settings: Settings) -> TaskOut:
    """The task's whole record; a result kept in the store comes with its presigned link."""
    record = lifecycle.get_task(key).to_dict()
    if record["result_ref"] is not None:
        store = offload.store_for(settings)
        link = store.link(record["result_ref"]["uri"]) if store is not None else None
        record["result_ref"] = {**record["result_ref"], "url": link}
    return TaskOut.model_validate(record)


def result_response(key: str, settings: Settings) -> Response[Any]:
    """A finished task's result as the body (409 before it finishes), or, when it is too large for
    an answer (:data:`MAX_RESULT_RESPONSE_BYTES`), a redirect (303) to its presigned link; 413
    when it does not fit and there is no link (a folder store)."""
    task = lifecycle.get_task(key)
    if task.status != TaskStatus.FINISHED.value:
        raise TaskStateConflictError(f"task {task.key!r} is {task.status}: only a finished task has a result")
    if task.result_ref is None:  # on the record: at most COWORKER_INLINE_RESULT_BYTES (64 KB)
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON,
                        body=json.dumps(task.result))
    store = offload.store_for(settings)
    size = int(task.result_ref.get("bytes", 0))
    link = store.link(task.result_ref["uri"]) if store is not None else None
    if link and size > MAX_RESULT_RESPONSE_BYTES:
        return Response(status_code=303, content_type=content_types.APPLICATION_JSON, headers={"Location": link},
                        body=ResultLinkOut(location=link, bytes=size))
    if size <= RESULT_ANSWER_BYTES:  # above it, no body fits whatever it holds: not read
        body = offload.read(task.result_ref, store).decode()
        if len(json.dumps(body)) <= RESULT_ANSWER_BYTES:  # the body as the answer carries it
            return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=body)
    raise ResultTooLargeError(
        f"the result of task {task.key!r} is {size:,} bytes of JSON, more than an answer of the API carries "
        f"(Lambda's 6 MB, where escaping may triple it), and the result store ({task.result_ref['uri'][:300]}) "
        "gives no link to it: read it from the store, or run with a results bucket, where this route answers "
        "303 with a presigned link")


# -- list --------------------------------------------------------------------------------------

def task_page(cursors: CursorCodec, status: IndexedStatus, *, task_type: str | None, batch_id: str | None,
              limit: int, cursor: str | None, order: Order) -> TaskPage:
    """A page of the status index (400 for ``finished``, which the index does not hold)."""
    if status is IndexedStatus.FINISHED:
        raise BadRequestError(FINISHED_NOT_LISTED)
    listing = ("tasks", status.value, task_type, batch_id, order.value, status_shards())
    start = cursors.decode(cursor, listing)
    tasks, last_key, scanned = read_index(status.value, want=limit, start=start,
                                          forward=order is Order.OLDEST, batch_id=batch_id, task_type=task_type)
    return TaskPage(items=[TaskSummary(**_summary(t)) for t in tasks], count=len(tasks),
                    cursor=cursors.encode(last_key, listing), scanned=scanned)


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


# -- retry and cancel --------------------------------------------------------------------------

def redrive_one(key: str, settings: Settings) -> TaskOut:
    """Redrive a failed or ignored task; 409 for a task in another state, 404 for none."""
    task = redrive.retry(key, settings)
    if task is None:
        current = lifecycle.get_task(key)  # TaskNotFoundError -> 404
        raise TaskStateConflictError(f"task {key!r} is {current.status}; "
                                     "only failed or ignored tasks can be retried")
    return TaskOut.model_validate(task.to_dict())


def cancel_one(key: str, settings: Settings) -> TaskOut:
    """Cancel a task that is not finished or ignored; 409 for one that is, 404 for none."""
    task = lifecycle.cancel(key, settings, reason="through the API")
    if task is None:
        current = lifecycle.get_task(key)
        raise TaskStateConflictError(f"task {key!r} is already {current.status}; "
                                     "only todo, failed or processing tasks can be cancelled")
    return TaskOut.model_validate(task.to_dict())


def bulk_page(body: BulkIn, services: Services) -> BulkOut:
    """Apply a bulk action to one page of the index entries matching its filter."""
    window = writes.Window.of_request()  # its reads count too
    task_filter = bulk.TaskFilter(status=body.status.value, task_type=body.type, batch_id=body.batch_id,
                                  created_after=body.created_after, created_before=body.created_before)
    listing = ("bulk", body.action.value, body.status.value, body.type, body.batch_id,
               iso_utc(body.created_after), iso_utc(body.created_before), status_shards())
    start = services.cursors.decode(body.cursor, listing)
    tasks, last_key, scanned = read_index(body.status.value, want=body.limit, start=start,
                                          batch_id=body.batch_id, task_type=body.type)
    outcome = bulk.apply(body.action, tasks, task_filter, services.settings, dry_run=body.dry_run,
                         reason="in bulk through the API", window=window)
    if not body.dry_run:
        logger.info("bulk action", extra={"action": body.action.value, "filter": dataclasses.asdict(task_filter),
                                          "changed": outcome.changed, "skipped": outcome.skipped,
                                          "unreached": outcome.unreached})
    # Tasks not reached (writes were slow): the cursor reads this page again, where the tasks
    # changed meanwhile no longer match.
    resume = (start if start is not None else start_state()) if outcome.unreached else last_key
    return BulkOut(action=body.action, status=body.status, dry_run=body.dry_run, matched=outcome.matched,
                   changed=outcome.changed, skipped=outcome.skipped, unreached=outcome.unreached, scanned=scanned,
                   cursor=services.cursors.encode(resume, listing))
