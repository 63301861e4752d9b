"""The results bucket: where results and payloads too large for a task's record are kept."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

# Object prefixes (coworker.engine.offload.RESULT_PREFIX / PAYLOAD_PREFIX); grants are limited to them.
RESULT_PREFIX = "results/"
PAYLOAD_PREFIX = "payloads/"


def grant_objects(bucket: s3.IBucket, grantee: iam.IGrantable, action: str, prefix: str) -> None:
    """Exactly ``action`` (``s3:PutObject`` or ``s3:GetObject``) on the objects under ``prefix``."""
    grantee.grant_principal.add_to_principal_policy(
        iam.PolicyStatement(actions=[action], resources=[bucket.arn_for_objects(f"{prefix}*")])
    )


class ResultsBucket(Construct):
    """A private, encrypted, TLS-only bucket; objects expire with their tasks when the tasks do.

    It is retained when the stack is deleted (a bucket with objects cannot be deleted by
    CloudFormation): empty and delete it by hand if you want it gone.
    """

    def __init__(self, scope: Construct, construct_id: str, *, retention_days: float) -> None:
        super().__init__(scope, construct_id)
        lifecycle = []
        if retention_days:
            # A finished task is deleted by TTL after retention_days; its result goes a day later.
            lifecycle.append(s3.LifecycleRule(prefix=RESULT_PREFIX,
                                              expiration=Duration.days(int(retention_days) + 1)))
        lifecycle.append(s3.LifecycleRule(abort_incomplete_multipart_upload_after=Duration.days(1)))
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            lifecycle_rules=lifecycle,
            removal_policy=RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE,
        )
