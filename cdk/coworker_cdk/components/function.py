"""The common shape of a Coworker function: Python on arm64, the layer, tracing, own log group."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import App, CfnResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from coworker_cdk import constants as c

RUNTIME = lambda_.Runtime.PYTHON_3_13  # must match constants.PYTHON_VERSION (layer wheels)
ARCHITECTURE = lambda_.Architecture.ARM_64  # must match constants.PIP_PLATFORMS
_DAYS = logs.RetentionDays
# CloudWatch Logs' retention periods by days (option logRetentionDays takes only these).
LOG_RETENTION: dict[int, logs.RetentionDays] = {
    1: _DAYS.ONE_DAY, 3: _DAYS.THREE_DAYS, 5: _DAYS.FIVE_DAYS, 7: _DAYS.ONE_WEEK, 14: _DAYS.TWO_WEEKS,
    30: _DAYS.ONE_MONTH, 60: _DAYS.TWO_MONTHS, 90: _DAYS.THREE_MONTHS, 120: _DAYS.FOUR_MONTHS,
    150: _DAYS.FIVE_MONTHS, 180: _DAYS.SIX_MONTHS, 365: _DAYS.ONE_YEAR, 400: _DAYS.THIRTEEN_MONTHS,
    545: _DAYS.EIGHTEEN_MONTHS, 731: _DAYS.TWO_YEARS, 1096: _DAYS.THREE_YEARS, 1827: _DAYS.FIVE_YEARS,
    2192: _DAYS.SIX_YEARS, 2557: _DAYS.SEVEN_YEARS, 2922: _DAYS.EIGHT_YEARS, 3288: _DAYS.NINE_YEARS,
    3653: _DAYS.TEN_YEARS,
}
assert tuple(LOG_RETENTION) == c.LOG_RETENTION_DAYS


def log_group(scope: Construct, construct_id: str, *, retention_days: int, removal_policy: RemovalPolicy,
              log_group_name: str | None = None, encryption_key: kms.IKey | None = None) -> logs.LogGroup:
    """A log group of the stack, keeping its events ``retention_days`` (option logRetentionDays),
    encrypted with ``encryption_key`` (option kms_key_arn; CloudWatch Logs uses it with its own
    service principal, which the key's policy must allow: docs/deploy.md, Regulated accounts)."""
    return logs.LogGroup(scope, construct_id, retention=LOG_RETENTION[retention_days],
                         removal_policy=removal_policy, log_group_name=log_group_name,
                         encryption_key=encryption_key)


def logical_id_at(scope: Construct, *path: str) -> str:
    """The logical ID CDK gives a resource at ``path`` under ``scope``, found by its own rule on a
    copy of the construct path in an app of its own (nothing is added to ``scope``'s stack)."""
    stack = Stack.of(scope)
    ids = [*scope.node.path.removeprefix(stack.node.path).strip("/").split("/"), *path]
    copy = Stack(App(), "Copy")
    parent: Construct = copy
    for construct_id in ids[:-1]:
        parent = Construct(parent, construct_id)
    return copy.get_logical_id(CfnResource(parent, ids[-1], type="Coworker::Copy"))


class CoworkerFunction(Construct):
    """A function whose code is ``functions/<name>/`` (or ``code``, bundled from it) and whose
    handler is ``handler.handler``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        code_dir: Path,
        layer: lambda_.ILayerVersion,
        environment: dict[str, str],
        timeout_seconds: int,
        memory_mb: int,
        removal_policy: RemovalPolicy,
        log_retention_days: int,
        description: str,
        reserved_concurrency: int | None = None,
        code: lambda_.Code | None = None,
        encryption_key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = log_group(self, "Logs", retention_days=log_retention_days, removal_policy=removal_policy,
                                   encryption_key=encryption_key)
        # A role of its own with no managed policy: AWSLambdaBasicExecutionRole would let it
        # create and write any log group in the account; it writes only to its own.
        self.role = iam.Role(self, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                             description=f"{description}: its own log group, and what its code calls")
        # The logical ID of the role Lambda's construct made in releases before this one (at
        # Function/ServiceRole): an upgrade updates that role in place. As a new resource, the old
        # role would be deleted at the update's cleanup while invocations of the old code still
        # run on it (their tasks then fail and run again). tests/infra/test_upgrade.py holds it.
        self.role.node.default_child.override_logical_id(  # type: ignore[union-attr]
            logical_id_at(self, "Function", "ServiceRole", "Resource"))
        self.log_group.grant_write(self.role)  # CreateLogStream, PutLogEvents on this group
        code = code or lambda_.Code.from_asset(str(code_dir), exclude=list(c.ASSET_EXCLUDES))
        self.function = self._build_function(
            code, layer, environment, timeout_seconds, memory_mb, description, reserved_concurrency
        )

    def _build_function(
        self,
        code: lambda_.Code,
        layer: lambda_.ILayerVersion,
        environment: dict[str, str],
        timeout_seconds: int,
        memory_mb: int,
        description: str,
        reserved_concurrency: int | None,
    ) -> lambda_.Function:
        return lambda_.Function(
            self,
            "Function",
            description=description,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=c.HANDLER,
            code=code,
            layers=[layer],
            environment=environment,
            timeout=Duration.seconds(timeout_seconds),
            memory_size=memory_mb,
            tracing=lambda_.Tracing.ACTIVE,
            log_group=self.log_group,
            role=self.role,
            reserved_concurrent_executions=reserved_concurrency,
        )
