"""The bill's model of each design (benchmarks/bill.py): the rules it applies, on made-up
measurements, so that a change to a rule shows up here."""

from __future__ import annotations

import importlib
import math
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

BENCHMARKS = str(Path(__file__).parents[2] / "benchmarks")


@pytest.fixture(scope="module")
def bill():
    with mock.patch.dict(os.environ), mock.patch.object(sys, "path", [BENCHMARKS, *sys.path]):
        return importlib.import_module("bill")


@pytest.fixture
def measured(bill):
    run = bill.RunCost(requests=40, stream_reads=1, read_units=20.0, write_units=3.0, log_bytes=600,
                       metric_names=frozenset({"CoordinatorTicks"}))
    return bill.Measured(own_write_units=7.0, invocation_write_units=10.0, race_write_units=20.0,
                         race_invocations=20, race_tasks=2000, race_started=20, batch_extra_write_units=0.1,
                         lock_beat_units=tuple(3.0 * n for n in range(5)), slot_extension_units=3.0, read_units=0.3,
                         log_bytes_per_task=40.0, log_bytes_per_invocation=0.0, idle_run=run, busy_tick=run)


def workload(bill, seconds: float):
    return bill.Workload(tasks=1_000_000, seconds=seconds, memory_gb=0.5, threads=10, concurrency=1000)


def test_every_design_runs_ten_tasks_at_once_per_invocation(bill, measured):
    w = workload(bill, 1.0)
    expected = 1_000_000 * (1.0 + bill.p.DYNAMODB_SECONDS_PER_TASK) / 10 * 0.5 * bill.p.LAMBDA_GB_SECOND_ARM
    assert bill.sqs_bill(measured, w).lines["Lambda GB-s"] == pytest.approx(expected)
    assert bill.coworker_bill(measured, w).lines["Lambda GB-s"] == pytest.approx(expected)
    # a Distributed Map child of 100 items runs them 10 at once: 10 rounds of 1 s
    dmap = bill.distributed_map_bill(measured, w, 100).lines["Lambda GB-s"]
    assert dmap == pytest.approx(10_000 * (10 + bill.p.DYNAMODB_SECONDS_PER_TASK) * 0.5 * bill.p.LAMBDA_GB_SECOND_ARM)


def test_a_distributed_map_child_never_outlasts_its_limits(bill, measured):
    # 1-s tasks: 1,000 items 10 at once is 100 s, within Express's 5 minutes
    assert "express child requests" in bill.distributed_map_bill(measured, workload(bill, 1.0), 1000).lines
    # 5-min tasks: no Express child fits; 100 items (10 rounds, 50 minutes) outlast Lambda's 15
    five = workload(bill, 300.0)
    assert "standard child transitions" in bill.distributed_map_bill(measured, five, 10).lines
    assert not bill.distributed_map_bill(measured, five, 100).lines
    assert bill.cheapest_distributed_map(measured, five).name.endswith("(batch 10)")


def test_heartbeats_are_billed_by_task_length(bill, measured):
    def task_writes(seconds: float) -> float:
        return bill.coworker_bill(measured, workload(bill, seconds)).lines["DynamoDB writes, tasks"]

    unit = 1_000_000 * bill.p.DYNAMODB_WRITE_UNIT
    assert task_writes(1.0) == pytest.approx(7.0 * unit)  # no heartbeat before the first 20 s
    assert task_writes(60.0) == pytest.approx((7.0 + 2 * 3.0) * unit)  # extended at 20 s and 40 s
    assert task_writes(300.0) == pytest.approx((7.0 + 14 * 3.0) * unit)  # past the measured beats


def test_lock_heartbeats_past_the_measured_ones_go_on_at_the_rate_of_the_later_ones(bill, measured):
    import dataclasses

    # the first beat moves the index entry (3 units), then every other one (1, 3, 1, 3, ...)
    m = dataclasses.replace(measured, lock_beat_units=(0.0, 3.0, 4.0, 7.0, 8.0, 11.0, 12.0, 15.0))
    assert m.lock_heartbeat_units(2) == 4.0
    assert m.lock_heartbeat_units(7) == 15.0
    assert m.lock_heartbeat_units(10) == pytest.approx(15.0 + 3 * (15.0 - 7.0) / 4)


def test_five_minute_tasks_get_the_worker_timeout_their_declared_limit_needs(bill, measured):
    assert bill.coworker_worker_timeout(1.0) == 300
    assert bill.coworker_worker_timeout(300.0) == 312  # 300 s, the 5-s margin and 6 s to start
    note = bill.coworker_bill(measured, workload(bill, 300.0)).note
    assert "timeout 312 s" in note and f"{math.ceil(1_000_000 / 10):,} worker invocations" in note
    assert "killed" not in note
    # Without declared limits a team set Lambda's longest by hand, and a third of the attempts die.
    assert bill.coworker_worker_timeout(300.0, limits_declared=False) == 900
    undeclared = bill.coworker_bill(measured, workload(bill, 300.0), limits_declared=False).note
    assert "timeout 900 s" in undeclared and "33% of attempts killed at the deadline (0.50 a task" in undeclared


@pytest.mark.parametrize(("seconds", "timeout", "finished", "lost"), [
    (60.0, 300, 4, 1),  # 1 attempt in 5 (issue 47)
    (100.0, 300, 2, 1),  # 1 in 3
    (150.0, 300, 1, 1),  # 1 in 2
    (300.0, 900, 2, 1),  # 1 in 3 even at 900 s
    (1.0, 300, 265, 0),  # claims end at 90 % of the timeout; nothing straddles the deadline
])
def test_without_limits_the_task_straddling_the_deadline_is_killed(bill, seconds, timeout, finished, lost):
    rounds = bill.deadline_rounds(seconds, timeout, limits_declared=False)
    assert (rounds.finished, rounds.lost) == (finished, lost)
    length = seconds + bill.p.DYNAMODB_SECONDS_PER_TASK
    assert rounds.seconds == (timeout if lost else pytest.approx(finished * length))
    declared = bill.deadline_rounds(seconds, bill.coworker_worker_timeout(seconds), limits_declared=True)
    assert declared.lost == 0 and declared.finished >= 1


def test_attempts_lost_at_the_deadline_cost_lambda_time_and_writes(bill, measured):
    sixty = workload(bill, 60.0)
    declared = bill.coworker_bill(measured, sixty)
    undeclared = bill.coworker_bill(measured, sixty, limits_declared=False)
    assert undeclared.lines["Lambda GB-s"] > declared.lines["Lambda GB-s"] * 1.2
    assert undeclared.lines["DynamoDB writes, tasks"] > declared.lines["DynamoDB writes, tasks"]


def test_an_idle_month_prices_one_run_a_minute_and_the_metrics_it_sends(bill, measured):
    idle = bill.coordinator_idle(measured)
    assert idle.lines["custom metrics"] == pytest.approx(bill.p.CLOUDWATCH_METRIC_MONTH)  # one metric
    runs = bill.p.COORDINATOR_RUNS_A_MONTH
    assert idle.lines["DynamoDB reads and writes"] == pytest.approx(
        runs * (20.0 * bill.p.DYNAMODB_READ_UNIT + 3.0 * bill.p.DYNAMODB_WRITE_UNIT))
    busy = bill.coordinator_busy(measured, bill.p.HOURS_A_MONTH)
    assert busy.lines["custom metrics"] == pytest.approx(len(bill.CUSTOM_METRICS) * bill.p.CLOUDWATCH_METRIC_MONTH)
    assert busy.total > idle.total


def test_every_scheduled_coordinator_run_is_traced(bill, measured):
    # Lambda's tracing keeps the first request of each second (and 5 % of the rest): a run a minute
    # is always the first of its second, so the idle month pays for every run's trace, not 5 %.
    idle = bill.coordinator_idle(measured)
    assert idle.lines["X-Ray"] == pytest.approx(bill.p.COORDINATOR_RUNS_A_MONTH * bill.p.XRAY_TRACE)  # $0.22
    hours = 17 / 60  # a job's 17 minutes of supervision: 17 runs
    assert bill.coordinator_busy(measured, hours).lines["X-Ray"] == pytest.approx(17 * bill.p.XRAY_TRACE)


def test_a_payload_on_the_record_adds_its_measured_units_to_each_write_and_beat(bill, measured):
    import dataclasses

    m = dataclasses.replace(measured, lock_beat_units=(0.0, 3.0, 4.0, 5.0),
                            payload_units={4096: (12.0, 4.0)}, bucket_units=(0.5, 0.0))
    sized = m.with_payload(4096)
    assert sized.own_write_units == 19.0
    assert sized.lock_beat_units == (0.0, 7.0, 12.0, 17.0)
    assert m.with_payload(None) is m
    unit = 1_000_000 * bill.p.DYNAMODB_WRITE_UNIT
    one_second = workload(bill, 1.0)
    on_record = bill.coworker_bill(sized, one_second)
    in_bucket = bill.coworker_bill(m.with_payload_in_bucket(), one_second, payload_in_bucket=True)
    assert on_record.lines["DynamoDB writes, tasks"] == pytest.approx(19.0 * unit)
    assert in_bucket.lines["DynamoDB writes, tasks"] == pytest.approx(7.5 * unit)
    assert in_bucket.lines["S3 payload requests"] == pytest.approx(1_000_000 * (bill.p.S3_PUT + bill.p.S3_GET))
    assert "S3 payload requests" not in on_record.lines


def test_sqs_bills_a_request_per_64_kb_a_batch_carries(bill):
    assert bill.sqs_requests_per_task(0) == pytest.approx(0.3)
    assert bill.sqs_requests_per_task(6 * 1024) == pytest.approx(0.3)  # 60 KB a batch of 10
    assert bill.sqs_requests_per_task(16 * 1024) == pytest.approx(0.3 + 2 * 2 / 10)  # 160 KB: 3 requests each


def test_tracking_running_tasks_per_invocation_drops_lock_heartbeats_and_bills_the_slots_records(bill, measured):
    import dataclasses

    tracked = bill.Tracked(own_write_units={11: 5.0, 64: 5.0}, write_ahead_units={11: 0.05, 64: 0.125},
                           slot_extension_units={11: 3.0, 64: 6.0}, fence_units=1.5, window=40)
    m = dataclasses.replace(measured, tracked=tracked).with_running_tracked_per_invocation(64)
    assert m.own_write_units == pytest.approx(5.125)
    assert m.lock_heartbeat_units(14) == 0.0  # a task's lock is its invocation's slot
    assert m.slot_extension_units == 6.0
    unit = 1_000_000 * bill.p.DYNAMODB_WRITE_UNIT
    five_minutes = workload(bill, 300.0)
    assert bill.coworker_bill(m, five_minutes).lines["DynamoDB writes, tasks"] == pytest.approx(5.125 * unit)
    built = bill.coworker_bill(measured, five_minutes)
    assert built.lines["DynamoDB writes, tasks"] == pytest.approx((7.0 + 14 * 3.0) * unit)
    # each invocation's slot beats cost twice as much with 64-character keys held
    assert (bill.coworker_bill(m, five_minutes).lines["DynamoDB writes, invocations"]
            > built.lines["DynamoDB writes, invocations"])


def test_a_two_hour_fargate_task_costs_what_the_vcpu_and_gb_hours_say(bill, measured):
    two_hours = workload(bill, 7200.0)
    size = bill.FargateTask(vcpu=1.0, memory_gb=2.0)
    hours = 1_000_000 * (7200 + bill.p.FARGATE_START_SECONDS) / 3600  # a Fargate task a job
    batch = bill.batch_bill(measured, two_hours, size)
    assert batch.lines["Fargate vCPU-hours"] == pytest.approx(hours * 1.0 * 0.03238)
    assert batch.lines["Fargate GB-hours"] == pytest.approx(hours * 2.0 * 0.00356)
    assert batch.lines["public IPv4 addresses"] == pytest.approx(hours * 0.005)  # the address it holds
    assert set(batch.lines) == {"Fargate vCPU-hours", "Fargate GB-hours", "public IPv4 addresses",
                                "CloudWatch Logs"}  # Batch costs nothing of its own
    private = bill.batch_bill(measured, two_hours, bill.FargateTask(public_ip=False))
    assert "public IPv4 addresses" not in private.lines
    # Coworker's runners feed themselves: 1,000 starts (one a runner slot) for the million tasks
    runner = bill.coworker_runner_bill(measured, two_hours, size)
    runner_hours = 1000 * (bill.p.FARGATE_START_SECONDS + 1000 * (7200 + bill.p.DYNAMODB_SECONDS_PER_TASK)) / 3600
    assert runner.lines["Fargate vCPU-hours"] == pytest.approx(runner_hours * 0.03238)
    assert runner.lines["Fargate GB-hours"] == pytest.approx(runner_hours * 2 * 0.00356)
    # a Fargate task is billed a minute at least
    short = bill.batch_bill(measured, workload(bill, 1.0), size)
    assert short.lines["Fargate vCPU-hours"] == pytest.approx(1_000_000 * 60 / 3600 * 0.03238)


def test_a_runner_pays_the_heartbeats_and_the_slot_of_a_lambda_worker(bill, measured):
    two_hours = workload(bill, 7200.0)
    runner = bill.coworker_runner_bill(measured, two_hours)
    unit = bill.p.DYNAMODB_WRITE_UNIT
    beats = 7200 // 20 - 1  # the lock is extended every 20 s while the task runs, not at its start
    assert runner.lines["DynamoDB writes, tasks"] == pytest.approx(
        1_000_000 * (7.0 + measured.lock_heartbeat_units(beats)) * unit)
    slot_beats = math.floor(1000 * (7200 + bill.p.DYNAMODB_SECONDS_PER_TASK) / 20)
    assert runner.lines["DynamoDB writes, runners"] == pytest.approx(1000 * (10.0 + 20.0 + slot_beats * 3.0) * unit)
    # tasks that come apart start a runner each: a Fargate start and a slot's writes a task
    apart = bill.coworker_runner_bill(measured, two_hours, tasks_per_start=1)
    assert apart.lines["Fargate vCPU-hours"] > runner.lines["Fargate vCPU-hours"]
    assert "1,000,000 runners" in apart.note


def test_distributed_map_with_ecs_pays_a_start_and_three_transitions_an_item_that_the_runner_does_not(
        bill, measured):
    size = bill.FargateTask()
    for seconds in (300.0, 1800.0):
        w = workload(bill, seconds)
        dmap = bill.distributed_map_ecs_bill(measured, w, size)
        runner = bill.coworker_runner_bill(measured, w, size)
        assert dmap.lines["parent state transitions"] + dmap.lines["standard child transitions"] == pytest.approx(
            1_000_000 * 3 * bill.p.STEP_FUNCTIONS_TRANSITION)  # $75 a million items
        fargate = sum(dmap.lines[line] for line in ("Fargate vCPU-hours", "Fargate GB-hours", "public IPv4 addresses"))
        runner_fargate = sum(runner.lines[line]
                             for line in ("Fargate vCPU-hours", "Fargate GB-hours", "public IPv4 addresses"))
        starts = (1_000_000 - 1000) * bill.p.FARGATE_START_SECONDS * size.hourly / 3600  # the runner starts 1,000
        assert fargate - runner_fargate == pytest.approx(starts, rel=0.01)
        assert dmap.total > runner.total
    # At 2 hours the runner's heartbeats (5 write units each 20 s) pass a 40-s start a task.
    two_hours = workload(bill, 7200.0)
    assert bill.coworker_runner_bill(measured, two_hours).total > bill.batch_bill(measured, two_hours).total
    even = bill.runner_break_even(measured, workload(bill, 1.0), bill.batch_bill)
    assert 1800 < even < 7200


@pytest.mark.parametrize("seconds", [1800.0, 7200.0])
def test_lambda_designs_are_not_available_beyond_lambdas_fifteen_minutes(bill, measured, seconds):
    w = workload(bill, seconds)
    for lambda_bill in (bill.coworker_bill(measured, w), bill.coworker_bill(measured, w, limits_declared=False),
                        bill.sqs_bill(measured, w), bill.cheapest_distributed_map(measured, w)):
        assert lambda_bill.lines == {} and lambda_bill.note == "n/a (longer than Lambda's 15 min)"
        assert bill._cell(lambda_bill).strip() == "n/a"
    for fargate_bill in (bill.coworker_runner_bill(measured, w), bill.distributed_map_ecs_bill(measured, w),
                         bill.batch_bill(measured, w)):
        assert fargate_bill.total > 0
    assert bill.coworker_bill(measured, workload(bill, 300.0)).total > 0  # 5 minutes: Lambda still runs it


def test_break_even_is_where_the_two_bills_meet(bill):
    assert bill.break_even(lambda s: 2 * s, lambda s: s + 10) == pytest.approx(10, abs=0.002)
    assert bill.break_even(lambda s: s, lambda s: 2 * s + 1) is None  # dearer at every length
    assert bill.break_even(lambda s: s + 10, lambda s: s) == 0.0  # never dearer


def test_fargate_costs_less_than_lambda_from_where_a_start_is_paid_back(bill, measured):
    size = bill.FargateTask()
    alone = bill.Workload(tasks=1_000_000, seconds=1.0, memory_gb=1.0, threads=1, concurrency=1000)
    even = bill.lambda_fargate_break_even(measured, alone, size, tasks_per_start=1)

    def costs(seconds: float) -> tuple[float, float]:
        w = bill.Workload(tasks=1_000_000, seconds=seconds, memory_gb=1.0, threads=1, concurrency=1000)
        return bill.coworker_bill(measured, w).total, bill.coworker_runner_bill(measured, w, size, 1, 1).total

    lambda_cost, fargate_cost = costs(even)
    assert fargate_cost <= lambda_cost
    assert fargate_cost == pytest.approx(lambda_cost, rel=1e-4)
    assert costs(even - 1)[1] > costs(even - 1)[0] and costs(even + 1)[1] < costs(even + 1)[0]
    # a second of Fargate is cheaper than one of 1 GB of Lambda: a start (40 s) is paid back by then
    lambda_hourly = bill.p.LAMBDA_GB_SECOND_ARM * 3600

    def paid_back(fargate) -> float:
        return bill.p.FARGATE_START_SECONDS * fargate.hourly / (lambda_hourly - fargate.hourly)

    # (each second Fargate rounds up moves it by hourly / (lambda_hourly - hourly): 13 s, 5 s without the address)
    assert even == pytest.approx(paid_back(size), abs=15)
    private = bill.FargateTask(public_ip=False)
    assert bill.lambda_fargate_break_even(measured, alone, private, 1) == pytest.approx(paid_back(private), abs=6)
    # with a deep backlog a runner's start is shared by 1,000 tasks: Fargate is cheaper almost at once
    assert bill.lambda_fargate_break_even(measured, alone, size) < 1
    # at 512 MB a second of Lambda costs less than one of 1 vCPU / 2 GB: Fargate never catches up
    assert bill.lambda_memory_like(size) == pytest.approx(size.hourly / 3600 / bill.p.LAMBDA_GB_SECOND_ARM)
    half = bill.Workload(tasks=1_000_000, seconds=1.0, memory_gb=0.5, threads=1, concurrency=1000)
    assert bill.lambda_fargate_break_even(measured, half, size) is None
