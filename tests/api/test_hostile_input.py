"""Hostile input, second round: internal items, keys no task can have, payloads too deep or not
text, unbounded numbers and amplified errors are refused with a 4xx, and change nothing."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from coworker.api.errors import MAX_LISTED_ERRORS
from coworker.engine import control, dispatch, submit
from coworker.engine.tasks import MAX_PAYLOAD_DEPTH, TaskSpec

from tests.support.doubles import Api, RecordingInvoker


@pytest.fixture
def api(settings) -> Api:
    return Api(settings)


@pytest.mark.parametrize("key", ["control#types", "slot#0000", "lease#coordinator", "stream#counted-through",
                                 "gate#key:site", "batch#b"])
def test_internal_items_are_not_tasks(settings, api, key) -> None:
    # Given a table with each kind of Coworker's own items
    control.pause("slow")
    submit.put_task(TaskSpec(key="t", type="quick", concurrency_key="site", batch_id="b"), settings)
    dispatch.tick(settings, RecordingInvoker())
    before = api.items()
    # When a client reads, retries or cancels one through the task routes
    for method, suffix in (("GET", ""), ("GET", "/result"), ("POST", "/retry"), ("POST", "/cancel")):
        status, body, _ = api.call(method, f"/tasks/{quote(key, safe='')}{suffix}")
        # Then it is told no such task exists, and nothing changes
        assert (status, body["error"]) == (404, "task_not_found"), (method, suffix, body)
        assert "reserved" in body["message"]
    assert api.items() == before


def test_a_batch_counter_item_is_not_a_batch(settings, api) -> None:
    submit.put_task(TaskSpec(key="t", type="quick", batch_id="b"), settings)
    api.counted_batch("b")
    counters = [item["key"]["S"] for item in api.items() if item["key"]["S"].startswith("batch#b#")]
    assert counters
    shard = counters[0].split("#", 2)[2]
    for method, suffix in (("GET", ""), ("POST", "/retry")):
        status, body, _ = api.call(method, f"/batches/{quote(f'b#{shard}', safe='')}{suffix}")
        assert (status, body["error"]) == (404, "batch_not_found"), body


def test_keys_and_batch_ids_too_long_for_dynamodb_are_client_errors(api) -> None:
    long_key = quote("é" * 1100, safe="")  # 2,200 bytes of UTF-8: over DynamoDB's 2,048
    for method, suffix in (("GET", ""), ("GET", "/result"), ("POST", "/retry"), ("POST", "/cancel")):
        status, body, _ = api.call(method, f"/tasks/{long_key}{suffix}")
        assert status == 404 and "1 to 512 characters" in body["message"], (method, suffix)
        assert len(body["message"]) < 400  # the key is not echoed whole
    for method, suffix in (("GET", ""), ("POST", "/retry")):
        status, body, _ = api.call(method, f"/batches/{'b' * 3000}{suffix}")
        assert status == 404, (method, suffix)


def _nested(depth: int) -> str:
    """A JSON array nested ``depth`` deep, as text (deeper than ``json.dumps`` can write)."""
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("payload", [
    _nested(MAX_PAYLOAD_DEPTH + 1),
    _nested(300),  # was accepted, then unreadable
    _nested(955),  # was a 502 in the record's JSON encoding
    '{"blob": "' + "x" * 20_000 + '", "bad": "\\ud800"}',  # was a 502 in the object store's encoding
    '{"\\ud800": 1}',
], ids=["depth-65", "depth-300", "depth-955", "lone-surrogate-large", "lone-surrogate-key"])
def test_payloads_that_could_not_be_read_back_are_refused_at_the_door(api, payload) -> None:
    status, body, _ = api.call("POST", "/tasks", raw='{"key": "deep", "type": "quick", "payload": ' + payload + "}")
    assert status == 422, body
    assert api.items() == []
    # the deepest payload taken is read, retried and cancelled like any
    deepest = '{"key": "ok", "type": "quick", "payload": ' + _nested(MAX_PAYLOAD_DEPTH) + "}"
    assert api.call("POST", "/tasks", raw=deepest)[0] == 201
    assert api.call("GET", "/tasks/ok")[0] == 200
    assert api.call("POST", "/tasks/ok/cancel")[0] == 200


@pytest.mark.parametrize("field,value", [
    ("tolerated_failure_count", 2**300), ("tolerated_failure_count", 10**10),
    ("tolerated_failure_percent", 1e-320), ("tolerated_failure_percent", 1e-9),
])
def test_failure_thresholds_are_bounded(api, field, value) -> None:
    status, body, _ = api.call("POST", "/tasks", {"tasks": [{"key": "a", "type": "quick"}], field: value})
    assert status == 422, body
    assert api.items() == []


def test_a_422_lists_a_bounded_number_of_problems_and_says_how_many(api) -> None:
    tasks = [{"type": "quick", **{f"unknown_{n}": n for n in range(20)}} for _ in range(50)]  # 1,000 problems
    status, body, response = api.call("POST", "/tasks", {"tasks": tasks})
    assert status == 422
    assert len(body["errors"]) == MAX_LISTED_ERRORS
    assert "1000 problems; the first 100 are listed" in body["message"]
    assert "50 bad entries" in body["message"]
    assert len(response["body"]) < 50_000


def test_a_re_sent_batch_whose_tasks_all_exist_is_answered_as_documented(api) -> None:
    body = {"batch_id": "again", "tasks": [{"key": "a", "type": "quick"}]}
    assert api.call("POST", "/tasks", body)[0] == 201
    status, answer, _ = api.call("POST", "/tasks", body)
    assert status == 200 and answer["existing"] == 1
    documented = json.loads(api.app.get_openapi_json_schema())
    shapes = documented["paths"]["/tasks"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert {"$ref": "#/components/schemas/SubmitBatchOut"} in shapes["oneOf"]


def test_a_503_tells_the_client_what_to_do_not_what_dynamodb_said(api, monkeypatch) -> None:
    from coworker.engine import lifecycle
    from coworker.errors import StorageError

    def refused(*args, **kwargs):
        raise StorageError("could not get task 'x': User: arn:aws:sts::123456789012:assumed-role/internal is "
                           "not authorized to perform: dynamodb:GetItem on resource: arn:aws:dynamodb:table/secret")

    monkeypatch.setattr(lifecycle, "get_task", refused)
    status, answer, _ = api.call("GET", "/tasks/x")
    assert (status, answer["error"]) == (503, "storage_unavailable")
    assert "retry later" in answer["message"]
    assert "arn:" not in answer["message"] and "not authorized" not in answer["message"]


@pytest.mark.parametrize(("method", "path"), [("GET", "/types"), ("GET", "/stats"), ("GET", "/tasks/x"),
                                              ("GET", "/batches/b")])
def test_a_raw_dynamodb_error_on_any_route_is_a_503_not_a_500(api, monkeypatch, method, path) -> None:
    """The engine wraps the DynamoDB errors it expects; one that reaches a route unwrapped (a read
    throttled past botocore's retries, an expired token) is still the client's to retry."""
    from botocore.exceptions import ClientError
    from pynamodb.connection.base import Connection
    from pynamodb.exceptions import GetError

    def throttled(*args, **kwargs):
        raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException",
                                     "Message": "arn:aws:dynamodb:us-east-1:123456789012:table/secret throttled"}},
                          "Query")

    def get_failed(*args, **kwargs):
        raise GetError("Failed to get item: throttled", cause=throttled)

    monkeypatch.setattr(Connection, "query", throttled)
    monkeypatch.setattr(Connection, "get_item", get_failed)
    monkeypatch.setattr(Connection, "batch_get_item", throttled)
    monkeypatch.setattr(Connection, "scan", throttled)
    status, answer, _ = api.call(method, path)
    assert (status, answer["error"]) == (503, "storage_unavailable"), answer
    assert "retry later" in answer["message"] and "arn:" not in answer["message"]


BODY_ROUTES = [("POST", "/tasks"), ("POST", "/bulk"), ("PUT", "/types/quick/limit"), ("PUT", "/rate-limits/site"),
               ("PUT", "/schedules/nightly")]
MEDIA_TYPES = ["multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=x",
               "application/x-www-form-urlencoded", "text/plain", "application/json"]


@pytest.mark.parametrize("media_type", MEDIA_TYPES)
def test_an_empty_body_is_a_missing_body_whatever_its_content_type(api, media_type) -> None:
    # Given a table with a task in it
    api.call("POST", "/tasks", {"key": "existing", "type": "quick"})
    before = api.items()
    for method, path in BODY_ROUTES:
        # When a route that takes a body gets an empty one, with any Content-Type
        status, answer, _ = api.call(method, path, headers={"Content-Type": media_type}, raw="")
        # Then it answers as it does to no body at all: a 4xx in the API's shape, and nothing changes
        _, without, _ = api.call(method, path, headers={"Content-Type": "application/json"}, raw="")
        assert 400 <= status < 500 and answer["error"] and answer["message"], (method, path, answer)
        assert (status, answer["error"]) == (without["statusCode"], without["error"]), (method, path)
    assert api.items() == before


def test_a_route_without_a_body_takes_an_empty_form_post(api, settings) -> None:
    # ``curl -X POST -d ''`` sends an empty form body
    submit.put_task(TaskSpec(key="t", type="quick"), settings)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, answer, _ = api.call("POST", "/tasks/t/cancel", headers=form, raw="")
    assert status == 200 and answer["status"] == "ignored", answer
    status, answer, _ = api.call("POST", "/types/quick/pause", headers={"Content-Type": "multipart/form-data"}, raw="")
    assert status == 200, answer
