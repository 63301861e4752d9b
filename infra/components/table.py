"""The task table, built from the one layout in :mod:`coworker.schema`."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct
from coworker import schema

_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}


class TaskTable(Construct):
    """On-demand table with the ``status-due`` index, TTL, PITR and AWS-managed encryption."""

    def __init__(self, scope: Construct, construct_id: str, *, removal_policy: RemovalPolicy) -> None:
        super().__init__(scope, construct_id)
        self.table = self._build_table(removal_policy)

    def _build_table(self, removal_policy: RemovalPolicy) -> dynamodb.TableV2:
        types = schema.key_schema()
        return dynamodb.TableV2(
            self,
            "Table",
            partition_key=self._attribute(schema.PARTITION_KEY, types),
            billing=dynamodb.Billing.on_demand(),
            global_secondary_indexes=[
                dynamodb.GlobalSecondaryIndexPropsV2(
                    index_name=schema.STATUS_INDEX_NAME,
                    partition_key=self._attribute(schema.STATUS_INDEX_PARTITION_KEY, types),
                    sort_key=self._attribute(schema.STATUS_INDEX_SORT_KEY, types),
                    projection_type=dynamodb.ProjectionType.INCLUDE,
                    non_key_attributes=list(schema.STATUS_INDEX_PROJECTED),
                )
            ],
            time_to_live_attribute=schema.TTL_ATTRIBUTE,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryptionV2.aws_managed_key(),
            removal_policy=removal_policy,
        )

    @staticmethod
    def _attribute(name: str, types: dict[str, str]) -> dynamodb.Attribute:
        return dynamodb.Attribute(name=name, type=_TYPES[types[name]])
