"""Coordinator and workers: the schedule, the two functions, their DLQ and their grants."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from coworker_cdk import constants as c
from coworker_cdk.bundling import function_code
from coworker_cdk.components.function import CoworkerFunction
from coworker_cdk.components.grants import (
    SendToQueue,
    grant_invoke,
    grant_key_use,
    grant_put_events,
    grant_stream_read,
    grant_table,
)
from coworker_cdk.components.results import PAYLOAD_PREFIX, RESULT_PREFIX, grant_objects
from coworker_cdk.config import StackConfig

# Least privilege on the table (no wildcards): what each role's library code calls.
# Workers claim, heartbeat and record tasks and their slot lease by UpdateItem and feed
# themselves more due work from the index (Query). Follow-up tasks are put (PutItem) in
# transactions that check the claim (ConditionCheckItem); a task too large to claim is ended
# after reading its batch (GetItem). A batch callback's handler reads the batch's results by key
# (coworker.read_results: BatchGetItem). A rate group's start log above 100 starts per interval
# seals its older starts into chunk items (PutItem) that workers read back (BatchGetItem).
WORKER_TABLE_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:UpdateItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:ConditionCheckItem",
)
# The coordinator finds free slots and due or lost tasks on the index (Query), takes its lease,
# reserves slots and reaps lost tasks (UpdateItem, after reading the error history: GetItem),
# and creates missing worker-slot items at the start of each run (BatchGetItem, then a
# conditional PutItem per missing slot), deleting the free slots left from a larger
# max_concurrency (a conditional DeleteItem each). It follows the table's stream (found with
# DescribeTable; read rights from grants.grant_stream_read) and moves batch counters (BatchGetItem,
# UpdateItem) and its checkpoints (PutItem). It puts schedules' occurrences and batches' callback
# tasks (PutItem) and, with the events option, publishes events (grants.grant_put_events).
COORDINATOR_TABLE_ACTIONS = (
    "dynamodb:Query",
    "dynamodb:GetItem",
    "dynamodb:UpdateItem",
    "dynamodb:BatchGetItem",
    "dynamodb:PutItem",
    "dynamodb:DeleteItem",
    "dynamodb:DescribeTable",
)


def grant_worker_access(table: dynamodb.ITableV2, results_bucket: s3.IBucket | None, grantee: iam.IGrantable,
                        key: kms.IKey | None = None) -> None:
    """What a worker's code calls on the table and the results bucket (and the customer-managed
    ``key`` they are encrypted with): the Lambda worker's role, and the container runner's task role
    (it runs the same code on other task types)."""
    grant_table(table, grantee, WORKER_TABLE_ACTIONS)
    grant_key_use(key, grantee)
    if results_bucket is not None:
        # Writes large results and the large payloads of the follow-ups it puts; reads large
        # payloads; never lists.
        grant_objects(results_bucket, grantee, "s3:PutObject", RESULT_PREFIX)
        grant_objects(results_bucket, grantee, "s3:PutObject", PAYLOAD_PREFIX)
        grant_objects(results_bucket, grantee, "s3:GetObject", PAYLOAD_PREFIX)
        # a batch callback's handler reads the batch's results (coworker.read_results)
        grant_objects(results_bucket, grantee, "s3:GetObject", RESULT_PREFIX)


class Processing(Construct):
    """A scheduled coordinator that supervises dispatch to asynchronously invoked workers.

    Each scheduled run ticks every ``tick_seconds`` for ``supervise_seconds``; the API (dispatch
    on submit) and the workers themselves (self-feeding) start work in between. The API gets
    invoke rights on the worker from :class:`coworker_cdk.components.api.TaskApi`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        table: dynamodb.ITableV2,
        layer: lambda_.ILayerVersion,
        functions_dir: Path,
        removal_policy: RemovalPolicy,
        results_bucket: s3.IBucket | None = None,
        key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._removal_policy = removal_policy
        self._results_bucket = results_bucket
        self._key = key  # the customer-managed key (option kms_key_arn), when there is one
        self.dead_letter_queue = self._build_dead_letter_queue()
        self.worker = self._build_worker(table, layer, functions_dir / c.WORKER_DIR_NAME)
        self.coordinator = self._build_coordinator(table, layer, functions_dir / c.COORDINATOR_DIR_NAME)
        self.schedule = self._build_schedule(self.coordinator.function)

    def _build_dead_letter_queue(self) -> sqs.Queue:
        return sqs.Queue(
            self,
            "WorkerDeadLetterQueue",
            encryption=sqs.QueueEncryption.KMS if self._key else sqs.QueueEncryption.SQS_MANAGED,
            encryption_master_key=self._key,
            enforce_ssl=True,
            retention_period=Duration.days(14),
            removal_policy=self._removal_policy,
        )

    def _build_worker(
        self, table: dynamodb.ITableV2, layer: lambda_.ILayerVersion, code_dir: Path
    ) -> CoworkerFunction:
        config = self._config
        worker = CoworkerFunction(
            self,
            "Worker",
            code_dir=code_dir,
            # The worker's handler module plus your handlers package and its requirements.
            code=function_code(code_dir, config.handlers_dir, install_dependencies=config.install_layer_dependencies),
            layer=layer,
            environment=config.function_environment(
                with_handlers=True, table_name=table.table_name,
                result_bucket=self._results_bucket.bucket_name if self._results_bucket else None,
            ),
            timeout_seconds=config.settings.worker_timeout_seconds,
            memory_mb=config.worker_memory_mb,
            removal_policy=self._removal_policy,
            log_retention_days=config.log_retention_days,
            encryption_key=self._key,
            description="Coworker worker: runs a batch of claimed tasks",
            # Exactly the library's worker slots, ceil(max_concurrency / batch_size): each
            # invocation holds one slot, so this is the hard ceiling of tasks in flight.
            reserved_concurrency=config.worker_reserved_concurrency,
        )
        # The claim in DynamoDB owns retries: a failed or throttled-out invocation must not be
        # re-run by Lambda behind the dispatchers' backs (due work is dispatched again after the
        # lock expires). An event older than its slot reservation would only exit at once.
        worker.function.configure_async_invoke(
            retry_attempts=0,
            max_event_age=Duration.seconds(config.worker_max_event_age_seconds),
            on_failure=SendToQueue(self.dead_letter_queue),
        )
        grant_worker_access(table, self._results_bucket, worker.function, self._key)
        return worker

    def _build_coordinator(
        self, table: dynamodb.ITableV2, layer: lambda_.ILayerVersion, code_dir: Path
    ) -> CoworkerFunction:
        config = self._config
        coordinator = CoworkerFunction(
            self,
            "Coordinator",
            code_dir=code_dir,
            layer=layer,
            environment=config.function_environment(
                table_name=table.table_name, worker_function=self.worker.function.function_name
            ),
            timeout_seconds=config.coordinator_timeout_seconds,
            memory_mb=config.coordinator_memory_mb,
            removal_policy=self._removal_policy,
            log_retention_days=config.log_retention_days,
            encryption_key=self._key,
            description="Coworker coordinator: supervises dispatch of due tasks to workers",
            reserved_concurrency=c.COORDINATOR_RESERVED_CONCURRENCY,
        )
        # A missed run is made up by the next one; a retried run would only wait for the lease.
        # A run that failed is kept in the dead-letter queue, where the operator sees it.
        coordinator.function.configure_async_invoke(
            retry_attempts=0, max_event_age=Duration.seconds(c.MIN_EVENT_AGE_SECONDS),
            on_failure=SendToQueue(self.dead_letter_queue),
        )
        grant_table(table, coordinator.function, COORDINATOR_TABLE_ACTIONS)
        grant_stream_read(table, coordinator.function)
        grant_key_use(self._key, coordinator.function)  # the table, its stream, the dead-letter queue
        if config.settings.events == "eventbridge":  # the coordinator publishes every event
            grant_put_events(self, coordinator.function, config.settings.event_bus)
        grant_invoke(self.worker.function, coordinator.function)
        return coordinator

    def _build_schedule(self, coordinator: lambda_.IFunction) -> events.Rule:
        return events.Rule(
            self,
            "Schedule",
            description="Coworker coordinator tick",
            schedule=events.Schedule.rate(Duration.minutes(self._config.schedule_minutes)),
            targets=[targets.LambdaFunction(coordinator)],
        )
