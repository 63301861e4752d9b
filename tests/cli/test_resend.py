"""The CLI and the demo follow the API's advice: re-send on 503 (a batch stored part way lists what
it stored) and back off on 429, a bounded number of times, then say what they tried."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from coworker_local import api_client, cli, commands, demo
from coworker_local.client import Coworker


class ScriptedApi:
    """An HTTP server that answers requests from a script of (status, body) and records each
    request body (a GET's path); ``headers`` go with every answer."""

    def __init__(self, script: list[tuple[int, dict]], headers: dict[str, str] | None = None) -> None:
        self.script = list(script)
        self.bodies: list[dict] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                self.answer({"GET": self.path})

            def do_POST(self) -> None:  # noqa: N802 - the standard library's name
                self.answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

            def answer(self, request: dict) -> None:
                api.bodies.append(request)
                status, body = api.script.pop(0) if len(api.script) > 1 else api.script[0]
                if callable(body):
                    body = body(api.bodies[-1])
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def no_waiting(monkeypatch) -> Iterator[None]:
    monkeypatch.setattr(api_client, "FIRST_DELAY_SECONDS", 0.0)
    yield


def _unavailable(stored: list[str]) -> dict:
    return {"statusCode": 503, "error": "storage_unavailable", "stored": stored,
            "message": "the batch's puts took over 30 s; re-send the same request to store the rest"}


def test_a_batch_refused_part_way_is_re_sent_and_counted_once(tmp_path, no_waiting) -> None:
    # Given three tasks without keys, and an API that stores the first, then answers 503
    source = tmp_path / "tasks.jsonl"
    source.write_text("\n".join(json.dumps({"type": "quick", "payload": {"n": n}}) for n in range(3)))

    def stored_first(body: dict) -> dict:
        return _unavailable([body["tasks"][0]["key"]])

    def all_stored(body: dict) -> dict:
        keys = [task["key"] for task in body["tasks"]]
        results = [{"key": key, "outcome": "created"} for key in keys]
        return {"batch_id": body["batch_id"], "created": len(keys), "existing": 0, "results": results}

    api = ScriptedApi([(503, stored_first), (201, all_stored)])
    out, err = io.StringIO(), io.StringIO()
    try:
        # When the CLI submits them
        code = cli.main(["--url", api.url, "submit", "--file", str(source), "--quiet"], out, err)
    finally:
        api.close()

    # Then it re-sent the request without the task stored (keys given before the first send), and
    # counts each task once
    assert code == commands.EXIT_OK, err.getvalue()
    assert len(api.bodies) == 2 and api.bodies[1]["tasks"] == api.bodies[0]["tasks"][1:]
    assert api.bodies[1]["batch_id"] == api.bodies[0]["batch_id"]
    assert all(task["key"] for task in api.bodies[0]["tasks"])
    assert "3 submitted, 3 created, 0 existing" in out.getvalue()


def test_the_cli_gives_up_after_its_re_sends_and_says_so(tmp_path, no_waiting) -> None:
    api = ScriptedApi([(503, _unavailable([]))])
    err = io.StringIO()
    try:
        code = cli.main(["--url", api.url, "submit", "--type", "quick"], io.StringIO(), err)
    finally:
        api.close()
    assert code == commands.EXIT_API_ERROR
    assert len(api.bodies) == api_client.RESEND_ATTEMPTS + 1
    assert f"sent {api_client.RESEND_ATTEMPTS + 1} times" in err.getvalue()


def test_the_demo_backs_off_on_429_and_re_sends_on_503(no_waiting) -> None:
    created = {"batch_id": "b", "created": 1, "existing": 0, "results": [{"key": "k", "outcome": "created"}]}
    api = ScriptedApi([(429, {"message": "Too Many Requests"}), (503, _unavailable([])), (201, created)])
    waits: list[float] = []
    try:
        answer = demo.post_tasks(api_client.ApiClient(api.url, sleep=waits.append), "b",
                                 [{"key": "k", "type": "quick"}])
    finally:
        api.close()
    assert answer.created == 1 and len(api.bodies) == 3 and len(waits) == 2

    always = ScriptedApi([(503, _unavailable([]))])
    try:
        with pytest.raises(demo.SubmitError, match="answered 503"):
            demo.post_tasks(api_client.ApiClient(always.url, sleep=waits.append), "b", [{"key": "k", "type": "quick"}])
    finally:
        always.close()
    assert len(always.bodies) == api_client.RESEND_ATTEMPTS + 1


def test_a_keyed_batch_cut_off_at_the_gateway_is_sent_again_a_put_without_key_is_not(no_waiting) -> None:
    # API Gateway answers 504 after 29 s: the request may have stored some tasks, or none
    timed_out = {"message": "Endpoint request timed out"}
    created = {"batch_id": "b", "created": 0, "existing": 1, "results": [{"key": "k", "outcome": "exists"}]}
    api = ScriptedApi([(504, timed_out), (200, created)])
    try:
        submitted = Coworker(api=api_client.ApiClient(api.url)).submit([{"key": "k", "type": "quick"}], batch_id="b")
    finally:
        api.close()
    # A batch whose tasks all have keys is sent again as it was (it stores only what is missing)
    assert len(api.bodies) == 2 and api.bodies[0] == api.bodies[1]
    assert submitted.submitted == 1

    # A task without a key is not: a second send could create it twice
    single = ScriptedApi([(504, timed_out)])
    try:
        with pytest.raises(api_client.ApiError) as refused:
            Coworker(api=api_client.ApiClient(single.url)).put({"type": "quick"})
    finally:
        single.close()
    assert refused.value.status == 504 and len(single.bodies) == 1

    # A read is sent again
    reads = ScriptedApi([(504, timed_out), (200, {"batch_id": "b"})])
    try:
        assert api_client.ApiClient(reads.url).request("GET", "/batches/b") == {"batch_id": "b"}
    finally:
        reads.close()
    assert reads.bodies == [{"GET": "/batches/b"}] * 2


def test_a_batch_stored_a_part_at_each_send_is_re_sent_while_it_progresses(no_waiting) -> None:
    # Slow writes: each send stores one more task, for more sends than the re-sends allowed in a row
    keys = [f"k{n}" for n in range(api_client.RESEND_ATTEMPTS + 4)]
    tasks = [{"key": key, "type": "quick"} for key in keys]

    def one_more(body: dict) -> dict:
        sent = len(api.bodies)
        return _unavailable(keys[sent - 1:sent])

    def all_there(body: dict) -> dict:
        results = [{"key": task["key"], "outcome": "exists"} for task in body["tasks"]]
        return {"batch_id": "b", "created": 0, "existing": len(results), "results": results}

    api = ScriptedApi([*((503, one_more) for _ in keys), (200, all_there)])
    try:
        submitted = Coworker(api=api_client.ApiClient(api.url)).submit(tasks, batch_id="b")
    finally:
        api.close()
    assert len(api.bodies) == len(keys) + 1
    # each re-send leaves out what the sends before it stored (one task stays, to be answered)
    assert [len(body["tasks"]) for body in api.bodies] == [*range(len(keys), 0, -1), 1]
    assert (submitted.created, submitted.existing) == (len(keys), 0)  # each stored once, by some send


def test_the_message_of_a_request_given_up_says_how_often_it_was_sent(no_waiting) -> None:
    api = ScriptedApi([(503, _unavailable(["k"]))])  # the same key each time: no progress after the first
    try:
        with pytest.raises(api_client.ApiError) as refused:
            Coworker(api=api_client.ApiClient(api.url)).submit([{"key": "k", "type": "quick"}], batch_id="b")
    finally:
        api.close()
    assert len(api.bodies) == api_client.RESEND_ATTEMPTS + 2
    assert f"sent {api_client.RESEND_ATTEMPTS + 2} times" in str(refused.value)


@pytest.mark.parametrize("retry_after", ["0", "nan", "-5", "soon", "inf"])
def test_a_retry_after_that_gives_no_wait_is_replaced_by_the_clients_own_backoff(retry_after) -> None:
    # Given an API that always answers 429 with a Retry-After of no use (zero, not a number, negative)
    api = ScriptedApi([(429, {"message": "Too Many Requests"})], headers={"Retry-After": retry_after})
    waits: list[float] = []
    try:
        # When a request is sent until the client gives up
        with pytest.raises(api_client.ApiError):
            api_client.ApiClient(api.url, sleep=waits.append).request("GET", "/stats")
    finally:
        api.close()
    # Then it waited before each re-send, doubling (with jitter) as without the header
    assert len(waits) == api_client.RESEND_ATTEMPTS
    ceilings = [min(api_client.MAX_DELAY_SECONDS, api_client.FIRST_DELAY_SECONDS * 2 ** n) for n in range(len(waits))]
    assert all(ceiling / 2 <= wait <= ceiling for wait, ceiling in zip(waits, ceilings, strict=True)), waits


def test_a_usable_retry_after_is_honoured_up_to_the_longest_delay() -> None:
    assert api_client.resend_delay(1, "3") == 3.0
    assert api_client.resend_delay(1, "3600") == api_client.MAX_DELAY_SECONDS


def test_the_re_sends_take_25_to_51_seconds_in_all_as_documented() -> None:
    # docs/api.md and the module say so: 1 s doubling to at most 20 s, each drawn from its upper half
    ceilings = [min(api_client.MAX_DELAY_SECONDS, api_client.FIRST_DELAY_SECONDS * 2 ** n)
                for n in range(api_client.RESEND_ATTEMPTS)]
    assert (sum(ceilings) / 2, sum(ceilings)) == (25.5, 51.0)


def test_keys_named_stored_that_were_never_sent_are_no_progress() -> None:
    # Given an API whose 503s each name a key stored that the client did not send
    def a_stranger(body: dict) -> dict:
        return _unavailable([f"never-sent-{len(api.bodies)}"])

    api = ScriptedApi([(503, a_stranger)])
    waits: list[float] = []
    try:
        # When a batch is put
        with pytest.raises(api_client.ApiError):
            Coworker(api=api_client.ApiClient(api.url, sleep=waits.append)).submit(
                [{"key": "k", "type": "quick"}], batch_id="b")
    finally:
        api.close()
    # Then those keys do not count as progress: it gives up after the re-sends allowed in a row
    assert len(api.bodies) == api_client.RESEND_ATTEMPTS + 1
    assert all(body["tasks"] == [{"key": "k", "type": "quick"}] for body in api.bodies)
