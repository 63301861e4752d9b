"""LocalGateway: real HTTP in, API Gateway REST proxy events out."""

from __future__ import annotations

import http.client
import json

import pytest
import requests
from coworker_local.gateway import GatewayResponse, LocalGateway, build_proxy_event


@pytest.fixture
def echo_gateway(tmp_path):
    seen: list[dict] = []

    def handler(event, context):
        seen.append(event)
        if event["path"] == "/boom":
            raise RuntimeError("crash")
        return {"statusCode": 201, "headers": {"Content-Type": "application/json", "X-Seen": "yes"},
                "body": json.dumps({"path": event["path"],
                                    "remaining": context.get_remaining_time_in_millis()})}

    (tmp_path / "index.html").write_text("<h1>dash</h1>")
    def health(request):
        return GatewayResponse(200, {"Content-Type": "text/plain"}, "ok " + request.method)

    extra = {"/health": health}
    with LocalGateway(handler, extra_routes=extra, static={"/ui": tmp_path}) as gateway:
        yield gateway, seen


def test_request_becomes_a_rest_proxy_event(echo_gateway):
    gateway, seen = echo_gateway
    response = requests.post(f"{gateway.url}/tasks/a%20b?x=1&x=2&y=", data=b'{"k": 1}',
                             headers={"x-api-key": "secret", "Content-Type": "application/json"})
    assert response.status_code == 201
    assert response.headers["X-Seen"] == "yes"
    assert response.json()["path"] == "/tasks/a%20b"  # REST APIs pass the path still encoded
    event = seen[-1]
    assert event["httpMethod"] == "POST"
    assert event["resource"] == "/{proxy+}"
    assert event["pathParameters"] == {"proxy": "tasks/a b"}
    assert event["queryStringParameters"] == {"x": "2", "y": ""}
    assert event["multiValueQueryStringParameters"] == {"x": ["1", "2"], "y": [""]}
    assert event["body"] == '{"k": 1}' and event["isBase64Encoded"] is False
    assert event["headers"]["x-api-key"] == "secret"
    assert event["requestContext"]["stage"] == "local"
    assert event["requestContext"]["identity"]["sourceIp"] == "127.0.0.1"
    assert event["requestContext"]["requestId"]


def test_binary_body_is_base64_encoded():
    event = build_proxy_event("PUT", "/x", {}, b"\xff\x00")
    assert event["isBase64Encoded"] is True and event["body"] == "/wA="
    assert event["queryStringParameters"] is None and event["headers"] is None


def test_crashing_handler_answers_502(echo_gateway):
    gateway, _ = echo_gateway
    response = requests.get(f"{gateway.url}/boom")
    assert response.status_code == 502
    assert response.json() == {"message": "Internal server error"}


def test_extra_routes_and_static_files(echo_gateway):
    gateway, seen = echo_gateway
    assert requests.get(f"{gateway.url}/health").text == "ok GET"
    page = requests.get(f"{gateway.url}/ui/")
    assert page.status_code == 200 and "dash" in page.text and page.headers["Content-Type"] == "text/html"
    connection = http.client.HTTPConnection(gateway.url.removeprefix("http://"))
    connection.request("GET", "/ui/../../etc/passwd")  # http.client sends the path as written
    assert connection.getresponse().status == 404
    assert seen == []  # none of these reached the Lambda handler


def test_a_burst_of_simultaneous_clients_is_served_without_resets(echo_gateway):
    """Listen backlog: 200 clients connecting at the same moment all get their answer."""
    CLIENTS = 200
    import socket
    import threading

    gateway, _ = echo_gateway
    host, port = gateway.host, int(gateway.url.rsplit(":", 1)[1])
    start = threading.Barrier(CLIENTS)
    answers: list[str] = []

    def client() -> None:
        start.wait()
        try:
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(b"GET /x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                answers.append(sock.recv(64).decode(errors="replace"))
        except OSError as exc:
            answers.append(f"error: {exc!r}")

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == CLIENTS and all(a.startswith("HTTP/1.1 201") for a in answers), answers


def test_a_client_that_disconnects_leaves_no_traceback(echo_gateway, capfd):
    import socket

    gateway, _ = echo_gateway
    host, port = gateway.host, int(gateway.url.rsplit(":", 1)[1])
    for _ in range(5):
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: localhost\r\n\r\n")
        sock.close()  # gone (with a reset) before the answer is written
    assert requests.get(gateway.url + "/x", timeout=10).status_code == 201
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err and "ConnectionReset" not in err


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "PROPFIND"])
def test_methods_without_a_route_get_405_in_the_api_error_shape(echo_gateway, method):
    gateway, seen = echo_gateway
    host, port = gateway.host, int(gateway.url.rsplit(":", 1)[1])
    connection = http.client.HTTPConnection(host, port, timeout=10)
    connection.request(method, "/tasks")
    response = connection.getresponse()
    body = json.loads(response.read())
    assert response.status == 405 and response.getheader("Allow")
    assert body == {"statusCode": 405, "error": "method_not_allowed", "message": f"method {method} is not allowed"}
    assert seen == []  # the API handler never saw it


def _raw(gateway, request: bytes, timeout: float = 10) -> str:
    """Send ``request`` as is on a new connection; what comes back before it closes (or the timeout)."""
    import socket

    host, port = gateway.host, int(gateway.url.rsplit(":", 1)[1])
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(request)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
                if b"\r\n\r\n" in received and b"Connection: close" not in received and len(received) > 100:
                    break
        except TimeoutError:
            pass
    return received.decode(errors="replace")


@pytest.mark.parametrize("headers", [
    {"Origin": "http://evil.example"},  # a cross-site form or fetch
    {"Origin": "null"},  # a sandboxed page or a file
    {"Sec-Fetch-Site": "cross-site"},  # a browser that says so, without Origin
])
def test_a_state_changing_request_from_another_origin_is_refused_before_the_api(echo_gateway, headers):
    gateway, seen = echo_gateway
    response = requests.post(f"{gateway.url}/types/slow/pause", data=b"", headers=headers, timeout=10)
    assert response.status_code == 403 and "refused" in response.json()["message"]
    assert seen == []  # nothing reached the API
    # while reading from anywhere, and changing from the server's own pages, still work
    assert requests.get(f"{gateway.url}/x", headers=headers, timeout=10).status_code == 201
    own = {"Origin": gateway.url, "Sec-Fetch-Site": "same-origin"}
    assert requests.post(f"{gateway.url}/types/slow/pause", headers=own, timeout=10).status_code == 201


def test_a_request_naming_the_server_by_a_foreign_host_name_is_refused(echo_gateway):
    # DNS rebinding: a page on attacker.example whose name now resolves to 127.0.0.1
    gateway, seen = echo_gateway
    response = requests.get(f"{gateway.url}/tasks", headers={"Host": "attacker.example"}, timeout=10)
    assert response.status_code == 421 and "attacker.example" in response.json()["message"]
    assert seen == []
    for host in ("localhost", "127.0.0.1", "[::1]", "app.localhost"):
        port = gateway.url.rsplit(":", 1)[1]
        assert requests.get(f"{gateway.url}/x", headers={"Host": f"{host}:{port}"}, timeout=10).status_code == 201


@pytest.mark.parametrize("length", [b"abc", b"1e3", b"-1", b"5, 6", b"2\r\nContent-Length: 3"])
def test_a_content_length_that_is_not_a_size_gets_400_and_the_connection_closes(echo_gateway, length):
    gateway, seen = echo_gateway
    answer = _raw(gateway, b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Length: " + length + b"\r\n\r\n{}")
    assert answer.startswith("HTTP/1.1 400") and "Content-Length" in answer, answer
    assert seen == []


def test_a_chunked_body_reaches_the_api_whole(echo_gateway):
    gateway, seen = echo_gateway
    answer = _raw(gateway, b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                           b"Connection: close\r\n\r\n4\r\n{\"k\"\r\n4\r\n: 1}\r\n0\r\n\r\n")
    assert answer.startswith("HTTP/1.1 201"), answer
    assert seen[-1]["body"] == '{"k": 1}'
    # both framings at once (request smuggling) is refused
    answer = _raw(gateway, b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                           b"Content-Length: 3\r\n\r\n0\r\n\r\n")
    assert answer.startswith("HTTP/1.1 400"), answer


def test_an_idle_connection_is_closed(echo_gateway, monkeypatch):
    import socket

    from coworker_local import gateway as gateway_module

    monkeypatch.setattr(gateway_module._RequestHandler, "timeout", 0.5)
    gateway, _ = echo_gateway
    host, port = gateway.host, int(gateway.url.rsplit(":", 1)[1])
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(b"GET /x HTTP/1.1\r\n")  # and then nothing more
        assert sock.recv(1024) == b""  # the server closed it (a timeout here would fail the test)


CHUNKED_POST = (b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
                b"Connection: close\r\n\r\n")


@pytest.mark.parametrize("size", [b"0x2", b"0_2", b"+2", b" 2", b"0" * 1100 + b"2"],
                         ids=["0x-prefix", "underscore", "plus-sign", "leading-space", "1100-digit-line"])
def test_a_chunk_size_that_is_not_plain_hex_gets_400(echo_gateway, size):
    # Python's int(..., 16) takes "0x2", "0_2" and "+2"; a size line over 1,024 bytes was read
    # as its first 1,024 zeros: an empty body, then the chunk data parsed as trailers.
    gateway, seen = echo_gateway
    answer = _raw(gateway, CHUNKED_POST + size + b"\r\n{}\r\n0\r\n\r\n")
    assert answer.startswith("HTTP/1.1 400 ") and "not a valid HTTP/1.1 request" in answer, answer
    assert len(answer) < 600  # the size line is not echoed back
    assert seen == []


def test_a_chunk_with_a_long_extension_reaches_the_api_whole(echo_gateway):
    gateway, seen = echo_gateway
    answer = _raw(gateway, CHUNKED_POST + b"2;name=" + b"x" * 1100 + b"\r\n{}\r\n0\r\n\r\n")
    assert answer.startswith("HTTP/1.1 201"), answer
    assert seen[-1]["body"] == "{}"


@pytest.mark.parametrize(("name", "headers"), [
    ("Host", b"Host: attacker.example\r\nHost: localhost\r\n"),
    ("Host", b"Host: localhost\r\nHost: attacker.example\r\n"),
    ("Origin", b"Host: localhost\r\nOrigin: http://evil.example\r\nOrigin: http://localhost\r\n"),
    ("Origin", b"Host: localhost\r\nOrigin: http://localhost\r\nOrigin: http://evil.example\r\n"),
])
def test_a_repeated_host_or_origin_gets_400(echo_gateway, name, headers):
    # which of the two would the host and origin checks judge?
    gateway, seen = echo_gateway
    for version in (b"1.1", b"1.0"):
        answer = _raw(gateway, b"POST /types/slow/pause HTTP/" + version + b"\r\n" + headers
                      + b"Content-Length: 0\r\n\r\n")
        head, _, body = answer.partition("\r\n\r\n")
        assert head.startswith("HTTP/1.1 400 ") and name in json.loads(body)["message"], answer
    assert seen == []


@pytest.mark.parametrize("version", [b"1.1", b"1.0"])
def test_a_request_without_a_host_gets_400(echo_gateway, version):
    gateway, seen = echo_gateway
    answer = _raw(gateway, b"GET /x HTTP/" + version + b"\r\nConnection: close\r\n\r\n")
    assert answer.startswith("HTTP/1.1 400 ") and "Host" in answer, answer
    assert seen == []


@pytest.mark.parametrize(("request_line", "status"), [
    (b"GET /x\r\n\r\n", "400"),  # HTTP/0.9: no version, and an answer would have no status line
    (b"GET /x HTTP/2.0\r\nHost: localhost\r\n\r\n", "505"),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "505"),  # the HTTP/2 connection preface
    (b"GET /x HTTP/1.2\r\nHost: localhost\r\n\r\n", "505"),
])
def test_a_request_in_another_http_version_gets_a_status_line_and_a_message(echo_gateway, request_line, status):
    gateway, seen = echo_gateway
    answer = _raw(gateway, request_line)
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} "), answer
    assert "application/json" in head and json.loads(body)["message"], answer
    assert seen == []


def test_a_keep_alive_connection_serves_requests_one_after_another(echo_gateway):
    gateway, seen = echo_gateway
    connection = http.client.HTTPConnection(gateway.host, int(gateway.url.rsplit(":", 1)[1]), timeout=10)
    for n in range(3):
        connection.request("POST", f"/tasks/{n}", body=b'{"n": %d}' % n)
        response = connection.getresponse()
        assert response.status == 201 and response.read()
    assert [event["body"] for event in seen] == ['{"n": 0}', '{"n": 1}', '{"n": 2}']


def test_a_body_over_the_limit_gets_413_before_it_is_read(echo_gateway):
    gateway, seen = echo_gateway
    answer = _raw(gateway, b"POST /tasks HTTP/1.1\r\nHost: localhost\r\nContent-Length: 20000000\r\n\r\n"
                  + b"x" * 65536)
    assert answer.startswith("HTTP/1.1 413 "), answer
    assert seen == []


@pytest.mark.parametrize("result", [
    {"statusCode": 200, "headers": {"X-Note": "a\r\nSet-Cookie: session=stolen"}, "body": "{}"},
    {"statusCode": 200, "headers": {"Bad Name": "x"}, "body": "{}"},
    {"statusCode": 99, "body": "{}"},
], ids=["line-break-in-value", "space-in-name", "status-99"])
def test_a_lambda_answer_no_http_message_can_carry_is_a_502(result):
    # API Gateway: "Malformed Lambda proxy response"; never a header written as given
    with LocalGateway(lambda event, context: result) as gateway:
        answer = _raw(gateway, b"GET /x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert answer.startswith("HTTP/1.1 502 ") and "Set-Cookie" not in answer, answer
    assert answer.endswith('{"message": "Internal server error"}'), answer
