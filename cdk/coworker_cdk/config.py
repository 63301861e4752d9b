"""Deployment settings: the options of :class:`coworker_cdk.task_system.TaskSystem`, or the stack's CDK
context, validated once and passed inward as values.

Library settings (concurrency, batch size, timeouts...) are validated by the library's own
:class:`coworker.config.Settings`, so a value the functions would reject fails at synth time.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from aws_cdk import Token
from constructs import Node
from coworker.config import Settings
from coworker.engine import timing
from coworker.engine.handlers import handler_package
from coworker.errors import ConfigurationError
from pydantic import ValidationError

from coworker_cdk import account, resource_policy
from coworker_cdk import constants as c
from coworker_cdk.declared import runners_of

# Library settings a deployment may set: each is an option of TaskSystem under the Settings
# field's name, and a context key of the stack.
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
    c.CTX_DISPATCH_ON_SUBMIT: "dispatch_on_submit",  # a bool: read by _flag, as every boolean option
    c.CTX_RETENTION_DAYS: "retention_days",
    c.CTX_HANDLER_MODULES: "handler_modules",
    c.CTX_EXAMPLE_HANDLERS: "example_handlers",
    c.CTX_INLINE_RESULT_BYTES: "inline_result_bytes",
    c.CTX_INLINE_PAYLOAD_BYTES: "inline_payload_bytes",
    c.CTX_STATUS_SHARDS: "status_shards",
    c.CTX_EVENTS: "events",
    c.CTX_EVENT_BUS: "event_bus",
    c.CTX_MAX_RUNNERS: "max_runners",
    c.CTX_RUNNER_THREADS: "runner_threads",
    c.CTX_RUNNER_START_SECONDS: "runner_start_seconds",
}
# Deployment options that are not library settings: context key -> option name.
_DEPLOY_CONTEXT: dict[str, str] = {
    c.CTX_HANDLERS_DIR: "handlers",
    c.CTX_RESULTS_BUCKET: "results_bucket",
    c.CTX_API_AUTH: "api_auth",
    c.CTX_REMOVAL_POLICY: "removal_policy",
    c.CTX_LAYER_DEPENDENCIES: "layer_dependencies",
    c.CTX_WORKER_MEMORY: "worker_memory_mb",
    c.CTX_COORDINATOR_MEMORY: "coordinator_memory_mb",
    c.CTX_API_MEMORY: "api_memory_mb",
    c.CTX_SCHEDULE_MINUTES: "schedule_minutes",
    c.CTX_LOG_LEVEL: "log_level",
    c.CTX_LOG_RETENTION_DAYS: "log_retention_days",
    c.CTX_API_RATE_LIMIT: "api_rate_limit",
    c.CTX_API_BURST_LIMIT: "api_burst_limit",
    c.CTX_API_CLOUDWATCH_ROLE: "api_cloudwatch_role",
    c.CTX_API_LOGS: "api_logs",
    c.CTX_ALARM_EMAIL: "alarm_email",
    c.CTX_ALARM_TOPIC: "alarm_topic_arn",
    c.CTX_SILENCE_ALARM_MINUTES: "coordinator_silence_alarm_minutes",
    c.CTX_OLDEST_TASK_ALARM_SECONDS: "oldest_task_alarm_seconds",
    c.CTX_IGNORED_ALARM_PERCENT: "ignored_alarm_percent",
    c.CTX_LEGACY_STATUS_INDEX: "legacy_status_index",
    c.CTX_WARM_WRITE_UNITS: "warm_write_units",
    c.CTX_WARM_READ_UNITS: "warm_read_units",
    c.CTX_LAMBDA_QUOTA: "lambda_concurrency_quota",
    c.CTX_CONTAINER_RUNNER: "container_runner",
    c.CTX_RUNNER_CPU: "runner_cpu",
    c.CTX_RUNNER_MEMORY: "runner_memory_mb",
    c.CTX_RUNNER_CLUSTER: "runner_cluster",
    c.CTX_RUNNER_SUBNETS: "runner_subnets",
    c.CTX_RUNNER_SECURITY_GROUPS: "runner_security_groups",
    c.CTX_RUNNER_PUBLIC_IP: "runner_public_ip",
    c.CTX_EVENT_ARCHIVE_DAYS: "event_archive_days",
    c.CTX_EVENT_BUS_ACCOUNTS: "event_bus_accounts",
    c.CTX_EVENT_BUS_ORGANIZATION: "event_bus_organization_id",
    c.CTX_STREAM_LAG_ALARM_SECONDS: "stream_lag_alarm_seconds",
    c.CTX_KMS_KEY: "kms_key_arn",
    c.CTX_WAF_WEB_ACL: "waf_web_acl_arn",
    c.CTX_API_ENDPOINT: "api_endpoint",
    c.CTX_API_VPC_ENDPOINTS: "api_vpc_endpoint_ids",
    c.CTX_API_RESOURCE_POLICY: "api_resource_policy",
}
CONTEXT_OPTIONS: dict[str, str] = {**_SETTINGS_CONTEXT, **_DEPLOY_CONTEXT}
_CONTEXT_KEY: dict[str, str] = {name: key for key, name in CONTEXT_OPTIONS.items()}
# The words a boolean option takes (see constants).
TRUE_WORDS = c.TRUE_WORDS
FALSE_WORDS = c.FALSE_WORDS
# Every option TaskSystem takes, by name.
OPTION_NAMES: frozenset[str] = frozenset(CONTEXT_OPTIONS.values())
# Options that configure the container runner: refused in a deployment that has none (max_runners
# 0 aside), rather than silently left unused.
_RUNNER_OPTIONS = ("max_runners", "runner_threads", "runner_start_seconds", "runner_cpu", "runner_memory_mb",
                   "runner_cluster", "runner_subnets", "runner_security_groups", "runner_public_ip")
# Options of the stack's own event bus: refused with a named bus or without events=eventbridge.
_OWN_BUS_OPTIONS = ("event_archive_days", "event_bus_accounts", "event_bus_organization_id")
_ACCOUNT_ID = re.compile(c.ACCOUNT_ID)
_ORGANIZATION_ID = re.compile(c.ORGANIZATION_ID)
_SUBNET_ID = re.compile(r"subnet-[0-9a-f]{8,17}")
_SECURITY_GROUP_ID = re.compile(r"sg-[0-9a-f]{8,17}")
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9_-]{1,255}")
# A key by its ARN (a single-Region key's id is a UUID, a multi-Region key's mrk-<32 hex>): IAM grants
# and the services take the key's ARN, not an alias's.
_KMS_KEY_ARN = re.compile(r"arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-"
                          r"[0-9a-f]{4}-[0-9a-f]{12}|mrk-[0-9a-f]{32})")
# A regional web ACL (API Gateway takes no CLOUDFRONT-scoped one, arn:...:global/webacl/...).
_WEB_ACL_ARN = re.compile(r"arn:aws[a-z-]*:wafv2:[a-z0-9-]+:\d{12}:regional/webacl/[A-Za-z0-9_-]{1,128}/"
                          r"[0-9a-f-]{36}")
_VPC_ENDPOINT_ID = re.compile(r"vpce-[0-9a-f]{8,17}")
_CLUSTER_ARN = re.compile(r"arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:cluster/[A-Za-z0-9_-]{1,255}")
# Context keys that no longer exist -> what replaced them (a stale cdk.json fails loudly).
_RETIRED_CONTEXT: dict[str, str] = {
    "ticksPerInvocation": f"{c.CTX_SUPERVISE_SECONDS} (a coordinator run ticks every "
    f"{c.CTX_TICK_SECONDS} for that long)",
}
# Context keys the CDK itself sets without a ":" (cdk.json, cdk.context.json).
_CDK_CONTEXT = frozenset({"acknowledged-issue-numbers"})
# Environment variables that Lambda reserves or that make no sense in AWS.
_NOT_IN_LAMBDA_ENV = {"AWS_REGION", "COWORKER_DYNAMODB_ENDPOINT", "COWORKER_LAMBDA_ENDPOINT"}
# The ``handlers`` value that deploys no handlers package, only the example task types.
EXAMPLES = "examples"
_HANDLERS_REQUIRED = ("option handlers is required: the folder of your handlers package (a folder with "
                      "__init__.py whose modules register task handlers), or 'examples' to deploy only the "
                      "example task types")


@dataclass(frozen=True)
class RunnerConfig:
    """The container runner (ECS Fargate): the size of one runner, its cluster and its network.

    Without ``subnets`` the stack builds the runners' VPC (public subnets, no NAT gateway) and
    security group; ``cluster`` names an existing cluster, else the stack makes one.
    """

    cpu: int = c.DEFAULT_RUNNER_CPU
    memory_mb: int = c.DEFAULT_RUNNER_MEMORY_MB
    cluster: str | None = None  # an existing cluster's name or ARN
    subnets: tuple[str, ...] = ()  # the deployer's subnet ids
    security_groups: tuple[str, ...] = ()  # the deployer's security group ids (with subnets)
    public_ip: bool = True  # runners in subnets without a NAT gateway need one to reach ECR

    @property
    def own_network(self) -> bool:
        """True when the runners run in the deployer's subnets, not in a VPC the stack builds."""
        return bool(self.subnets)


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
    coordinator_silence_alarm_minutes: int = c.DEFAULT_SILENCE_ALARM_MINUTES
    oldest_task_alarm_seconds: int = c.DEFAULT_OLDEST_TASK_ALARM_SECONDS
    ignored_alarm_percent: int = c.DEFAULT_IGNORED_ALARM_PERCENT
    # The stage's access logs (it writes no execution logs): they need the account's API Gateway CloudWatch role.
    api_logs: bool = True
    handlers_dir: Path | None = None  # your handlers package, bundled into the worker
    results_bucket: bool = True  # an S3 bucket for results too large for the record
    api_auth: str = c.API_AUTH_KEY  # how API callers authenticate: an API key, or IAM (SigV4)
    legacy_status_index: bool = False  # keep the pre-sharding index while a table migrates
    warm_write_units: int | None = None  # pre-warmed throughput of the table and its index
    warm_read_units: int | None = None
    lambda_concurrency_quota: int = c.DEFAULT_LAMBDA_CONCURRENCY_QUOTA  # the account's, as the deployer says
    log_retention_days: int = c.DEFAULT_LOG_RETENTION_DAYS  # of every log group the stack makes
    # A customer-managed key (by ARN) for the table, the results bucket, the dead-letter queue, the
    # stack's alarm topic and every log group; unset, each is encrypted with an AWS-owned or managed key.
    kms_key_arn: str | None = None
    waf_web_acl_arn: str | None = None  # a regional WAFv2 web ACL the API's stage is associated with
    api_endpoint: str = c.API_ENDPOINT_REGIONAL  # or private: reached only through api_vpc_endpoint_ids
    api_vpc_endpoint_ids: tuple[str, ...] = ()
    # Statements of the API's resource policy of the deployer's own, checked (resource_policy.read_statements);
    # components/api.py puts them after the private API's.
    api_resource_policy: tuple[dict[str, Any], ...] = ()
    # The container runner, when the deployment has one (container types, or container_runner=true);
    # its task types are the settings' container_types.
    runner: RunnerConfig | None = None
    # With events=eventbridge and no eventBus named, the stack makes the bus (its name replaces
    # settings.event_bus in TaskSystem), its archive and a delivery DLQ for consumers' rules.
    own_event_bus: bool = False
    event_archive_days: int | None = c.DEFAULT_EVENT_ARCHIVE_DAYS  # None: no archive; 0: kept for ever
    event_bus_accounts: tuple[str, ...] = ()  # other accounts the own bus's policy lets put events
    event_bus_organization_id: str | None = None  # an organization whose principals it lets put events too
    stream_lag_alarm_seconds: int = c.DEFAULT_STREAM_LAG_ALARM_SECONDS
    # The ``service`` dimension of the functions' metrics (POWERTOOLS_SERVICE_NAME): one per
    # deployment (TaskSystem sets it), so two deployments in an account share no graph or alarm.
    service_name: str = c.SERVICE_NAME

    @property
    def reserved_concurrency(self) -> int:
        """Concurrent executions this deployment reserves: the worker slots and the coordinator."""
        return account.reserved_concurrency(self.settings)

    @property
    def required_lambda_quota(self) -> int:
        """The account concurrency quota this deployment needs: what it reserves, plus what Lambda
        keeps unreserved."""
        return account.required_lambda_quota(self.settings)

    @property
    def handlers_package(self) -> str | None:
        """The import name of the handlers package (its folder's name)."""
        return self.handlers_dir.name if self.handlers_dir is not None else None

    @property
    def handler_settings(self) -> Settings:
        """Settings of a function whose code has the handlers package (worker, API): it imports it."""
        if self.handlers_package is None:
            return self.settings
        modules = ",".join(filter(None, [self.settings.handler_modules, self.handlers_package]))
        return self.settings.model_copy(update={"handler_modules": modules})

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

    def function_environment(self, *, with_handlers: bool = False, **overrides: Any) -> dict[str, str]:
        """Environment of a function: the library settings plus Powertools settings.

        ``overrides`` are Settings fields known only at deploy time (table name, worker name);
        ``with_handlers`` adds the handlers package, for the functions whose code has it.
        """
        # A function without the handlers package in its code (the coordinator) imports no handler
        # module: it never runs a handler, and a module it cannot import would stop it at start-up.
        settings = self.handler_settings if with_handlers else self.settings.model_copy(update={"handler_modules": ""})
        settings = settings.model_copy(update=overrides)
        env = {k: v for k, v in settings.as_environment().items() if k not in _NOT_IN_LAMBDA_ENV}
        env.update(
            # X-Ray keeps neither responses (task payloads, results) nor exception bodies.
            POWERTOOLS_TRACER_CAPTURE_RESPONSE="false",
            POWERTOOLS_TRACER_CAPTURE_ERROR="false",
            POWERTOOLS_SERVICE_NAME=self.service_name,
            POWERTOOLS_METRICS_NAMESPACE=c.METRICS_NAMESPACE,
            POWERTOOLS_LOG_LEVEL=self.log_level,
        )
        return env

    @classmethod
    def from_context(cls, node: Node) -> StackConfig:
        """Read and validate the context of ``node`` (raises ConfigurationError)."""

        def get(key: str) -> Any:
            value = node.try_get_context(key)
            return None if value is None or value == "" else value

        for key, replacement in _RETIRED_CONTEXT.items():
            if get(key) is not None:
                raise ConfigurationError(f"context {key} was removed; use {replacement}")
        _refuse_unknown_context(node.get_all_context())
        options = {name: get(key) for key, name in CONTEXT_OPTIONS.items()}
        if options["handlers"] is None:  # the app's own handlers/ folder, as `make run` takes it
            if not Path(c.DEFAULT_HANDLERS_DIR_NAME).is_dir():
                raise ConfigurationError(
                    f"no handlers package: the stack deploys ./{c.DEFAULT_HANDLERS_DIR_NAME} by default and there "
                    f"is no such folder here ({Path.cwd()}); pass -c {c.CTX_HANDLERS_DIR}=path/to/your_package, "
                    f"or -c {c.CTX_HANDLERS_DIR}={EXAMPLES} for the example task types only")
            options["handlers"] = c.DEFAULT_HANDLERS_DIR_NAME
        return cls.from_options(**{name: value for name, value in options.items() if value is not None})

    @classmethod
    def from_options(cls, **options: Any) -> StackConfig:
        """Validate the options of :class:`coworker_cdk.task_system.TaskSystem` (raises ConfigurationError
        naming the option and what it accepts); unset options take their defaults."""
        unknown = sorted(set(options) - OPTION_NAMES)
        if unknown:
            hints = [f"{name!r}" + _did_you_mean(name) for name in unknown]
            raise ConfigurationError(f"unknown Coworker option {', '.join(hints)}; options are "
                                     f"{', '.join(sorted(OPTION_NAMES))}")
        settings = _settings_from_options(options)
        if options.get("handlers") is None:
            raise ConfigurationError(_HANDLERS_REQUIRED)
        handlers_dir = _handlers_dir(options["handlers"])
        if handlers_dir is None:  # the examples, asked for by name
            if options.get("example_handlers") is not None and not settings.example_handlers:
                raise ConfigurationError("handlers='examples' deploys the example task types: with "
                                         "example_handlers off there would be nothing to run")
            settings = settings.model_copy(update={"example_handlers": True})

        explicit_timeout = options.get("worker_timeout_seconds") is not None
        by_runner = runners_of(handlers_dir, settings.example_handlers, settings)
        settings = _fit_worker_timeout(settings, by_runner.lambda_limits, explicit=explicit_timeout)
        runner = _runner_config(options, by_runner.container_types, settings)
        # Every function knows the container types (the coordinator loads no handlers; the API refuses
        # their tasks when no runner may start) and how many runners may run: none without a runner.
        settings = settings.model_copy(update={"container_types": ",".join(by_runner.container_types),
                                               "max_runners": settings.max_runners if runner else 0})

        def choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
            value = str(options.get(name) or default).lower()
            if value not in allowed:
                raise ConfigurationError(f"option {name} must be {' or '.join(allowed)}, not {value!r}")
            return value

        def number(name: str, default: int, minimum: int = 1) -> int:
            return _whole(options, name, default, minimum)

        def optional_number(name: str, minimum: int) -> int | None:
            return _whole(options, name, None, minimum)

        schedule_minutes = number("schedule_minutes", c.DEFAULT_SCHEDULE_MINUTES)
        _refuse_overlapping_runs(settings.supervise_seconds, schedule_minutes)
        # The coordinator is silent between runs when the schedule leaves a gap: the alarm waits longer.
        gap_minutes = max(0, math.ceil(schedule_minutes - settings.supervise_seconds / 60))
        silence_floor = gap_minutes + 2
        silence = number("coordinator_silence_alarm_minutes", max(c.DEFAULT_SILENCE_ALARM_MINUTES, silence_floor),
                         silence_floor)
        ignored_percent = number("ignored_alarm_percent", c.DEFAULT_IGNORED_ALARM_PERCENT)
        if ignored_percent > 100:
            raise ConfigurationError(f"option ignored_alarm_percent must be 1-100, not {ignored_percent}")
        removal = choice("removal_policy", c.REMOVAL_RETAIN, (c.REMOVAL_RETAIN, c.REMOVAL_DESTROY))
        deps = choice("layer_dependencies", c.LAYER_DEPS_INSTALL, (c.LAYER_DEPS_INSTALL, c.LAYER_DEPS_SKIP))
        cloudwatch_role = _bool(options, "api_cloudwatch_role", True)
        return cls(
            settings=settings,
            destroy_on_removal=removal == c.REMOVAL_DESTROY,
            install_layer_dependencies=deps == c.LAYER_DEPS_INSTALL,
            worker_memory_mb=number("worker_memory_mb", c.DEFAULT_WORKER_MEMORY_MB, c.MIN_MEMORY_MB),
            coordinator_memory_mb=number("coordinator_memory_mb", c.DEFAULT_COORDINATOR_MEMORY_MB,
                                         c.MIN_MEMORY_MB),
            api_memory_mb=number("api_memory_mb", c.DEFAULT_API_MEMORY_MB, c.MIN_MEMORY_MB),
            schedule_minutes=schedule_minutes,
            log_level=str(options.get("log_level") or c.DEFAULT_LOG_LEVEL).upper(),
            api_rate_limit=number("api_rate_limit", c.DEFAULT_API_RATE_LIMIT),
            api_burst_limit=number("api_burst_limit", c.DEFAULT_API_BURST_LIMIT),
            api_cloudwatch_role=cloudwatch_role,
            api_logs=_api_logs(options, cloudwatch_role),
            alarm_email=options.get("alarm_email"),
            alarm_topic_arn=options.get("alarm_topic_arn"),
            coordinator_silence_alarm_minutes=silence,
            oldest_task_alarm_seconds=number("oldest_task_alarm_seconds", c.DEFAULT_OLDEST_TASK_ALARM_SECONDS),
            ignored_alarm_percent=ignored_percent,
            handlers_dir=handlers_dir,
            results_bucket=_bool(options, "results_bucket", True),
            api_auth=choice("api_auth", c.API_AUTH_KEY, (c.API_AUTH_KEY, c.API_AUTH_IAM)),
            legacy_status_index=_bool(options, "legacy_status_index", False),
            warm_write_units=optional_number("warm_write_units", c.MIN_WARM_WRITE_UNITS),
            warm_read_units=optional_number("warm_read_units", c.MIN_WARM_READ_UNITS),
            lambda_concurrency_quota=number("lambda_concurrency_quota", c.DEFAULT_LAMBDA_CONCURRENCY_QUOTA),
            log_retention_days=_log_retention_days(options),
            kms_key_arn=_arn(options, "kms_key_arn", _KMS_KEY_ARN,
                             "a customer-managed KMS key's ARN, arn:aws:kms:<region>:<account>:key/<key id> (not an "
                             "alias: IAM grants and the services take the key itself)"),
            waf_web_acl_arn=_arn(options, "waf_web_acl_arn", _WEB_ACL_ARN,
                                 "a regional WAFv2 web ACL's ARN, arn:aws:wafv2:<region>:<account>:regional/webacl/"
                                 "<name>/<id> (API Gateway takes no CLOUDFRONT-scoped, global, web ACL)"),
            **_api_endpoint(options),
            api_resource_policy=resource_policy.read_statements(options.get("api_resource_policy")),
            runner=runner,
            own_event_bus=_own_event_bus(options, settings),
            event_archive_days=_event_archive_days(options),
            event_bus_accounts=_ids(options, "event_bus_accounts", _ACCOUNT_ID, "123456789012 (12 digits)"),
            event_bus_organization_id=_organization_id(options),
            stream_lag_alarm_seconds=number("stream_lag_alarm_seconds", c.DEFAULT_STREAM_LAG_ALARM_SECONDS),
        )._within_quota()

    def _within_quota(self) -> StackConfig:
        """Refuse a deployment whose reserved concurrency the account's quota cannot hold."""
        if self.required_lambda_quota > self.lambda_concurrency_quota:
            raise ConfigurationError(
                f"this deployment reserves {self.reserved_concurrency} concurrent Lambda executions "
                f"({self.worker_reserved_concurrency} worker slots = ceil(maxConcurrency "
                f"{self.settings.max_concurrency} / batchSize {self.settings.batch_size}), and the coordinator's "
                f"{c.COORDINATOR_RESERVED_CONCURRENCY}); Lambda keeps {c.LAMBDA_UNRESERVED_MINIMUM} unreserved, so "
                f"the account's concurrency quota must be at least {self.required_lambda_quota}, above "
                f"{self.lambda_concurrency_quota}: raise batchSize, lower maxConcurrency, or ask AWS for a higher "
                f"quota (Service Quotas, Lambda, {account.LAMBDA_CONCURRENCY_QUOTA_CODE}) and deploy with "
                "-c lambdaConcurrencyQuota=<the new quota>; `coworker preflight` reads the account's real quota")
        return self


def _settings_from_options(options: dict[str, Any]) -> Settings:
    """The library settings among ``options``; an invalid one is reported by its option name and
    context key, with pydantic's reason."""
    values = {field: options[field] for field in _SETTINGS_CONTEXT.values() if options.get(field) is not None}
    # A boolean setting takes the words every boolean option takes (pydantic's own list is longer).
    values.update({field: _flag(options, field) for field in values
                   if Settings.model_fields[field].annotation is bool})
    # A deployment runs the example task types (a crawl that spawns, tasks that always fail) only
    # when asked to: anyone who may call its API could otherwise start them.
    values.setdefault("example_handlers", False)
    # A deployment's finished tasks expire by default (c.DEFAULT_RETENTION_DAYS); 0 keeps them.
    values.setdefault("retention_days", c.DEFAULT_RETENTION_DAYS)
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        by_alias = {f.alias: name for name, f in Settings.model_fields.items()}
        context_key = {name: key for key, name in _SETTINGS_CONTEXT.items()}
        problems = []
        for error in exc.errors():
            field = by_alias.get(str(error["loc"][0]), str(error["loc"][0])) if error["loc"] else ""
            where = f"option {field} (context {context_key[field]})" if field in context_key else "settings"
            shown = f": got {error['input']!r}" if field in context_key else ""
            problems.append(f"{where}: {error['msg']}{shown}")
        raise ConfigurationError("; ".join(problems)) from None


def _fit_worker_timeout(settings: Settings, limits: dict[str, float], explicit: bool) -> Settings:
    """The worker's timeout follows the time limits the Lambda worker's types declare (``limits``;
    the container runner's types do not count): raised so that the longest fits (see
    :mod:`coworker.engine.timing`), unless ``workerTimeoutSeconds`` was set, which must then give it."""
    if not limits:
        return settings
    margin = settings.timeout_margin_seconds
    longest = max(limits, key=lambda name: limits[name])
    needed = timing.worker_timeout_for(limits[longest], margin)
    assert needed is not None, "runners_of keeps only limits a Lambda worker gives"
    if settings.worker_timeout_seconds >= needed:
        return settings
    if explicit:
        raise ConfigurationError(
            f"option worker_timeout_seconds (context {c.CTX_WORKER_TIMEOUT}) is {settings.worker_timeout_seconds}, "
            f"which gives a task at most {timing.max_task_seconds(settings):g} s, but task type {longest!r} declares "
            f"a time limit of {limits[longest]:g} s: set {c.CTX_WORKER_TIMEOUT} to at least {needed}, or leave it "
            "unset and the stack sizes the worker from the declared limits")
    return settings.model_copy(update={"worker_timeout_seconds": needed})


def _runner_config(options: dict[str, Any], container_types: tuple[str, ...],
                   settings: Settings) -> RunnerConfig | None:
    """The container runner of this deployment: built when a deployed type runs on it, or when
    ``container_runner`` says so; ``None`` without one."""
    asked = _flag(options, "container_runner")
    if asked is False and container_types:
        raise ConfigurationError(
            f"option container_runner (context {c.CTX_CONTAINER_RUNNER}) is false, but task type "
            f"{', '.join(map(repr, container_types))} runs on the container runner (runner=\"container\", or a time "
            f"limit over the {timing.lambda_max_task_seconds(settings):g} s a Lambda worker gives): leave the option "
            "unset, or move the type to Lambda")
    if not (asked or container_types):
        given = [name for name in _RUNNER_OPTIONS if options.get(name) is not None
                 and not (name == "max_runners" and str(options[name]) == "0")]
        if given:
            raise ConfigurationError(
                f"option {', '.join(given)} configures the container runner, which this deployment does not have: "
                'no task type runs on it (runner="container", or a time limit longer than a Lambda worker gives); '
                f"set container_runner (context {c.CTX_CONTAINER_RUNNER}) to true to build it anyway")
        return None
    cpu = _whole(options, "runner_cpu", c.DEFAULT_RUNNER_CPU)
    if cpu not in c.FARGATE_MEMORY_MB:
        raise ConfigurationError(f"option runner_cpu (context {c.CTX_RUNNER_CPU}) must be one of Fargate's CPU sizes "
                                 f"{', '.join(map(str, c.FARGATE_MEMORY_MB))}, not {cpu}")
    allowed = c.FARGATE_MEMORY_MB[cpu]
    memory = _whole(options, "runner_memory_mb", max(c.DEFAULT_RUNNER_MEMORY_MB, allowed[0]))
    if memory not in allowed:
        sizes = (", ".join(map(str, allowed)) if len(allowed) <= 4
                 else f"{allowed[0]} to {allowed[-1]} in steps of {allowed[1] - allowed[0]}")
        raise ConfigurationError(f"option runner_memory_mb (context {c.CTX_RUNNER_MEMORY}) is {memory}, which "
                                 f"Fargate does not allow with runner_cpu {cpu}: it takes {sizes}")
    subnets = _ids(options, "runner_subnets", _SUBNET_ID)
    security_groups = _ids(options, "runner_security_groups", _SECURITY_GROUP_ID)
    if bool(subnets) != bool(security_groups):
        raise ConfigurationError(
            "options runner_subnets and runner_security_groups go together: runners in your subnets take your "
            "security group (one in the subnets' VPC; it needs no inbound rule), and without subnets the stack "
            "builds both")
    public_ip = _flag(options, "runner_public_ip")
    if public_ip is False and not subnets:
        raise ConfigurationError(
            f"option runner_public_ip (context {c.CTX_RUNNER_PUBLIC_IP}) is false, but the VPC the stack builds for "
            "runners has no NAT gateway: without a public IP they cannot pull their image; give runner_subnets "
            "(with a NAT gateway or VPC endpoints) to run them without one")
    return RunnerConfig(cpu=cpu, memory_mb=memory, cluster=_cluster(options.get("runner_cluster")),
                        subnets=subnets, security_groups=security_groups,
                        public_ip=public_ip if public_ip is not None else not subnets)


def _own_event_bus(options: dict[str, Any], settings: Settings) -> bool:
    """Whether the stack makes the events' bus: with events=eventbridge and no eventBus named. The
    options of that bus are refused where there is none, rather than silently left unused."""
    own = settings.events == "eventbridge" and options.get("event_bus") is None
    given = [name for name in _OWN_BUS_OPTIONS if options.get(name) is not None]
    if given and not own:
        why = ("eventBus names a bus of yours, used as it is (its archive and policy are yours to set: "
               "docs/events.md)" if settings.events == "eventbridge" else f"events is {settings.events}")
        raise ConfigurationError(
            f"option {', '.join(given)} configures the event bus the stack makes with events=eventbridge (context "
            f"{c.CTX_EVENTS}) and no eventBus (context {c.CTX_EVENT_BUS}), which this deployment does not have: {why}")
    return own


def _organization_id(options: dict[str, Any]) -> str | None:
    """Option event_bus_organization_id: an AWS Organizations id (a token is taken as it is), or
    ``None`` when unset."""
    value = options.get("event_bus_organization_id")
    if value is None:
        return None
    organization = str(value).strip()
    if not (Token.is_unresolved(organization) or _ORGANIZATION_ID.fullmatch(organization)):
        raise ConfigurationError(
            f"option event_bus_organization_id (context {c.CTX_EVENT_BUS_ORGANIZATION}) must be an AWS "
            "Organizations id, o- and 10 to 32 lowercase letters or digits (o-a1b2c3d4e5; `aws organizations "
            f"describe-organization` shows it), not {value!r}")
    return organization


def _event_archive_days(options: dict[str, Any]) -> int | None:
    """Option event_archive_days: days the own bus's archive keeps events (0: for ever, as
    EventBridge reads it), or ``None`` for no archive (:data:`constants.NO_EVENT_ARCHIVE`)."""
    value = options.get("event_archive_days")
    if isinstance(value, str) and value.strip().lower() == c.NO_EVENT_ARCHIVE:
        return None
    try:
        return _whole(options, "event_archive_days", c.DEFAULT_EVENT_ARCHIVE_DAYS, 0)
    except ConfigurationError:
        raise ConfigurationError(
            f"option event_archive_days (context {c.CTX_EVENT_ARCHIVE_DAYS}) must be a whole number of days of at "
            f"least 0 (0 keeps the archive's events for ever), or {c.NO_EVENT_ARCHIVE} for no archive, "
            f"not {value!r}") from None


@overload
def _whole(options: dict[str, Any], name: str, default: int, minimum: int = 1) -> int: ...
@overload
def _whole(options: dict[str, Any], name: str, default: None, minimum: int = 1) -> int | None: ...
def _whole(options: dict[str, Any], name: str, default: int | None, minimum: int = 1) -> int | None:
    """Option ``name`` as a whole number of at least ``minimum`` (``default`` when unset or None)."""
    value = options.get(name)
    if value is None:
        value = default
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"option {name} must be a whole number, not {value!r}") from None
    if isinstance(value, bool) or number != float(value) or number < minimum:
        raise ConfigurationError(f"option {name} must be a whole number of at least {minimum}, not {value!r}")
    return number


def _flag(options: dict[str, Any], name: str) -> bool | None:
    """Option ``name`` as true or false, or ``None`` when unset: the one reader of every boolean
    option. A value that is none of :data:`TRUE_WORDS` and :data:`FALSE_WORDS` is refused."""
    value = options.get(name)
    if value is None or isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConfigurationError(
        f"option {name} must be true or false, not {value!r} (context {_CONTEXT_KEY[name]}): it takes "
        f"{', '.join(TRUE_WORDS)} (true) or {', '.join(FALSE_WORDS)} (false), in any case")


def _bool(options: dict[str, Any], name: str, default: bool) -> bool:
    """Option ``name`` as true or false (:func:`_flag`), ``default`` when unset."""
    value = _flag(options, name)
    return default if value is None else value


def _log_retention_days(options: dict[str, Any]) -> int:
    """Option log_retention_days: one of the retention periods CloudWatch Logs allows."""
    days = _whole(options, "log_retention_days", c.DEFAULT_LOG_RETENTION_DAYS, 0)
    if days not in c.LOG_RETENTION_DAYS:
        raise ConfigurationError(
            f"option log_retention_days (context {c.CTX_LOG_RETENTION_DAYS}) is {days}, which CloudWatch Logs does "
            f"not allow: it keeps log events {', '.join(map(str, c.LOG_RETENTION_DAYS))} days (the stack keeps "
            "none for ever: 3653 is ten years)")
    return days


def _arn(options: dict[str, Any], name: str, pattern: re.Pattern[str], what: str) -> str | None:
    """Option ``name`` as an ARN that ``pattern`` matches (a token, from a construct of your own app,
    is taken as it is), or ``None`` when unset."""
    value = options.get(name)
    if value is None:
        return None
    arn = str(value).strip()
    if not (Token.is_unresolved(arn) or pattern.fullmatch(arn)):
        raise ConfigurationError(f"option {name} (context {_CONTEXT_KEY[name]}) must be {what}, not {value!r}")
    return arn


def _api_endpoint(options: dict[str, Any]) -> dict[str, Any]:
    """Options api_endpoint and api_vpc_endpoint_ids: a private API is reached only through the
    interface VPC endpoints listed, so it takes them; a regional one takes none."""
    endpoint = str(options.get("api_endpoint") or c.API_ENDPOINT_REGIONAL).strip().lower()
    if endpoint not in (c.API_ENDPOINT_REGIONAL, c.API_ENDPOINT_PRIVATE):
        raise ConfigurationError(f"option api_endpoint (context {c.CTX_API_ENDPOINT}) must be "
                                 f"{c.API_ENDPOINT_REGIONAL} or {c.API_ENDPOINT_PRIVATE}, "
                                 f"not {options['api_endpoint']!r}")
    given = options.get("api_vpc_endpoint_ids")
    if endpoint == c.API_ENDPOINT_REGIONAL:
        if given is not None:
            raise ConfigurationError(
                f"option api_vpc_endpoint_ids (context {c.CTX_API_VPC_ENDPOINTS}) names the VPC endpoints of a "
                f"private API, and api_endpoint (context {c.CTX_API_ENDPOINT}) is {c.API_ENDPOINT_REGIONAL}: set "
                f"{c.CTX_API_ENDPOINT}={c.API_ENDPOINT_PRIVATE}, or leave {c.CTX_API_VPC_ENDPOINTS} unset")
        return {"api_endpoint": endpoint, "api_vpc_endpoint_ids": ()}
    problem = (f"option api_vpc_endpoint_ids (context {c.CTX_API_VPC_ENDPOINTS}) must list the interface VPC "
               "endpoints (com.amazonaws.<region>.execute-api) a private API is called through, as ids like "
               "vpce-0123456789abcdef0, comma-separated")
    if given is None:
        raise ConfigurationError(f"{problem}: api_endpoint (context {c.CTX_API_ENDPOINT}) is "
                                 f"{c.API_ENDPOINT_PRIVATE}, and a private API without them can be called by nobody")
    try:
        ids = _ids(options, "api_vpc_endpoint_ids", _VPC_ENDPOINT_ID)
    except ConfigurationError:
        raise ConfigurationError(f"{problem}, not {given!r}") from None
    return {"api_endpoint": endpoint, "api_vpc_endpoint_ids": ids}


def _api_logs(options: dict[str, Any], cloudwatch_role: bool) -> bool:
    """Whether the API stage writes access logs. API Gateway writes them only in an
    account (and region) whose settings name a CloudWatch role, else the stage's create fails and
    the stack rolls back: without the role the stack makes (api_cloudwatch_role false) the deployer
    must say which holds, since the synth cannot look at the account."""
    logs = _flag(options, "api_logs")
    if logs is None and not cloudwatch_role:
        raise ConfigurationError(
            f"option api_cloudwatch_role (context {c.CTX_API_CLOUDWATCH_ROLE}) is false, so the stack leaves the "
            "account's API Gateway CloudWatch role alone, and the stage's access logs need one (without "
            "it the stage's create fails and the stack rolls back): say which holds with api_logs (context "
            f"{c.CTX_API_LOGS}): true if the account already has the role (`aws apigateway get-account` shows a "
            "cloudwatchRoleArn), false to deploy the API without API Gateway logs; or leave "
            f"{c.CTX_API_CLOUDWATCH_ROLE} unset and the stack sets the role")
    return True if logs is None else logs


def _refuse_overlapping_runs(supervise_seconds: float, schedule_minutes: int) -> None:
    """A coordinator run must be over by the next scheduled one. Only one runs at a time (reserved
    concurrency 1, COORDINATOR_RESERVED_CONCURRENCY), so an event that finds a run still
    supervising is throttled; Lambda keeps it MIN_EVENT_AGE_SECONDS, then drops it into the
    dead-letter queue, whose alarm fires. A run that ends as the next event arrives (the default,
    60 s every minute) hands over within that time; one that supervises past the next event makes
    every run later than the one before until events are dropped. Idle exit does not help: a busy
    deployment supervises for the whole window."""
    period = schedule_minutes * 60
    if supervise_seconds <= period:
        return
    runs = math.ceil(supervise_seconds / period)  # scheduled events during one run
    raise ConfigurationError(
        f"option supervise_seconds (context {c.CTX_SUPERVISE_SECONDS}) is {supervise_seconds:g}, longer than the "
        f"{period} s between scheduled coordinator runs (schedule_minutes, context {c.CTX_SCHEDULE_MINUTES}, is "
        f"{schedule_minutes}): the coordinator runs one at a time, so up to {runs - 1} of every {runs} scheduled "
        f"runs would find the last one still supervising and be throttled into the dead-letter queue; set "
        f"{c.CTX_SUPERVISE_SECONDS} to at most {period} ({c.CTX_SCHEDULE_MINUTES} x 60), or "
        f"{c.CTX_SCHEDULE_MINUTES} to at least {runs}")


def _ids(options: dict[str, Any], name: str, pattern: re.Pattern[str], like: str | None = None) -> tuple[str, ...]:
    """Option ``name`` as AWS resource ids: a list, or one string of comma-separated ids. A token
    (an id from a construct of your own app) is taken as it is."""
    value = options.get(name)
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    ids = tuple(dict.fromkeys(str(item).strip() for item in items if str(item).strip()))
    bad = [item for item in ids if not Token.is_unresolved(item) and not pattern.fullmatch(item)]
    if bad or not ids:
        like = like or f"{pattern.pattern.split('-')[0]}-0123abcd"
        raise ConfigurationError(f"option {name} must list ids like {like}, comma-separated, not {value!r}")
    return ids


def _cluster(value: Any) -> str | None:
    """An existing ECS cluster's name or ARN (a token is taken for a name)."""
    if value is None:
        return None
    cluster = str(value).strip()
    if not (Token.is_unresolved(cluster) or _CLUSTER_NAME.fullmatch(cluster) or _CLUSTER_ARN.fullmatch(cluster)):
        raise ConfigurationError(f"option runner_cluster must be an ECS cluster's name or ARN "
                                 f"(arn:aws:ecs:<region>:<account>:cluster/<name>), not {value!r}")
    return cluster


def _handlers_dir(value: Any) -> Path | None:
    """The handlers package folder (it must be a package), or ``None`` for ``"examples"``."""
    if isinstance(value, str) and value.strip().lower() == EXAMPLES:
        return None
    if isinstance(value, str) and value.strip().lower() in ("none", "off", "false"):
        raise ConfigurationError(f"handlers {value!r} would deploy nothing to run: give the folder of your "
                                 f"handlers package, or {EXAMPLES!r} for the example task types")
    parent, name = handler_package(value)
    return parent / name


def _refuse_unknown_context(context: dict[str, Any]) -> None:
    """A context key that is none of Coworker's options is a typo (``maxConcurency``), refused
    before it silently deploys the default. Keys with a ``:`` or starting with ``@`` (the CDK's own
    and its feature flags; use such names for your app's own context) are left alone."""
    unknown = sorted(key for key in context if ":" not in key and not key.startswith("@")
                     and key not in CONTEXT_OPTIONS and key not in _RETIRED_CONTEXT and key not in _CDK_CONTEXT)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, CONTEXT_OPTIONS, n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigurationError(f"unknown context key {', '.join(hints)}; Coworker's keys are "
                                 f"{', '.join(sorted(CONTEXT_OPTIONS))} (docs/deploy.md)")


def context_key(name: str) -> str:
    """The context key of option ``name`` (``kms_key_arn`` -> ``kmsKeyArn``)."""
    return _CONTEXT_KEY[name]


def _did_you_mean(name: str) -> str:
    close = difflib.get_close_matches(name, OPTION_NAMES, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
