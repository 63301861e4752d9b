"""A local stand-in for API Gateway (REST API, Lambda proxy integration).

:class:`LocalGateway` is a small threaded HTTP server on 127.0.0.1 that turns each real HTTP
request into the proxy event API Gateway would send (``resource``, ``path``, ``httpMethod``,
headers and multi-value headers, query string parameters, ``pathParameters``, ``body``,
``isBase64Encoded``, ``requestContext``), calls a Lambda handler ``handler(event, context)``
and writes back the ``statusCode``, headers and body it returns.

It is generic: the API tests, the CLI tests and the local runtime serve the task API with it,
and ``extra_routes``/``static`` let the runtime add a dashboard next to the API.

The HTTP/1.1 parsing and framing (request line, headers, Content-Length, chunks, keep-alive) is
h11's, a maintained and strict implementation; in front of it this module refuses what h11 lets
through but a local API must not take (a repeated Host or Origin, no Host, HTTP/2.0, both framings).

Nothing here is used on AWS.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
import mimetypes
import socket
import socketserver
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import h11
from coworker.observability import invocation_scope

# API Gateway refuses request bodies over 10 MB with 413.
MAX_REQUEST_BYTES = 10 * 1024 * 1024
# Request line and headers: a request whose head is longer is refused (431) before its body.
MAX_HEADER_BYTES = 64 * 1024
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
        self._server: _Server | None = None
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


def _framing_refusal(request: h11.Request) -> GatewayResponse | None:
    """What h11 lets through but this server refuses before reading a body: an HTTP version other
    than 1.0 and 1.1, a missing or repeated ``Host`` or ``Origin`` (which one would the host and
    origin checks judge?), both framings at once (request smuggling), or a body over the limit."""
    if request.http_version not in (b"1.0", b"1.1"):
        return _refused(505, f"HTTP/{request.http_version.decode('ascii', 'replace')} is not supported: "
                             "send HTTP/1.1")
    names = [name for name, _ in request.headers]
    for name in (b"host", b"origin"):
        if names.count(name) > 1:
            return _refused(400, f"send one {name.decode().title()} header, not {names.count(name)}")
    if b"host" not in names:
        return _refused(400, "a Host header is required: it names the server the request is for")
    if b"transfer-encoding" in names and b"content-length" in names:
        return _refused(400, "send a body either with Content-Length or chunked, not both")
    length = next((int(value) for name, value in request.headers if name == b"content-length"), 0)
    if length > MAX_REQUEST_BYTES:
        return _refused(413, "Request Too Long")
    return None


def _malformed(exc: h11.RemoteProtocolError) -> str:
    """What h11 found wrong, without the bytes it quotes (they can be long, and not text)."""
    reason = str(exc).split(": bytearray(", 1)[0].split(": b'", 1)[0]
    return f"this is not a valid HTTP/1.1 request ({reason})"


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:  # a status of the handler's own
        return b""


class _Refusal(Exception):
    """A request answered without reading the rest of it; the connection then closes."""

    def __init__(self, response: GatewayResponse) -> None:
        super().__init__(response.status)
        self.response = response


class _ClientGone(Exception):
    """The connection ended, or stayed idle past the timeout, before a whole request arrived."""


class _Server(socketserver.ThreadingTCPServer):
    """A thread per connection, with a listen backlog for bursts of clients (the default of 5
    resets connections when a batch of clients connects at once), quiet about clients that
    disconnect."""

    request_queue_size = 256
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], _CLIENT_GONE):
            return
        super().handle_error(request, client_address)


class _RequestHandler(socketserver.BaseRequestHandler):
    """One connection. h11 parses and frames HTTP/1.1 (request line, headers, Content-Length,
    chunks, keep-alive, 100-continue); this class moves bytes between it and the socket."""

    gateway: LocalGateway
    timeout = IDLE_TIMEOUT_SECONDS  # of each read: an idle connection is closed

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        while True:
            try:
                request, body = self._read_request(connection)
            except _ClientGone:
                return
            except h11.RemoteProtocolError as exc:
                self._send(connection, _refused(exc.error_status_hint, _malformed(exc)))
                self._drain()
                return
            except _Refusal as refusal:
                self._send(connection, refusal.response)
                self._drain()
                return
            self._send(connection, self._dispatch(request, body), head=request.method == b"HEAD")
            if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                return  # the connection ends here (Connection: close, HTTP/1.0)
            connection.start_next_cycle()

    def _next_event(self, connection: h11.Connection) -> Any:
        while (event := connection.next_event()) is h11.NEED_DATA:
            if connection.they_are_waiting_for_100_continue:
                self.request.sendall(connection.send(h11.InformationalResponse(status_code=100, headers=[])))
            try:
                data = self.request.recv(65536)
            except (TimeoutError, *_CLIENT_GONE):
                raise _ClientGone from None
            connection.receive_data(data)
        if isinstance(event, h11.ConnectionClosed):
            raise _ClientGone
        return event

    def _read_request(self, connection: h11.Connection) -> tuple[h11.Request, bytes]:
        request = self._next_event(connection)
        refused = _framing_refusal(request)
        if refused is not None:
            raise _Refusal(refused)
        chunks: list[bytes] = []
        size = 0
        while isinstance(event := self._next_event(connection), h11.Data):
            size += len(event.data)
            if size > MAX_REQUEST_BYTES:
                raise _Refusal(_refused(413, "Request Too Long"))
            chunks.append(bytes(event.data))
        return request, b"".join(chunks)

    def _dispatch(self, event: h11.Request, body: bytes) -> GatewayResponse:
        method = event.method.decode("ascii")
        if method not in ALLOWED_METHODS.split(", "):
            # Methods API Gateway has no route for (TRACE, CONNECT, PROPFIND...): 405 in the API's
            # error shape.
            return GatewayResponse(405, {"Content-Type": "application/json", "Allow": ALLOWED_METHODS},
                                   json.dumps({"statusCode": 405, "error": "method_not_allowed",
                                               "message": f"method {method} is not allowed"}))
        target = event.target.decode("latin-1")
        # As sent (API Gateway passes header names in the client's case), but for hop-by-hop ones.
        pairs = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in event.headers.raw_items()]
        parts = urlsplit(target)
        request = GatewayRequest(
            method=method,
            path=unquote(parts.path) or "/",
            query=parse_qs(parts.query, keep_blank_values=True),
            headers=dict(pairs),
            body=body,
        )
        passed = [(k, v) for k, v in pairs if k.lower() not in ("connection", "keep-alive", "transfer-encoding")]
        return self.gateway.dispatch(request, target, passed, self.client_address[0])

    def _send(self, connection: h11.Connection, response: GatewayResponse, head: bool = False) -> None:
        body = response.body.encode("utf-8") if isinstance(response.body, str) else response.body
        headers = [(name, value) for name, value in response.headers.items()
                   if name.lower() not in ("content-length", "connection", "transfer-encoding")]
        headers.append(("Content-Length", str(len(body))))
        if response.status >= 400 and connection.their_state is not h11.DONE:
            headers.append(("Connection", "close"))  # the rest of the request is unread
        try:
            answer = h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status))
        except h11.LocalProtocolError:
            # A header no HTTP message can carry (a line break in a value, a status under 200):
            # API Gateway's "Malformed Lambda proxy response".
            body = b'{"message": "Internal server error"}'
            answer = h11.Response(status_code=502, reason=b"Bad Gateway", headers=[
                ("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        try:
            if connection.our_state is not h11.SEND_RESPONSE and connection.our_state is not h11.IDLE:
                return  # h11 can no longer answer on this connection
            data = connection.send(answer)
            if not head:
                data += connection.send(h11.Data(data=body))
            data += connection.send(h11.EndOfMessage())
            self.request.sendall(data)  # in one write: headers and body in one segment
        except _CLIENT_GONE:
            pass  # the client went away: nobody to answer

    def _drain(self) -> None:
        """After a refusal, read what the client still sends (for a second at most) before the
        connection closes: closing with unread bytes resets it, and the client may then lose the
        answer it was sent."""
        sock: socket.socket = self.request
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(0.2)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and sock.recv(65536):
                pass
        except (OSError, TimeoutError):
            pass
