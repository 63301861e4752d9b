"""Every listing route pages, and no page can outgrow a Lambda answer (6 MB).

GET /schedules, GET /types and GET /rate-limits page with ``limit`` and an opaque ``cursor`` (the
task listing's signed cursors); the CLI, the Python client and the dashboard follow the cursor to
the end. Every GET route that answers a list takes a bounded ``limit`` and a ``cursor``. The
largest page of each listing route is built from the models' limits and measured as the Lambda
answer that would carry it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from coworker.engine import control, schedules
from coworker.engine.tasks import NewTask

from tests.support.doubles import Api

SMALL_TASK = NewTask(type="quick", payload={"n": 1})


def put_schedules(count: int, task: NewTask = SMALL_TASK, paused_every: int = 0) -> list[str]:
    """``count`` schedules put through the library (one write each), every ``paused_every``-th paused."""
    names = [f"s{number:03d}" for number in range(count)]
    for number, name in enumerate(names):
        schedules.put(name, f"rate({number % 7 + 1} minutes)", "UTC", "once", task,
                      paused=bool(paused_every) and number % paused_every == 0)
    return names


def pages(api: Api, path: str, field: str, limit: int) -> list[list[dict]]:
    """Every page of a listing route, following its cursor."""
    found, cursor = [], None
    while True:
        status, answer, _ = api.call("GET", f"{path}?limit={limit}" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200, answer
        found.append(answer[field])
        cursor = answer["cursor"]
        if cursor is None:
            return found
        assert len(found) < 50, "the cursor does not end"


def answer_bytes(response: dict) -> int:
    """Bytes of the Lambda answer carrying a resolver's response (the runtime's JSON of it)."""
    return len(json.dumps(response).encode())


# -- GET /schedules ------------------------------------------------------------------------------

def test_schedules_page_through_more_schedules_than_one_answer_holds(settings):
    api = Api(settings)
    names = put_schedules(8, paused_every=3)  # 3 of them paused: the pages walk both partitions

    found = pages(api, "/schedules", "schedules", limit=3)

    assert [len(page) for page in found] == [3, 3, 2]
    listed = [entry["name"] for page in found for entry in page]
    assert sorted(listed) == names  # each once
    # active ones by next occurrence first, then the paused ones
    paused = [entry["paused"] for page in found for entry in page]
    assert paused == sorted(paused) and paused.count(True) == 3
    last = api.call("GET", "/schedules?limit=8")[1]
    assert (len(last["schedules"]), last["cursor"], last["truncated"]) == (8, None, False)
    first = api.call("GET", "/schedules?limit=7")[1]
    assert first["cursor"] and first["truncated"] is True


def test_the_default_schedule_page_stays_far_below_6_mb_with_the_largest_templates(settings):
    from coworker.api.models import DEFAULT_SCHEDULE_PAGE, LAMBDA_RESPONSE_BYTES, MAX_SCHEDULE_FIELD_BYTES

    api = Api(settings)
    largest = largest_template_task()
    names = put_schedules(DEFAULT_SCHEDULE_PAGE + 1, task=largest)

    status, page, response = api.call("GET", "/schedules")

    assert status == 200 and len(page["schedules"]) == DEFAULT_SCHEDULE_PAGE and page["cursor"]
    size = answer_bytes(response)
    assert size <= DEFAULT_SCHEDULE_PAGE * 2 * (schedules.MAX_TEMPLATE_BYTES + MAX_SCHEDULE_FIELD_BYTES)
    assert size < LAMBDA_RESPONSE_BYTES / 3, size
    rest = api.call("GET", f"/schedules?cursor={page['cursor']}")[1]
    assert sorted(s["name"] for s in page["schedules"] + rest["schedules"]) == names and rest["cursor"] is None


def largest_template_task(task_type: str = "quick") -> NewTask:
    """A task whose template is exactly MAX_TEMPLATE_BYTES as stored, of quotes: each is stored as
    two bytes and grows to four in the Lambda answer (the most any stored byte grows)."""
    empty = NewTask(type=task_type, payload="")
    stored = len(json.dumps(empty.model_dump(mode="json", exclude_none=True, exclude={"key", "run_at"}),
                            separators=(",", ":")))
    room = schedules.MAX_TEMPLATE_BYTES - stored
    return NewTask(type=task_type, payload='"' * (room // 2) + "x" * (room % 2))


# -- GET /types ----------------------------------------------------------------------------------

def test_types_page_through_more_types_than_one_answer_holds(settings):
    api = Api(settings)
    for name in ("limited-a", "limited-b", "limited-c"):
        control.set_limit(name, 3)  # no cap on how many types may have a limit
    control.pause("paused-z")
    every = api.call("GET", "/types?limit=100")[1]
    assert every["cursor"] is None
    names = [entry["type"] for entry in every["types"]]
    assert {"limited-a", "limited-c", "paused-z", "quick"} <= set(names) and len(names) > 4

    found = pages(api, "/types", "types", limit=2)

    assert all(len(page) == 2 for page in found[:-1]) and 1 <= len(found[-1]) <= 2
    assert [entry["type"] for page in found for entry in page] == names  # by name, each once


# -- GET /rate-limits ----------------------------------------------------------------------------

def set_rate_limits(count: int) -> list[str]:
    groups = [f"key:tenant-{number:02d}" for number in range(count)]
    for number, group in enumerate(groups):
        control.set_rate(group, control.Rate(number + 1, 1000))
    return groups


def test_rate_limits_page_through_more_groups_than_one_answer_holds(settings):
    from coworker.engine import rates

    api = Api(settings)
    groups = set_rate_limits(7)
    control._cache.invalidate()
    read: list[int] = []
    states = rates.states

    def counted(groups_of_page, now=None):
        read.append(len(groups_of_page))
        return states(groups_of_page, now)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rates, "states", counted)
        found = pages(api, "/rate-limits", "limits", limit=3)

    assert [len(page) for page in found] == [3, 3, 1]
    assert [entry["group"] for page in found for entry in page] == groups  # by name, each once
    assert [entry["limit"] for page in found for entry in page] == list(range(1, 8))
    assert read == [3, 3, 1]  # each page reads its own groups' logs, in one read
    every = api.call("GET", "/rate-limits?limit=7")[1]
    assert (len(every["limits"]), every["cursor"]) == (7, None)


def test_the_cli_and_the_client_show_every_rate_limit_across_pages(settings, monkeypatch):
    import io
    from argparse import Namespace

    from coworker.api.app import create_app
    from coworker_local import client as client_module
    from coworker_local import commands
    from coworker_local.api_client import ApiClient
    from coworker_local.client import Coworker
    from coworker_local.gateway import LocalGateway

    groups = set_rate_limits(5)
    monkeypatch.setattr(client_module, "RATE_PAGE", 2)
    monkeypatch.setattr(commands, "RATE_PAGE", 2)
    app = create_app(settings)
    asked: list[str] = []

    def handler(event, context):
        asked.append(f"{event['path']}?{'&'.join(sorted(event.get('queryStringParameters') or {}))}")
        return app.resolve(event, context)

    with LocalGateway(handler) as gateway:
        client = ApiClient(gateway.url)
        out = io.StringIO()
        assert commands.cmd_rates(client, Namespace(json=True), out, io.StringIO()) == 0
        assert [entry["group"] for entry in json.loads(out.getvalue())["limits"]] == groups
        out = io.StringIO()
        assert commands.cmd_rates(client, Namespace(json=False), out, io.StringIO()) == 0
        assert [line.split(": ")[0] for line in out.getvalue().splitlines()] == groups
        assert [entry["group"] for entry in Coworker(api=client).rate_limits()] == groups
    # three times three pages of 2, 2 and 1: each after the first with the previous page's cursor
    assert asked.count("/rate-limits?cursor&limit") == 6 and asked.count("/rate-limits?limit") == 3, asked


# -- every listing route pages --------------------------------------------------------------------

def listing_routes(document: dict) -> dict[str, dict]:
    """The GET routes of the OpenAPI document whose success answers a list (a property of array
    type), by path: each is a listing, however it is named. Routes of one item (a path parameter)
    are not: their lists are the item's, bounded by its record (DynamoDB's 400 KB)."""
    schemas = document["components"]["schemas"]
    found = {}
    for path, operations in document["paths"].items():
        operation = operations.get("get")
        if operation is None or "{" in path:
            continue
        schema = operation["responses"]["200"].get("content", {}).get("application/json", {}).get("schema", {})
        schema = schemas[schema["$ref"].rsplit("/", 1)[-1]] if "$ref" in schema else schema
        if any(field.get("type") == "array" for field in schema.get("properties", {}).values()):
            found[path] = operation
    return found


def test_every_listing_route_takes_a_bounded_limit_and_a_cursor(settings):
    from coworker.api.models import MAX_CURSOR_CHARS

    document = Api(settings).call("GET", "/openapi.json")[1]

    listings = listing_routes(document)

    assert set(listings) == {"/tasks", "/types", "/rate-limits", "/schedules"}
    for path, operation in listings.items():
        parameters = {p["name"]: p["schema"] for p in operation.get("parameters", []) if p["in"] == "query"}
        limit = parameters["limit"]
        limit = next((part for part in limit.get("anyOf", []) if "maximum" in part), limit)
        assert limit["minimum"] == 1 and limit["maximum"] <= 500 and limit["default"] <= limit["maximum"], path
        cursor = parameters["cursor"]
        assert any(part.get("maxLength") == MAX_CURSOR_CHARS for part in [cursor, *cursor.get("anyOf", [])]), path


# -- bad limits and cursors ----------------------------------------------------------------------

BAD_QUERIES = [
    ("/schedules?limit=0", 422, "query.limit"),
    ("/schedules?limit=101", 422, "query.limit"),
    ("/schedules?limit=many", 422, "query.limit"),
    ("/schedules?cursor=not-a-cursor", 400, "cursor is not valid"),
    ("/schedules?cursor=" + "x" * 5000, 422, "query.cursor"),
    ("/types?limit=0", 422, "query.limit"),
    ("/types?limit=101", 422, "query.limit"),
    ("/types?cursor=not-a-cursor", 400, "cursor is not valid"),
    ("/rate-limits?limit=0", 422, "query.limit"),
    ("/rate-limits?limit=101", 422, "query.limit"),
    ("/rate-limits?cursor=not-a-cursor", 400, "cursor is not valid"),
]


def test_a_bad_limit_or_cursor_is_refused_with_a_reason_and_changes_nothing(settings):
    api = Api(settings)
    put_schedules(2)
    before = api.items()
    for path, status, says in BAD_QUERIES:
        code, answer, _ = api.call("GET", path)
        assert code == status and says in answer["message"], (path, answer)
    assert api.items() == before


def test_a_cursor_of_another_listing_or_of_no_position_is_refused(settings):
    from coworker.api.cursors import CursorCodec, cursor_secret

    api = Api(settings)
    put_schedules(3)
    api.call("POST", "/tasks", {"key": "t1", "type": "quick"})
    api.call("POST", "/tasks", {"key": "t2", "type": "quick"})
    of_tasks = api.call("GET", "/tasks?status=todo&limit=1")[1]["cursor"]
    of_schedules = api.call("GET", "/schedules?limit=1")[1]["cursor"]
    of_types = api.call("GET", "/types?limit=1")[1]["cursor"]
    set_rate_limits(2)
    of_rates = api.call("GET", "/rate-limits?limit=1")[1]["cursor"]
    assert of_tasks and of_schedules and of_types and of_rates
    for path, cursor in (("/schedules", of_tasks), ("/schedules", of_types), ("/types", of_schedules),
                         ("/tasks?status=todo", of_schedules), ("/rate-limits", of_types), ("/types", of_rates)):
        code, answer, _ = api.call("GET", f"{path}{'&' if '?' in path else '?'}cursor={cursor}")
        assert code == 400 and "belongs to another listing" in answer["message"], (path, answer)
    # Signed by this deployment, yet naming no position of the listing: refused, not misread.
    codec = CursorCodec(cursor_secret(settings))
    for path, listing, state in (("/schedules", ("schedules",), [0, "s000"]),
                                 ("/schedules", ("schedules",), [2, "s000", "2026-01-01T00:00:00.000000+0000"]),
                                 ("/schedules", ("schedules",), [0, "bad name", "2026-01-01T00:00:00.000000+0000"]),
                                 ("/schedules", ("schedules",), [0, "s000", "yesterday"]),
                                 ("/types", ("types",), 42), ("/types", ("types",), ""),
                                 ("/rate-limits", ("rate-limits",), 7), ("/rate-limits", ("rate-limits",), "")):
        code, answer, _ = api.call("GET", f"{path}?cursor={codec.encode(state, listing)}")
        assert code == 400 and "cursor is not valid" in answer["message"], (path, state, answer)


# -- the CLI and the Python client follow the cursor ---------------------------------------------

def test_the_cli_and_the_client_show_every_schedule_across_pages(settings):
    import io
    from argparse import Namespace

    from coworker.api.app import create_app
    from coworker_local import commands
    from coworker_local.api_client import ApiClient
    from coworker_local.client import Coworker
    from coworker_local.gateway import LocalGateway

    names = put_schedules(103, paused_every=10)  # more than the client's page of 100
    control.set_limit("limited-a", 2)
    app = create_app(settings)
    asked: list[str] = []

    def handler(event, context):
        asked.append(f"{event['path']}?{'&'.join(sorted(event.get('queryStringParameters') or {}))}")
        return app.resolve(event, context)

    with LocalGateway(handler) as gateway:
        client = ApiClient(gateway.url)
        out = io.StringIO()
        assert commands.cmd_schedules(client, Namespace(json=True), out, io.StringIO()) == 0
        listed = json.loads(out.getvalue())["schedules"]
        assert [entry["name"] for entry in listed] == names
        out = io.StringIO()
        assert commands.cmd_schedules(client, Namespace(json=False), out, io.StringIO()) == 0
        assert [line.split(":")[0] for line in out.getvalue().splitlines()] == names
        by_client = [entry["name"] for entry in Coworker(api=client).schedules()]
        assert sorted(by_client) == names  # each once, in the index's order
        assert "limited-a" in {entry["type"] for entry in Coworker(api=client).types()}
    # the CLI twice and the client once: each read a second page, with the first page's cursor
    assert asked.count("/schedules?cursor&limit") == 3, asked


# -- the largest page of every listing route, from the models' limits -----------------------------

ASTRAL = "\U0001f600"  # a character written as an escaped surrogate pair: 12 bytes of body, 14 of answer
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
LATEST_TEXT = "9999-12-31T23:59:59.999999+00:00"
BIG = 2**63


def lambda_answer(model) -> int:
    """Bytes of the Lambda answer carrying ``model`` as the app serializes it (Powertools: the
    JSON-able form, compact, ASCII) in API Gateway's proxy response."""
    from aws_lambda_powertools.event_handler.openapi.encoders import jsonable_encoder

    body = json.dumps(jsonable_encoder(model), separators=(",", ":"))
    return answer_bytes({"statusCode": 200, "body": body, "isBase64Encoded": False,
                         "multiValueHeaders": {"Content-Type": ["application/json"]}})


def largest_schedule():
    from coworker.api.models import ScheduleOut

    template = json.loads(json.dumps(largest_template_task().model_dump(mode="json", exclude_none=True,
                                                                        exclude={"key", "run_at"})))
    longest_zone = max(schedules.iana_zone_names(), key=len)
    # Names, expressions and zones are ASCII without quotes or backslashes (their checks say so).
    return ScheduleOut(name="n" * 80, expression="x" * 200, timezone=longest_zone, missed="once", paused=False,
                       task=template, next_run_at=LATEST, last_run_at=LATEST, last_task_key="n" * 80 + "@" + "9" * 20,
                       skipped=BIG, created_at=LATEST, updated_at=LATEST, created=False, changed=False)


def test_the_largest_page_of_every_listing_route_fits_in_a_lambda_answer():
    from aws_lambda_powertools.event_handler.openapi.encoders import jsonable_encoder
    from coworker.api import models
    from coworker.engine.control import MAX_RATE_LIMITS
    from coworker.engine.tasks import MAX_CONCURRENCY_KEY_CHARS, MAX_KEY_CHARS, MAX_TYPE_CHARS

    cursor = "c" * models.MAX_CURSOR_CHARS
    one_schedule = lambda_answer(largest_schedule())
    # the arithmetic in models.py: a schedule's body is its template and at most 1 KB besides
    body = len(json.dumps(jsonable_encoder(largest_schedule()), separators=(",", ":")))
    assert body <= schedules.MAX_TEMPLATE_BYTES + models.MAX_SCHEDULE_FIELD_BYTES, body
    assert one_schedule <= 2 * body
    largest = {
        "GET /schedules": models.SchedulesOut(schedules=[largest_schedule()] * models.MAX_SCHEDULE_PAGE,
                                              cursor=cursor, truncated=True),
        "GET /tasks": models.TaskPage(items=[models.TaskSummary(
            key=ASTRAL * MAX_KEY_CHARS, type=ASTRAL * MAX_TYPE_CHARS, status="processing", due_at=LATEST_TEXT,
            attempts=BIG, max_attempts=BIG, updated_at=LATEST_TEXT, batch_id="b" * 128,
            lock_owner="runner-0000-" + "o" * 100)] * models.MAX_PAGE_SIZE,
            count=models.MAX_PAGE_SIZE, cursor=cursor, scanned=BIG),
        "GET /types": models.TypesOut(types=[models.TypeOut(
            type=ASTRAL * MAX_TYPE_CHARS, registered=True, paused=True, held=BIG, limit=BIG, running=BIG,
            blocked=BIG, changed=True, timeout_seconds=-1.2345678901234567e-300, runner="container",
            observed_p95_seconds=-1.2345678901234567e-300)] * models.MAX_TYPE_PAGE,
            note="n" * 500, cursor=cursor),
        # Bounded by design: at most MAX_RATE_LIMITS limits are set (control.set_rate refuses more).
        "GET /rate-limits": models.RateLimitsOut(limits=[models.RateLimitOut(
            group="key:" + ASTRAL * MAX_CONCURRENCY_KEY_CHARS, limit=BIG, interval_seconds=-1.2345678901234567e-300,
            source="last start", started_in_interval=BIG, next_free_at=LATEST_TEXT, booked_until=LATEST_TEXT,
            changed=True)] * min(MAX_RATE_LIMITS, models.MAX_RATE_PAGE), note="n" * 500, cursor=cursor),
    }
    sizes = {route: lambda_answer(page) for route, page in largest.items()}
    assert all(size < models.LAMBDA_RESPONSE_BYTES for size in sizes.values()), sizes
    # the schedules' page, whose items are the largest, keeps a wide margin (models.py's arithmetic)
    assert sizes["GET /schedules"] <= models.MAX_SCHEDULE_PAGE * 2 * (
        schedules.MAX_TEMPLATE_BYTES + models.MAX_SCHEDULE_FIELD_BYTES) < 0.6 * models.LAMBDA_RESPONSE_BYTES
