"""Coordinator Lambda: run by an EventBridge schedule; dispatches due tasks to the worker."""

import dataclasses

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from coworker.bootstrap import configure
from coworker.dispatch import LambdaInvoker, run_ticks
from coworker.errors import ConfigurationError
from coworker.observability import logger, metrics, tracer

SETTINGS = configure()
if not SETTINGS.worker_function:
    raise ConfigurationError("COWORKER_WORKER_FUNCTION must name the worker Lambda")
INVOKER = LambdaInvoker(SETTINGS.worker_function, SETTINGS.region)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE, clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: LambdaContext) -> dict:
    reports = run_ticks(SETTINGS, INVOKER, lambda: context.get_remaining_time_in_millis() / 1000)
    return {"ticks": [dataclasses.asdict(report) for report in reports]}
