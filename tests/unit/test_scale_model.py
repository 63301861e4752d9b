"""The scale model's simulation (benchmarks/scale_model.py): DynamoDB's per-partition-key limit
throttles an unsharded status index at 1,000 tasks/s and not a sharded one; on-demand capacity
and warm throughput behave as documented. Fed with hand-made per-task writes (the script itself
measures them on the real engine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
scale_model = pytest.importorskip("scale_model")

# What the engine writes per task (as measured: put, claim and finish, 1 table unit each).
WRITES = scale_model.TaskWrites(
    table={"put": 1.0, "claim": 1.0, "finish": 1.0},
    index={"put": {"todo": 1.0}, "claim": {"todo": 1.0, "processing": 1.0}, "finish": {"processing": 1.0}},
    batch_item={},
)


def run(shards: int, warm: float | None = None, tasks: int = 200_000, submit_rate: float = 1_000.0):
    return scale_model.simulate(WRITES, tasks=tasks, rate=1_000, task_seconds=1.0, shards=shards,
                                batch_size=10, submit_rate=submit_rate, account_concurrency=1_000,
                                tick_seconds=5.0, warm_write_units=warm, batched=False)


def test_an_unsharded_index_throttles_at_1000_tasks_per_second_and_a_sharded_one_does_not():
    unsharded, sharded = run(1), run(4)
    assert unsharded.throttled_by_key > 0 and unsharded.peak_partition_demand > 1_000
    assert sharded.throttled_by_key == 0 and sharded.peak_partition_demand <= 1_000
    assert sharded.drained_at < unsharded.drained_at
    assert sharded.tick_queries == 13 and unsharded.tick_queries == 4


def test_a_cold_table_caps_a_fast_start_and_warm_throughput_lifts_it():
    cold, warm = run(4, submit_rate=2_000), run(4, warm=10_000, submit_rate=2_000)
    assert cold.throttled_by_capacity > 0 and warm.throttled_by_capacity == 0
    assert warm.drained_at <= cold.drained_at
    assert warm.drained_at == pytest.approx(200, abs=15)  # 200,000 tasks at about 1,000/s


def _wide_batch(head_writes_per_task: float, submit_rate: float = 1_000.0):
    batched = scale_model.TaskWrites(WRITES.table, WRITES.index, batch_item={"put": head_writes_per_task})
    return scale_model.simulate(batched, tasks=100_000, rate=1_000, task_seconds=1.0, shards=4,
                                batch_size=10, submit_rate=submit_rate, account_concurrency=1_000,
                                tick_seconds=5.0, warm_write_units=10_000, batched=True)


def test_a_wide_batch_put_in_requests_of_many_tasks_has_no_hot_item():
    outcome = _wide_batch(head_writes_per_task=0.01)  # one head update per 100 tasks
    assert outcome.throttled_by_key == 0 and outcome.peak_partition_status != "batch item"


def test_a_wide_batch_put_one_task_per_request_makes_its_head_item_hot():
    outcome = _wide_batch(head_writes_per_task=1.0, submit_rate=2_000)
    assert outcome.peak_partition_status == "batch item" and outcome.throttled_by_key > 0
