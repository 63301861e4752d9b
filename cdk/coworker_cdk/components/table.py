"""The task table, built from the one layout in :mod:`coworker.data.layout`."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_kms as kms
from constructs import Construct
from coworker.data import layout

_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}


class TaskTable(Construct):
    """On-demand table with the sharded status index, TTL, PITR, encryption (AWS-managed, or
    ``encryption_key``: option kms_key_arn) and a stream of new and old images (batch progress is
    counted from it).

    ``legacy_status_index`` keeps the index of releases before sharding (``status-due``) next to
    the new one, for the migration (docs/deploy.md): DynamoDB adds or removes one index per
    deployment. ``warm_write_units`` / ``warm_read_units`` pre-warm the table and the index for
    a large first backlog (billed once, per unit raised).
    """

    def __init__(self, scope: Construct, construct_id: str, *, removal_policy: RemovalPolicy,
                 legacy_status_index: bool = False, warm_write_units: int | None = None,
                 warm_read_units: int | None = None, encryption_key: kms.IKey | None = None) -> None:
        super().__init__(scope, construct_id)
        warm = None
        if warm_write_units or warm_read_units:
            warm = dynamodb.WarmThroughput(write_units_per_second=warm_write_units,
                                           read_units_per_second=warm_read_units)
        self.table = self._build_table(removal_policy, legacy_status_index, warm)
        if encryption_key is not None:
            self._encrypt_with(encryption_key)

    def _build_table(self, removal_policy: RemovalPolicy, legacy_status_index: bool,
                     warm: dynamodb.WarmThroughput | None) -> dynamodb.TableV2:
        types = layout.key_schema(legacy_status_index)
        indexes = [self._status_index(layout.STATUS_INDEX_NAME, layout.STATUS_INDEX_PARTITION_KEY, types, warm)]
        if legacy_status_index:
            indexes.append(self._status_index(layout.LEGACY_STATUS_INDEX_NAME, layout.STATUS_ATTRIBUTE, types, None))
        return dynamodb.TableV2(
            self,
            "Table",
            partition_key=self._attribute(layout.PARTITION_KEY, types),
            billing=dynamodb.Billing.on_demand(),
            global_secondary_indexes=indexes,
            warm_throughput=warm,
            # The coordinator counts batch progress from the stream (coworker.engine.progress).
            dynamo_stream=dynamodb.StreamViewType(layout.STREAM_SPECIFICATION["StreamViewType"]),
            time_to_live_attribute=layout.TTL_ATTRIBUTE,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            encryption=dynamodb.TableEncryptionV2.aws_managed_key(),
            removal_policy=removal_policy,
            # A retained table is also protected from a delete by hand; removalPolicy=destroy
            # (test stacks) turns both off.
            deletion_protection=removal_policy != RemovalPolicy.DESTROY,
        )

    def _encrypt_with(self, key: kms.IKey) -> None:
        """The table under the customer-managed key: SSE of type KMS (as with the AWS-managed key)
        and the key named on its one replica. Written on the template: the CDK's
        ``TableEncryptionV2.customer_managed_key`` names it per replica by region, which a stack
        without an account and region (deployable anywhere, as this one is) cannot render."""
        table = self.table.node.default_child
        assert isinstance(table, dynamodb.CfnGlobalTable)
        table.add_property_override("Replicas.0.SSESpecification.KMSMasterKeyId", key.key_arn)

    def _status_index(self, name: str, partition_key: str, types: dict[str, str],
                      warm: dynamodb.WarmThroughput | None) -> dynamodb.GlobalSecondaryIndexPropsV2:
        return dynamodb.GlobalSecondaryIndexPropsV2(
            index_name=name,
            partition_key=self._attribute(partition_key, types),
            sort_key=self._attribute(layout.STATUS_INDEX_SORT_KEY, types),
            projection_type=dynamodb.ProjectionType.INCLUDE,
            non_key_attributes=list(layout.STATUS_INDEX_PROJECTED),
            warm_throughput=warm,
        )

    @staticmethod
    def _attribute(name: str, types: dict[str, str]) -> dynamodb.Attribute:
        return dynamodb.Attribute(name=name, type=_TYPES[types[name]])
