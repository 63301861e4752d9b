"""Route of counts (``GET /stats``): index entries by status, at most a cap each."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from coworker.api.errors import responses
from coworker.api.models import StatsOut, StatusCount
from coworker.api.services import Services
from coworker.data import index, layout
from coworker.data.models import TaskStatus, status_shards

DEFAULT_STATS_CAP = 1000
# Index entries counted per status at most: 4 statuses x 1,001 entries (and one more per shard)
# per request, a few hundred read units whatever the backlog. Counting every shard of every status
# at once, Select=COUNT, GET /stats answers in 0.40 s (median of 7, 0.53 s at most) at 100,000
# tasks on DynamoDB Local with the machine loaded (load average over 20 on 2 cores); counted a
# status after another, keys read, it took 0.71 s, and 1.8 s at a cap of 2,500 (0.92 s counted
# at once: hence the lower bound). benchmarks/stats_counts.py measures it.
MAX_STATS_CAP = 1_000
# The largest cap the query takes: a larger cap than MAX_STATS_CAP counts MAX_STATS_CAP, and the
# answer's cap says so (clients written when up to 2,500 were counted keep working).
MAX_STATS_CAP_ASKED = 2_500
INDEXED_STATUSES = (TaskStatus.TODO, TaskStatus.PROCESSING, TaskStatus.FAILED, TaskStatus.IGNORED)


def router(services: Services) -> APIGatewayRouter:
    """The stats route of one app (it needs nothing of ``services``: counts read the index)."""
    routes = APIGatewayRouter()

    @routes.get("/stats", summary="Counts by status (bounded)", tags=["stats"],
                responses=responses("Counts by status"))
    def stats(
        cap: Annotated[int, Query(ge=1, le=MAX_STATS_CAP_ASKED,
                                  description=f"Most entries counted per status; at most {MAX_STATS_CAP:,} are "
                                              "(a larger cap counts that many: the answer's cap says which "
                                              "was used).")] = DEFAULT_STATS_CAP,
    ) -> StatsOut:
        return count_by_status(min(cap, MAX_STATS_CAP))

    return routes


def count_by_status(cap: int) -> StatsOut:
    """Index entries of each indexed status, at most ``cap`` each, every shard of every status
    counted at once (:func:`coworker.data.index.count_exactly_up_to`); finished tasks are not
    counted."""
    found = index.count_exactly_up_to(
        {status.value: layout.shard_values(status.value, status_shards()) for status in INDEXED_STATUSES}, cap)
    counts = {status: StatusCount(count=count, capped=capped) for status, (count, capped) in found.items()}
    counts[TaskStatus.FINISHED.value] = StatusCount(count=None, capped=False)
    return StatsOut(counts=counts, cap=cap, note=(
        "todo, processing, failed and ignored are counted from the status index (eventually "
        f"consistent), at most {cap} each: capped means there are more, at least count. finished tasks are "
        "not in the index and are not counted here; see GET /batches/{id} for a batch's finished count."))
