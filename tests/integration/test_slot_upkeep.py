"""A coordinator run keeps its worker slots at its start (creates the missing, deletes the surplus);
a write of that upkeep refused by DynamoDB (throttling) is logged and counted, and the run ticks."""

from __future__ import annotations

import botocore.client
import botocore.exceptions
from coworker.data.models import LeaseModel
from coworker.engine import dispatch, slots
from coworker.observability import MetricName, metrics

from tests.support.doubles import RecordingInvoker


def test_a_run_whose_surplus_slot_cannot_be_deleted_logs_counts_it_and_still_ticks(make_settings, monkeypatch,
                                                                                  log_lines):
    # Given a deployment lowered from 4 worker slots to 2, whose table refuses deletes (throttled)
    settings = make_settings(max_concurrency=2, batch_size=1, tick_seconds=0.2, idle_exit=True)
    slots.ensure_slots(4)
    real_call = botocore.client.BaseClient._make_api_call

    def throttled(client, operation, params):
        if operation == "DeleteItem":
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "ThrottlingException", "Message": "Rate of requests exceeds the limit"}},
                operation)
        return real_call(client, operation, params)

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", throttled)
    counted: list[str] = []
    real_add = metrics.add_metric
    monkeypatch.setattr(metrics, "add_metric", lambda **kw: (counted.append(kw["name"]), real_add(**kw))[1])

    # When a coordinator run starts, its window open for one tick
    seen: list[object] = []
    supervisor = dispatch.Supervisor(settings, RecordingInvoker())
    supervisor.on_tick = lambda report, error: seen.append(report)
    reports = supervisor.run(lambda: 60.0 if len(seen) < 1 else 0.0)

    # Then it ticked, and the failed upkeep was logged and counted; the surplus slots stay for a later run
    assert len(reports) == 1 and MetricName.COORDINATOR_TICKS in counted
    assert MetricName.SLOT_UPKEEP_FAILED in counted
    assert any(line["message"].startswith("could not keep the worker slots") for line in log_lines()), log_lines()
    assert {slots.slot_key(n) for n in range(4)} <= {item.key for item in LeaseModel.scan()}


def test_slots_made_meanwhile_by_another_coordinator_are_kept_and_the_rest_are_made(make_settings, monkeypatch):
    # Given 6 slots wanted, none seen by this coordinator's read, while another coordinator makes
    # slot 2 and takes it (between the read and the puts)
    settings = make_settings(max_concurrency=6, batch_size=1)
    table = [item.key for item in LeaseModel.scan()]
    for key in table:
        LeaseModel(key).delete()
    real_batch_get = LeaseModel.batch_get

    def read_then_race(keys, **kwargs):
        seen = list(real_batch_get(keys, **kwargs))
        monkeypatch.setattr(LeaseModel, "batch_get", real_batch_get)
        slots.ensure_slots(3)  # the other coordinator's upkeep: slots 0..2
        assert slots.reserve(slots.slot_key(2), "other", 60)
        return iter(seen)

    monkeypatch.setattr(LeaseModel, "batch_get", read_then_race)

    # When this coordinator keeps its 6 slots
    created = slots.ensure_slots(settings.worker_slots)

    # Then it made the 3 missing ones (its transaction refused, one by one), and slot 2 keeps its holder
    assert created == 3
    assert sorted(item.key for item in LeaseModel.scan()) == [slots.slot_key(n) for n in range(6)]
    assert LeaseModel.get(slots.slot_key(2)).holder == "other"
