"""What a deployment can run: tasks at once, and tasks per second for a task length, from its
settings and DynamoDB's write limits.

One place for the arithmetic that ``cdk synth`` prints, that ``benchmarks/scale_model.py`` and
``benchmarks/bill.py`` start from, and that docs/cost.md quotes, so none of them can speak of
another deployment than the template's. The defaults are :class:`coworker.config.Settings`' own,
which the stack deploys unless told otherwise (tests/infra/test_stack.py holds them equal).

The rate is the lowest of three ceilings:

=================  ======================================================================
workers            ``max_concurrency / (task seconds + DYNAMODB_SECONDS_PER_TASK)``
on-demand table    ``write units / writes per task``: a new on-demand table and its index
                   each take 4,000 write units/s at once (or the warm throughput given);
                   the index takes 4 a task, the table 3. On-demand raises this later,
                   to twice a peak it held 30 minutes, not during a first big run.
status shards      ``shards x 1,000 / 2``: a status's writes spread over its shards, and
                   each key value takes 1,000 write units/s; ``todo`` takes 2 a task (the
                   put and the claim), ``processing`` 2 (the claim and the finish)
=================  ======================================================================

Writes a task are measured by ``benchmarks/scale_model.py`` on the real engine (put, claim and
finish: 1 table unit each; index: todo 1 + 1, processing 1 + 1). Reads, heartbeats, retries
and a worker invocation's own slot writes (10 units per invocation, not per task) are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from coworker.config import Settings

# DynamoDB's limits (docs.aws.amazon.com/amazondynamodb: "Warm throughput", "Throughput capacity").
PARTITION_WRITE_UNITS: Final = 1_000  # per second per partition key value, table or index
NEW_ON_DEMAND_WRITE_UNITS: Final = 4_000  # a new on-demand table (and each index) at once
# A task's lifecycle (put, claim, finish), measured write units.
TABLE_WRITES_PER_TASK: Final = 3
INDEX_WRITES_PER_TASK: Final = 4
STATUS_KEY_WRITES_PER_TASK: Final = 2  # on the busiest status (todo, and processing alike)
# A task's own round trips inside the worker (claim and finish), on AWS in the same region.
DYNAMODB_SECONDS_PER_TASK: Final = 0.02

# The template's defaults: Settings' fields, which the stack passes on unchanged.
DEFAULT_MAX_CONCURRENCY: Final[int] = Settings.model_fields["max_concurrency"].default
DEFAULT_BATCH_SIZE: Final[int] = Settings.model_fields["batch_size"].default
DEFAULT_STATUS_SHARDS: Final[int] = Settings.model_fields["status_shards"].default
DEFAULT_TICK_SECONDS: Final[float] = Settings.model_fields["tick_seconds"].default

WORKERS, TABLE, SHARDS = "workers", "on-demand table", "status shards"


@dataclass(frozen=True)
class Capacity:
    """What one deployment's Lambda workers and task table can carry."""

    max_concurrency: int = DEFAULT_MAX_CONCURRENCY  # tasks at once
    batch_size: int = DEFAULT_BATCH_SIZE  # threads of a worker invocation
    status_shards: int = DEFAULT_STATUS_SHARDS
    warm_write_units: int | None = None  # the table's and the index's pre-warmed write units/s

    @classmethod
    def of(cls, settings: Settings, warm_write_units: int | None = None) -> Capacity:
        """The capacity of a deployment with these settings."""
        return cls(settings.max_concurrency, settings.batch_size, settings.status_shards, warm_write_units)

    @property
    def worker_invocations(self) -> int:
        """Worker invocations at once (the worker's reserved concurrency)."""
        return math.ceil(self.max_concurrency / self.batch_size)

    @property
    def write_units(self) -> int:
        """Write units per second the table, and its index, take from the start."""
        return max(NEW_ON_DEMAND_WRITE_UNITS, self.warm_write_units or 0)

    def ceilings(self, task_seconds: float) -> dict[str, float]:
        """Tasks per second each limit allows, for tasks of ``task_seconds``."""
        per_task = max(TABLE_WRITES_PER_TASK, INDEX_WRITES_PER_TASK)
        return {
            WORKERS: self.max_concurrency / (task_seconds + DYNAMODB_SECONDS_PER_TASK),
            TABLE: self.write_units / per_task,
            SHARDS: self.status_shards * PARTITION_WRITE_UNITS / STATUS_KEY_WRITES_PER_TASK,
        }

    def tasks_per_second(self, task_seconds: float) -> float:
        """Tasks per second for tasks of ``task_seconds``: the lowest ceiling."""
        return min(self.ceilings(task_seconds).values())

    def bound_by(self, task_seconds: float) -> str:
        """The limit that sets the rate for tasks of ``task_seconds``."""
        ceilings = self.ceilings(task_seconds)
        return min(ceilings, key=lambda name: ceilings[name])

    def hours_for(self, tasks: int, task_seconds: float) -> float:
        """Hours ``tasks`` tasks of ``task_seconds`` take at :meth:`tasks_per_second`."""
        return tasks / self.tasks_per_second(task_seconds) / 3600

    def describe(self) -> str:
        """One paragraph: what this deployment runs, as ``cdk synth`` says it."""
        table = (f"a table pre-warmed to {self.write_units:,} write units/s" if self.warm_write_units
                 else f"a new on-demand table ({self.write_units:,} write units/s until on-demand scales up)")

        def rate(seconds: float) -> str:
            return f"{self.tasks_per_second(seconds):,.0f} tasks/s of {_length(seconds)} tasks " \
                   f"(bound by the {self.bound_by(seconds)})"

        return (f"Coworker runs {self.max_concurrency:,} tasks at once ({self.worker_invocations:,} worker invocations "
                f"x {self.batch_size} threads): {rate(1.0)}, {rate(0.05)}, with {table} and {self.status_shards} "
                f"status shards; 1,000,000 1-s tasks take {_duration(self.hours_for(1_000_000, 1.0))}. maxConcurrency, "
                "warmWriteUnits and statusShards raise these (docs/cost.md); assumes 3 table and 4 index write "
                f"units a task, {DYNAMODB_SECONDS_PER_TASK * 1000:.0f} ms of DynamoDB round trips a task, and "
                "the account's Lambda quota")


def _duration(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def _length(seconds: float) -> str:
    return f"{seconds * 1000:.0f}-ms" if seconds < 1 else f"{seconds:g}-s"
