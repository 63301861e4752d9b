"""What the engine costs on DynamoDB: DynamoDB Local's own ``ConsumedCapacity`` answers, checked
against the documented rules side by side.

Figures, not speed: the meter counts requests, items read and capacity units of the real
requests the engine makes (see :mod:`coworker_local.capacity`); nothing here is timed. These
tests need DynamoDB Local (moto's figures are wrong).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from coworker.data import connection, index, layout, writes
from coworker.data.models import ControlModel, LeaseModel, TaskModel, status_shards, utcnow
from coworker.engine import control, dispatch, lifecycle, submit
from coworker.engine.tasks import TaskSpec
from coworker_local.capacity import CapacityMeter, Reported, item_size, read_units, status_index
from coworker_local.database import dynamodb_client

# Large beside what a tick reads (7 entries) and beside the count cap below: 40 times the small
# backlog and 5 times the cap prove "not the backlog" as 5,000 did, at a fifth of the loading.
LARGE_BACKLOG = 2_000
SMALL_BACKLOG = 50
INDEX = status_index()

pytestmark = pytest.mark.dynamodb_local


class RecordingInvoker:
    """Keeps the dispatched keys and starts nothing, so a tick's own reads can be metered."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def invoke(self, request) -> None:
        self.keys.extend(request.keys)


def load_backlog(settings, count: int) -> None:
    """``count`` due todo tasks, copies of a real task item, written with BatchWriteItem."""
    client = dynamodb_client(settings)
    submit.put_task(TaskSpec(key="template", type="quick", payload={"n": 0}), settings)
    template = client.get_item(TableName=settings.table_name, Key={"key": {"S": "template"}})["Item"]
    client.delete_item(TableName=settings.table_name, Key={"key": {"S": "template"}})
    base = utcnow() - timedelta(hours=1)
    for first in range(0, count, 25):
        batch = []
        for i in range(first, min(first + 25, count)):
            due = (base + timedelta(microseconds=i)).strftime("%Y-%m-%dT%H:%M:%S.%f+0000")
            key = f"b-{i:06d}"
            batch.append({"PutRequest": {"Item": {
                **template, "key": {"S": key}, "due_at": {"S": due},
                "status_shard": {"S": TaskModel.shard_value_of(key, "todo")}}}})
        pending = {settings.table_name: batch}
        while pending:
            pending = client.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}


def partition(read) -> str:
    """The index partition a metered read queried ("" for a GetItem)."""
    return str(read.key_values[0]) if read.key_values else ""


def metered_tick(settings) -> tuple[dispatch.TickReport, CapacityMeter]:
    lease_connection = LeaseModel._get_connection().connection
    control_connection = ControlModel._get_connection().connection
    with CapacityMeter.for_model(TaskModel, dynamodb_client(settings), lease_connection,
                                 control_connection) as meter:
        report = dispatch.tick(settings, RecordingInvoker())
    return report, meter


def _tick_over_backlog(backlog: int, make_settings) -> tuple[dispatch.TickReport, CapacityMeter]:
    # 10 worker slots of one task each, 3 of them taken by workers already dispatched
    settings = make_settings(max_concurrency=10, batch_size=1)
    load_backlog(settings, backlog)
    assert len(dispatch.start_workers(settings, RecordingInvoker(), ["busy-0", "busy-1", "busy-2"])) == 3
    # A table's first tick records its index shard count (one write, once): measure a later one.
    control.record_status_shards(settings.status_shards, None)
    return metered_tick(settings)


@pytest.mark.slow
def test_tick_reads_what_it_dispatches_not_the_backlog(make_settings):
    # Given a large backlog of due tasks, when the coordinator ticks with 7 free slots
    report, meter = _tick_over_backlog(LARGE_BACKLOG, make_settings)

    # Then it starts 7 workers and reads only the 7 free slots, and of the tasks about the 7 it
    # hands out: one page per index shard, of about 7/S entries each
    shards = status_shards()
    assert (report.busy_slots, report.free_slots, report.dispatched, report.invocations) == (3, 7, 7, 7)
    slot_reads = [r for r in meter.reads if r.key_values[:1] == (layout.SLOT_STATUS,)]
    todo_reads = [r for r in meter.reads if partition(r).startswith("todo#")]
    assert [r.items_read for r in slot_reads] == [7]
    assert len({r.key_values[0] for r in todo_reads}) == shards
    assert report.dispatched <= sum(r.items_read for r in todo_reads) <= 2 * report.dispatched + shards
    # no scan, no per-item reads: a GetItem of the control record (paused types); the
    # stream follower looks its stream up once per process (DescribeTable), if this is the first,
    # and keeps its place in the stream (PutItem of its checkpoints, not of any task)
    assert set(meter.totals.requests) - {"DescribeTable", "PutItem"} == {"Query", "UpdateItem", "GetItem"}
    assert all(w.new and w.new["key"]["S"].startswith("stream#") for w in meter.writes if w.operation == "PutItem")
    assert meter.totals.requests.get("DescribeTable", 0) <= 1
    # (GetItems: the control record, and the follower's checkpoint when it first reads the stream)
    assert [r.key_values for r in meter.reads if r.operation == "GetItem"] in ([()], [(), ()])
    assert meter.totals.requests["UpdateItem"] == 7  # one reservation per worker started
    # plus one read per shard of the running tasks (none here), to count them and find lost ones
    running_reads = [r for r in meter.reads if partition(r).startswith("processing#")]
    assert len(running_reads) == shards and sum(r.items_read for r in running_reads) == 0
    assert not [r for r in meter.reads if r.select == "COUNT"]
    # every query here reads well under 4 KB: the minimum half unit each
    queries_read = [r for r in meter.reads if r.operation == "Query"]
    assert sum(r.units for r in queries_read) == 0.5 * len(queries_read)
    # and DynamoDB Local reports the same for each query that read something, and for the
    # GetItems of the (absent) control record and of the checkpoint; for an empty query (no expired locks, no due
    # retries, nothing running here) it reports 0 where AWS bills its 0.5 minimum
    queries_read = [r for r in meter.reads if r.operation == "Query"]
    for read in queries_read:
        assert read.reported_units == (read.units if read.items_read else 0.0)
    gets = [r for r in meter.reads if r.operation == "GetItem"]
    assert all(r.reported_units == r.units for r in gets)
    assert sorted(r.units for r in gets) in ([0.5], [0.5, 1.0])  # the checkpoint is read consistently
    empty = sum(1 for r in queries_read if not r.items_read)
    assert meter.totals.reported_read_units == meter.totals.read_units - 0.5 * empty

    # And the same tick over a backlog 40 times smaller reads exactly as much
    small_report, small_meter = _tick_over_backlog(SMALL_BACKLOG, make_settings)
    assert small_report.dispatched == report.dispatched
    assert small_meter.totals.items_read == meter.totals.items_read
    assert small_meter.totals.read_units == meter.totals.read_units


def test_query_read_units_follow_the_sizes_of_the_items_read(make_settings):
    # Given 100 due tasks whose index entries together pass 4 KB, in an unsharded index
    settings = make_settings(max_concurrency=100, batch_size=10, status_shards=1)
    load_backlog(settings, 100)

    report, meter = metered_tick(settings)

    (todo_read,) = [r for r in meter.reads if r.key_values[:1] == ("todo#0",)]
    assert todo_read.items_read == report.dispatched == 100
    assert todo_read.bytes_read > 4096
    assert todo_read.units == read_units(todo_read.bytes_read) > 0.5
    assert todo_read.reported_units == todo_read.units


def test_happy_path_write_units_match_the_rules_for_the_observed_items(make_settings):
    # Given a few quick tasks run to the end by coordinator ticks and in-process workers
    settings = make_settings(max_concurrency=4, batch_size=2, dispatch_on_submit=False)
    tasks = 6
    keys = {f"t{i}" for i in range(tasks)}
    with CapacityMeter.for_model(TaskModel, dynamodb_client(settings)) as meter:
        for key in sorted(keys):
            submit.put_task(TaskSpec(key=key, type="quick", payload={"n": int(key[1:])}), settings)
        invoker = dispatch.InProcessInvoker(settings)
        finished = 0
        for _ in range(10):
            dispatch.tick(settings, invoker)
            finished += sum(r.outcome.value == "finished" for r in invoker.wait())
            if finished == tasks:
                break
        invoker.shutdown()
    assert finished == tasks

    # Then each task took exactly put, claim, finish: one PutItem and two UpdateItems that
    # succeeded (a self-feeding worker may also try a claim that another worker won)
    # (the meter sees every write of the shared client: the tasks' are those of their keys)
    task_writes = [record for record in meter.writes
                   if (record.new or record.old or {}).get("key", {}).get("S") in keys]
    succeeded = [record for record in task_writes if record.succeeded]
    failed = [record for record in task_writes if not record.succeeded]
    assert sum(r.operation == "PutItem" for r in succeeded) == tasks
    assert sum(r.operation == "UpdateItem" for r in succeeded) == 2 * tasks
    assert all(r.operation == "UpdateItem" and r.index_units == 0 for r in failed)
    by_key: dict[str, list] = {}
    for record in succeeded:
        by_key.setdefault(record.new["key"]["S"], []).append(record)
    client = dynamodb_client(settings)
    for key, (put, claim, finish) in by_key.items():
        # the snapshots chain: each write starts from the item the previous one left
        assert put.old is None and claim.old == put.new and finish.old == claim.new
        final = client.get_item(TableName=settings.table_name, Key={"key": {"S": key}})["Item"]
        assert finish.new == final
        # and the units are the documented ones for these items: small items, 1 unit a write;
        # index: added (1), key todo->processing (delete + put: 2), left the sparse index (1)
        assert max(item_size(r.new) for r in (put, claim, finish)) <= 1024
        assert INDEX.contains(put.new) and INDEX.contains(claim.new) and not INDEX.contains(finish.new)
        assert INDEX.key_of(put.new) != INDEX.key_of(claim.new)
        assert [r.table_units for r in (put, claim, finish)] == [1, 1, 1]
        assert [r.index_units for r in (put, claim, finish)] == [1, 2, 1]
        # and DynamoDB Local reports exactly what the rules predict, write by write
        assert [r.reported for r in (put, claim, finish)] == [Reported(1, 1), Reported(1, 2), Reported(1, 1)]

    # So a finished task costs 3 table and 4 index write units: the index writes are counted
    # (plus one unit per lost claim race, billed by AWS and not reported by DynamoDB Local)
    assert sum(r.table_units for r in task_writes) == 3 * tasks + len(failed)
    assert sum(r.reported.table_units for r in succeeded) == 3 * tasks
    assert sum(r.index_units for r in task_writes) == sum(r.reported.index_units for r in succeeded) == 4 * tasks
    assert sum(r.reported.units for r in succeeded) / tasks == 7
    assert [r.reported for r in failed] == [None] * len(failed)


def test_failed_conditional_put_is_billed_without_index_writes(make_settings):
    settings = make_settings()
    submit.put_task(TaskSpec(key="dup", type="quick"), settings)
    with CapacityMeter.for_model(TaskModel, dynamodb_client(settings)) as meter:
        assert submit.put_task(TaskSpec(key="dup", type="quick"), settings) is submit.PutOutcome.EXISTS
    (record,) = meter.writes
    assert not record.succeeded
    assert (record.table_units, record.index_units) == (1, 0)
    # DynamoDB Local reports nothing for it; AWS bills it, so the rules fill the gap
    assert record.reported is None
    assert meter.totals.reported_write_units == 0 and meter.totals.unreported_write_units == 1


def test_transaction_figures_reported_and_by_the_rules_side_by_side(make_settings):
    # Given two tasks put in one transaction (as a worker puts follow-ups with its completion)
    settings = make_settings()
    now = utcnow()
    tasks = [lifecycle.new_task(TaskSpec(key=f"in-transaction-{n}", type="quick"), settings, now) for n in (1, 2)]

    def build(transaction):
        for task in tasks:
            transaction.save(task, condition=TaskModel.key.does_not_exist())

    with CapacityMeter.for_model(TaskModel, dynamodb_client(settings), connection.transaction_connection()) as meter:
        assert writes.transact(build, "two puts") is None
    assert meter.totals.requests["TransactWriteItems"] == 1
    # Then the rules bill each item twice (a transactional write costs double), and DynamoDB
    # Local, visibly, reports one unit each: the benchmarks print both, and bill by the rules
    assert meter.totals.table_write_units == 4 and meter.totals.reported_table_write_units == 2
    # Both put one index entry per task (index entries are propagated, not written in the transaction)
    assert meter.totals.index_write_units == meter.totals.reported_index_write_units == 2


@pytest.mark.slow
def test_backlog_measure_reads_at_most_the_cap_whatever_the_backlog(make_settings):
    # Given a backlog larger than the count cap (5 times)
    cap = LARGE_BACKLOG // 5
    settings = make_settings(backlog_count_cap=cap)
    loading_began = utcnow()
    load_backlog(settings, LARGE_BACKLOG)

    # When the coordinator measures the backlog
    with CapacityMeter.for_model(TaskModel, dynamodb_client(settings)) as meter:
        measured_at = utcnow()
        backlog = index.backlog(measured_at, cap)

    # Then it reports the cap (and says so), and the age of the oldest due task (loaded an hour ago)
    assert (backlog.todo, backlog.capped) == (cap, ("todo",))
    # (however long the load took on a busy machine: the oldest is due an hour before it began)
    assert 3600 <= backlog.oldest_due_age_seconds <= 3600 + (measured_at - loading_began).total_seconds() + 1
    # reading about the cap's worth of todo entries, each shard its share, plus one entry per
    # shard to find the oldest; failed has nothing, so its reads are empty
    shards = status_shards()
    todo_reads = [r for r in meter.reads if partition(r).startswith("todo#")]
    assert cap <= sum(r.items_read for r in todo_reads) <= cap + 2 * shards
    assert not [r for r in meter.reads if partition(r).startswith("failed#") and r.items_read]
    # which costs about half a unit per 4 KB of index entries read (eventually consistent)
    assert meter.totals.read_units <= read_units(sum(r.bytes_read for r in meter.reads)) + 0.5 * len(meter.reads)
    print(f"backlog measure over {LARGE_BACKLOG} due tasks, cap {cap}: {len(meter.reads)} queries, "
          f"{meter.totals.items_read} entries, {meter.totals.read_units} read units")
