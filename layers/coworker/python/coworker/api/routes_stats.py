"""Route of counts (``GET /stats``): index entries by status, at most a cap each."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.router import APIGatewayRouter

from coworker.api.errors import responses
from coworker.api.models import StatsOut, StatusCount
from coworker.api.services import Services
from coworker.data import index
from coworker.data.models import TaskStatus

DEFAULT_STATS_CAP = 1000
# At most 4 statuses x 2,500 index entries (a few hundred bytes each): about 10,000 entries and a
# few hundred read units per request, whatever the backlog.
MAX_STATS_CAP = 2_500
INDEXED_STATUSES = (TaskStatus.TODO, TaskStatus.PROCESSING, TaskStatus.FAILED, TaskStatus.IGNORED)


def router(services: Services) -> APIGatewayRouter:
    """The stats route of one app (it needs nothing of ``services``: counts read the index)."""
    routes = APIGatewayRouter()

    @routes.get("/stats", summary="Counts by status (bounded)", tags=["stats"],
                responses=responses("Counts by status"))
    def stats(
        cap: Annotated[int, Query(ge=1, le=MAX_STATS_CAP,
                                  description="Most entries counted per status.")] = DEFAULT_STATS_CAP,
    ) -> StatsOut:
        return count_by_status(cap)

    return routes


def count_by_status(cap: int) -> StatsOut:
    """Index entries of each indexed status, at most ``cap`` each; finished tasks are not counted."""
    counts: dict[str, StatusCount] = {}
    for status in INDEXED_STATUSES:
        count, capped = index.count_capped(status.value, cap)
        counts[status.value] = StatusCount(count=count, capped=capped)
    counts[TaskStatus.FINISHED.value] = StatusCount(count=None, capped=False)
    return StatsOut(counts=counts, cap=cap, note=(
        "todo, processing, failed and ignored are counted from the status index (eventually "
        f"consistent), at most {cap} each: capped means 'at least count'. finished tasks are not "
        "in the index and are not counted here; see GET /batches/{id} for a batch's finished count."))
