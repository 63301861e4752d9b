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
    c.CTX_HEARTBEAT_SECONDS: "heartbeat_seconds",
    c.CTX_RESERVATION_SECONDS: "reservation_seconds",
    c.CTX_TICK_SECONDS: "tick_seconds",
    c.CTX_SUPERVISE_SECONDS: "supervise_seconds",
    c.CTX_DISPATCH_ON_SUBMIT: "dispatch_on_submit",  # a bool: pydantic reads "true" / "false"
    c.CTX_RETENTION_DAYS: "retention_days",
    c.CTX_HANDLER_MODULES: "handler_modules",
}
# Context keys that no longer exist -> what replaced them (a stale cdk.json fails loudly).
_RETIRED_CONTEXT: dict[str, str] = {
    "ticksPerInvocation": f"{c.CTX_SUPERVISE_SECONDS} (a coordinator run ticks every "
    f"{c.CTX_TICK_SECONDS} for that long)",
}
# Environment variables that Lambda reserves or that make no sense in AWS.
_NOT_IN_LAMBDA_ENV = {"AWS_REGION", "COWORKER_DYNAMODB_ENDPOINT", "COWORKER_LAMBDA_ENDPOINT"}


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
        """Exactly the library's worker slots, ``ceil(max_concurrency / batch_size)``.

        The coordinator and the API start a worker only into a reserved slot, so they never
        start more; a stale invocation whose slot was given away exits at once.
        """
        return self.settings.worker_slots

    @property
    def coordinator_timeout_seconds(self) -> int:
        """One run supervises for ``supervise_seconds``, plus slack to start and wind down."""
        busy = math.ceil(self.settings.supervise_seconds)
        return min(c.LAMBDA_MAX_TIMEOUT_SECONDS, busy + c.COORDINATOR_TIMEOUT_SLACK_SECONDS)

    @property
    def worker_max_event_age_seconds(self) -> int:
        # A worker event older than its slot reservation finds the slot given away and exits
        # at once; dropping it (to the DLQ) is cheaper than starting it.
        age = self.settings.reservation_seconds
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

        for key, replacement in _RETIRED_CONTEXT.items():
            if get(key) is not None:
                raise ConfigurationError(f"context {key} was removed; use {replacement}")
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
