"""What a deployment can run (coworker.capacity): the lowest of the workers', the new on-demand
table's and the status shards' ceilings, as docs/cost.md and `cdk synth` give them."""

from __future__ import annotations

import pytest
from coworker.capacity import SHARDS, TABLE, WORKERS, Capacity
from coworker.config import Settings


def test_the_default_deployment_runs_120_at_once_and_is_bound_by_dynamodb_at_50_ms() -> None:
    deployed = Capacity.of(Settings())
    assert (deployed.max_concurrency, deployed.worker_invocations, deployed.status_shards) == (120, 12, 4)
    assert deployed.tasks_per_second(1.0) == pytest.approx(120 / 1.02)
    assert deployed.bound_by(1.0) == WORKERS
    assert deployed.hours_for(1_000_000, 1.0) == pytest.approx(1e6 * 1.02 / 120 / 3600)  # about 2.4 h
    # 120 / 0.07 s would be 1,714 tasks/s; a new table's 4,000 write units at 4 index units a task hold 1,000.
    assert deployed.tasks_per_second(0.05) == 1_000 and deployed.bound_by(0.05) == TABLE


def test_the_options_that_reach_1000_tasks_per_second() -> None:
    wider = Capacity(max_concurrency=1020)
    assert wider.tasks_per_second(1.0) == pytest.approx(1_000)
    warm = Capacity(max_concurrency=1020, warm_write_units=10_000)
    assert warm.tasks_per_second(0.05) == 2_000 and warm.bound_by(0.05) == SHARDS  # 4 x 1,000 / 2
    assert Capacity(1020, 10, 8, 10_000).tasks_per_second(0.05) == 2_500  # then the table again


def test_an_unsharded_index_holds_500_tasks_per_second() -> None:
    assert Capacity(max_concurrency=1020, status_shards=1).tasks_per_second(1.0) == 500
