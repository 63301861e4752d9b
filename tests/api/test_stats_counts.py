"""GET /stats: counts by status that are exact up to the cap, flagged when there are more, and
whose reads are bounded by the cap whatever the backlog."""

from __future__ import annotations

import pytest
from coworker.data import index
from coworker.data.models import TaskModel
from coworker.engine import submit
from coworker.engine.tasks import TaskSpec

from tests.support.doubles import Api


def keys_on_one_shard(count: int, status: str = "todo") -> list[str]:
    """``count`` task keys that all land on the first index shard of ``status``."""
    first = TaskModel.shard_value_of("k-0", status)
    keys = (f"k-{number}" for number in range(100_000))
    return [key for key in keys if TaskModel.shard_value_of(key, status) == first][:count]


@pytest.fixture
def reads(monkeypatch):
    """The limit of every count query, by index partition."""
    asked: list[tuple[str, int]] = []
    real = index._count_page

    def counted(value, limit, start):
        asked.append((value, limit))
        return real(value, limit, start)

    monkeypatch.setattr(index, "_count_page", counted)
    return asked


def test_a_count_below_the_cap_is_exact_however_unevenly_the_shards_hold_it(settings, reads):
    api = Api(settings)
    for key in keys_on_one_shard(12):  # every task on one of the 4 shards: a quarter of the cap each is not enough
        submit.put_task(TaskSpec(key=key, type="quick"), settings)

    exact = api.call("GET", "/stats?cap=12")[1]["counts"]["todo"]
    over = api.call("GET", "/stats?cap=11")[1]["counts"]["todo"]

    assert exact == {"count": 12, "capped": False}  # exactly the cap: not "at least"
    assert over == {"count": 11, "capped": True}  # more than the cap: a lower bound, and said so
    # the shard holding them went on with what the empty ones left of the budget
    assert max(limit for _, limit in reads) > 12 // 4 + 1


def test_a_large_backlog_reads_about_the_cap_in_one_round_and_says_it_is_a_lower_bound(settings, reads):
    api = Api(settings)
    for number in range(60):
        submit.put_task(TaskSpec(key=f"t-{number}", type="quick"), settings)
    shards = settings.status_shards

    status, stats, _ = api.call("GET", "/stats?cap=20")

    assert status == 200 and stats["counts"]["todo"] == {"count": 20, "capped": True}
    assert stats["cap"] == 20 and "at least" in stats["note"]
    todo = [limit for value, limit in reads if value.startswith("todo#")]
    assert len(todo) == shards and sum(todo) <= 21 + shards  # one round, the cap and one more
    # each status was counted, every shard of each in the same round
    assert {value.split("#")[0] for value, _ in reads} == {"todo", "processing", "failed", "ignored"}
    assert {"count": 0, "capped": False} == stats["counts"]["ignored"]
