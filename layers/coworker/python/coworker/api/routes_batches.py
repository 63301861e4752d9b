"""Routes of batches (``/batches``): read a batch's progress, redrive its ignored or failed tasks a
bounded slice per call (a stopped batch is reopened first)."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import unquote

from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from coworker.api.cursors import CursorCodec, read_index, start_state
from coworker.api.errors import responses
from coworker.api.models import MAX_CURSOR_CHARS, MAX_REDRIVE_PER_REQUEST, BatchOut, RedriveOut, RedriveStatus
from coworker.api.services import Services
from coworker.config import Settings
from coworker.data import writes
from coworker.data.models import status_shards
from coworker.engine import batches, redrive
from coworker.engine.tasks import BATCH_ID_PATTERN
from coworker.errors import BatchNotFoundError
from coworker.observability import logger


def router(services: Services) -> APIGatewayRouter:
    """The batch routes of one app, answering with ``services``."""
    routes = APIGatewayRouter()

    @routes.get("/batches/<batch_id>", summary="A batch's progress", tags=["batches"],
                responses=responses("The batch's counters"))
    def read_batch(batch_id: str) -> BatchOut:
        return BatchOut(**batches.get_batch(batch_id_of(batch_id)).to_dict())

    @routes.post("/batches/<batch_id>/retry", summary="Redrive a batch's ignored or failed tasks",
                 tags=["batches"], responses=responses("What this slice of the batch redrove"))
    def retry_batch(
        batch_id: str,
        status: Annotated[RedriveStatus, Query()] = RedriveStatus.IGNORED,
        limit: Annotated[int, Query(ge=1, le=MAX_REDRIVE_PER_REQUEST)] = 100,
        cursor: Annotated[str | None, Query(max_length=MAX_CURSOR_CHARS)] = None,
    ) -> RedriveOut:
        return redrive_slice(services.cursors, services.settings, batch_id_of(batch_id), status, limit=limit,
                             cursor=cursor)

    return routes


def batch_id_of(raw: str) -> str:
    """The batch id of a path parameter; 404 for an id no batch can have (the API makes and takes
    only ids of ``BATCH_ID_PATTERN``: a counter item's ``<id>#<shard>`` is not a batch)."""
    batch_id = unquote(raw)
    if not re.fullmatch(BATCH_ID_PATTERN, batch_id):
        shown = batch_id if len(batch_id) <= 100 else f"{batch_id[:100]}... ({len(batch_id)} characters)"
        raise BatchNotFoundError(f"no batch with id {shown!r} (batch ids are 1-128 letters, digits and ._:-)")
    return batch_id


def redrive_slice(cursors: CursorCodec, settings: Settings, batch_id: str, status: RedriveStatus, *, limit: int,
                  cursor: str | None) -> RedriveOut:
    """Redrive one page of the batch's tasks in ``status``; a stopped batch is reopened first
    (404 for a batch that does not exist)."""
    window = writes.Window.of_request()  # its reads count too
    if batches.get_batch(batch_id).failed_at is not None:  # BatchNotFoundError -> 404
        batches.reopen(batch_id)  # a stopped batch runs again: its redriven tasks are claimable
        logger.info("stopped batch reopened for a redrive", extra={"batch_id": batch_id})
    listing = ("redrive", status.value, batch_id, status_shards())
    start = cursors.decode(cursor, listing)
    tasks, last_key, scanned = read_index(status.value, want=limit, start=start, batch_id=batch_id)
    done, unreached = redrive.retry_all(tasks, settings, reason="with its batch through the API", window=window)
    redriven = len(done)
    logger.info("batch redrive", extra={"batch_id": batch_id, "status": status.value,
                                        "redriven": redriven, "unreached": unreached})
    # Tasks not reached (writes were slow): the cursor reads this page again.
    resume = (start if start is not None else start_state()) if unreached else last_key
    return RedriveOut(batch_id=batch_id, status=status, redriven=redriven, skipped=len(tasks) - redriven - unreached,
                      unreached=unreached, scanned=scanned, cursor=cursors.encode(resume, listing))
