"""Literals of the Coworker stack, in one place.

Table names, keys and the index come from :mod:`coworker.data.layout`; this module holds only what
is particular to the AWS deployment (context keys and their defaults, paths, names, limits).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

import coworker

PACKAGE_DIR: Final = Path(__file__).resolve().parent

# --- paths -------------------------------------------------------------------------------
# The folder holding the installed ``coworker`` package (the layer's python/ gets a copy of it).
LAYER_SOURCE_DIR: Final = Path(coworker.__file__).resolve().parent.parent
LAYER_PACKAGE: Final = "coworker"
# The layer's dependencies: exact versions and wheel hashes for Lambda's platform, resolved from
# the library's requirements.txt by ``python -m coworker_cdk.lock`` (see bundling).
LAYER_LOCK: Final = PACKAGE_DIR / "layer.lock"
# pip's installs, reused across synths and apps while a lock is unchanged (delete to refetch).
_CACHE_DIR: Final = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "coworker-cdk"
LAYER_DEPENDENCY_CACHE: Final = _CACHE_DIR / "dependencies"
# The container runner's image build contexts, prepared at synth, one folder per content hash.
RUNNER_IMAGE_CACHE: Final = _CACHE_DIR / "runner-image"
# The three functions' handler modules, shipped inside this package.
FUNCTIONS_DIR: Final = PACKAGE_DIR / "functions"
# Your task handlers: a package bundled into the worker. The stack (context handlersDir) takes
# the app folder's handlers/ when not told otherwise; the TaskSystem construct must be told.
DEFAULT_HANDLERS_DIR_NAME: Final = "handlers"
HANDLER_REQUIREMENTS: Final = "requirements.txt"  # inside the handlers package
COORDINATOR_DIR_NAME: Final = "coordinator"
WORKER_DIR_NAME: Final = "worker"
API_DIR_NAME: Final = "api"
RUNNER_DIR_NAME: Final = "runner"  # the container runner's entry point, main.py (not a Lambda function)
RUNNER_MAIN: Final = "main.py"
HANDLER: Final = "handler.handler"
# Left out of every asset: byte code and caches from local runs.
ASSET_EXCLUDES: Final = ["__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache", ".ruff_cache"]

# --- runtime -------------------------------------------------------------------------------
# The layer's wheels are fetched for exactly this interpreter and platform, so the Lambda
# runtime and architecture below must change together with them.
PYTHON_VERSION: Final = "3.13"
# Every wheel tag the runtime's Amazon Linux 2023 (glibc 2.34) takes: a dependency that ships
# only newer manylinux wheels (numpy 2.3 and later: manylinux_2_28) installs too.
PIP_PLATFORMS: Final = ("manylinux_2_34_aarch64", "manylinux_2_28_aarch64", "manylinux2014_aarch64")
PIP_IMPLEMENTATION: Final = "cp"

# --- naming ------------------------------------------------------------------------------
STACK_ID: Final = "Coworker"
STACK_DESCRIPTION: Final = "Coworker: serverless coordinator-worker task system"
SERVICE_NAME: Final = "coworker"  # POWERTOOLS_SERVICE_NAME of every function (metric dimension)
METRICS_NAMESPACE: Final = "Coworker"
# 5xx answers of the task API in one alarm period that raise its alarm (a lone 503 while DynamoDB
# throttles is re-sent by the client; a run of them is not).
API_5XX_ALARM_COUNT: Final = 5
API_STAGE_NAME: Final = "v1"
DASHBOARD_SUFFIX: Final = "-dashboard"

# --- context keys and defaults -------------------------------------------------------------
# The words a boolean option takes, from the command line (-c key=value) or cdk.json; any other
# value is refused: read as false, a misspelled "ture" would deploy the option off.
TRUE_WORDS: Final = ("true", "yes", "on", "1")
FALSE_WORDS: Final = ("false", "no", "off", "0")
# `cdk deploy -c key=value` (strings) or the "context" block of cdk.json (JSON values).
CTX_REMOVAL_POLICY: Final = "removalPolicy"  # "retain" | "destroy"
CTX_LAYER_DEPENDENCIES: Final = "layerDependencies"  # "install" | "skip"
CTX_WORKER_TIMEOUT: Final = "workerTimeoutSeconds"
CTX_WORKER_MEMORY: Final = "workerMemoryMb"
CTX_COORDINATOR_MEMORY: Final = "coordinatorMemoryMb"
CTX_API_MEMORY: Final = "apiMemoryMb"
CTX_MAX_CONCURRENCY: Final = "maxConcurrency"
CTX_BATCH_SIZE: Final = "batchSize"
CTX_MAX_ATTEMPTS: Final = "maxAttempts"
CTX_LOCK_SECONDS: Final = "lockSeconds"
CTX_HEARTBEAT_SECONDS: Final = "heartbeatSeconds"
CTX_RESERVATION_SECONDS: Final = "reservationSeconds"
CTX_TICK_SECONDS: Final = "tickSeconds"
CTX_SUPERVISE_SECONDS: Final = "superviseSeconds"
CTX_DISPATCH_ON_SUBMIT: Final = "dispatchOnSubmit"  # "true" | "false"
CTX_RETENTION_DAYS: Final = "retentionDays"  # days a finished task is kept; 0 keeps it
CTX_LOG_RETENTION_DAYS: Final = "logRetentionDays"
CTX_HANDLER_MODULES: Final = "handlerModules"
CTX_HANDLERS_DIR: Final = "handlersDir"  # a path, or "examples" for the example task types only
CTX_EXAMPLE_HANDLERS: Final = "exampleHandlers"  # "true" | "false"
CTX_RESULTS_BUCKET: Final = "resultsBucket"  # "true" | "false"
CTX_API_AUTH: Final = "apiAuth"  # "api-key" | "iam"
CTX_INLINE_RESULT_BYTES: Final = "inlineResultBytes"
CTX_INLINE_PAYLOAD_BYTES: Final = "inlinePayloadBytes"
CTX_STATUS_SHARDS: Final = "statusShards"
CTX_EVENTS: Final = "events"  # completion events: off | eventbridge | log
CTX_EVENT_BUS: Final = "eventBus"  # unset: the stack makes its own bus; a name or ARN: that bus, as it is
CTX_EVENT_ARCHIVE_DAYS: Final = "eventArchiveDays"  # own bus's archive; 0: for ever, none: no archive
CTX_EVENT_BUS_ACCOUNTS: Final = "eventBusAccounts"  # accounts that may put to the stack's own bus
CTX_EVENT_BUS_ORGANIZATION: Final = "eventBusOrganizationId"  # an organization whose accounts may put to it
CTX_STREAM_LAG_ALARM_SECONDS: Final = "streamLagAlarmSeconds"
CTX_LEGACY_STATUS_INDEX: Final = "legacyStatusIndex"  # "true" while migrating a pre-sharding table
CTX_WARM_WRITE_UNITS: Final = "warmWriteUnits"  # pre-warmed write units per second (table + index)
CTX_WARM_READ_UNITS: Final = "warmReadUnits"
CTX_LAMBDA_QUOTA: Final = "lambdaConcurrencyQuota"  # the account's quota, when raised above the default
CTX_SCHEDULE_MINUTES: Final = "scheduleMinutes"
CTX_LOG_LEVEL: Final = "logLevel"
CTX_API_RATE_LIMIT: Final = "apiRateLimit"
CTX_API_BURST_LIMIT: Final = "apiBurstLimit"
CTX_API_CLOUDWATCH_ROLE: Final = "apiCloudWatchRole"  # "true" | "false"
CTX_API_LOGS: Final = "apiLogs"  # "true" | "false"; must be said with apiCloudWatchRole=false
CTX_ALARM_EMAIL: Final = "alarmEmail"
CTX_ALARM_TOPIC: Final = "alarmTopic"
CTX_SILENCE_ALARM_MINUTES: Final = "coordinatorSilenceAlarmMinutes"
CTX_OLDEST_TASK_ALARM_SECONDS: Final = "oldestTaskAlarmSeconds"
CTX_IGNORED_ALARM_PERCENT: Final = "ignoredAlarmPercent"
# What a regulated account asks of the stack (docs/deploy.md, Regulated accounts).
CTX_KMS_KEY: Final = "kmsKeyArn"  # a customer-managed KMS key for the table, bucket, queue, topic and logs
CTX_WAF_WEB_ACL: Final = "wafWebAclArn"  # a regional WAFv2 web ACL associated with the API's stage
CTX_API_ENDPOINT: Final = "apiEndpoint"  # "regional" | "private"
CTX_API_VPC_ENDPOINTS: Final = "apiVpcEndpointIds"  # vpce-... ids, comma-separated: the private API's callers
# The API's resource policy of your own: a JSON file's path, inline JSON, or the document in cdk.json.
CTX_API_RESOURCE_POLICY: Final = "apiResourcePolicy"
# The container runner (ECS Fargate), for task types longer than Lambda allows.
CTX_CONTAINER_RUNNER: Final = "containerRunner"  # unset: built when a type runs on it; "true" | "false"
CTX_MAX_RUNNERS: Final = "maxRunners"
CTX_RUNNER_THREADS: Final = "runnerThreads"
CTX_RUNNER_START_SECONDS: Final = "runnerStartSeconds"
CTX_RUNNER_CPU: Final = "runnerCpu"  # Fargate CPU units
CTX_RUNNER_MEMORY: Final = "runnerMemoryMb"
CTX_RUNNER_CLUSTER: Final = "runnerCluster"  # an existing cluster's name or ARN
CTX_RUNNER_SUBNETS: Final = "runnerSubnets"  # subnet ids, comma-separated (or a JSON list in cdk.json)
CTX_RUNNER_SECURITY_GROUPS: Final = "runnerSecurityGroups"
CTX_RUNNER_PUBLIC_IP: Final = "runnerPublicIp"  # "true" | "false"

API_AUTH_KEY: Final = "api-key"
API_AUTH_IAM: Final = "iam"
API_ENDPOINT_REGIONAL: Final = "regional"
API_ENDPOINT_PRIVATE: Final = "private"
REMOVAL_RETAIN: Final = "retain"
REMOVAL_DESTROY: Final = "destroy"
LAYER_DEPS_INSTALL: Final = "install"
LAYER_DEPS_SKIP: Final = "skip"

# DynamoDB's floor for warm throughput: what every new on-demand table can already take.
MIN_WARM_WRITE_UNITS: Final = 4_000
MIN_WARM_READ_UNITS: Final = 12_000
MIN_MEMORY_MB: Final = 128  # Lambda's smallest memory size
DEFAULT_WORKER_MEMORY_MB: Final = 512
DEFAULT_COORDINATOR_MEMORY_MB: Final = 256
DEFAULT_API_MEMORY_MB: Final = 256
DEFAULT_SCHEDULE_MINUTES: Final = 1
DEFAULT_LOG_LEVEL: Final = "INFO"
DEFAULT_API_RATE_LIMIT: Final = 50  # requests per second, steady
DEFAULT_API_BURST_LIMIT: Final = 100
# A deployment deletes a finished task's record (TTL) this long after it finished, and its large
# result with it (results bucket): a quarter, long enough to read results, look back at a month's
# runs and dedupe re-sent keys, while storage and PITR stop growing with every task ever run. The
# library's own default (local runs) stays 0, keep for ever; retentionDays=0 says it here.
DEFAULT_RETENTION_DAYS: Final = 90
# Days every log group of the stack keeps its events, and the values CloudWatch Logs allows.
DEFAULT_LOG_RETENTION_DAYS: Final = 30
LOG_RETENTION_DAYS: Final = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192,
                             2557, 2922, 3288, 3653)

API_TIMEOUT_SECONDS: Final = 29  # API Gateway's integration limit
# Slack added to a coordinator invocation beyond its supervision time (supervise_seconds); the
# coordinator itself stops supervising 10 s before its timeout, so a run always ends cleanly.
COORDINATOR_TIMEOUT_SLACK_SECONDS: Final = 30
LAMBDA_MAX_TIMEOUT_SECONDS: Final = 900
# One coordinator at a time (its lease item enforces single flight as well; this keeps an
# overlapping scheduled run from even starting while the previous one supervises).
COORDINATOR_RESERVED_CONCURRENCY: Final = 1
# Lambda's account concurrency quota by default, and what it keeps unreserved: a deployment's
# reserved concurrency must leave that much of the account's quota (new accounts often have 10
# or 50 until they ask for more).
DEFAULT_LAMBDA_CONCURRENCY_QUOTA: Final = 1000
LAMBDA_UNRESERVED_MINIMUM: Final = 100
# Async events older than this are dropped (to the DLQ). Lambda allows 60 s .. 6 h.
MIN_EVENT_AGE_SECONDS: Final = 60
MAX_EVENT_AGE_SECONDS: Final = 6 * 60 * 60

# --- completion events (events=eventbridge) -------------------------------------------------
# The archive of the stack's own bus keeps every event this long, for replay to a consumer that
# missed some (a rule disabled, a target down past EventBridge's 24 h of retries).
DEFAULT_EVENT_ARCHIVE_DAYS: Final = 30
# eventArchiveDays=none: no archive. Not "off" or "0": 0 is EventBridge's "keep for ever" (and a
# false word of the boolean options), so a word that reads as a number of days would mislead.
NO_EVENT_ARCHIVE: Final = "none"
# Deliveries a consumer's rule on the stack's bus could not make go to the stack's delivery DLQ
# (the rule's target names it); SQS keeps a message at most 14 days.
EVENT_DLQ_RETENTION_DAYS: Final = 14
ACCOUNT_ID: Final = r"\d{12}"
ORGANIZATION_ID: Final = r"o-[a-z0-9]{10,32}"  # AWS Organizations' own pattern for an organization's id

# --- container runner ----------------------------------------------------------------------
DEFAULT_RUNNER_CPU: Final = 1024  # 1 vCPU
DEFAULT_RUNNER_MEMORY_MB: Final = 2048
# Fargate's CPU units -> the memory sizes (MiB) it allows with them.
FARGATE_MEMORY_MB: Final[dict[int, tuple[int, ...]]] = {
    256: (512, 1024, 2048),
    512: tuple(range(1024, 4096 + 1, 1024)),
    1024: tuple(range(2048, 8192 + 1, 1024)),
    2048: tuple(range(4096, 16384 + 1, 1024)),
    4096: tuple(range(8192, 30720 + 1, 1024)),
    8192: tuple(range(16384, 61440 + 1, 4096)),
    16384: tuple(range(32768, 122880 + 1, 8192)),
}
# SIGTERM to SIGKILL when ECS stops a runner: Fargate's most. The runner's handlers get all but
# the last 10 s of it (COWORKER_RUNNER_STOP_SECONDS) to finish, the rest to record the others.
RUNNER_STOP_TIMEOUT_SECONDS: Final = 120
RUNNER_STOP_SECONDS: Final = 110
RUNNER_LOG_PREFIX: Final = "runner"
# The image's base: the official Python image (Debian, glibc) for arm64, from ECR Public (no Docker
# Hub rate limit); the locked wheels are the layer's, for the same Python and platform.
RUNNER_BASE_IMAGE: Final = f"public.ecr.aws/docker/library/python:{PYTHON_VERSION}-slim"
# The default network: a VPC of public subnets only (no NAT gateway, no hourly cost).
RUNNER_VPC_MAX_AZS: Final = 2

# --- monitoring --------------------------------------------------------------------------
# Metric names are the library's own (coworker.observability.MetricName).
DURATION_PERCENTILES: Final = ("p50", "p90", "p99")
METRIC_PERIOD_MINUTES: Final = 1
ALARM_PERIOD_MINUTES: Final = 5
# The heartbeat alarm: no coordinator tick for this many minutes (missing data breaches). At least
# the schedule's gap between runs plus two minutes, so a healthy schedule never trips it.
DEFAULT_SILENCE_ALARM_MINUTES: Final = 5
# Oldest due task older than this: work waits (capacity too low, a paused type, a dead coordinator).
DEFAULT_OLDEST_TASK_ALARM_SECONDS: Final = 900
# Share of ended tasks (finished + ignored) that were ignored over the alarm window, in percent,
# once at least IGNORED_ALARM_MIN_ENDED tasks ended in it.
DEFAULT_IGNORED_ALARM_PERCENT: Final = 5
IGNORED_ALARM_MIN_ENDED: Final = 10
IGNORED_ALARM_PERIODS: Final = 3  # of ALARM_PERIOD_MINUTES: a 15-minute window
# The stream follower's counts this far behind the writes (StreamFollowerLag): batch progress,
# callbacks and Task Ignored events wait. Keeping up, it lags a tick or two (seconds).
DEFAULT_STREAM_LAG_ALARM_SECONDS: Final = 300
DASHBOARD_WIDGET_WIDTH: Final = 12
DASHBOARD_WIDGET_HEIGHT: Final = 6
