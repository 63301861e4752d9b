"""The results bucket: where results and payloads too large for a task's record are kept."""

from __future__ import annotations

import math

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct
from coworker.engine import offload

# Object prefixes (coworker.engine.offload.RESULT_PREFIX / PAYLOAD_PREFIX); grants are limited to them.
RESULT_PREFIX = "results/"
PAYLOAD_PREFIX = "payloads/"
# A result object outlives its task's TTL by this much: DynamoDB deletes an expired record
# "typically within a few days", not at once, and the record points at the object until then.
RESULT_EXPIRY_MARGIN_DAYS = 7


def grant_objects(bucket: s3.IBucket, grantee: iam.IGrantable, action: str, prefix: str) -> None:
    """Exactly ``action`` (``s3:PutObject`` or ``s3:GetObject``) on the objects under ``prefix``."""
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(actions=[action], resources=[bucket.arn_for_objects(f"{prefix}*")])
    )


class ResultsBucket(Construct):
    """A private, encrypted, TLS-only bucket; results expire after their tasks when the tasks do.

    Results: a finished task's record is deleted (TTL) ``retention_days`` after it finished; its
    result, written just before, sits under its own prefix (:func:`coworker.engine.offload.result_prefix`)
    and expires RESULT_EXPIRY_MARGIN_DAYS later. Payloads never expire: a task's record points at
    its payload from its put, however long it waits (``run_at`` has no limit, a paused type holds
    its tasks, an ignored task is kept, without TTL, until it is redriven), so no object age is
    safe for them.

    It is retained when the stack is deleted (a bucket with objects cannot be deleted by
    CloudFormation): empty and delete it by hand if you want it gone.
    """

    def __init__(self, scope: Construct, construct_id: str, *, retention_days: float,
                 encryption_key: kms.IKey | None = None) -> None:
        super().__init__(scope, construct_id)
        lifecycle = []
        if retention_days:  # 0 keeps finished tasks, and so their results, for ever
            days = math.ceil(retention_days) + RESULT_EXPIRY_MARGIN_DAYS
            lifecycle.append(s3.LifecycleRule(id="ExpireResults", prefix=offload.result_prefix(retention_days),
                                              expiration=Duration.days(days)))
        lifecycle.append(s3.LifecycleRule(abort_incomplete_multipart_upload_after=Duration.days(1)))
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            # SSE-S3, or SSE-KMS under the customer-managed key (option kms_key_arn) with an S3 Bucket
            # Key, which spares a KMS request per object.
            encryption=s3.BucketEncryption.KMS if encryption_key else s3.BucketEncryption.S3_MANAGED,
            encryption_key=encryption_key,
            bucket_key_enabled=True if encryption_key else None,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=lifecycle,
            removal_policy=RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE,
        )
