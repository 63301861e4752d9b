"""The local web dashboard and the runtime's own endpoints, served next to the API.

=====================  ==================================================================
``/dashboard``         the page (static HTML + JavaScript, no external scripts): it reads
                       the task API (``/stats``, ``/tasks``, ``/batches/{id}``) every second
``/favicon.ico``       the page's icon (an SVG)
``/local/info``        runtime state: settings, worker pool counters, last coordinator tick
                       and backlog measure
``/local/invocations`` worker invocations in flight with their process ids (``?recent=1``
                       adds finished ones): what the crash tests kill
=====================  ==================================================================
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coworker_local.gateway import ExtraRoute, GatewayRequest, GatewayResponse

if TYPE_CHECKING:
    from coworker_local.runtime import LocalRuntime

NO_CACHE = {"Cache-Control": "no-store"}
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

    return {
        "/": home,
        "/dashboard": dashboard,
        "/dashboard/": dashboard,
        "/favicon.ico": favicon,
        "/local/info": info,
        "/local/invocations": invocations,
    }
