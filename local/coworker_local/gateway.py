"""A local stand-in for API Gateway (REST API, Lambda proxy integration).

:class:`LocalGateway` is a small threaded HTTP server on 127.0.0.1 that turns each real HTTP
request into the proxy event API Gateway would send (``resource``, ``path``, ``httpMethod``,
headers and multi-value headers, query string parameters, ``pathParameters``, ``body``,
``isBase64Encoded``, ``requestContext``), calls a Lambda handler ``handler(event, context)``
and writes back the ``statusCode``, headers and body it returns.

It is generic: the API tests, the CLI tests and the local runtime serve the task API with it,
and ``extra_routes``/``static`` let the runtime add a dashboard next to the API.

Nothing here is used on AWS.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
import mimetypes
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from coworker.observability import invocation_scope

# API Gateway refuses request bodies over 10 MB with 413.
MAX_REQUEST_BYTES = 10 * 1024 * 1024
# A connection that sends nothing for this long is closed (an idle or stalled client).
IDLE_TIMEOUT_SECONDS = 60.0
# Methods that change nothing: allowed from any origin (a page can only read what CORS lets it).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# What the API's proxy resource accepts (API Gateway's ANY method).
ALLOWED_METHODS = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"
PROXY_RESOURCE = "/{proxy+}"

LambdaHandler = Callable[[dict, Any], Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class GatewayRequest:
    """One HTTP request, as given to an ``extra_routes`` callable."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


@dataclasses.dataclass
class GatewayResponse:
    """What an ``extra_routes`` callable returns (a plain ``(status, headers, body)`` tuple also works)."""

    status: int
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes | str = b""


ExtraRoute = Callable[[GatewayRequest], "GatewayResponse | tuple[int, dict[str, str], bytes | str]"]


@dataclasses.dataclass
class LocalLambdaContext:
    """Enough of a Lambda context for Powertools' ``inject_lambda_context`` and handlers."""

    function_name: str = "coworker-local"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 512
    aws_request_id: str = dataclasses.field(default_factory=lambda: str(uuid.uuid4()))
    timeout_seconds: float = 29.0  # API Gateway's integration timeout
    started: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:us-east-1:000000000000:function:{self.function_name}"

    @property
    def log_group_name(self) -> str:
        return f"/aws/lambda/{self.function_name}"

    @property
    def log_stream_name(self) -> str:
        return "local"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_seconds - (time.monotonic() - self.started)) * 1000))


def build_proxy_event(
    method: str,
    raw_path: str,
    headers: Mapping[str, str] | list[tuple[str, str]] | None = None,
    body: bytes | str | None = None,
    stage: str = "local",
    source_ip: str = "127.0.0.1",
    resource: str | None = None,
    path_parameters: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The API Gateway REST proxy event for one request.

    ``raw_path`` is the request target as sent (percent-encoded, may carry a query string).
    Without ``resource`` the event looks like a ``/{proxy+}`` resource (what a ``LambdaRestApi``
    with ``proxy=True`` produces); pass ``resource`` and ``path_parameters`` to mimic an explicit
    resource instead.
    """
    parts = urlsplit(raw_path)
    # REST APIs hand the path on still percent-encoded (so "%2F" stays apart from "/"), while
    # path parameters arrive decoded.
    path = parts.path or "/"
    header_pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers or [])
    single_headers: dict[str, str] = {}
    multi_headers: dict[str, list[str]] = {}
    for name, value in header_pairs:
        single_headers[name] = value  # API Gateway keeps the last value
        multi_headers.setdefault(name, []).append(value)
    multi_query = parse_qs(parts.query, keep_blank_values=True)
    if resource is None:
        resource = "/" if path == "/" else PROXY_RESOURCE
        path_parameters = None if path == "/" else {"proxy": unquote(path.lstrip("/"))}
    is_base64 = False
    body_text: str | None = None
    if isinstance(body, bytes) and body:
        try:
            body_text = body.decode("utf-8")
        except UnicodeDecodeError:
            body_text, is_base64 = base64.b64encode(body).decode("ascii"), True
    elif isinstance(body, str) and body:
        body_text = body
    request_id = str(uuid.uuid4())
    now = datetime.now(UTC)
    # API Gateway sends null (not {}) for absent headers, query strings and path parameters.
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method.upper(),
        "headers": single_headers or None,
        "multiValueHeaders": multi_headers or None,
        "queryStringParameters": {k: v[-1] for k, v in multi_query.items()} or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": path_parameters,
        "stageVariables": None,
        "body": body_text,
        "isBase64Encoded": is_base64,
        "requestContext": {
            "resourcePath": resource,
            "httpMethod": method.upper(),
            # Served at the root, without the stage in the URL (as SAM local or a custom domain):
            # Powertools then gives Swagger UI the server "/" rather than "/<stage>".
            "path": path,
            "stage": stage,
            "requestId": request_id,
            "extendedRequestId": request_id,
            "accountId": "000000000000",
            "apiId": "local",
            "protocol": "HTTP/1.1",
            "domainName": "localhost",
            "requestTime": now.strftime("%d/%b/%Y:%H:%M:%S +0000"),
            "requestTimeEpoch": int(now.timestamp() * 1000),
            "identity": {
                "sourceIp": source_ip,
                "userAgent": single_headers.get("User-Agent") or single_headers.get("user-agent"),
                "apiKey": single_headers.get("x-api-key") or single_headers.get("X-Api-Key"),
            },
        },
    }


class LocalGateway:
    """Serve a Lambda proxy handler (and optional extra routes and static files) over HTTP.

    ``extra_routes`` maps exact paths (``"/"``, ``"/dashboard/data"``) to callables taking a
    :class:`GatewayRequest`; they answer any method. ``static`` maps URL prefixes to
    directories whose files are served for GET. Anything else goes to ``handler``.

    Lambda runs one event at a time per execution environment, and Powertools resolvers keep the
    current event on the instance, so calls into ``handler`` are serialized unless
    ``concurrent=True``.
    """

    def __init__(
        self,
        handler: LambdaHandler,
        host: str = "127.0.0.1",
        port: int = 0,
        extra_routes: dict[str, ExtraRoute] | None = None,
        static: dict[str, str | Path] | None = None,
        stage: str = "local",
        concurrent: bool = False,
        context_factory: Callable[[], Any] = LocalLambdaContext,
        allowed_hosts: Sequence[str] = (),
    ) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.extra_routes = dict(extra_routes or {})
        self.static = {prefix.rstrip("/") + "/": Path(folder) for prefix, folder in (static or {}).items()}
        self.stage = stage
        self.context_factory = context_factory
        # Host names requests may use besides IP addresses and localhost (a name that resolves to
        # this machine on purpose); any other name is refused: a DNS-rebinding page uses one.
        self.allowed_hosts = {name.lower() for name in allowed_hosts}
        self._lock = None if concurrent else threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321`` (valid once started)."""
        if self._server is None:
            raise RuntimeError("the gateway is not started")
        return f"http://{self.host}:{self._server.server_address[1]}"

    def start(self) -> LocalGateway:
        gateway = self

        class Handler(_RequestHandler):
            pass

        Handler.gateway = gateway
        self._server = _Server((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="local-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def serve_forever(self) -> None:
        """Start and block until interrupted (Ctrl-C)."""
        self.start()
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(timeout=0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> LocalGateway:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- request dispatch -------------------------------------------------------------------

    def refusal(self, request: GatewayRequest) -> GatewayResponse | None:
        """Refuse what a web page the developer visits could make a browser send here: a request
        naming this server by a foreign host name (DNS rebinding), and a state-changing request from
        another origin (a cross-site form or fetch). The local API has no credentials to stop them."""
        headers = {name.lower(): value for name, value in request.headers.items()}
        host = _host_name(headers.get("host", ""))
        if host and not (host in self.allowed_hosts or host == "localhost" or host.endswith(".localhost")
                         or _is_ip_address(host)):
            return _refused(421, f"this server answers to its address or to localhost, not to {host!r}")
        if request.method in SAFE_METHODS:
            return None
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc.lower() != headers.get("host", "").lower():
            return _refused(403, f"a {request.method} from another origin ({origin}) is refused: the local "
                                 "API changes tasks only for its own pages and for clients that send no Origin")
        if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return _refused(403, f"a {request.method} sent by another site is refused")
        return None

    def dispatch(self, request: GatewayRequest, raw_path: str, header_pairs: list[tuple[str, str]],
                 source_ip: str) -> GatewayResponse:
        """Answer one request: extra route, static file, or the Lambda handler."""
        refused = self.refusal(request)
        if refused is not None:
            return refused
        route = self.extra_routes.get(request.path)
        if route is not None:
            answer = route(request)
            return answer if isinstance(answer, GatewayResponse) else GatewayResponse(*answer)
        static = self._static_file(request)
        if static is not None:
            return static
        event = build_proxy_event(request.method, raw_path, header_pairs, request.body,
                                  stage=self.stage, source_ip=source_ip)
        return self._invoke(event)

    def _static_file(self, request: GatewayRequest) -> GatewayResponse | None:
        if request.method not in ("GET", "HEAD"):
            return None
        for prefix, folder in self.static.items():
            if not (request.path + "/").startswith(prefix):
                continue
            relative = request.path[len(prefix):] or "index.html"
            target = (folder / relative).resolve()
            # Refuse paths that climb out of the folder (../).
            if folder.resolve() not in target.parents or not target.is_file():
                return GatewayResponse(404, {"Content-Type": "application/json"},
                                       '{"statusCode": 404, "message": "Not found"}')
            kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
            return GatewayResponse(200, {"Content-Type": kind}, target.read_bytes())
        return None

    def _invoke(self, event: dict[str, Any]) -> GatewayResponse:
        context = self.context_factory()
        try:
            # Logger keys of this request only (the API's handler sets its request and correlation
            # ids on the logger the whole process shares with the coordinator's thread).
            with invocation_scope():
                if self._lock is None:
                    result = self.handler(event, context)
                else:
                    with self._lock:
                        result = self.handler(event, context)
        except Exception:  # a crashed Lambda: API Gateway answers 502, so do we
            traceback.print_exc()
            return GatewayResponse(502, {"Content-Type": "application/json"},
                                   '{"message": "Internal server error"}')
        return self._response_from_lambda(result)

    @staticmethod
    def _response_from_lambda(result: Mapping[str, Any]) -> GatewayResponse:
        if not isinstance(result, Mapping) or "statusCode" not in result:
            # API Gateway: "Malformed Lambda proxy response".
            return GatewayResponse(502, {"Content-Type": "application/json"},
                                   '{"message": "Internal server error"}')
        headers = {k: str(v) for k, v in (result.get("headers") or {}).items()}
        for name, values in (result.get("multiValueHeaders") or {}).items():
            headers[name] = ", ".join(str(v) for v in values)
        body: bytes | str = result.get("body") or ""
        if result.get("isBase64Encoded") and body:
            body = base64.b64decode(body)
        return GatewayResponse(int(result["statusCode"]), headers, body)


# Errors of a client that went away mid-request: nothing to answer, nothing to report.
_CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


def _host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port: ``[::1]:80`` -> ``::1``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _refused(status: int, message: str) -> GatewayResponse:
    return GatewayResponse(status, {"Content-Type": "application/json"},
                           json.dumps({"statusCode": status, "message": message}))


def _content_length(headers: Message) -> int | None:
    """The body's length from ``Content-Length`` (0 when absent); ``None`` when it is not a
    plain count of bytes (``abc``, ``1e3``, ``-1``, two different values, in one header or in
    two)."""
    given = headers.get_all("Content-Length")
    if not given:
        return 0
    values = {part.strip() for value in given for part in value.split(",")}
    if len(values) != 1:
        return None
    (text,) = values
    return int(text) if text.isascii() and text.isdigit() else None


class _Server(ThreadingHTTPServer):
    """A threading HTTP server with a listen backlog for bursts of clients (the default of 5
    resets connections when a batch of clients connects at once), quiet about clients that
    disconnect."""

    request_queue_size = 256
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], _CLIENT_GONE):
            return
        super().handle_error(request, client_address)


class _RequestHandler(BaseHTTPRequestHandler):
    gateway: LocalGateway
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_SECONDS  # of each read: an idle connection is closed

    def __getattr__(self, name: str) -> Any:
        # Methods API Gateway has no route for (TRACE, CONNECT, PROPFIND...): 405 in the API's
        # error shape, rather than http.server's HTML 501.
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _method_not_allowed(self) -> None:
        length = _content_length(self.headers)
        if length is not None and 0 < length <= MAX_REQUEST_BYTES:
            self.rfile.read(length)  # the next request on this connection starts after it
        else:  # a body it will not read, or of unknown length: where the next request starts is unknown
            self.close_connection = (length is None or length > 0
                                     or self.headers.get("Transfer-Encoding") is not None)
        body = json.dumps({"statusCode": 405, "error": "method_not_allowed",
                           "message": f"method {self.command} is not allowed"})
        self._send(GatewayResponse(405, {"Content-Type": "application/json", "Allow": ALLOWED_METHODS}, body))

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet: the handler logs through Powertools

    def _handle(self) -> None:
        body = self._read_body()
        if body is None:
            return  # answered, and the connection closed
        parts = urlsplit(self.path)
        request = GatewayRequest(
            method=self.command,
            path=unquote(parts.path) or "/",
            query=parse_qs(parts.query, keep_blank_values=True),
            headers={k: v for k, v in self.headers.items()},
            body=body,
        )
        # Hop-by-hop headers are not passed on by API Gateway either.
        pairs = [(k, v) for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")]
        response = self.gateway.dispatch(request, self.path, pairs, self.client_address[0])
        self._send(response, head=self.command == "HEAD")

    def _read_body(self) -> bytes | None:
        """The request's body, by its length or in chunks; ``None`` once a malformed or oversized
        framing has been answered (the connection is then closed: where the next request would
        start is unknown)."""
        encoding = self.headers.get("Transfer-Encoding")
        length = _content_length(self.headers)
        if encoding is not None:
            if self.headers.get("Content-Length") is not None or encoding.strip().lower() != "chunked":
                return self._refuse_framing(400, "send a body either with Content-Length or chunked, not both "
                                                 "nor another transfer coding")
            return self._read_chunks()
        if length is None:
            return self._refuse_framing(400, "Content-Length must be the body's size in bytes")
        if length > MAX_REQUEST_BYTES:
            return self._refuse_framing(413, "Request Too Long")
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            self.close_connection = True  # the client stopped sending: nobody to answer
            return None
        return body

    def _read_chunks(self) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(1024)
            text = line.split(b";", 1)[0].strip()
            try:
                chunk = int(text, 16)
            except ValueError:
                chunk = -1
            if chunk < 0:
                return self._refuse_framing(400, "malformed chunked body")
            if chunk == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers, if any
                return b"".join(chunks)
            size += chunk
            if size > MAX_REQUEST_BYTES:
                return self._refuse_framing(413, "Request Too Long")
            data = self.rfile.read(chunk)
            if len(data) < chunk or self.rfile.readline(1024).strip():
                return self._refuse_framing(400, "malformed chunked body")
            chunks.append(data)

    def _refuse_framing(self, status: int, message: str) -> bytes | None:
        self._send(_refused(status, message))
        self.close_connection = True
        return None

    def _send(self, response: GatewayResponse, head: bool = False) -> None:
        body = response.body.encode("utf-8") if isinstance(response.body, str) else response.body
        self.send_response(response.status)
        for name, value in response.headers.items():
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        try:
            self.end_headers()
            if not head:
                self.wfile.write(body)
        except _CLIENT_GONE:
            self.close_connection = True  # the client went away: nobody to answer

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle
