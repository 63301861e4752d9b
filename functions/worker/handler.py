"""Worker Lambda: invoked asynchronously by the coordinator with {"keys": [...]}."""

import time

from aws_lambda_powertools.utilities.typing import LambdaContext
from coworker.bootstrap import configure
from coworker.observability import logger, metrics, tracer
from coworker.worker import run_batch

SETTINGS = configure()


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: LambdaContext) -> dict:
    deadline = time.monotonic() + context.get_remaining_time_in_millis() / 1000
    reports = run_batch(event.get("keys", []), context.aws_request_id, SETTINGS, deadline)
    return {"outcomes": {report.key: report.outcome.value for report in reports}}
