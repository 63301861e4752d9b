"""Deployment settings read once from CDK context, validated, and passed inward as values.

Library settings (concurrency, batch size, timeouts...) are validated by the library's own
:class:`coworker.config.Settings`, so a value the functions would reject fails at synth time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from constructs import Node
from coworker.config import Settings
from coworker.errors import ConfigurationError

from infra import constants as c

# Context key -> Settings field, for the values that go straight to the functions.
_SETTINGS_CONTEXT: dict[str, str] = {
    c.CTX_WORKER_TIMEOUT: "worker_timeout_seconds",
    c.CTX_MAX_CONCURRENCY: "max_concurrency",
    c.CTX_BATCH_SIZE: "batch_size",
    c.CTX_MAX_ATTEMPTS: "max_attempts",
    c.CTX_LOCK_SECONDS: "lock_seconds",
    c.CTX_TICKS_PER_INVOCATION: "ticks_per_invocation",
    c.CTX_TICK_SECONDS: "tick_seconds",
    c.CTX_RETENTION_DAYS: "retention_days",
    c.CTX_HANDLER_MODULES: "handler_modules",
}
# Environment variables that Lambda reserves or that make no sense in AWS.
_NOT_IN_LAMBDA_ENV = {"AWS_REGION", "COWORKER_DYNAMODB_ENDPOINT"}


@dataclass(frozen=True)
class StackConfig:
    """Everything the constructs need from the deployer, with defaults applied."""

    settings: Settings
    destroy_on_removal: bool
    install_layer_dependencies: bool
    worker_memory_mb: int
    coordinator_memory_mb: int
    api_memory_mb: int
    schedule_minutes: int
    log_level: str
    api_rate_limit: int
    api_burst_limit: int
    api_cloudwatch_role: bool
    alarm_email: str | None
    alarm_topic_arn: str | None

    @property
    def worker_reserved_concurrency(self) -> int:
        """Workers needed for ``max_concurrency`` tasks at ``batch_size`` tasks per worker."""
        return math.ceil(self.settings.max_concurrency / self.settings.batch_size)

    @property
    def coordinator_timeout_seconds(self) -> int:
        busy = math.ceil(self.settings.ticks_per_invocation * self.settings.tick_seconds)
        return min(c.LAMBDA_MAX_TIMEOUT_SECONDS, busy + c.COORDINATOR_TIMEOUT_SLACK_SECONDS)

    @property
    def worker_max_event_age_seconds(self) -> int:
        # A worker event that waited longer than the lock lives finds its claim taken over
        # by the coordinator anyway; dropping it (to the DLQ) is cheaper than running it.
        age = self.settings.effective_lock_seconds
        return max(c.MIN_EVENT_AGE_SECONDS, min(c.MAX_EVENT_AGE_SECONDS, age))

    def function_environment(self, **overrides: Any) -> dict[str, str]:
        """Environment of a function: the library settings plus Powertools settings.

        ``overrides`` are Settings fields known only at deploy time (table name, worker name).
        """
        settings = self.settings.model_copy(update=overrides)
        env = {k: v for k, v in settings.as_environment().items() if k not in _NOT_IN_LAMBDA_ENV}
        env.update(
            POWERTOOLS_SERVICE_NAME=c.SERVICE_NAME,
            POWERTOOLS_METRICS_NAMESPACE=c.METRICS_NAMESPACE,
            POWERTOOLS_LOG_LEVEL=self.log_level,
        )
        return env

    @classmethod
    def from_context(cls, node: Node) -> StackConfig:
        """Read and validate the context of ``node`` (raises ConfigurationError)."""

        def get(key: str, default: Any = None) -> Any:
            value = node.try_get_context(key)
            return default if value is None or value == "" else value

        values = {field: get(key) for key, field in _SETTINGS_CONTEXT.items()}
        settings = Settings.from_env({}, **{k: v for k, v in values.items() if v is not None})

        removal = str(get(c.CTX_REMOVAL_POLICY, c.REMOVAL_RETAIN)).lower()
        if removal not in (c.REMOVAL_RETAIN, c.REMOVAL_DESTROY):
            raise ConfigurationError(
                f"context {c.CTX_REMOVAL_POLICY} must be retain or destroy, not {removal!r}"
            )
        deps = str(get(c.CTX_LAYER_DEPENDENCIES, c.LAYER_DEPS_INSTALL)).lower()
        if deps not in (c.LAYER_DEPS_INSTALL, c.LAYER_DEPS_SKIP):
            raise ConfigurationError(
                f"context {c.CTX_LAYER_DEPENDENCIES} must be install or skip, not {deps!r}"
            )
        schedule = int(get(c.CTX_SCHEDULE_MINUTES, c.DEFAULT_SCHEDULE_MINUTES))
        if schedule < 1:
            raise ConfigurationError(f"context {c.CTX_SCHEDULE_MINUTES} must be at least 1")
        return cls(
            settings=settings,
            destroy_on_removal=removal == c.REMOVAL_DESTROY,
            install_layer_dependencies=deps == c.LAYER_DEPS_INSTALL,
            worker_memory_mb=int(get(c.CTX_WORKER_MEMORY, c.DEFAULT_WORKER_MEMORY_MB)),
            coordinator_memory_mb=int(get(c.CTX_COORDINATOR_MEMORY, c.DEFAULT_COORDINATOR_MEMORY_MB)),
            api_memory_mb=int(get(c.CTX_API_MEMORY, c.DEFAULT_API_MEMORY_MB)),
            schedule_minutes=schedule,
            log_level=str(get(c.CTX_LOG_LEVEL, c.DEFAULT_LOG_LEVEL)).upper(),
            api_rate_limit=int(get(c.CTX_API_RATE_LIMIT, c.DEFAULT_API_RATE_LIMIT)),
            api_burst_limit=int(get(c.CTX_API_BURST_LIMIT, c.DEFAULT_API_BURST_LIMIT)),
            api_cloudwatch_role=_as_bool(get(c.CTX_API_CLOUDWATCH_ROLE, True)),
            alarm_email=get(c.CTX_ALARM_EMAIL),
            alarm_topic_arn=get(c.CTX_ALARM_TOPIC),
        )


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")
