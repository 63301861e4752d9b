"""Worker Lambda: invoked asynchronously with {"keys": [...], "slot": ..., "token": ...}."""

import time

from aws_lambda_powertools.utilities.typing import LambdaContext
from coworker.bootstrap import configure
from coworker.engine.worker import WorkerRequest, run_invocation
from coworker.observability import logger, metrics, tracer

SETTINGS = configure()


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: LambdaContext) -> dict:
    deadline = time.monotonic() + context.get_remaining_time_in_millis() / 1000
    request = WorkerRequest.from_event(event)
    reports = run_invocation(request, context.aws_request_id, SETTINGS, deadline)
    outcomes: dict[str, int] = {}
    for report in reports:
        outcomes[report.outcome.value] = outcomes.get(report.outcome.value, 0) + 1
    return {"tasks": len(reports), "outcomes": outcomes}
