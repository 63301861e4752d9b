"""The local web dashboard and the runtime's own endpoints, served next to the API.

=====================  ==================================================================
``/dashboard``         the page (static HTML + JavaScript, no external scripts): it reads
                       the task API (``/stats``, ``/tasks``, ``/batches/{id}``) every second
``/favicon.ico``       the page's icon (an SVG)
``/local/info``        runtime state: settings, worker pool counters, last coordinator tick
                       and backlog measure
``/local/invocations`` worker invocations in flight with their process ids (``?recent=1``
                       adds finished ones): what the crash tests kill
``/local/failures``    the latest failed and ignored tasks with their last error, in one
                       request (the page's failures panel)
``/local/batches``     the progress of the batches named by ``?id=`` (repeated), in one request
=====================  ==================================================================

Each panel of the page reads one route and is drawn as soon as its answer arrives.
"""

from __future__ import annotations

import itertools
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coworker.data import index
from coworker.data.models import TaskModel, TaskStatus
from coworker.engine import batches
from coworker.errors import BatchNotFoundError

from coworker_local.gateway import ExtraRoute, GatewayRequest, GatewayResponse

if TYPE_CHECKING:
    from coworker_local.runtime import LocalRuntime

NO_CACHE = {"Cache-Control": "no-store"}
MAX_BATCHES_PER_REQUEST = 20
# Two overlapping tiles in the dashboard's colours; browsers ask for /favicon.ico whatever the page says.
FAVICON_SVG = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    b'<rect x="1" y="1" width="9" height="9" rx="2" fill="#6b7fd7"/>'
    b'<rect x="6" y="6" width="9" height="9" rx="2" fill="#2f9e5b"/></svg>'
)


def static_folder() -> Path:
    return Path(__file__).resolve().parent / "static"


def _json(status: int, body: Any) -> GatewayResponse:
    headers = {"Content-Type": "application/json", **NO_CACHE}
    return GatewayResponse(status, headers, json.dumps(body, default=str))


def dashboard_routes(runtime: LocalRuntime) -> dict[str, ExtraRoute]:
    """Extra routes for :class:`~coworker_local.gateway.LocalGateway`."""
    page = static_folder() / "dashboard.html"

    def dashboard(request: GatewayRequest) -> GatewayResponse:
        headers = {"Content-Type": "text/html; charset=utf-8", **NO_CACHE}
        return GatewayResponse(200, headers, page.read_bytes())

    def home(request: GatewayRequest) -> GatewayResponse:
        return GatewayResponse(302, {"Location": "/dashboard"}, b"")

    def favicon(request: GatewayRequest) -> GatewayResponse:
        return GatewayResponse(200, {"Content-Type": "image/svg+xml", "Cache-Control": "max-age=86400"},
                               FAVICON_SVG)

    def info(request: GatewayRequest) -> GatewayResponse:
        return _json(200, runtime.info())

    def invocations(request: GatewayRequest) -> GatewayResponse:
        assert runtime.pool is not None
        body: dict[str, Any] = {"running": runtime.pool.running()}
        if request.query.get("recent"):
            body["recent"] = runtime.pool.recent()
        return _json(200, body)

    def failures(request: GatewayRequest) -> GatewayResponse:
        limit = _int(request.query.get("limit", ["10"])[0], 1, 50)
        return _json(200, {"items": recent_failures(limit)})

    def recent_events(request: GatewayRequest) -> GatewayResponse:
        limit = _int(request.query.get("limit", ["20"])[0], 1, 200)
        settings = runtime.settings
        return _json(200, {"events": settings.events, "items": last_events(settings.events_file, limit)})

    def batch_progress(request: GatewayRequest) -> GatewayResponse:
        found = []
        for batch_id in list(dict.fromkeys(request.query.get("id", [])))[:MAX_BATCHES_PER_REQUEST]:
            try:
                found.append(batches.get_batch(batch_id).to_dict())
            except (BatchNotFoundError, ValueError):
                continue
        return _json(200, {"items": found})

    return {
        "/": home,
        "/dashboard": dashboard,
        "/dashboard/": dashboard,
        "/favicon.ico": favicon,
        "/local/info": info,
        "/local/invocations": invocations,
        "/local/failures": failures,
        "/local/batches": batch_progress,
        "/local/events": recent_events,
    }


def last_events(path: str | None, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` last events of the events file (newest first), read from its last 256 KB."""
    if path is None or not os.path.exists(path):
        return []
    with open(path, "rb") as events_file:
        events_file.seek(max(0, os.path.getsize(path) - 256 * 1024))
        lines = events_file.read().decode("utf-8", errors="replace").splitlines()[-limit:]
    found = []
    for line in reversed(lines):
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a line cut by the seek, or being written
    return found


def recent_failures(limit: int) -> list[dict[str, Any]]:
    """The ``limit`` most recently changed failed and ignored tasks (newest first), each with its
    last error: two index reads and one BatchGetItem."""
    listed = [task for status in (TaskStatus.FAILED, TaskStatus.IGNORED)
              for task in itertools.islice(index.MergedRead(status.value, want=limit, forward=False), limit)]
    listed.sort(key=lambda task: task.updated_at or datetime.min.replace(tzinfo=UTC), reverse=True)
    # A task that moved from failed to ignored between the two reads is listed once, as it is now.
    newest: dict[str, TaskModel] = {}
    for task in listed:
        newest.setdefault(task.key, task)
    listed = list(newest.values())[:limit]
    errors = {task.key: task.errors for task in TaskModel.batch_get(
        [task.key for task in listed], attributes_to_get=["key", "errors"])} if listed else {}
    items = []
    for task in listed:
        history = errors.get(task.key) or []
        last = history[-1] if history else None
        items.append({"key": task.key, "type": task.task_type, "status": task.status,
                      "attempts": task.attempts, "max_attempts": task.max_attempts,
                      "updated_at": task.updated_at.isoformat() if task.updated_at else None,
                      "batch_id": task.batch_id,
                      "last_error": {"kind": last.kind, "message": last.message} if last else None})
    return items


def _int(text: str, low: int, high: int) -> int:
    try:
        return min(high, max(low, int(text)))
    except ValueError:
        return low
