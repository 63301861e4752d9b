"""No answer of the API outgrows Lambda's 6 MB, whatever the data behind it.

A result in the store may be up to COWORKER_MAX_RESULT_BYTES (100 MB): GET /tasks/{key}/result
answers one too large for any answer with a 303 to its presigned link (the Python client follows
it without the API's credentials), or, with no link (a folder store), a 413 that says where it is.
"""

from __future__ import annotations

import json

import pytest
from coworker.api import routes_tasks
from coworker.api.models import LAMBDA_RESPONSE_BYTES, ErrorOut, PutResult, SubmitBatchOut
from coworker.engine import lifecycle, offload, submit
from coworker.engine.tasks import TaskSpec

from tests.support.doubles import Api

ASTRAL = "\U0001f600"  # 4 bytes as stored, 12 in a body escaped to ASCII: grows the most in an answer


def answer_bytes(response: dict) -> int:
    """Bytes of the Lambda answer carrying a resolver's response (the runtime's JSON of it, every
    non-ASCII character escaped, as runtimes before Python 3.12 write it)."""
    return len(json.dumps(response).encode())


class LinkingStore(offload.FolderObjectStore):
    """The folder store with presigned links, as the S3 store gives them; counts its reads."""

    base = "https://results.example.test"

    def __init__(self, folder) -> None:
        super().__init__(folder)
        self.reads = 0

    def get(self, uri: str) -> bytes:
        self.reads += 1
        return super().get(uri)

    def link(self, uri: str) -> str:
        return f"{self.base}/{uri.rsplit('/', 1)[-1]}?X-Amz-Signature=abc"


class CountingStore(LinkingStore):
    """The folder store as it is (no links), counting its reads."""

    def link(self, uri: str) -> None:
        return None


@pytest.fixture
def store_settings(make_settings, tmp_path):
    return make_settings(result_dir=str(tmp_path / "results"), inline_result_bytes=1024)


def use_store(monkeypatch, store) -> None:
    monkeypatch.setattr(offload, "store_for", lambda settings: store)


def finish_with(settings, key: str, value) -> int:
    """Finish a task with ``value`` as its result, written as a worker writes it; its stored bytes."""
    submit.put_task(TaskSpec(key=key, type="quick"), settings)
    claim = lifecycle.claim(key, "w-1", settings)
    prepared = offload.prepare_result(value, settings, offload.store_for(settings), key=key, attempt=1, owner="w-1")
    assert prepared.stored is not None
    lifecycle.complete(claim, settings, result=None, result_ref=prepared.stored.to_dict())
    return prepared.stored.bytes


def astral_result(stored_bytes: int) -> str:
    """A string result of ``stored_bytes`` (as JSON, quotes included) of astral characters."""
    return ASTRAL * ((stored_bytes - 2) // 4)


def test_a_result_that_could_outgrow_an_answer_is_a_redirect_to_its_link(store_settings, tmp_path, monkeypatch):
    store = LinkingStore(store_settings.result_dir)
    use_store(monkeypatch, store)
    limit = routes_tasks.MAX_RESULT_RESPONSE_BYTES
    over = finish_with(store_settings, "over", astral_result(limit + 8))
    under = finish_with(store_settings, "under", astral_result(limit))
    assert over > limit >= under > limit - 8
    api = Api(store_settings)

    status, body, response = api.call("GET", "/tasks/over/result")

    assert status == 303 and store.reads == 0  # answered from the record, the result not read
    location = response["multiValueHeaders"]["Location"][0]
    assert location.startswith(LinkingStore.base) and body == {"location": location, "bytes": over}
    assert answer_bytes(response) < 2048
    # Just under the limit, the worst characters there are answer inline, and still fit.
    status, _, response = api.call("GET", "/tasks/under/result")
    assert status == 200 and json.loads(response["body"]) == astral_result(limit)
    assert 0.95 * LAMBDA_RESPONSE_BYTES < answer_bytes(response) <= LAMBDA_RESPONSE_BYTES


def test_without_a_link_a_result_is_answered_when_it_fits_and_refused_with_its_place_when_not(
        store_settings, monkeypatch):
    store = CountingStore(store_settings.result_dir)
    use_store(monkeypatch, store)
    ascii_size = finish_with(store_settings, "ascii", "x" * 5_000_000)  # grows by its quotes only
    finish_with(store_settings, "astral", astral_result(2_500_000))  # 7.5 MB once escaped
    huge = finish_with(store_settings, "huge", "x" * (LAMBDA_RESPONSE_BYTES + 1))
    api = Api(store_settings)

    status, _, response = api.call("GET", "/tasks/ascii/result")
    assert status == 200 and len(json.loads(response["body"])) == ascii_size - 2
    assert answer_bytes(response) <= LAMBDA_RESPONSE_BYTES
    for key in ("astral", "huge"):
        status, body, response = api.call("GET", f"/tasks/{key}/result")
        assert (status, body["error"]) == (413, "result_too_large"), body
        assert "read it from the store" in body["message"] and "file://" in body["message"]
        assert answer_bytes(response) < 4096
    assert store.reads == 2  # ascii and astral: "huge" cannot fit whatever it holds, so it is not read
    assert huge > LAMBDA_RESPONSE_BYTES


def test_the_client_follows_the_redirect_without_the_apis_credentials(store_settings, monkeypatch):
    from coworker.api.app import create_app
    from coworker_local.api_client import ApiClient
    from coworker_local.client import Coworker
    from coworker_local.gateway import GatewayResponse, LocalGateway

    store = LinkingStore(store_settings.result_dir)
    use_store(monkeypatch, store)
    monkeypatch.setattr(routes_tasks, "MAX_RESULT_RESPONSE_BYTES", 100)
    finish_with(store_settings, "large", {"rows": list(range(1000))})
    fetched: list[dict[str, str]] = []

    def presigned(request):  # the bucket: answers the object to whoever holds the link
        fetched.append({name.lower(): value for name, value in request.headers.items()})
        uri = next(path for path in store.folder.rglob("*.json")).as_uri()
        return GatewayResponse(200, {"Content-Type": "application/json"}, store.get(uri))

    app = create_app(store_settings)
    with LocalGateway(app.resolve, extra_routes={"/bucket": presigned}) as gateway:
        monkeypatch.setattr(store, "link", lambda uri: f"{gateway.url}/bucket?X-Amz-Signature=abc")
        client = ApiClient(gateway.url, api_key="secret-key")

        assert Coworker(api=client).result("large") == {"rows": list(range(1000))}

    assert len(fetched) == 1 and "x-api-key" not in fetched[0] and "authorization" not in fetched[0]


# -- POST /tasks: a batch's answer lists every key ----------------------------------------------

def test_a_batch_whose_answer_would_outgrow_lambdas_is_refused_before_anything_is_written(settings):
    from coworker.engine.tasks import MAX_KEY_CHARS

    api = Api(settings)
    before = api.items()
    # 1,000 keys of 512 emoji: each is 12 bytes in the body, 14 in the answer, 7.2 MB of results.
    tasks = [{"key": f"{number:03d}" + ASTRAL * (MAX_KEY_CHARS - 3), "type": "quick"} for number in range(1000)]

    status, body, _ = api.call("POST", "/tasks", {"tasks": tasks})

    assert (status, body["error"]) == (413, "batch_too_large"), body
    assert "nothing was written" in body["message"] and "the first 868 fit in one" in body["message"]
    assert api.items() == before
    # As many as the message says fit are taken, and their answer (or a 503's list of the keys
    # stored, a part of them) fits: built as the route builds it, and measured.
    fitting = [task["key"] for task in tasks[:868]]
    assert check_answer_fits_keys(fitting) is None
    answer = SubmitBatchOut(batch_id="b" * 128, created=868, existing=0,
                            results=[PutResult(key=key, outcome="created") for key in fitting])
    assert 0.95 * LAMBDA_RESPONSE_BYTES < lambda_answer(answer, 201) <= LAMBDA_RESPONSE_BYTES
    stored = ErrorOut(statusCode=503, error="storage_unavailable", message="m" * 1000, stored=fitting)
    assert lambda_answer(stored, 503) <= LAMBDA_RESPONSE_BYTES


def check_answer_fits_keys(keys: list[str]) -> None:
    from coworker.api.models import TaskIn

    return routes_tasks.check_answer_fits([TaskIn(key=key, type="quick") for key in keys])


def lambda_answer(model, status: int) -> int:
    """Bytes of the Lambda answer carrying ``model`` as the app serializes it (compact, ASCII)."""
    from aws_lambda_powertools.event_handler.openapi.encoders import jsonable_encoder

    body = json.dumps(jsonable_encoder(model), separators=(",", ":"))
    return answer_bytes({"statusCode": status, "body": body, "isBase64Encoded": False,
                         "multiValueHeaders": {"Content-Type": ["application/json"]}})


# -- routes of one record: bounded by DynamoDB's 400 KB item -------------------------------------

DYNAMODB_ITEM_BYTES = 400 * 1024


def test_the_largest_task_record_fits_in_an_answer():
    """GET /tasks/{key}, POST /tasks/{key}/retry and /cancel answer one record: at most 400 KB
    as stored. The byte that grows the most is a control character in a string (an error's
    message): 1 byte stored, 6 in the body (a \\u escape), 7 in the answer."""
    from coworker.api.models import TaskOut

    filler = "\x01" * DYNAMODB_ITEM_BYTES
    record = TaskOut(key=ASTRAL * 512, type=ASTRAL * 128, status="finished", payload=None, attempts=100,
                     max_attempts=100, created_at="2026-01-01T00:00:00Z", updated_at=None, due_at=None,
                     finished_at=None, lock_owner=None, lock_expires_at=None, batch_id="b" * 128, priority=0,
                     result_ref={"uri": "s3://" + "u" * 1100, "bytes": 10**8, "sha256": "f" * 64,
                                 "url": "https://" + "l" * 4096},
                     errors=[{"kind": "system", "message": filler}])

    size = lambda_answer(record, 200)

    assert 7 * DYNAMODB_ITEM_BYTES < size < 7 * DYNAMODB_ITEM_BYTES + 64 * 1024 < LAMBDA_RESPONSE_BYTES / 2


def test_an_error_names_at_most_twenty_known_types_and_says_how_many_more(settings):
    from coworker.api.errors import MAX_NAMED
    from coworker.engine import control, handlers

    for number in range(40):  # limits set have no count cap: the types known grow with them
        control.set_limit(f"limited-{number:02d}", 1)
    known = len(control.types_listed(control.read(consistent=True), handlers.registered_types()))

    status, body, _ = Api(settings).call("POST", "/types/nope/pause")

    assert (status, body["error"]) == (404, "type_not_found")
    assert f"and {known - MAX_NAMED} more (GET /types lists them)" in body["message"]
    assert body["message"].count(", ") == MAX_NAMED - 1
