"""cdk-nag (AwsSolutions) findings this stack accepts, each with its reason.

cdk-nag v3 reads acknowledgments from CDK's ``Validations.of(construct).acknowledge``. Each one
names a single finding on the construct that raised it, so any new finding fails the synth.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from aws_cdk import Acknowledgment, CfnElement, Stack, Validations
from constructs import IConstruct

if TYPE_CHECKING:
    from coworker_cdk.components.api import TaskApi
    from coworker_cdk.components.event_bus import CompletionEventBus
    from coworker_cdk.components.processing import Processing
    from coworker_cdk.components.results import ResultsBucket
    from coworker_cdk.components.runners import ContainerRunner
    from coworker_cdk.components.table import TaskTable

PACK = "AwsSolutions"
API_GATEWAY_LOGS_POLICY = (
    "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AmazonAPIGatewayPushToCloudWatchLogs"
)


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Accept one finding (``rule`` as cdk-nag prints it, without the pack prefix) on ``scope``."""
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{PACK}::{rule}", reason=reason))


def _arn_of(construct: IConstruct) -> str:
    """How cdk-nag spells ``Fn::GetAtt <resource>.Arn`` in a finding."""
    logical_id = Stack.of(construct).get_logical_id(construct.node.default_child)  # type: ignore[arg-type]
    return f"<{logical_id}.Arn>"


def acknowledge_findings(
    *, tasks: TaskTable, processing: Processing, api: TaskApi, results: ResultsBucket | None,
    runner: ContainerRunner | None = None, event_bus: CompletionEventBus | None = None,
) -> None:
    """Record the accepted findings of a Coworker task system (the parts ``TaskSystem`` builds)."""
    if event_bus is not None:
        acknowledge(
            event_bus.dead_letter_queue,
            "AwsSolutions-SQS3",
            "This queue is itself the dead-letter destination of consumers' rules on the events' bus.",
        )
    _acknowledge_functions(tasks, processing, api)
    _acknowledge_processing(processing, api)
    _acknowledge_rest_api(api)
    if results is not None:
        _acknowledge_results_bucket(results, processing, api)
    if runner is not None:
        _acknowledge_runner(runner, results)


def _acknowledge_functions(tasks: TaskTable, processing: Processing, api: TaskApi) -> None:
    """What every function's role holds: tracing, the status index; the pinned runtime."""
    table_index_arns = f"Resource::{_arn_of(tasks.table)}/index/*"
    for fn in (processing.worker, processing.coordinator, api.handler):
        acknowledge(
            fn,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray PutTraceSegments/PutTelemetryRecords take no resource; CDK's tracing grant.",
        )
        acknowledge(
            fn,
            "AwsSolutions-IAM5[" + table_index_arns + "]",
            "Queries on the status index of the task table only (the table's own indexes).",
        )
        acknowledge(
            fn,
            "AwsSolutions-L1",
            "The runtime is pinned to the Python version the layer's wheels are built for "
            "(coworker_cdk/constants.py PYTHON_VERSION); both move together.",
        )


def _acknowledge_processing(processing: Processing, api: TaskApi) -> None:
    """Who may start workers, and the worker's dead-letter queue."""
    worker_arn = _arn_of(processing.worker.function)
    for invoker in (processing.coordinator, api.handler):  # both start workers
        acknowledge(
            invoker,
            f"AwsSolutions-IAM5[Resource::{worker_arn}:*]",
            "lambda:InvokeFunction on the worker function and its versions/aliases only.",
        )
    acknowledge(
        processing.dead_letter_queue,
        "AwsSolutions-SQS3",
        "This queue is itself the dead-letter destination of the worker's async invocations.",
    )


def _acknowledge_rest_api(api: TaskApi) -> None:
    """The REST API: how callers authenticate (API keys or IAM), WAF, the logging role."""
    rest_api = api.rest_api
    if api.invoke_policy is None:  # API keys
        acknowledge(
            rest_api,
            "AwsSolutions-APIG4",
            "Callers authenticate with an API key on every method (api_key_required); deploy with "
            "apiAuth=iam for SigV4 authorization (docs/deploy.md).",
        )
        acknowledge(
            rest_api,
            "AwsSolutions-COG4",
            "No Cognito user pool: clients are machines holding API keys of a usage plan.",
        )
    else:  # IAM
        acknowledge(
            rest_api,
            "AwsSolutions-COG4",
            "No Cognito user pool: every method uses IAM authorization (SigV4-signed requests).",
        )
        acknowledge(
            api.invoke_policy,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:"
            f"<{Stack.of(rest_api).get_logical_id(cast(CfnElement, rest_api.node.default_child))}>/*/*/*]",
            "execute-api:Invoke on every method and stage of this one API: callers of the task API.",
        )
    acknowledge(
        rest_api,
        "AwsSolutions-APIG6",
        "No execution logs: API Gateway writes them to a group it names and makes itself, kept for ever, "
        "which the stack can neither make (an upgrade fails where the previous release's stage made it) "
        "nor own; each request's gateway and integration errors are in the stage's access log."
        if api.access_logs is not None else
        "No API Gateway logs (apiLogs=false): the account has no CloudWatch role for API Gateway.",
    )
    if api.web_acl_association is None:  # wafWebAclArn associates the team's web ACL with the stage
        acknowledge(
            rest_api,
            "AwsSolutions-APIG3",
            "No WAF web ACL given: the stage throttles the API; deploy with wafWebAclArn=<your regional web "
            "ACL's ARN> for public exposure (docs/deploy.md, Regulated accounts).",
        )
    acknowledge(
        rest_api,
        f"AwsSolutions-IAM4[{API_GATEWAY_LOGS_POLICY}]",
        "API Gateway's account-wide CloudWatch role needs exactly this AWS managed policy.",
    )


def _acknowledge_results_bucket(results: ResultsBucket, processing: Processing, api: TaskApi) -> None:
    """The results bucket, and the worker's and API's access to its two prefixes."""
    bucket = results.bucket
    acknowledge(
        bucket,
        "AwsSolutions-S1",
        "Results bucket read and written only by the worker and API roles (one object prefix, "
        "exact actions); server access logs would cost more than the data they describe. "
        "Turn on CloudTrail S3 data events where an audit trail of reads is required.",
    )
    results_prefix = f"Resource::{_arn_of(bucket)}/results/*"
    payloads_prefix = f"Resource::{_arn_of(bucket)}/payloads/*"
    acknowledge(
        processing.worker,
        f"AwsSolutions-IAM5[{results_prefix}]",
        "s3:PutObject on the results/ prefix only: each attempt writes its own object there.",
    )
    acknowledge(
        processing.worker,
        f"AwsSolutions-IAM5[{payloads_prefix}]",
        "s3:GetObject on the payloads/ prefix only: a large payload is read before the handler runs.",
    )
    acknowledge(
        api.handler,
        f"AwsSolutions-IAM5[{results_prefix}]",
        "s3:GetObject on the results/ prefix only: GET /tasks/{key}/result reads a large result.",
    )
    acknowledge(
        api.handler,
        f"AwsSolutions-IAM5[{payloads_prefix}]",
        "s3:PutObject on the payloads/ prefix only: a large payload is stored before its task is put.",
    )


def _acknowledge_runner(runner: ContainerRunner, results: ResultsBucket | None) -> None:
    """The container runner: its settings in the environment, its cluster, its roles."""
    acknowledge(
        runner.task_definition,
        "AwsSolutions-ECS2",
        "The runner's environment holds the library's settings (table and bucket names, limits), as the "
        "worker function's does; no secret: the task role grants the access.",
    )
    if runner.cluster_resource is not None:  # a cluster of its own
        acknowledge(
            runner.cluster_resource,
            "AwsSolutions-ECS4",
            "No Container Insights: runners publish their task metrics themselves (EMF in their logs) and the "
            "coordinator counts them (RunnersStarted, BusyRunnerSlots); Container Insights would bill custom "
            "metrics for every runner started.",
        )
    acknowledge(
        runner.task_definition,
        "AwsSolutions-IAM5[Resource::*]",
        "ecr:GetAuthorizationToken takes no resource; the execution role CDK makes to pull the image "
        "(its other ECR actions are on the image's repository, its logs on the runner's log group).",
    )
    if results is not None:
        bucket = _arn_of(results.bucket)
        acknowledge(
            runner.task_role,
            f"AwsSolutions-IAM5[Resource::{bucket}/results/*]",
            "The worker's grant: s3:PutObject and GetObject on the results/ prefix only (large results).",
        )
        acknowledge(
            runner.task_role,
            f"AwsSolutions-IAM5[Resource::{bucket}/payloads/*]",
            "The worker's grant: s3:GetObject and PutObject on the payloads/ prefix only (large payloads).",
        )
