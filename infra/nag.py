"""cdk-nag (AwsSolutions) findings this stack accepts, each with its reason.

cdk-nag v3 reads acknowledgments from CDK's ``Validations.of(construct).acknowledge``. Each one
names a single finding on the construct that raised it, so any new finding fails the synth.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

if TYPE_CHECKING:
    from infra.task_system import TaskSystem

PACK = "AwsSolutions"
BASIC_EXECUTION_POLICY = (
    "Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"
)
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


def acknowledge_findings(system: TaskSystem) -> None:
    """Record the accepted findings of a Coworker task system."""
    table_index_arns = f"Resource::{_arn_of(system.tasks.table)}/index/*"
    functions = (system.processing.worker, system.processing.coordinator, system.api.handler)
    for fn in functions:
        acknowledge(
            fn,
            f"AwsSolutions-IAM4[{BASIC_EXECUTION_POLICY}]",
            "AWSLambdaBasicExecutionRole only lets the function write its own logs.",
        )
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
            "(infra/constants.py PYTHON_VERSION); both move together.",
        )

    worker_arn = _arn_of(system.processing.worker.function)
    for invoker in (system.processing.coordinator, system.api.handler):  # both start workers
        acknowledge(
            invoker,
            f"AwsSolutions-IAM5[Resource::{worker_arn}:*]",
            "lambda:InvokeFunction on the worker function and its versions/aliases only.",
        )
    acknowledge(
        system.processing.dead_letter_queue,
        "AwsSolutions-SQS3",
        "This queue is itself the dead-letter destination of the worker's async invocations.",
    )

    rest_api = system.api.rest_api
    if system.api.invoke_policy is None:  # API keys
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
            system.api.invoke_policy,
            "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:execute-api:<AWS::Region>:<AWS::AccountId>:"
            f"<{Stack.of(rest_api).get_logical_id(rest_api.node.default_child)}>/*/*/*]",
            "execute-api:Invoke on every method and stage of this one API: callers of the task API.",
        )
    acknowledge(
        rest_api,
        "AwsSolutions-APIG3",
        "No WAF web ACL: the stage throttles the API; add WAF for public exposure.",
    )
    acknowledge(
        rest_api,
        f"AwsSolutions-IAM4[{API_GATEWAY_LOGS_POLICY}]",
        "API Gateway's account-wide CloudWatch role needs exactly this AWS managed policy.",
    )

    if system.results is not None:
        bucket = system.results.bucket
        acknowledge(
            bucket,
            "AwsSolutions-S1",
            "Results bucket read and written only by the worker and API roles (one object prefix, "
            "exact actions); server access logs would cost more than the data they describe. "
            "Turn on CloudTrail S3 data events where an audit trail of reads is required.",
        )
        results = f"Resource::{_arn_of(bucket)}/results/*"
        payloads = f"Resource::{_arn_of(bucket)}/payloads/*"
        acknowledge(
            system.processing.worker,
            f"AwsSolutions-IAM5[{results}]",
            "s3:PutObject on the results/ prefix only: each attempt writes its own object there.",
        )
        acknowledge(
            system.processing.worker,
            f"AwsSolutions-IAM5[{payloads}]",
            "s3:GetObject on the payloads/ prefix only: a large payload is read before the handler runs.",
        )
        acknowledge(
            system.api.handler,
            f"AwsSolutions-IAM5[{results}]",
            "s3:GetObject on the results/ prefix only: GET /tasks/{key}/result reads a large result.",
        )
        acknowledge(
            system.api.handler,
            f"AwsSolutions-IAM5[{payloads}]",
            "s3:PutObject on the payloads/ prefix only: a large payload is stored before its task is put.",
        )
