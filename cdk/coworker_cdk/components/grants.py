"""Least privilege, written out: each role gets exactly the actions its code calls, on exactly the
resources it calls them on. The CDK's convenience grants add more (item actions on every index,
``ListStreams`` on ``*``, ``GetQueueAttributes`` for a destination queue); tests/rehearsal holds
these grants against every request each function makes.
"""

from __future__ import annotations

from collections.abc import Sequence

import jsii
from aws_cdk import Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sqs as sqs
from constructs import Construct
from coworker.data import layout

QUERY = "dynamodb:Query"
# What the services that keep a role's data under a customer-managed key ask KMS for with the role's
# rights: a data key to write (an object, a queue message, the table's key) and its decryption to read.
KEY_USE = ("kms:Decrypt", "kms:GenerateDataKey")
STREAM_READS = ("dynamodb:DescribeStream", "dynamodb:GetShardIterator", "dynamodb:GetRecords")


def grant_table(table: dynamodb.ITableV2, grantee: iam.IGrantable, actions: Sequence[str]) -> None:
    """``actions`` on the table's items; ``Query`` only on the status index (no code queries the
    table itself or another index)."""
    item_actions = [action for action in actions if action != QUERY]
    if item_actions:
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=item_actions, resources=[table.table_arn]))
    if QUERY in actions:
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=[QUERY], resources=[f"{table.table_arn}/index/{layout.STATUS_INDEX_NAME}"]))


def grant_delete_items(table: dynamodb.ITableV2, grantee: iam.IGrantable, key_prefix: str) -> None:
    """``DeleteItem`` on the table, only of items whose key starts with ``key_prefix`` (IAM's
    ``dynamodb:LeadingKeys`` condition): the API deletes schedules, never tasks."""
    grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
        actions=["dynamodb:DeleteItem"], resources=[table.table_arn],
        conditions={"ForAllValues:StringLike": {"dynamodb:LeadingKeys": [f"{key_prefix}*"]}}))


def grant_stream_read(table: dynamodb.ITableV2, grantee: iam.IGrantable) -> None:
    """Reading the table's own stream (it is found with DescribeTable; ``ListStreams`` is never called)."""
    if table.table_stream_arn is None:
        raise ValueError("the task table has no stream")
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(actions=list(STREAM_READS), resources=[table.table_stream_arn]))


def grant_put_events(scope: Construct, grantee: iam.IGrantable, bus: str) -> None:
    """``events:PutEvents`` on one event bus (a name in this account and region, or an ARN)."""
    arn = bus if bus.startswith("arn:") else Stack.of(scope).format_arn(
        service="events", resource="event-bus", resource_name=bus)
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(actions=["events:PutEvents"], resources=[arn]))


def grant_key_use(key: kms.IKey | None, grantee: iam.IGrantable) -> None:
    """:data:`KEY_USE` on the customer-managed key (option kms_key_arn), when there is one: DynamoDB,
    S3 and SQS call KMS with the caller's rights (the code itself never calls KMS)."""
    if key is not None:
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=list(KEY_USE), resources=[key.key_arn]))


def grant_invoke(function: lambda_.IFunction, grantee: iam.IGrantable) -> None:
    """Invoking ``function`` by name (the code never names a version or an alias)."""
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(actions=["lambda:InvokeFunction"], resources=[function.function_arn]))


@jsii.implements(lambda_.IDestination)
class SendToQueue:
    """An asynchronous invocation's failure destination that may only ``SendMessage`` to its queue
    (what Lambda does with a destination; the CDK's ``SqsDestination`` also grants queue reads)."""

    def __init__(self, queue: sqs.IQueue) -> None:
        self.queue = queue

    def bind(self, _scope: Construct, fn: lambda_.IFunction, *,
             type: lambda_.DestinationType | None = None) -> lambda_.DestinationConfig:  # noqa: A002 - the interface's name
        fn.add_to_role_policy(iam.PolicyStatement(actions=["sqs:SendMessage"], resources=[self.queue.queue_arn]))
        return lambda_.DestinationConfig(destination=self.queue.queue_arn)
