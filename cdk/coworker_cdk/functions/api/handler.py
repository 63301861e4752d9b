"""API Lambda: API Gateway (REST, Lambda proxy) -> the task API's Powertools resolver."""

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext
from coworker.api.app import create_app
from coworker.bootstrap import configure
from coworker.engine.dispatch import invoker_from_settings
from coworker.observability import logger, metrics, tracer

SETTINGS = configure()
# Tasks put with free worker slots start at once (dispatch on submit).
app = create_app(SETTINGS, invoker_from_settings(SETTINGS))


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict, context: LambdaContext) -> dict:
    return app.resolve(event, context)
