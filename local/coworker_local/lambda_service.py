"""A local stand-in for the Lambda ``Invoke`` API, in front of the worker pool.

The API (dispatch on submit) and the coordinator start workers with
:class:`coworker.engine.dispatch.LambdaInvoker`, a boto3 Lambda client, as they do on AWS; locally its
endpoint (``COWORKER_LAMBDA_ENDPOINT``) is this server, which hands each ``Event`` invocation
of the worker function to the :class:`~coworker_local.workers.ProcessWorkerPool` and answers
``202 Accepted`` at once, as Lambda does. So the local runtime runs the production code path,
HTTP request included.

Only asynchronous invocations of the one worker function are served; anything else gets the
error Lambda would give, with a message saying what is supported.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from coworker_local.gateway import GatewayRequest, GatewayResponse, LocalGateway

INVOKE_PATH = "/2015-03-31/functions/{name}/invocations"
LOCAL_WORKER_FUNCTION = "coworker-worker"


class EventSink(Protocol):
    def invoke(self, event: dict[str, Any]) -> None: ...


def _error(status: int, kind: str, message: str) -> GatewayResponse:
    headers = {"Content-Type": "application/json", "X-Amzn-ErrorType": kind}
    return GatewayResponse(status, headers, json.dumps({"Type": "User", "message": message}))


def _no_handler(event: dict, context: Any) -> dict:
    return {"statusCode": 404, "headers": {"Content-Type": "application/json"},
            "body": json.dumps({"message": "this endpoint serves only the Lambda Invoke API"})}


class LocalLambdaService:
    """Serves ``POST /2015-03-31/functions/<worker>/invocations`` for ``InvocationType=Event``."""

    def __init__(self, pool: EventSink, function_name: str = LOCAL_WORKER_FUNCTION,
                 host: str = "127.0.0.1") -> None:
        self.pool = pool
        self.function_name = function_name
        path = INVOKE_PATH.format(name=function_name)
        self._gateway = LocalGateway(_no_handler, host=host, extra_routes={path: self._invoke},
                                     concurrent=True)

    @property
    def endpoint(self) -> str:
        return self._gateway.url

    def start(self) -> LocalLambdaService:
        self._gateway.start()
        return self

    def stop(self) -> None:
        self._gateway.stop()

    def _invoke(self, request: GatewayRequest) -> GatewayResponse:
        if request.method != "POST":
            return _error(405, "MethodNotAllowed", "use POST to invoke")
        kind = {k.lower(): v for k, v in request.headers.items()}.get("x-amz-invocation-type", "RequestResponse")
        if kind != "Event":
            return _error(400, "InvalidParameterValueException",
                          f"the local Lambda serves InvocationType=Event only, not {kind!r}")
        try:
            event = json.loads(request.body or b"{}")
        except ValueError:
            return _error(400, "InvalidRequestContentException", "the payload is not JSON")
        if not isinstance(event, dict):
            return _error(400, "InvalidRequestContentException", "the payload must be a JSON object")
        self.pool.invoke(event)
        return GatewayResponse(202, {"Content-Type": "application/json"}, b"")
