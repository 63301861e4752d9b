"""The container runner: ECS Fargate tasks for the task types longer than Lambda allows.

Nothing runs until the coordinator asks: it starts one runner per free runner slot with
``ecs:RunTask`` of this task definition (:class:`coworker.engine.runners.EcsLauncher`), and a runner
exits once no container work is due. So there is no service, no load balancer and no idle cost;
the default network (a VPC of public subnets with gateway endpoints for DynamoDB and S3, no NAT
gateway) costs nothing by the hour either.

The runner runs the worker's code on other task types, so its task role is exactly the Lambda
worker's grants on the table and the results bucket (the same function grants both), and its
container has the worker's environment.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from constructs import Construct
from coworker.config import Settings

from coworker_cdk import constants as c
from coworker_cdk.components.function import log_group
from coworker_cdk.components.processing import grant_worker_access
from coworker_cdk.config import RunnerConfig, StackConfig
from coworker_cdk.runner_image import RunnerImageContext

ECS_TASKS = "ecs-tasks.amazonaws.com"


def _variable(field: str) -> str:
    """The environment variable of a library setting (its alias)."""
    alias = Settings.model_fields[field].alias
    assert alias is not None
    return alias


class ContainerRunner(Construct):
    """The runner's cluster, network, image, task definition (arm64), roles and log group.

    ``image_context`` is the Docker build context prepared at synth; the cloud assembly holds a
    copy of it as ``image_asset_directory`` (``cdk.out/asset.<hash>``). :meth:`allow_start` lets a
    function (the coordinator) start runners.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        runner: RunnerConfig,
        table: dynamodb.ITableV2,
        removal_policy: RemovalPolicy,
        runner_dir: Path,
        results_bucket: s3.IBucket | None = None,
        key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._runner = runner
        self._key = key  # the customer-managed key (option kms_key_arn), when there is one
        self.vpc: ec2.Vpc | None = None  # the VPC built for runners, without runner_subnets
        self.cluster_resource: ecs.CfnCluster | None = None  # the cluster built, without runner_cluster
        self.subnets, self.security_groups = self._build_network(removal_policy)
        self.cluster = self._build_cluster()
        self.log_group = log_group(self, "Logs", retention_days=config.log_retention_days,
                                   removal_policy=removal_policy, encryption_key=key)
        # Exactly what the worker's code calls (no logs: the container's output goes through the
        # execution role's awslogs driver; no X-Ray: there is no daemon beside it).
        self.task_role = iam.Role(self, "TaskRole", assumed_by=iam.ServicePrincipal(ECS_TASKS),
                                  description="Coworker container runner: what the worker's code calls")
        grant_worker_access(table, results_bucket, self.task_role, key)
        self.image_context = RunnerImageContext(
            runner_dir, config.handlers_dir, install_dependencies=config.install_layer_dependencies).prepare()
        self.image = ecr_assets.DockerImageAsset(self, "Image", directory=str(self.image_context),
                                                 platform=ecr_assets.Platform.LINUX_ARM64)
        self.task_definition = self._build_task_definition(table, results_bucket)
        execution_role = self.task_definition.execution_role  # CDK's: pulls the image, writes the log group
        assert execution_role is not None
        self.execution_role: iam.IRole = execution_role

    @property
    def image_asset_directory(self) -> str:
        """The image's build context inside the cloud assembly (``cdk.out/<this>``)."""
        return f"asset.{self.image.asset_hash}"

    # --- network -------------------------------------------------------------------------------
    def _build_network(self, removal_policy: RemovalPolicy) -> tuple[list[ec2.ISubnet], list[ec2.ISecurityGroup]]:
        """The deployer's subnets and security groups (no lookup: synth stays offline), or a VPC of
        its own: public subnets in two zones, no NAT gateway (no hourly cost; runners get a public
        IP to reach ECR and CloudWatch Logs), gateway endpoints for DynamoDB and S3 (free; the
        image's layers come from S3 too), flow logs, and a security group with no inbound rule."""
        runner = self._runner
        if runner.own_network:
            subnets = [ec2.Subnet.from_subnet_id(self, f"Subnet{i}", subnet_id)
                       for i, subnet_id in enumerate(runner.subnets)]
            groups = [ec2.SecurityGroup.from_security_group_id(self, f"SecurityGroup{i}", group_id, mutable=False)
                      for i, group_id in enumerate(runner.security_groups)]
            return subnets, groups
        flow_logs = log_group(self, "FlowLogs", retention_days=self._config.log_retention_days,
                              removal_policy=removal_policy, encryption_key=self._key)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            max_azs=c.RUNNER_VPC_MAX_AZS,
            nat_gateways=0,
            subnet_configuration=[ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC)],
            gateway_endpoints={
                "DynamoDb": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.DYNAMODB),
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3),
            },
            flow_logs={"FlowLog": ec2.FlowLogOptions(
                destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                traffic_type=ec2.FlowLogTrafficType.ALL)},
            # Runners use the group below, never the default one; restricting it would add a
            # custom-resource function to the stack.
            restrict_default_security_group=False,
        )
        group = ec2.SecurityGroup(self, "SecurityGroup", vpc=self.vpc, allow_all_outbound=True,
                                  description="Coworker container runners: no inbound traffic")
        return list(self.vpc.public_subnets), [group]

    def _build_cluster(self) -> ecs.ICluster:
        """The deployer's cluster (by name or ARN), or a cluster of its own.

        A Fargate cluster holds no network (each runner gets its subnets from RunTask), so it is a
        plain ``AWS::ECS::Cluster``: the L2 ``ecs.Cluster`` builds a VPC with NAT gateways when
        given none, and the deployer's subnets come without one.
        """
        name_or_arn = self._runner.cluster
        if name_or_arn is None:
            self.cluster_resource = ecs.CfnCluster(self, "Cluster")
            return ecs.Cluster.from_cluster_arn(self, "ClusterRef", self.cluster_resource.attr_arn)
        arn = name_or_arn if name_or_arn.startswith("arn:") else Stack.of(self).format_arn(
            service="ecs", resource="cluster", resource_name=name_or_arn)
        return ecs.Cluster.from_cluster_arn(self, "Cluster", arn)

    # --- task definition -----------------------------------------------------------------------
    def _build_task_definition(self, table: dynamodb.ITableV2,
                               results_bucket: s3.IBucket | None) -> ecs.FargateTaskDefinition:
        runner = self._runner
        task_definition = ecs.FargateTaskDefinition(
            self,
            "TaskDefinition",
            cpu=runner.cpu,
            memory_limit_mib=runner.memory_mb,
            runtime_platform=ecs.RuntimePlatform(cpu_architecture=ecs.CpuArchitecture.ARM64,
                                                 operating_system_family=ecs.OperatingSystemFamily.LINUX),
            task_role=self.task_role,
        )
        task_definition.add_container(
            "Runner",
            container_name=self._config.settings.runner_container,
            image=ecs.ContainerImage.from_docker_image_asset(self.image),
            environment=self._environment(table, results_bucket),
            logging=ecs.LogDrivers.aws_logs(stream_prefix=c.RUNNER_LOG_PREFIX, log_group=self.log_group),
            # SIGTERM to SIGKILL: Fargate's most; the runner's handlers get COWORKER_RUNNER_STOP_SECONDS of it.
            stop_timeout=Duration.seconds(c.RUNNER_STOP_TIMEOUT_SECONDS),
            essential=True,
        )
        return task_definition

    def _environment(self, table: dynamodb.ITableV2, results_bucket: s3.IBucket | None) -> dict[str, str]:
        """The worker's environment (the same code, the same settings), plus what a container lacks:
        the region (Lambda sets it itself) and the runner's stop time."""
        environment = self._config.function_environment(
            with_handlers=True, table_name=table.table_name,
            result_bucket=results_bucket.bucket_name if results_bucket else None,
            runner_stop_seconds=float(c.RUNNER_STOP_SECONDS),
        )
        environment[_variable("region")] = Aws.REGION
        environment["POWERTOOLS_TRACE_DISABLED"] = "true"  # no X-Ray daemon beside the container
        return environment

    # --- who may start runners -----------------------------------------------------------------
    def starter_environment(self) -> dict[str, str]:
        """What a function that starts runners needs to know: the cluster, the task definition and
        the network of RunTask (the container types and ``max_runners`` are every function's)."""
        return {
            _variable("runner_cluster"): self.cluster.cluster_arn,
            _variable("runner_task_definition"): self.task_definition.task_definition_arn,
            _variable("runner_subnets"): ",".join(subnet.subnet_id for subnet in self.subnets),
            _variable("runner_security_groups"): ",".join(group.security_group_id for group in self.security_groups),
            _variable("runner_public_ip"): str(self._runner.public_ip),
        }

    def allow_start(self, function: lambda_.Function) -> None:
        """Let ``function`` start runners: its environment names them, and its role may run this
        task definition (in this cluster only) and pass it exactly its two roles."""
        for name, value in self.starter_environment().items():
            function.add_environment(name, value)
        function.add_to_role_policy(iam.PolicyStatement(
            actions=["ecs:RunTask"], resources=[self.task_definition.task_definition_arn],
            conditions={"ArnEquals": {"ecs:cluster": self.cluster.cluster_arn}}))
        function.add_to_role_policy(iam.PolicyStatement(
            actions=["iam:PassRole"], resources=[self.task_role.role_arn, self.execution_role.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": ECS_TASKS}}))
