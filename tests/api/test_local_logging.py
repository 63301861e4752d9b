"""The local runtime hosts the API and the coordinator in one process, where Lambda gives each
its own: an API request's ids (``correlation_id``, ``function_request_id``, set on the logger by
the API handler's ``inject_lambda_context``) must appear on that request's log lines only."""

from __future__ import annotations

import threading
from typing import Any

import requests
from aws_lambda_powertools.logging import correlation_paths
from coworker.observability import logger
from coworker_local import runtime
from coworker_local.gateway import LocalGateway

REQUEST_KEYS = ("correlation_id", "function_request_id")


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
def api_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Logs as the API function does (its request's ids on the logger)."""
    logger.info("api request")
    return {"statusCode": 200, "body": "{}"}


def by_message(lines: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["message"] == message]


def test_a_request_through_the_local_gateway_leaves_its_ids_to_no_other_log_line(log_lines) -> None:
    # Given the API served by the local gateway
    with LocalGateway(api_handler) as gateway:
        # When a request is served
        assert requests.get(f"{gateway.url}/tasks", timeout=30).status_code == 200

    # Then its own line carries its ids
    (api_line,) = by_message(log_lines(), "api request")
    assert api_line["correlation_id"] and api_line["function_request_id"]
    # and a line logged afterwards elsewhere in the process carries none of them
    done = threading.Event()
    threading.Thread(target=lambda: (logger.info("elsewhere"), done.set())).start()
    assert done.wait(30)
    (other,) = by_message(log_lines(), "elsewhere")
    assert not {key: other.get(key) for key in REQUEST_KEYS if other.get(key)}, other


class LoggingSupervisor:
    """Stands in for the coordinator's supervision: logs a tick once an API invocation in the
    same process has set its ids, then runs until stopped."""

    started = threading.Event()
    api_invoked = threading.Event()
    ticked = threading.Event()

    def __init__(self, settings: Any, invoker: Any, **kwargs: Any) -> None:
        self.on_tick = None

    def run(self, time_left: Any, stop: threading.Event) -> None:
        self.started.set()
        assert self.api_invoked.wait(30)
        logger.info("coordinator tick")
        self.ticked.set()
        stop.wait()


def test_the_local_coordinator_logs_without_the_ids_of_api_requests(log_lines, monkeypatch, make_settings) -> None:
    # Given the local coordinator's timer running in this process
    monkeypatch.setattr(runtime.dispatch, "Supervisor", LoggingSupervisor)
    timer = runtime.CoordinatorTimer(make_settings(), invoker=None).start()  # type: ignore[arg-type]
    try:
        assert LoggingSupervisor.started.wait(30)
        # When the API function runs in the same process (as Lambda would run it: no scope of its own)
        event = {"requestContext": {"requestId": "api-request-1"}, "path": "/tasks", "httpMethod": "GET"}
        api_handler(event, _Context())
        LoggingSupervisor.api_invoked.set()
        assert LoggingSupervisor.ticked.wait(30)
    finally:
        timer.stop()

    # Then the coordinator's line carries none of the request's ids
    (api_line,) = by_message(log_lines(), "api request")
    assert api_line["correlation_id"] == "api-request-1"
    (tick,) = by_message(log_lines(), "coordinator tick")
    assert not {key: tick.get(key) for key in REQUEST_KEYS if tick.get(key)}, tick


class _Context:
    function_name = "coworker-api"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:000000000000:function:coworker-api"
    memory_limit_in_mb = 256
    aws_request_id = "lambda-request-1"
