"""The Coworker stack: table, layer, coordinator and workers, API, monitoring."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import Aws, CfnOutput, RemovalPolicy, Stack
from constructs import Construct

from infra import constants as c
from infra.components.api import TaskApi
from infra.components.layer import CoworkerLayer
from infra.components.monitoring import Monitoring
from infra.components.processing import Processing
from infra.components.table import TaskTable
from infra.config import StackConfig
from infra.nag import acknowledge_findings


class CoworkerStack(Stack):
    """Everything Coworker runs on, configured from CDK context (see docs/deploy.md)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str = c.STACK_ID,
        *,
        functions_dir: Path = c.FUNCTIONS_DIR,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("description", c.STACK_DESCRIPTION)
        super().__init__(scope, construct_id, **kwargs)
        self.config = StackConfig.from_context(self.node)
        removal = RemovalPolicy.DESTROY if self.config.destroy_on_removal else RemovalPolicy.RETAIN

        self.tasks = TaskTable(self, "Tasks", removal_policy=removal)
        self.layer = CoworkerLayer(
            self,
            "Library",
            source_dir=c.LAYER_SOURCE_DIR,
            requirements=c.LAYER_REQUIREMENTS,
            install_dependencies=self.config.install_layer_dependencies,
        )
        shared = dict(
            config=self.config,
            table=self.tasks.table,
            layer=self.layer.layer,
            functions_dir=functions_dir,
            removal_policy=removal,
        )
        self.processing = Processing(self, "Processing", **shared)
        self.api = TaskApi(self, "Api", worker=self.processing.worker.function, **shared)
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            config=self.config,
            table=self.tasks.table,
            coordinator=self.processing.coordinator.function,
            worker=self.processing.worker.function,
            api_handler=self.api.handler.function,
            dead_letter_queue=self.processing.dead_letter_queue,
        )
        self._build_outputs()
        acknowledge_findings(self)

    def _build_outputs(self) -> None:
        dashboard_url = (
            f"https://{Aws.REGION}.console.aws.amazon.com/cloudwatch/home?region={Aws.REGION}"
            f"#dashboards:name={self.monitoring.dashboard.dashboard_name}"
        )
        CfnOutput(self, "ApiUrl", value=self.api.rest_api.url, description="Base URL of the task API")
        CfnOutput(
            self,
            "ApiKeyId",
            value=self.api.api_key.key_id,
            description="aws apigateway get-api-key --include-value --api-key <id> prints the key",
        )
        CfnOutput(self, "TableName", value=self.tasks.table.table_name, description="DynamoDB task table")
        CfnOutput(self, "DashboardUrl", value=dashboard_url, description="CloudWatch dashboard")
        CfnOutput(self, "WorkerFunctionName", value=self.processing.worker.function.function_name)
        CfnOutput(self, "DeadLetterQueueUrl", value=self.processing.dead_letter_queue.queue_url)
