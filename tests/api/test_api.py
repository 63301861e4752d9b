"""The task API, driven with API Gateway REST proxy events against the embedded DynamoDB.

Events are built as API Gateway builds them (``coworker_local.gateway.build_proxy_event``: path still
percent-encoded, ``/{proxy+}`` resource, headers and query strings single and multi-valued).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from urllib.parse import quote

import pytest
from coworker.api.models import MAX_BATCH_TASKS
from coworker.bootstrap import configure
from coworker.data import layout
from coworker.data.models import SecretModel
from coworker.engine import dispatch, lifecycle, submit
from coworker.engine.dispatch import InProcessInvoker
from coworker.engine.handlers import task_handler
from coworker.engine.offload import MAX_RECORD_PAYLOAD_BYTES
from coworker.engine.tasks import MAX_KEY_CHARS, TaskSpec
from coworker_local.gateway import LocalLambdaContext, build_proxy_event

from tests.support.doubles import Api, RecordingInvoker

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def api(settings) -> Api:
    return Api(settings)


def _run_all(settings) -> None:
    """Coordinator ticks with in-process workers until nothing is due."""
    invoker = InProcessInvoker(settings)
    try:
        for _ in range(10):
            # Tasks put a moment ago are due at once (no wait for dispatch on submit here).
            report = dispatch.tick(settings.model_copy(update={"dispatch_on_submit": False}), invoker)
            invoker.wait()
            if report.dispatched == 0:
                return
    finally:
        invoker.shutdown()


# Submit -------------------------------------------------------------------------------------

def test_a_submitted_task_starts_at_once_on_a_free_slot_without_a_tick(settings):
    invoker = InProcessInvoker(settings)
    api = Api(settings, invoker)
    later = "2999-01-01T00:00:00Z"
    assert api.call("POST", "/tasks", {"key": "now", "type": "quick"})[0] == 201
    assert api.call("POST", "/tasks", {"key": "later", "type": "quick", "run_at": later})[0] == 201
    assert api.call("POST", "/tasks", {"tasks": [{"key": "b1", "type": "quick"},
                                                 {"key": "b2", "type": "quick"}]})[0] == 201
    assert api.call("POST", "/tasks", {"key": "now", "type": "quick"})[0] == 200  # exists: no start
    invoker.wait()
    invoker.shutdown()
    assert sorted(key for request in invoker.requests for key in request.keys) == ["b1", "b2", "now"]
    assert {key: lifecycle.get_task(key).status for key in ("now", "b1", "b2", "later")} == {
        "now": "finished", "b1": "finished", "b2": "finished", "later": "todo"}


def test_submit_with_every_slot_busy_starts_nothing_and_the_task_waits(make_settings):
    settings = make_settings(max_concurrency=2, batch_size=1)
    dispatch.start_workers(settings, RecordingInvoker(), ["x", "y"])  # both slots reserved
    invoker = RecordingInvoker()
    status, body, _ = Api(settings, invoker).call("POST", "/tasks", {"key": "k", "type": "quick"})
    assert (status, invoker.requests) == (201, [])
    assert lifecycle.get_task("k").status == "todo"


def test_submit_one_task_is_idempotent_by_key(api):
    status, body, _ = api.call("POST", "/tasks", {"key": "k1", "type": "quick", "payload": {"n": 1},
                                                  "max_attempts": 4, "priority": 7})
    assert (status, body) == (201, {"key": "k1", "outcome": "created"})
    before = api.items()

    status, body, _ = api.call("POST", "/tasks", {"key": "k1", "type": "slow", "payload": {"n": 2}})
    assert (status, body) == (200, {"key": "k1", "outcome": "exists"})
    assert api.items() == before  # neither reset nor duplicated

    status, task, _ = api.call("GET", "/tasks/k1")
    assert status == 200
    assert task["type"] == "quick" and task["payload"] == {"n": 1}
    assert task["max_attempts"] == 4 and task["priority"] == 7 and task["status"] == "todo"


def test_submit_without_key_generates_one_and_honours_run_at(api):
    status, body, _ = api.call("POST", "/tasks", {"type": "quick", "run_at": "2099-01-01T00:00:00"})
    assert status == 201 and len(body["key"]) == 36
    task = api.call("GET", f"/tasks/{body['key']}")[1]
    assert task["due_at"].startswith("2099-01-01T00:00:00")


def test_batch_submit_counts_only_created_tasks_and_resubmits_idempotently(api):
    submit.put_task(TaskSpec(key="old", type="quick"), api.settings)
    batch = {"batch_id": "b-1", "tasks": [{"key": "old", "type": "quick"},
                                          {"key": "a", "type": "quick"}, {"key": "b", "type": "slow"}]}
    status, body, _ = api.call("POST", "/tasks", batch)
    assert status == 201
    assert body["batch_id"] == "b-1" and (body["created"], body["existing"]) == (2, 1)
    assert [r["outcome"] for r in body["results"]] == ["exists", "created", "created"]
    assert api.counted_batch("b-1")[1]["total"] == 2

    status, body, _ = api.call("POST", "/tasks", batch)
    assert status == 200 and body["created"] == 0 and body["existing"] == 3
    progress = api.counted_batch("b-1")[1]
    assert (progress["total"], progress["open"], progress["done"]) == (2, 2, False)


def test_batch_without_id_gets_one(api):
    status, body, _ = api.call("POST", "/tasks", {"tasks": [{"type": "quick"}, {"type": "quick"}]})
    assert status == 201 and body["batch_id"] and body["created"] == 2
    assert api.counted_batch(body["batch_id"])[1]["total"] == 2


# Bad input: a clear 4xx and an unchanged table --------------------------------------------------


BAD_SUBMISSIONS = {
    "malformed JSON": (None, '{"type": "quick",', "body", "not valid JSON"),
    "empty body": (None, "", "body", "required"),
    "type missing": ({"key": "k"}, None, "body.type", "required field is missing"),
    "wrong type of type": ({"type": 5}, None, "body.type", "valid string"),
    "wrong type of max_attempts": ({"type": "q", "max_attempts": "many"}, None, "body.max_attempts",
                                   "integer"),
    "max_attempts out of range": ({"type": "q", "max_attempts": 0}, None, "body.max_attempts",
                                  "greater than"),
    "unknown field": ({"type": "q", "colour": "red"}, None, "body.colour", "unknown field"),
    "empty key": ({"key": "", "type": "q"}, None, "body.key", "at least 1 character"),
    "over-long key": ({"key": "k" * (MAX_KEY_CHARS + 1), "type": "q"}, None, "body.key", "at most 512"),
    "control character in key": ({"key": "a\nb", "type": "q"}, None, "body.key", "control characters"),
    "reserved key": ({"key": "batch#x", "type": "q"}, None, "body.key", "reserved for batches"),
    "worker-slot key": ({"key": "slot#0001", "type": "q"}, None, "body.key", "reserved for Coworker's own items"),
    "lease key": ({"key": "lease#coordinator", "type": "q"}, None, "body.key", "reserved for Coworker's own"),
    "stream checkpoint key": ({"key": "stream#shardId-0001", "type": "q"}, None, "body.key",
                              "reserved for Coworker's own"),
    "bad run_at": ({"type": "q", "run_at": "next tuesday"}, None, "body.run_at", "datetime"),
    "empty batch": ({"tasks": []}, None, "body.tasks", "at least 1 item"),
    "batch over the limit": ({"tasks": [{"type": "q"}] * (MAX_BATCH_TASKS + 1)}, None, "body.tasks",
                             f"at most {MAX_BATCH_TASKS} items"),
    "bad batch id": ({"tasks": [{"type": "q"}], "batch_id": "a b"}, None, "body.batch_id", "pattern"),
    "unknown batch field": ({"tasks": [{"type": "q"}], "owner": "me"}, None, "body.owner", "unknown field"),
    "duplicate keys in a batch": ({"tasks": [{"key": "a", "type": "q"}, {"key": "a", "type": "q"}]}, None,
                                  "body", "tasks[1] repeats the key 'a' of tasks[0]"),
}


@pytest.mark.parametrize("case", list(BAD_SUBMISSIONS), ids=list(BAD_SUBMISSIONS))
def test_bad_submissions_are_refused_and_change_nothing(api, case):
    api.call("POST", "/tasks", {"key": "existing", "type": "quick"})
    before = api.items()
    body, raw, location, words = BAD_SUBMISSIONS[case]
    status, answer, _ = api.call("POST", "/tasks", body, raw=raw)
    assert status == 422, answer
    assert answer["error"] == "validation_error" and answer["statusCode"] == 422
    assert any(e["location"] == location and words in e["message"] for e in answer["errors"]), answer
    assert words in answer["message"] or case == "batch over the limit"
    assert api.items() == before


def test_batch_with_some_bad_entries_is_refused_whole_with_per_entry_errors(api):
    tasks = [{"key": "good-1", "type": "quick"}, {"key": "", "type": "quick"},
             {"key": "good-2", "type": "quick"}, {"key": "good-3", "type": 3, "extra": True}]
    status, answer, _ = api.call("POST", "/tasks", {"batch_id": "mixed", "tasks": tasks})
    assert status == 422
    assert "refused as a whole (nothing was written): 2 bad entries" in answer["message"]
    assert sorted({e["entry"] for e in answer["errors"]}) == [1, 3]
    assert {e["location"] for e in answer["errors"]} == {"body.tasks[1].key", "body.tasks[3].type",
                                                         "body.tasks[3].extra"}
    assert api.items() == []  # not even the good entries, nor a batch item


def test_unknown_routes_and_methods(api):
    status, answer, _ = api.call("GET", "/nowhere")
    assert status == 404 and answer["error"] == "route_not_found" and "GET /nowhere" in answer["message"]
    status, answer, response = api.call("DELETE", "/tasks/k1")
    assert status == 405 and answer["error"] == "method_not_allowed"
    assert response["multiValueHeaders"]["Allow"] == ["GET"]  # REST proxy responses use multiValueHeaders
    status, answer, response = api.call("PUT", "/tasks")
    assert status == 405 and response["multiValueHeaders"]["Allow"] == ["GET, POST"]


# Read ----------------------------------------------------------------------------------------

def test_read_missing_task_and_keys_that_need_encoding(api):
    status, answer, _ = api.call("GET", "/tasks/nope")
    assert status == 404 and answer == {"statusCode": 404, "error": "task_not_found",
                                        "message": "no task with key 'nope'"}
    key = "orders/2024 #7 é"
    assert api.call("POST", "/tasks", {"key": key, "type": "quick"})[0] == 201
    status, task, _ = api.call("GET", "/tasks/" + quote(key, safe=""))
    assert status == 200 and task["key"] == key
    api.call("POST", "/tasks", {"batch_id": "bb", "tasks": [{"type": "quick"}]})
    status, answer, _ = api.call("GET", "/tasks/batch%23bb")  # the batch item is not a task
    assert status == 404 and "reserved for batches" in answer["message"]


# List ----------------------------------------------------------------------------------------

def test_list_pages_through_the_index_in_both_orders(api):
    from datetime import timedelta

    from coworker.data.models import utcnow
    base = utcnow() - timedelta(minutes=10)
    for i in range(7):
        submit.put_task(TaskSpec(key=f"t{i}", type="quick"), api.settings, now=base + timedelta(seconds=i))
    seen, cursor, pages = [], None, 0
    while True:
        path = "/tasks?status=todo&limit=3" + (f"&cursor={cursor}" if cursor else "")
        status, page, _ = api.call("GET", path)
        assert status == 200
        pages += 1
        seen += [item["key"] for item in page["items"]]
        cursor = page["cursor"]
        if not cursor:
            break
    assert seen == [f"t{i}" for i in range(7)] and pages == 3
    newest = api.call("GET", "/tasks?status=todo&limit=10&order=newest")[1]
    assert [i["key"] for i in newest["items"]] == [f"t{i}" for i in reversed(range(7))]
    assert newest["cursor"] is None
    assert set(newest["items"][0]) >= {"key", "type", "status", "due_at", "attempts", "batch_id"}


def test_list_filters_by_type_and_batch(api):
    tasks = [{"key": f"b{i}", "type": "slow" if i % 2 else "quick"} for i in range(6)]
    api.call("POST", "/tasks", {"batch_id": "b1", "tasks": tasks})
    for i in range(4):
        api.call("POST", "/tasks", {"key": f"x{i}", "type": "slow"})
    page = api.call("GET", "/tasks?status=todo&batch=b1&type=slow&limit=2")[1]
    keys = [i["key"] for i in page["items"]]
    assert len(keys) == 2 and page["cursor"]
    rest = api.call("GET", f"/tasks?status=todo&batch=b1&type=slow&limit=10&cursor={page['cursor']}")[1]
    keys += [i["key"] for i in rest["items"]]
    assert sorted(keys) == ["b1", "b3", "b5"]
    empty = api.call("GET", "/tasks?status=failed")[1]
    assert empty == {"items": [], "count": 0, "cursor": None, "scanned": 0}


@pytest.mark.parametrize("query,status,words", [
    ("status=finished", 400, "finished tasks leave the status index"),
    ("", 422, "query.status: required field is missing"),
    ("status=done", 422, "query.status"),
    ("status=todo&limit=0", 422, "query.limit"),
    ("status=todo&limit=501", 422, "query.limit"),
    ("status=todo&order=sideways", 422, "query.order"),
    ("status=todo&cursor=not-a-cursor", 400, "cursor is not valid"),
])
def test_bad_listing_queries(api, query, status, words):
    code, answer, _ = api.call("GET", f"/tasks?{query}")
    assert code == status and words in answer["message"], answer


def test_cursor_of_another_listing_is_refused(api):
    for i in range(3):
        api.call("POST", "/tasks", {"key": f"t{i}", "type": "quick"})
    cursor = api.call("GET", "/tasks?status=todo&limit=1")[1]["cursor"]
    assert api.call("GET", f"/tasks?status=todo&limit=1&cursor={cursor}")[0] == 200
    for other in ("status=ignored", "status=todo&type=slow", "status=todo&order=newest", "status=todo&batch=b"):
        code, answer, _ = api.call("GET", f"/tasks?{other}&cursor={cursor}")
        assert code == 400 and "belongs to another listing" in answer["message"], other


def test_a_tampered_cursor_is_refused_before_it_reaches_the_database(api, make_settings):
    import base64
    import zlib

    for i in range(3):
        api.call("POST", "/tasks", {"key": f"t{i}", "type": "quick"})
    cursor = api.call("GET", "/tasks?status=todo&limit=1")[1]["cursor"]
    encoded, _, signature = cursor.partition(".")
    data = json.loads(zlib.decompress(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))))
    data["k"] = [0] * len(data["k"])  # well-formed, claiming that every shard is read
    forged = base64.urlsafe_b64encode(zlib.compress(json.dumps(data).encode())).decode().rstrip("=")
    for bad in (f"{forged}.{signature}", encoded, f"{encoded}.AAAA"):
        code, answer, _ = api.call("GET", f"/tasks?status=todo&cursor={bad}")
        assert code == 400 and "cursor is not valid" in answer["message"], bad
    # Another deployment (another secret) does not take this one's cursors.
    other = Api(make_settings(cursor_secret="another deployment"))
    code, answer, _ = other.call("GET", f"/tasks?status=todo&cursor={cursor}")
    assert code == 400 and "cursor is not valid" in answer["message"]


@pytest.mark.parametrize("state", [
    ["not", "a", "dict"], {"q": "x"}, "k", 7,
], ids=["list", "no-state", "string", "number"])
def test_a_cursor_signed_with_the_secret_but_not_made_by_the_api_is_refused(make_settings, state):
    """Whoever holds the secret (a leaked one) still cannot make the API fail with a cursor."""
    import base64
    import zlib

    from coworker.api.cursors import CURSOR_VERSION, CursorCodec

    settings = make_settings(cursor_secret="known")
    api = Api(settings)
    api.call("POST", "/tasks", {"key": "t", "type": "quick"})
    codec = CursorCodec("known")
    listing = ["tasks", "todo", None, None, "oldest", settings.status_shards]
    made = codec.encode([[1, 2]] * settings.status_shards, listing)  # well signed, positions not ours
    value = {**state, "q": [CURSOR_VERSION]} if isinstance(state, dict) else state
    data = zlib.compress(json.dumps(value).encode())
    raw = f"{base64.urlsafe_b64encode(data).decode().rstrip('=')}.{codec._sign(data)}"
    for bad in (made, raw):
        code, answer, _ = api.call("GET", f"/tasks?status=todo&cursor={bad}")
        assert code == 400, (code, answer)


def test_without_a_set_secret_cursors_are_signed_with_a_random_one_kept_in_the_table(make_settings):
    # Given a deployment's settings without a cursor secret (as the stack gives the API)
    settings = make_settings(cursor_secret=None)
    api = Api(settings)
    for i in range(3):
        api.call("POST", "/tasks", {"key": f"t{i}", "type": "quick"})
    cursor = api.call("GET", "/tasks?status=todo&limit=1")[1]["cursor"]

    # When another process of the same deployment reads the cursor
    code, page, _ = Api(settings).call("GET", f"/tasks?status=todo&limit=1&cursor={cursor}")

    # Then it takes it: both sign with the table's secret, which is random, not derived from a name
    assert code == 200 and page["items"], page
    stored = SecretModel.get(layout.CURSOR_SECRET_KEY, consistent_read=True).value
    assert len(stored) == 64 and settings.table_name not in stored
    # and a deployment with another table (another secret) does not
    code, answer, _ = Api(make_settings(cursor_secret=None)).call("GET", f"/tasks?status=todo&cursor={cursor}")
    assert code == 400 and "cursor is not valid" in answer["message"]
    # and deleting the item rotates it: cursors signed before are refused from then on
    configure(settings)
    SecretModel(layout.CURSOR_SECRET_KEY).delete()
    code, answer, _ = Api(settings).call("GET", f"/tasks?status=todo&cursor={cursor}")
    assert code == 400 and "cursor is not valid" in answer["message"]


# Cancel and retry ----------------------------------------------------------------------------

def test_cancel_then_retry_a_task(api):
    api.call("POST", "/tasks", {"key": "k", "type": "quick"})
    status, task, _ = api.call("POST", "/tasks/k/cancel")
    assert status == 200 and task["status"] == "ignored" and task["errors"][-1]["kind"] == "cancelled"
    status, answer, _ = api.call("POST", "/tasks/k/cancel")
    assert status == 409 and "already ignored" in answer["message"]
    status, task, _ = api.call("POST", "/tasks/k/retry")
    assert status == 200 and task["status"] == "todo" and task["errors"]  # history kept
    status, answer, _ = api.call("POST", "/tasks/k/retry")
    assert status == 409
    assert answer["message"] == "task 'k' is todo; only failed or ignored tasks can be retried"
    for action in ("cancel", "retry"):
        status, answer, _ = api.call("POST", f"/tasks/missing/{action}")
        assert status == 404 and answer["error"] == "task_not_found"


def test_cancel_of_finished_task_is_a_conflict(api):
    api.call("POST", "/tasks", {"key": "k", "type": "quick"})
    _run_all(api.settings)
    assert api.call("GET", "/tasks/k")[1]["status"] == "finished"
    status, answer, _ = api.call("POST", "/tasks/k/cancel")
    assert status == 409 and "already finished" in answer["message"]


# Batches -------------------------------------------------------------------------------------

def test_batch_progress_follows_the_tasks_and_redrive(api):
    tasks = ([{"key": f"ok{i}", "type": "quick"} for i in range(4)]
             + [{"key": f"bad{i}", "type": "always-fail", "max_attempts": 1} for i in range(3)])
    api.call("POST", "/tasks", {"batch_id": "run-1", "tasks": tasks})
    assert api.counted_batch("run-1")[1] | {"created_at": None, "updated_at": None, "counted_through": None} == {
        "batch_id": "run-1", "total": 7, "finished": 0, "ignored": 0, "open": 7, "done": False,
        "state": "running", "failure_reason": None, "failed_at": None, "tolerated_failure_percent": None,
        "tolerated_failure_count": None, "created_at": None, "updated_at": None, "counted_through": None,
        "callbacks": [], "fired": [], "completed_at": None}

    _run_all(api.settings)
    progress = api.counted_batch("run-1")[1]
    assert (progress["finished"], progress["ignored"], progress["open"], progress["done"]) == (4, 3, 0, True)

    # Redrive the ignored ones, one request at a time with a small limit: cursor, then the rest.
    status, first, _ = api.call("POST", "/batches/run-1/retry?status=ignored&limit=2")
    assert status == 200 and first["redriven"] == 2 and first["cursor"]
    rest = api.call("POST", f"/batches/run-1/retry?status=ignored&limit=2&cursor={first['cursor']}")[1]
    assert rest["redriven"] == 1 and rest["cursor"] is None
    # before the coordinator counts the redrive: the old counts, but not done
    stale = api.call("GET", "/batches/run-1")[1]
    assert (stale["ignored"], stale["open"], stale["done"], stale["state"]) == (3, 0, False, "running")
    progress = api.counted_batch("run-1")[1]
    assert (progress["ignored"], progress["open"], progress["done"]) == (0, 3, False)
    assert api.call("GET", "/tasks/bad0")[1]["attempts"] == 0

    _run_all(api.settings)
    progress = api.counted_batch("run-1")[1]
    assert (progress["finished"], progress["ignored"], progress["done"]) == (4, 3, True)


def test_missing_batch_and_bad_redrive_status(api):
    status, answer, _ = api.call("GET", "/batches/nope")
    assert status == 404 and answer["message"] == "no batch with id 'nope'"
    assert api.call("POST", "/batches/nope/retry")[0] == 404
    api.call("POST", "/tasks", {"batch_id": "b", "tasks": [{"type": "quick"}]})
    status, answer, _ = api.call("POST", "/batches/b/retry?status=todo")
    assert status == 422 and answer["errors"][0]["location"] == "query.status"


# Stats and documents --------------------------------------------------------------------------

def test_stats_counts_by_status_with_a_cap(api):
    for i in range(5):
        api.call("POST", "/tasks", {"key": f"t{i}", "type": "quick"})
    api.call("POST", "/tasks/t0/cancel")
    stats = api.call("GET", "/stats")[1]
    assert stats["counts"]["todo"] == {"count": 4, "capped": False}
    assert stats["counts"]["ignored"] == {"count": 1, "capped": False}
    assert stats["counts"]["finished"]["count"] is None and "not counted" in stats["note"]
    capped = api.call("GET", "/stats?cap=3")[1]
    assert capped["counts"]["todo"] == {"count": 3, "capped": True}


@pytest.mark.parametrize(("api_auth", "scheme"), [
    ("api-key", {"type": "apiKey", "in": "header", "name": "x-api-key"}),
    ("iam", {"type": "apiKey", "in": "header", "name": "Authorization", "x-amazon-apigateway-authtype": "awsSigv4"}),
])
def test_the_openapi_document_declares_how_callers_authenticate(make_settings, api_auth, scheme):
    document = Api(make_settings(api_auth=api_auth)).call("GET", "/openapi.json")[1]
    (name, declared), = document["components"]["securitySchemes"].items()
    assert scheme.items() <= declared.items()
    assert document["security"] == [{name: []}]  # every route needs it
    # locally, where nothing is checked, nothing is declared
    local = Api(make_settings()).call("GET", "/openapi.json")[1]
    assert "securitySchemes" not in local.get("components", {}) and not local.get("security")


def test_openapi_document_and_swagger_ui(api):
    status, document, _ = api.call("GET", "/openapi.json")
    assert status == 200 and document["info"]["title"] == "Coworker task API"
    assert {"/tasks", "/tasks/{key}", "/tasks/{key}/retry", "/tasks/{key}/cancel", "/batches/{batch_id}",
            "/batches/{batch_id}/retry", "/stats"} <= set(document["paths"])
    task_in = document["components"]["schemas"]["TaskIn"]
    assert task_in["additionalProperties"] is False
    assert task_in["properties"]["key"]["anyOf"][0]["maxLength"] == MAX_KEY_CHARS
    status, _, response = api.call("GET", "/docs")
    assert status == 200 and "swagger" in response["body"].lower()
    # Swagger UI's "Try it out" calls the server the page names: the root, where the local
    # gateway serves the API (the stage is not part of its URLs), not "/local"
    servers = re.search(r'"servers":\s*(\[[^\]]*\])', response["body"])
    assert servers and json.loads(servers.group(1)) == [{"url": "/"}]


@pytest.mark.filterwarnings("ignore:No application metrics to publish")
def test_lambda_handler_module(settings, monkeypatch):
    """The API function's handler module as Lambda runs it: settings from the environment."""
    for name, value in settings.as_environment().items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("api_handler_under_test",
                                                  ROOT / "cdk/coworker_cdk/functions/api/handler.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    event = build_proxy_event("POST", "/tasks", {"Content-Type": "application/json"},
                              json.dumps({"key": "via-handler", "type": "quick"}))
    response = module.handler(event, LocalLambdaContext())
    assert response["statusCode"] == 201
    assert lifecycle.get_task("via-handler").status == "todo"


def test_batch_submission_logs_at_info_level(api):
    """Log records with extra keys must not clash with LogRecord attributes (that was a 502)."""
    from coworker.observability import logger

    level = logger.log_level
    logger.setLevel("INFO")
    try:
        status, body, _ = api.call("POST", "/tasks", {"batch_id": "logged", "tasks": [{"type": "quick"}]})
    finally:
        logger.setLevel(level)
    assert status == 201 and body["created"] == 1


# Results ------------------------------------------------------------------------------------


@pytest.fixture
def result_settings(make_settings, tmp_path):
    return make_settings(result_dir=str(tmp_path / "results"), inline_result_bytes=1024)


def _finish_with(settings, key: str, value) -> None:
    from coworker.engine import offload
    from coworker.engine.outcomes import TaskOutcome  # noqa: F401

    submit.put_task(TaskSpec(key=key, type="quick"), settings)
    claim = lifecycle.claim(key, "w-1", settings)
    prepared = offload.prepare_result(value, settings, offload.store_for(settings), key=key, attempt=1, owner="w-1")
    lifecycle.complete(claim, settings, result=prepared.inline,
                       result_ref=prepared.stored.to_dict() if prepared.stored else None)


def test_a_result_is_read_from_the_record_or_the_store(result_settings) -> None:
    api = Api(result_settings)
    _finish_with(result_settings, "small", {"ok": True})
    _finish_with(result_settings, "large", {"rows": list(range(100_000))})
    status, body, _ = api.call("GET", "/tasks/small/result")
    assert (status, body) == (200, {"ok": True})
    status, task, _ = api.call("GET", "/tasks/large")
    assert status == 200 and task["result"] is None
    assert task["result_ref"]["bytes"] > 500_000 and task["result_ref"]["url"] is None  # no links locally
    status, body, _ = api.call("GET", "/tasks/large/result")
    assert (status, body) == (200, {"rows": list(range(100_000))})


def test_a_task_without_a_result_yet_is_a_conflict_and_a_missing_one_not_found(result_settings) -> None:
    api = Api(result_settings)
    submit.put_task(TaskSpec(key="waiting", type="quick"), result_settings)
    status, body, _ = api.call("GET", "/tasks/waiting/result")
    assert status == 409 and "only a finished task has a result" in body["message"]
    status, body, _ = api.call("GET", "/tasks/nobody/result")
    assert (status, body["error"]) == (404, "task_not_found")


def test_a_result_too_large_for_a_response_redirects_to_its_link(result_settings, monkeypatch) -> None:
    from coworker.api import routes_tasks
    from coworker.engine import offload

    class LinkingStore(offload.FolderObjectStore):
        def link(self, uri: str) -> str:
            return "https://results.example.test/object?signed=1"

    monkeypatch.setattr(routes_tasks, "MAX_RESULT_RESPONSE_BYTES", 1000)
    monkeypatch.setattr(offload, "store_for", lambda settings: LinkingStore(settings.result_dir))
    _finish_with(result_settings, "huge", "x" * 5000)
    status, body, response = Api(result_settings).call("GET", "/tasks/huge/result")
    assert status == 303
    assert response["multiValueHeaders"].get("Location", [None])[0] or response["headers"]["Location"]
    assert body == {"location": "https://results.example.test/object?signed=1", "bytes": 5002}


# Payloads over the record's budget ---------------------------------------------------------


def test_a_payload_too_large_without_a_store_is_413_and_writes_nothing(api):
    api.call("POST", "/tasks", {"key": "existing", "type": "quick"})
    before = api.items()
    # Counted as DynamoDB stores it: "é" takes 6 bytes as an escape, so this is far over 256 KB.
    status, answer, _ = api.call("POST", "/tasks", {"type": "quick", "payload": "é" * 50_000})
    assert (status, answer["error"]) == (413, "payload_too_large")
    assert f"the limit is {MAX_RECORD_PAYLOAD_BYTES} bytes" in answer["message"]
    batch = {"tasks": [{"key": "fine", "type": "quick"}, {"key": "huge", "type": "quick", "payload": "x" * 300_000}]}
    status, answer, _ = api.call("POST", "/tasks", batch)
    assert status == 413 and "task 2 (key 'huge')" in answer["message"]
    assert api.items() == before


def test_large_payloads_go_to_the_store_and_reach_the_handler_whole(make_settings, tmp_path):
    settings = make_settings(result_dir=str(tmp_path / "objects"), inline_payload_bytes=1024,
                             max_payload_bytes=3_000_000)
    api = Api(settings)
    payload = {"rows": ["é" * 50] * 20_000}  # about 2 MB of JSON
    status, _, _ = api.call("POST", "/tasks", {"key": "big-payload", "type": "quick", "payload": payload})
    assert status == 201
    status, task, _ = api.call("GET", "/tasks/big-payload")
    assert task["payload"] is None and task["payload_ref"]["bytes"] > 2_000_000
    seen = []

    @task_handler("test-payload-echo")
    def echo(payload, context):
        seen.append(payload)
        return {"rows": len(payload["rows"])}

    api.call("POST", "/tasks", {"tasks": [{"key": "echo", "type": "test-payload-echo", "payload": payload},
                                          {"key": "echo-small", "type": "test-payload-echo",
                                           "payload": {"rows": [1]}}]})
    _run_all(settings)
    assert seen and all(p in (payload, {"rows": [1]}) for p in seen) and len(seen) == 2
    assert api.call("GET", "/tasks/echo")[1]["result"] == {"rows": 20_000}
    # Over the maximum: refused, nothing written.
    status, answer, _ = api.call("POST", "/tasks", {"key": "too-big", "type": "quick",
                                                    "payload": "x" * 3_100_000})
    assert status == 413 and "COWORKER_MAX_PAYLOAD_BYTES" in answer["message"]
    assert api.call("GET", "/tasks/too-big")[0] == 404


# Hostile bodies: every one a 4xx in the documented shape, nothing written ------------------------

HOSTILE = {
    "max_attempts as text": ({"type": "quick", "max_attempts": "5"}, None, None, 422, "valid integer"),
    "max_attempts as bool": ({"type": "quick", "max_attempts": True}, None, None, 422, "valid integer"),
    "max_attempts as float": ({"type": "quick", "max_attempts": 2.0}, None, None, 422, "valid integer"),
    "priority as bool": ({"type": "quick", "priority": True}, None, None, 422, "valid integer"),
    "run_at as a number": ({"type": "quick", "run_at": 0}, None, None, 422, "ISO-8601 time as a string"),
    "run_at past year 9999 in UTC": ({"type": "quick", "run_at": "9999-12-31T23:59:59-14:00"}, None, None,
                                     422, "out of range"),
    "run_at before year 1 in UTC": ({"type": "quick", "run_at": "0001-01-01T00:00:00+14:00"}, None, None,
                                    422, "out of range"),
    "NaN": (None, '{"type": "quick", "payload": NaN}', None, 422, "NaN is not a JSON number"),
    "Infinity": (None, '{"type": "quick", "payload": [-Infinity]}', None, 422, "-Infinity is not a JSON number"),
    "1e400": (None, '{"type": "quick", "payload": 1e400}', None, 422, "too large"),
    "5,000-digit integer": (None, '{"type": "quick", "payload": ' + "9" * 5000 + "}", None, 422, "digits"),
    "4,000-digit integer": (None, '{"type": "quick", "payload": {"n": -' + "9" * 4000 + "}}", None, 422, "digits"),
    "310-digit integer": (None, '{"type": "quick", "payload": [' + "1" * 310 + "]}", None, 422, "at most 309"),
    "nesting 5,000 deep": (None, '{"type": "quick", "payload": ' + "[" * 5000 + "]" * 5000 + "}", None, 422,
                           "nested too deeply"),
    "text/plain": ({"type": "quick"}, None, {"Content-Type": "text/plain"}, 415, "Content-Type: application/json"),
    "form": (None, "type=quick", {"Content-Type": "application/x-www-form-urlencoded"}, 415, "must be JSON"),
    "multipart without boundary": (None, "--x\r\n", {"Content-Type": "multipart/form-data"}, 415, "must be JSON"),
    "latin-1 charset": ({"type": "quick"}, None, {"Content-Type": "application/json; charset=latin-1"}, 415,
                        "UTF-8"),
}


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_hostile_bodies_get_a_4xx_in_the_documented_shape_and_change_nothing(api, case):
    api.call("POST", "/tasks", {"key": "existing", "type": "quick"})
    before = api.items()
    body, raw, headers, expected, words = HOSTILE[case]
    status, answer, _ = api.call("POST", "/tasks", body, headers=headers, raw=raw)
    assert status == expected, answer
    assert answer["statusCode"] == expected and answer["error"] and words in answer["message"], answer
    assert api.items() == before


def test_a_body_that_is_not_utf8_is_400(api):
    import base64

    event = build_proxy_event("POST", "/tasks", {"Content-Type": "application/json"}, b'{"type": "\xff\xfe"}')
    assert event["isBase64Encoded"] and base64.b64decode(event["body"]) == b'{"type": "\xff\xfe"}'
    response = api.app.resolve(event, LocalLambdaContext())
    body = json.loads(response["body"])
    assert (response["statusCode"], body["error"]) == (400, "bad_request")
    assert body["message"] == "the body is not UTF-8 text"


# Task types -----------------------------------------------------------------------------------


def test_a_type_without_a_handler_is_refused_with_the_known_ones(api):
    before = api.items()
    status, answer, _ = api.call("POST", "/tasks", {"type": "no-such-type"})
    assert status == 422 and answer["errors"][0]["location"] == "body.type"
    assert "no handler is registered for task type 'no-such-type'" in answer["message"]
    assert "quick" in answer["message"] and "always-fail" in answer["message"]
    batch = {"tasks": [{"type": "quick"}, {"type": "quick"}, {"type": "qiuck"}]}
    status, answer, _ = api.call("POST", "/tasks", batch)
    assert status == 422 and [(e["location"], e["entry"]) for e in answer["errors"]] == [("body.tasks[2].type", 2)]
    assert api.items() == before


def test_type_checking_can_be_turned_off_and_the_worker_still_guards(make_settings):
    settings = make_settings(validate_task_types=False)
    api = Api(settings)
    status, _, _ = api.call("POST", "/tasks", {"key": "later", "type": "deployed-next-week", "max_attempts": 1})
    assert status == 201
    _run_all(settings)
    task = api.call("GET", "/tasks/later")[1]
    assert task["status"] == "ignored" and task["errors"][0]["kind"] == "unknown_type"


def test_a_storage_failure_mid_batch_names_what_was_stored_and_a_resend_completes_it(api, monkeypatch):
    from coworker.engine import batches

    tasks = [{"key": f"part-{n:03d}", "type": "quick"} for n in range(150)]
    real = batches._put_if_new

    def every_third_fails(task):
        if int(task.key[-3:]) % 3 == 2:
            raise batches.StorageError("DynamoDB is unavailable")
        return real(task)

    monkeypatch.setattr(batches, "_put_if_new", every_third_fails)
    status, answer, _ = api.call("POST", "/tasks", {"batch_id": "halfway", "tasks": tasks})
    assert (status, answer["error"]) == (503, "storage_unavailable")
    assert answer["stored"] == [task["key"] for n, task in enumerate(tasks) if n % 3 != 2]
    assert "100 of 150 tasks were stored" in answer["message"] and "re-send the same request" in answer["message"]
    assert api.counted_batch("halfway")[1]["total"] == 100
    monkeypatch.setattr(batches, "_put_if_new", real)
    status, answer, _ = api.call("POST", "/tasks", {"batch_id": "halfway", "tasks": tasks})
    assert (status, answer["created"], answer["existing"]) == (201, 50, 100)
    assert api.counted_batch("halfway")[1]["total"] == 150


def test_stats_cost_is_bounded_per_request(api):
    from coworker.api.routes_stats import MAX_STATS_CAP, MAX_STATS_CAP_ASKED

    assert api.call("GET", f"/stats?cap={MAX_STATS_CAP}")[1]["cap"] == MAX_STATS_CAP
    # a larger cap is taken (clients written when more were counted), and counts MAX_STATS_CAP
    code, answer, _ = api.call("GET", f"/stats?cap={MAX_STATS_CAP_ASKED}")
    assert (code, answer["cap"]) == (200, MAX_STATS_CAP) and f"at most {MAX_STATS_CAP} each" in answer["note"]
    code, answer, _ = api.call("GET", f"/stats?cap={MAX_STATS_CAP_ASKED + 1}")
    assert code == 422 and "query.cap" in answer["message"]
    assert (MAX_STATS_CAP + 1) * 4 <= 4_004  # four indexed statuses: about 4,000 index entries read at most


def test_every_cursor_the_api_hands_out_is_taken_back_even_with_long_keys_on_many_shards(make_settings):
    # Given tasks with the longest keys there are, of characters that do not compress, over 8 shards
    import random

    settings = make_settings(status_shards=8)
    api = Api(settings)
    rng = random.Random(7)
    keys = {"".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(MAX_KEY_CHARS)) for _ in range(32)}
    for key in keys:  # one at a time: their due times interleave the shards
        assert api.call("POST", "/tasks", {"key": key, "type": "quick"})[0] == 201

    # When they are listed a few at a time, newest first, each page with the cursor of the last
    seen: list[str] = []
    cursors: list[str] = []
    cursor = None
    for _ in range(40):
        path = "/tasks?status=todo&order=newest&limit=4" + (f"&cursor={quote(cursor)}" if cursor else "")
        code, page, _ = api.call("GET", path)
        assert code == 200, page  # (was 422 once a cursor passed 4,096 characters)
        seen += [item["key"] for item in page["items"]]
        cursor = page["cursor"]
        if not cursor:
            break
        cursors.append(cursor)

    # Then every cursor handed out was taken, each fits a request, and every task was listed once
    assert sorted(seen) == sorted(keys)
    assert cursors and all(len(c) <= 4096 for c in cursors)
    assert any(c.startswith("~") for c in cursors), [len(c) for c in cursors]  # some too long to carry whole


def test_a_309_digit_integer_and_a_body_without_content_type_are_taken(api):
    code, _, _ = api.call("POST", "/tasks", raw='{"key": "n", "type": "quick", "payload": ' + "9" * 309 + "}")
    assert code == 201
    assert api.call("POST", "/tasks", raw='{"key": "plain", "type": "quick"}', headers={"Content-Type": ""})[0] == 201
