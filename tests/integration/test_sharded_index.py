"""The sharded status index: every status spread over S partition key values, read back merged
in exactly the order of one partition; listings page through it; old tables migrate."""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest
from coworker.data import connection, index, layout
from coworker.data.models import TaskModel, TaskStatus, utcnow
from coworker.engine import control, dispatch, lifecycle, reshard, slots, submit
from coworker.engine.tasks import TaskSpec
from coworker_local import migration
from coworker_local.database import dynamodb_client

from tests.support.doubles import Api, RecordingInvoker


def _put_spread(settings, count: int, seed: int = 7) -> list[str]:
    """``count`` due tasks with distinct, shuffled due times; their keys, oldest due first.

    A task's due time is its creation less its priority, so the priorities lie a minute apart:
    the puts' own time (however slow the machine) cannot reorder them."""
    rng = random.Random(seed)
    offsets = rng.sample(range(3600), count)
    keys = []
    for i, offset in enumerate(offsets):
        key = f"task-{i:04d}"
        submit.put_task(TaskSpec(key=key, type="quick", run_at=None, priority=60 * (3600 - offset)), settings)
        keys.append((offset, key))
    return [key for _, key in sorted(keys)]


def _raw(settings, key: str) -> dict:
    return dynamodb_client(settings).get_item(TableName=settings.table_name, Key={"key": {"S": key}})["Item"]


def test_every_task_carries_the_shard_of_its_key_and_status(make_settings):
    settings = make_settings(status_shards=4)
    keys = _put_spread(settings, 60)
    shards = Counter(_raw(settings, key)["status_shard"]["S"] for key in keys)
    assert set(shards) == {f"todo#{n}" for n in range(4)}  # all four used
    for key in keys[:5]:
        assert _raw(settings, key)["status_shard"]["S"] == f"todo#{layout.shard_of(key, 4)}"
    # a claim moves the task to the processing shard of the same number, and back on release
    claim = lifecycle.claim(keys[0], "w1", settings)
    assert _raw(settings, keys[0])["status_shard"]["S"] == f"processing#{layout.shard_of(keys[0], 4)}"
    lifecycle.release_unstarted(claim)
    assert _raw(settings, keys[0])["status_shard"]["S"] == f"todo#{layout.shard_of(keys[0], 4)}"


@pytest.mark.parametrize("shards", [1, 3, 8])
def test_merged_read_is_the_global_oldest_first_order(make_settings, shards):
    settings = make_settings(status_shards=shards)
    oldest_first = _put_spread(settings, 80)
    now = utcnow()
    assert [t.key for t in index.due(TaskStatus.TODO, now, 80)] == oldest_first
    assert [t.key for t in index.due(TaskStatus.TODO, now, 7)] == oldest_first[:7]
    newest = index.MergedRead("todo", want=10, forward=False)
    assert [t.key for t in newest][:10] == oldest_first[::-1][:10]
    assert index.count(TaskStatus.TODO) == 80
    assert index.count_capped("todo", 20) == (20, True)
    assert index.count_capped("todo", 500) == (80, False)


def test_a_merged_read_resumes_where_it_stopped(make_settings):
    settings = make_settings(status_shards=5)
    oldest_first = _put_spread(settings, 53)
    seen: list[str] = []
    starts = None
    while True:
        read = index.MergedRead("todo", want=6, starts=starts)
        page = []
        for task in read:
            page.append(task.key)
            if len(page) == 6:
                break
        seen += page
        if read.complete:
            break
        starts = read.positions()
    assert seen == oldest_first  # every task once, in order, across pages


def test_the_coordinator_dispatches_oldest_first_across_shards(make_settings):
    settings = make_settings(max_concurrency=5, batch_size=1, status_shards=8, dispatch_on_submit=False)
    oldest_first = _put_spread(settings, 40)
    invoker = RecordingInvoker()
    report = dispatch.tick(settings, invoker)
    assert report.dispatched == 5 and sorted(invoker.keys) == sorted(oldest_first[:5])


def test_api_listing_pages_through_all_shards_in_order(make_settings):
    settings = make_settings(status_shards=4)
    oldest_first = _put_spread(settings, 25)
    api = Api(settings)
    seen, cursor = [], None
    while True:
        query = "/tasks?status=todo&limit=4" + (f"&cursor={cursor}" if cursor else "")
        code, page, _ = api.call("GET", query)
        assert code == 200
        seen += [item["key"] for item in page["items"]]
        cursor = page["cursor"]
        if not cursor:
            break
    assert seen == oldest_first
    # a cursor made under another shard count is refused, not misread
    code, page, _ = api.call("GET", "/tasks?status=todo&limit=4")
    other = Api(settings.model_copy(update={"status_shards": 8}))

    connection.bind(settings.model_copy(update={"status_shards": 8}))
    try:
        code, answer, _ = other.call("GET", f"/tasks?status=todo&cursor={page['cursor']}")
        assert code == 400 and "another listing" in answer["message"]
    finally:
        connection.bind(settings)


def _legacy_table(make_settings, new_index: bool = True):
    """A table as a release before sharding left it: the old index, items without a shard.
    ``new_index`` adds the sharded index too (step 1 of the documented migration)."""
    settings = make_settings()
    client = dynamodb_client(settings)
    client.delete_table(TableName=settings.table_name)
    client.get_waiter("table_not_exists").wait(TableName=settings.table_name, WaiterConfig={"Delay": 1})
    request = layout.create_table_request(settings.table_name, legacy_index=True)
    if not new_index:
        request["GlobalSecondaryIndexes"] = [ix for ix in request["GlobalSecondaryIndexes"]
                                             if ix["IndexName"] == layout.LEGACY_STATUS_INDEX_NAME]
        request["AttributeDefinitions"] = [a for a in request["AttributeDefinitions"]
                                           if a["AttributeName"] != layout.STATUS_INDEX_PARTITION_KEY]
    client.create_table(**request)
    client.get_waiter("table_exists").wait(TableName=settings.table_name, WaiterConfig={"Delay": 1})
    slots.ensure_slots(settings.worker_slots)
    for i in range(12):
        submit.put_task(TaskSpec(key=f"old-{i:02d}", type="quick", priority=100 - i), settings)
    for item in client.scan(TableName=settings.table_name)["Items"]:
        client.update_item(TableName=settings.table_name, Key={"key": item["key"]},
                           UpdateExpression="REMOVE status_shard")
    return settings


def test_migrating_an_unsharded_table_makes_its_tasks_visible_again(make_settings):
    settings = _legacy_table(make_settings)
    invoker = RecordingInvoker()
    # Slots and tasks have no shard: nothing can be dispatched yet. The coordinator's start
    # (ensure_slots) gives the slots theirs.
    assert index.count(TaskStatus.TODO) == 0
    slots.ensure_slots(settings.worker_slots)
    assert dispatch.tick(settings, invoker).dispatched == 0

    dry = migration.reshard(dry_run=True)
    assert (dry.moved, index.count(TaskStatus.TODO)) == (12, 0)
    report = migration.reshard()
    assert report.moved == 12 and report.scanned == 12 + settings.worker_slots
    assert index.count(TaskStatus.TODO) == 12
    assert dispatch.tick(settings, invoker).dispatched == 12
    assert migration.reshard().moved == 0  # idempotent


def test_lowering_the_shard_count_needs_a_reshard_raising_it_does_not(make_settings):

    settings = make_settings(status_shards=8)
    _put_spread(settings, 30)
    fewer = settings.model_copy(update={"status_shards": 2})
    connection.bind(fewer)
    try:
        assert index.count(TaskStatus.TODO) < 30  # tasks in shards 2..7 are not read
        assert migration.reshard().moved > 0
        assert index.count(TaskStatus.TODO) == 30
        connection.bind(settings.model_copy(update={"status_shards": 16}))
        assert index.count(TaskStatus.TODO) == 30  # more shards: every old one is still read
    finally:
        connection.bind(settings)


def test_lowering_the_shard_count_on_a_live_table_hides_no_task(make_settings, monkeypatch):
    # Given a table run with 8 shards, whose coordinator recorded them, with 30 tasks (2 held)
    settings = make_settings(status_shards=8, dispatch_on_submit=False)
    dispatch.tick(settings, RecordingInvoker())
    _put_spread(settings, 30)
    control.pause("slow")
    for key in ("held-1", "held-2"):
        submit.put_task(TaskSpec(key=key, type="slow"), settings, now=utcnow() - timedelta(seconds=5))
    dispatch.tick(settings, RecordingInvoker(), now=utcnow())  # parks the held ones
    assert index.count(TaskStatus.TODO) == 30

    # When the deployment lowers it to 2: at first the tasks in shards 2..7 are not read
    fewer = settings.model_copy(update={"status_shards": 2})
    connection.bind(fewer)
    monkeypatch.setattr(reshard, "GRACE_SECONDS", 0.0)
    try:
        assert index.count(TaskStatus.TODO) < 30
        # Then the coordinator's next tick moves them where the new count reads, and records it
        dispatch.tick(fewer, RecordingInvoker())
        assert index.count(TaskStatus.TODO) == 30
        assert control.read(consistent=True).status_shards == 8  # until a tick finds them empty
        dispatch.tick(fewer, RecordingInvoker())
        assert control.read(consistent=True).status_shards == 2
        control.resume("slow")
        dispatch.tick(fewer, RecordingInvoker())  # the held tasks come back too
        assert index.count(TaskStatus.TODO) == 32
        # and raising it again needs nothing: every shard below the new count is read
        more = settings.model_copy(update={"status_shards": 16})
        connection.bind(more)
        assert index.count(TaskStatus.TODO) == 32
        dispatch.tick(more, RecordingInvoker())
        assert control.read(consistent=True).status_shards == 16
    finally:
        connection.bind(settings)


def test_a_reshard_leaves_a_task_a_worker_moved_meanwhile(make_settings):
    settings = _legacy_table(make_settings)
    slots.ensure_slots(settings.worker_slots)
    item = TaskModel.get("old-00")
    assert item.status_shard is None
    lifecycle.claim("old-00", "w1", settings)  # a new-release worker writes the shard itself
    assert not migration._move(item, migration.expected_shard("old-00", "todo"))
    assert _raw(settings, "old-00")["status_shard"]["S"].startswith("processing#")


def test_a_cursor_over_four_shards_of_the_longest_keys_stays_under_its_limit(make_settings):
    from coworker.api.models import MAX_CURSOR_CHARS


    settings = make_settings(status_shards=4)
    rng = random.Random(3)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:"
    keys = {"".join(rng.choice(alphabet) for _ in range(512)) for _ in range(24)}
    for key in keys:
        submit.put_task(TaskSpec(key=key, type="quick"), settings)
    api = Api(settings)
    seen, cursor, longest = [], None, 0
    while True:
        code, page, _ = api.call("GET", "/tasks?status=todo&limit=2" + (f"&cursor={cursor}" if cursor else ""))
        assert code == 200, page
        seen += [item["key"] for item in page["items"]]
        cursor = page["cursor"]
        if not cursor:
            break
        longest = max(longest, len(cursor))
    assert sorted(seen) == sorted(keys) and longest <= MAX_CURSOR_CHARS


@pytest.mark.slow
def test_a_kept_local_table_without_the_index_gets_it_and_its_tasks_their_shards(make_settings):
    """What the local runtime does with a kept data folder of an earlier release. On a DynamoDB
    Local of its own: adding an index online to a table of a server that has served many other
    tables makes its next writes fail there (InternalFailure), a quirk of the emulator."""
    from coworker.bootstrap import configure
    from coworker_local.database import add_status_index, create_table, start_database

    server = start_database("dynamodb-local")
    try:
        def on_own_server(**overrides):
            settings = make_settings(**overrides)
            own = settings.model_copy(update={"dynamodb_endpoint": server.endpoint})
            create_table(own)
            configure(own)
            return own

        settings = _legacy_table(on_own_server, new_index=False)  # only the old index
        client = dynamodb_client(settings)
        assert create_table(settings) is False  # it exists: the index is added instead
        table = client.describe_table(TableName=settings.table_name)["Table"]
        assert layout.STATUS_INDEX_NAME in {ix["IndexName"] for ix in table["GlobalSecondaryIndexes"]}
        assert add_status_index(settings) is False  # once only
        slots.ensure_slots(settings.worker_slots)
        assert migration.reshard().moved == 12
        assert index.count(TaskStatus.TODO) == 12
    finally:
        server.stop()


def test_the_migrate_index_command_reports_and_moves(make_settings):
    import io

    from coworker_local import cli

    settings = _legacy_table(make_settings)
    out, err = io.StringIO(), io.StringIO()
    args = ["migrate-index", "--table", settings.table_name, "--endpoint", settings.dynamodb_endpoint,
            "--shards", str(settings.status_shards)]
    assert cli.main([*args, "--dry-run"], out, err) == 0
    moved = 12 + settings.worker_slots  # the tasks, and the slots (the coordinator's start would too)
    assert f"would move {moved} " in out.getvalue() and index.count(TaskStatus.TODO) == 0
    out = io.StringIO()
    assert cli.main([*args, "--segments", "3"], out, err) == 0
    assert f"moved {moved} " in out.getvalue() and index.count(TaskStatus.TODO) == 12
    assert cli.main(["migrate-index", "--endpoint", settings.dynamodb_endpoint], io.StringIO(), err) == 2
    assert "--table" in err.getvalue()
