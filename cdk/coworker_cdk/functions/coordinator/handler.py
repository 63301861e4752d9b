"""Coordinator Lambda: started every minute by EventBridge; supervises dispatch for that minute,
or ends after its first tick when nothing runs or is due (COWORKER_IDLE_EXIT)."""

import dataclasses

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from coworker.bootstrap import configure
from coworker.engine.dispatch import LambdaInvoker, invoker_from_settings, supervise
from coworker.engine.runners import launcher_from_settings
from coworker.errors import ConfigurationError
from coworker.observability import logger, metrics, tracer

SETTINGS = configure()
_INVOKER = invoker_from_settings(SETTINGS)
if _INVOKER is None:
    raise ConfigurationError("COWORKER_WORKER_FUNCTION must name the worker Lambda")
INVOKER: LambdaInvoker = _INVOKER
LAUNCHER = launcher_from_settings(SETTINGS)  # container runners, when the stack has them


@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE, clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: LambdaContext) -> dict:
    reports = supervise(SETTINGS, INVOKER, lambda: context.get_remaining_time_in_millis() / 1000, launcher=LAUNCHER)
    return {"ticks": len(reports), "started": sum(r.invocations for r in reports),
            "runners_started": sum(r.runners_started for r in reports),
            "last": dataclasses.asdict(reports[-1]) if reports else None}
