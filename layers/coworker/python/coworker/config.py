"""One place for configuration: every setting, its environment variable and its default.

Lambda functions, the local runtime and the tests all build a :class:`Settings` with
:meth:`Settings.from_env` (or directly, with keyword arguments) and pass plain values inward.
The README's settings table is generated from :data:`Settings.model_fields`' descriptions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from coworker.errors import ConfigurationError
from coworker.schema import DEFAULT_TABLE_NAME


class Settings(BaseModel):
    """Validated settings of one Coworker process (a Lambda function or the local runtime)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    table_name: str = Field(DEFAULT_TABLE_NAME, alias="COWORKER_TABLE_NAME",
                            description="DynamoDB table holding the tasks.")
    dynamodb_endpoint: str | None = Field(None, alias="COWORKER_DYNAMODB_ENDPOINT",
                                          description="DynamoDB endpoint URL; unset means AWS itself.")
    region: str = Field("us-east-1", alias="AWS_REGION", description="AWS region.")
    max_concurrency: int = Field(10, ge=1, le=10_000, alias="COWORKER_MAX_CONCURRENCY",
                                 description="Most tasks running at once, across all workers.")
    batch_size: int = Field(5, ge=1, le=100, alias="COWORKER_BATCH_SIZE",
                            description="Task keys per worker invocation (run in parallel threads).")
    worker_timeout_seconds: int = Field(300, ge=3, le=900, alias="COWORKER_WORKER_TIMEOUT_SECONDS",
                                        description="Worker invocation time limit (the Lambda timeout).")
    lock_seconds: int | None = Field(None, ge=5, alias="COWORKER_LOCK_SECONDS",
                                     description="Lock lifetime of a claim; default worker timeout + 30 s.")
    timeout_margin_seconds: float = Field(5.0, ge=0.5, alias="COWORKER_TIMEOUT_MARGIN_SECONDS",
                                          description="Time kept back before the worker's deadline "
                                                      "to record a timeout and release the lock.")
    max_attempts: int = Field(3, ge=1, le=100, alias="COWORKER_MAX_ATTEMPTS",
                              description="Default attempt ceiling; a task failing this often is ignored.")
    backoff_base_seconds: float = Field(5.0, ge=0, alias="COWORKER_BACKOFF_BASE_SECONDS",
                                        description="First retry delay; doubles each attempt, full jitter.")
    backoff_max_seconds: float = Field(600.0, ge=0, alias="COWORKER_BACKOFF_MAX_SECONDS",
                                       description="Ceiling of the retry delay.")
    error_history: int = Field(5, ge=1, le=50, alias="COWORKER_ERROR_HISTORY",
                               description="How many recent errors a task keeps.")
    retention_days: float = Field(0, ge=0, alias="COWORKER_RETENTION_DAYS",
                                  description="Days a finished task is kept before TTL deletes it; 0 keeps it forever.")
    tick_seconds: float = Field(60.0, gt=0, alias="COWORKER_TICK_SECONDS",
                                description="Time between coordinator ticks within one invocation.")
    ticks_per_invocation: int = Field(1, ge=1, le=60, alias="COWORKER_TICKS_PER_INVOCATION",
                                      description="Coordinator ticks per scheduled invocation "
                                                  "(EventBridge runs at most once a minute).")
    worker_function: str | None = Field(None, alias="COWORKER_WORKER_FUNCTION",
                                        description="Name or ARN of the worker Lambda (coordinator only).")
    handler_modules: str = Field("coworker.examples", alias="COWORKER_HANDLER_MODULES",
                                 description="Comma-separated modules that register task handlers.")

    @model_validator(mode="after")
    def _lock_outlives_worker(self) -> Settings:
        if self.lock_seconds is not None and self.lock_seconds <= self.worker_timeout_seconds:
            raise ValueError(
                f"COWORKER_LOCK_SECONDS ({self.lock_seconds}) must be longer than "
                f"COWORKER_WORKER_TIMEOUT_SECONDS ({self.worker_timeout_seconds}), "
                "or a live worker could lose its lock"
            )
        if self.timeout_margin_seconds >= self.worker_timeout_seconds:
            raise ValueError("COWORKER_TIMEOUT_MARGIN_SECONDS must be shorter than the worker timeout")
        return self

    @property
    def effective_lock_seconds(self) -> int:
        """Lock lifetime: explicit setting, or the worker timeout plus 30 s of slack."""
        return self.lock_seconds if self.lock_seconds is not None else self.worker_timeout_seconds + 30

    @property
    def handler_module_list(self) -> list[str]:
        return [name.strip() for name in self.handler_modules.split(",") if name.strip()]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read settings from environment variables (unset ones take their defaults)."""
        environ = os.environ if environ is None else environ
        aliases = {field.alias for field in cls.model_fields.values()}
        values: dict[str, Any] = {name: environ[name] for name in aliases if environ.get(name, "") != ""}
        if "AWS_REGION" not in values and environ.get("AWS_DEFAULT_REGION"):
            values["AWS_REGION"] = environ["AWS_DEFAULT_REGION"]
        values.update({cls.model_fields[k].alias or k: v for k, v in overrides.items()})
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ConfigurationError(f"invalid Coworker settings: {exc}") from exc

    def as_environment(self) -> dict[str, str]:
        """The environment variables that reproduce these settings (for Lambda or subprocesses)."""
        return {
            (field.alias or name): str(getattr(self, name))
            for name, field in type(self).model_fields.items()
            if getattr(self, name) is not None
        }
