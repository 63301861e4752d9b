"""One place for configuration: every setting, its environment variable and its default.

Lambda functions, the local runtime and the tests all build a :class:`Settings` with
:meth:`Settings.from_env` (or directly, with keyword arguments) and pass plain values inward.
The README's settings table is generated from :data:`Settings.model_fields`' descriptions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from coworker.data.layout import DEFAULT_STATUS_SHARDS, DEFAULT_TABLE_NAME, MAX_STATUS_SHARDS
from coworker.errors import ConfigurationError

# The example task types shipped with the library (registered unless example_handlers is off).
EXAMPLE_HANDLER_MODULE = "coworker.engine.examples"


# DynamoDB Streams publishes a write typically well under a second after it, with a timestamp
# rounded down to the second: 5 s of lag and 1 of rounding.
AWS_STREAM_LAG_SECONDS = 6.0


class Settings(BaseModel):
    """Validated settings of one Coworker process (a Lambda function or the local runtime)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="forbid")

    table_name: str = Field(DEFAULT_TABLE_NAME, alias="COWORKER_TABLE_NAME",
                            description="DynamoDB table holding the tasks.")
    dynamodb_endpoint: str | None = Field(None, alias="COWORKER_DYNAMODB_ENDPOINT",
                                          description="DynamoDB endpoint URL; unset means AWS itself.")
    region: str = Field("us-east-1", alias="AWS_REGION", description="AWS region.")
    status_shards: int = Field(DEFAULT_STATUS_SHARDS, ge=1, le=MAX_STATUS_SHARDS, alias="COWORKER_STATUS_SHARDS",
                               description="Index partition key values per status (todo#0 ... todo#N-1): "
                                           "each takes about 1,000 writes/s, or ~500 tasks/s, so 4 carry "
                                           "~2,000 tasks/s. "
                                           "Every process must use the same value; when it is lowered the "
                                           "coordinator moves tasks out of the retired shards.")
    max_concurrency: int = Field(120, ge=1, le=10_000, alias="COWORKER_MAX_CONCURRENCY",
                                 description="Most tasks running at once, across all workers.")
    batch_size: int = Field(10, ge=1, le=100, alias="COWORKER_BATCH_SIZE",
                            description="Tasks one worker invocation runs at once (its threads); "
                                        "max_concurrency / batch_size worker invocations run at once.")
    worker_timeout_seconds: int = Field(300, ge=3, le=900, alias="COWORKER_WORKER_TIMEOUT_SECONDS",
                                        description="Worker invocation time limit (the Lambda timeout); "
                                                    "a worker claims a task only if the time it has left "
                                                    "covers the task's time limit; raised to fit the longest "
                                                    "limit a task type declares.")
    lock_seconds: int = Field(60, ge=3, alias="COWORKER_LOCK_SECONDS",
                              description="Lock lifetime of a claim, extended by heartbeats while the "
                                          "task runs: a dead worker's task runs again after about this long.")
    heartbeat_seconds: float | None = Field(None, gt=0, alias="COWORKER_HEARTBEAT_SECONDS",
                                            description="How often a running task's lock (and its worker's "
                                                        "slot) is extended; default a third of the lock.")
    stream_lag_seconds: float | None = Field(None, ge=0, le=300, alias="COWORKER_STREAM_LAG_SECONDS",
                                             description="How late a write may appear in the table's stream "
                                                         "(plus its 1-second timestamps): a batch reads done only "
                                                         "once the counts are this far past its last change; "
                                                         "default 0 on an embedded database (it publishes as it "
                                                         "writes), 6 on AWS.")
    reservation_seconds: int = Field(30, ge=2, alias="COWORKER_RESERVATION_SECONDS",
                                     description="How long a dispatched worker has to start before its "
                                                 "slot may be given to another.")
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
    tick_seconds: float = Field(5.0, gt=0, alias="COWORKER_TICK_SECONDS",
                                description="Time between coordinator ticks (fixed cadence) while it supervises.")
    supervise_seconds: float = Field(60.0, gt=0, le=840, alias="COWORKER_SUPERVISE_SECONDS",
                                     description="How long one coordinator invocation keeps ticking; "
                                                 "the schedule (once a minute) starts the next.")
    backlog_seconds: float = Field(60.0, gt=0, alias="COWORKER_BACKLOG_SECONDS",
                                   description="How often the coordinator counts the due backlog by status "
                                               "and the oldest due task's age (metrics, dashboards).")
    backlog_count_cap: int = Field(10_000, ge=1, le=1_000_000, alias="COWORKER_BACKLOG_COUNT_CAP",
                                   description="Most due index entries counted per status for the backlog "
                                               "metrics (about 1 read unit per 100 entries counted); "
                                               "above it the figure stays at the cap.")
    control_cache_seconds: float = Field(5.0, ge=0, le=300, alias="COWORKER_CONTROL_CACHE_SECONDS",
                                         description="How long a worker or the API keeps its view of the "
                                                     "control record (paused types): a pause stops new claims "
                                                     "within this long.")
    dispatch_on_submit: bool = Field(True, alias="COWORKER_DISPATCH_ON_SUBMIT",
                                     description="Start a worker from the API when a task is put and a "
                                                 "slot is free (else the next tick does).")
    worker_function: str | None = Field(None, alias="COWORKER_WORKER_FUNCTION",
                                        description="Name or ARN of the worker Lambda (coordinator and API).")
    max_runners: int = Field(4, ge=0, le=1000, alias="COWORKER_MAX_RUNNERS",
                             description="Most container runners (ECS Fargate tasks; runner processes locally) "
                                         "running at once, for task types that run on the container runner "
                                         "(docs/time.md); 0: none is started.")
    runner_threads: int = Field(1, ge=1, le=100, alias="COWORKER_RUNNER_THREADS",
                                description="Tasks one container runner runs at once.")
    runner_start_seconds: int = Field(600, ge=10, le=3600, alias="COWORKER_RUNNER_START_SECONDS",
                                      description="How long a started runner has to take its slot (pull its image, "
                                                  "start) before the slot may be given to another.")
    runner_stop_seconds: float = Field(110.0, ge=2, le=120, alias="COWORKER_RUNNER_STOP_SECONDS",
                                       description="Time a runner has between SIGTERM and SIGKILL (the container's "
                                                   "stop timeout; Fargate allows at most 120): its handlers may finish "
                                                   "in it, then their attempts are recorded as timed out.")
    container_types: str = Field("", alias="COWORKER_CONTAINER_TYPES",
                                 description="Comma-separated task types that run on the container runner, for "
                                             "processes that do not load the handlers (the coordinator); the "
                                             "stack sets it from the handlers' declarations.")
    runner_cluster: str | None = Field(None, alias="COWORKER_RUNNER_CLUSTER",
                                       description="ECS cluster (name or ARN) the coordinator starts runners in "
                                                   "(set by the stack).")
    runner_task_definition: str | None = Field(None, alias="COWORKER_RUNNER_TASK_DEFINITION",
                                               description="Task definition (ARN) of the container runner (set by "
                                                           "the stack).")
    runner_container: str = Field("runner", min_length=1, alias="COWORKER_RUNNER_CONTAINER",
                                  description="Name of the runner's container in its task definition.")
    runner_subnets: str = Field("", alias="COWORKER_RUNNER_SUBNETS",
                                description="Comma-separated subnet ids runners start in (set by the stack).")
    runner_security_groups: str = Field("", alias="COWORKER_RUNNER_SECURITY_GROUPS",
                                        description="Comma-separated security group ids of the runners (set by the "
                                                    "stack).")
    runner_public_ip: bool = Field(False, alias="COWORKER_RUNNER_PUBLIC_IP",
                                   description="Give runners a public IP (subnets without a NAT gateway need one to "
                                               "reach ECR; set by the stack).")
    ecs_endpoint: str | None = Field(None, alias="COWORKER_ECS_ENDPOINT",
                                     description="ECS API endpoint URL; unset means AWS itself.")
    lambda_endpoint: str | None = Field(None, alias="COWORKER_LAMBDA_ENDPOINT",
                                        description="Lambda API endpoint URL; unset means AWS itself "
                                                    "(the local runtime serves its own).")
    handler_modules: str = Field("", alias="COWORKER_HANDLER_MODULES",
                                 description="Comma-separated modules or packages that register task "
                                             "handlers (a package's submodules are imported too); the stack "
                                             "and the local runtime add your handlers package themselves.")
    result_bucket: str | None = Field(None, alias="COWORKER_RESULT_BUCKET",
                                      description="S3 bucket for results over the record's budget (set by the "
                                                  "stack); unset means none.")
    result_dir: str | None = Field(None, alias="COWORKER_RESULT_DIR",
                                   description="Folder for results over the record's budget, where there is no "
                                               "bucket (local runs).")
    inline_result_bytes: int = Field(4096, ge=256, le=65536, alias="COWORKER_INLINE_RESULT_BYTES",
                                     description="Results up to this size (compact JSON) stay on the task's "
                                                 "record; larger ones go to the result store.")
    inline_payload_bytes: int = Field(16384, ge=256, le=262144, alias="COWORKER_INLINE_PAYLOAD_BYTES",
                                      description="Payloads up to this size (as stored) stay on the task's "
                                                  "record; larger ones go to the object store.")
    max_payload_bytes: int = Field(5 * 1024 * 1024, ge=1024, alias="COWORKER_MAX_PAYLOAD_BYTES",
                                   description="Largest payload accepted (compact JSON), kept in the object "
                                               "store; an API request body holds at most about 6 MB.")
    max_result_bytes: int = Field(100 * 1024 * 1024, ge=1024, alias="COWORKER_MAX_RESULT_BYTES",
                                  description="Largest result kept in the result store; above it the record "
                                              "keeps a note and a preview.")
    idle_exit: bool = Field(True, alias="COWORKER_IDLE_EXIT",
                            description="A coordinator run ends after a tick that finds nothing running, "
                                        "moving or due within its supervision window, instead of supervising "
                                        "for its whole window (an idle deployment then runs about a second a "
                                        "minute); the next scheduled run looks again.")
    api_auth: Literal["none", "api-key", "iam"] = Field(
        "none", alias="COWORKER_API_AUTH",
        description="How callers authenticate, as the API's OpenAPI document declares it: none (the local "
                    "runtime), api-key (the x-api-key header) or iam (SigV4 for execute-api). API Gateway "
                    "checks it; the stack sets it from its apiAuth option.")
    cursor_secret: str | None = Field(None, alias="COWORKER_CURSOR_SECRET",
                                      description="Key that signs listing cursors; unset, the API makes a random "
                                                  "one on first use and keeps it in the table "
                                                  "(control#cursor-secret). The local runtime sets one per run.")
    validate_task_types: bool = Field(True, alias="COWORKER_VALIDATE_TASK_TYPES",
                                      description="The API refuses a task whose type has no registered handler "
                                                  "(422, listing the known types); the worker still guards "
                                                  "types removed after a submit.")
    events: Literal["off", "eventbridge", "log"] = Field(
        "off", alias="COWORKER_EVENTS",
        description="Completion events (Task Ignored, Batch Completed, Batch Stopped; docs/events.md): off, "
                    "eventbridge (PutEvents to COWORKER_EVENT_BUS; the stack's events option sets it) or "
                    "log (a log line each, and COWORKER_EVENTS_FILE if set: the local runtime's choice).")
    event_bus: str = Field("default", min_length=1, max_length=1600, alias="COWORKER_EVENT_BUS",
                           description="Name or ARN of the EventBridge bus events go to.")
    events_file: str | None = Field(None, alias="COWORKER_EVENTS_FILE",
                                    description="With events=log, also append each event to this file as a "
                                                "JSON line (the local dashboard shows them).")
    example_handlers: bool = Field(True, alias="COWORKER_EXAMPLE_HANDLERS",
                                   description="Also register the example task types (quick, slow, flaky, "
                                               "always-fail, crawl) that the demo and the tests use.")

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        if self.effective_heartbeat_seconds * 2 > self.lock_seconds:
            raise ValueError(
                f"COWORKER_HEARTBEAT_SECONDS ({self.effective_heartbeat_seconds:g}) must be at most half "
                f"of COWORKER_LOCK_SECONDS ({self.lock_seconds}), or a live task could lose its lock "
                "between two heartbeats"
            )
        if self.timeout_margin_seconds >= self.worker_timeout_seconds:
            raise ValueError("COWORKER_TIMEOUT_MARGIN_SECONDS must be shorter than the worker timeout")
        return self

    @property
    def effective_lock_seconds(self) -> int:
        """Lock lifetime of a claim (heartbeats extend it while the task runs)."""
        return self.lock_seconds

    @property
    def effective_stream_lag_seconds(self) -> float:
        """How far behind the time of a pass the stream follower vouches for its counts."""
        if self.stream_lag_seconds is not None:
            return self.stream_lag_seconds
        return 0.0 if self.dynamodb_endpoint else AWS_STREAM_LAG_SECONDS

    @property
    def effective_heartbeat_seconds(self) -> float:
        """Seconds between heartbeats: explicit setting, or a third of the lock lifetime."""
        return self.heartbeat_seconds if self.heartbeat_seconds is not None else self.lock_seconds / 3

    @property
    def worker_slots(self) -> int:
        """Worker invocations that may run at once: ``ceil(max_concurrency / batch_size)``."""
        return -(-self.max_concurrency // self.batch_size)

    def slot_threads(self, slot_number: int) -> int:
        """Tasks the worker in slot ``slot_number`` runs at once: ``batch_size``, except the last
        slot, which takes what is left of ``max_concurrency``."""
        return max(0, min(self.batch_size, self.max_concurrency - slot_number * self.batch_size))

    @property
    def container_type_list(self) -> list[str]:
        """The task types named in ``container_types``."""
        return _listed(self.container_types)

    @property
    def runner_subnet_list(self) -> list[str]:
        return _listed(self.runner_subnets)

    @property
    def runner_security_group_list(self) -> list[str]:
        return _listed(self.runner_security_groups)

    @property
    def handler_module_list(self) -> list[str]:
        """Modules to import at start-up: the examples (unless turned off), then the listed ones."""
        listed = _listed(self.handler_modules)
        examples = [EXAMPLE_HANDLER_MODULE] if self.example_handlers else []
        return list(dict.fromkeys([*examples, *listed]))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read settings from environment variables (unset ones take their defaults)."""
        environ = os.environ if environ is None else environ
        aliases = {field.alias or name for name, field in cls.model_fields.items()}
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


def _listed(value: str) -> list[str]:
    """The names in a comma-separated setting, in order, without blanks or repeats."""
    return list(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
