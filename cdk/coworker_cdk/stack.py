"""The Coworker stack: a thin wrapper around :class:`coworker_cdk.task_system.TaskSystem` configured from
CDK context (see docs/deploy.md), with the outputs an operator needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

from coworker_cdk import constants as c
from coworker_cdk.config import StackConfig
from coworker_cdk.task_system import TaskSystem


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
        # "Default" leaves the construct out of the resources' logical IDs, so a stack deployed
        # before TaskSystem existed keeps its table and everything else in place.
        self.system = TaskSystem(
            self, "Default", config=StackConfig.from_context(self.node), functions_dir=functions_dir
        )
        self._build_outputs()

    def _build_outputs(self) -> None:
        system = self.system
        CfnOutput(self, "ApiUrl", value=system.api_url, description="Base URL of the task API")
        if system.api.api_key is not None:
            CfnOutput(
                self,
                "ApiKeyId",
                value=system.api.api_key.key_id,
                description="aws apigateway get-api-key --include-value --api-key <id> prints the key",
            )
        if system.api.invoke_policy is not None:
            CfnOutput(
                self,
                "ApiInvokePolicyArn",
                value=system.api.invoke_policy.managed_policy_arn,
                description="Attach to the users and roles that call the API (coworker --iam)",
            )
        CfnOutput(self, "TableName", value=system.tasks.table.table_name, description="DynamoDB task table")
        CfnOutput(self, "DashboardUrl", value=system.dashboard_url, description="CloudWatch dashboard")
        CfnOutput(self, "AlarmTopicArn", value=system.monitoring.topic.topic_arn,
                  description="SNS topic every alarm notifies (ALARM and OK): subscribe e-mail, PagerDuty, Chatbot")
        CfnOutput(self, "WorkerFunctionName", value=system.processing.worker.function.function_name)
        CfnOutput(self, "DeadLetterQueueUrl", value=system.processing.dead_letter_queue.queue_url)
        if system.events_bus_name is not None and system.events_bus_arn is not None:
            CfnOutput(self, "EventBusName", value=system.events_bus_name,
                      description="EventBridge bus of Coworker's completion events (docs/events.md)")
            CfnOutput(self, "EventBusArn", value=system.events_bus_arn)
        bus = system.events_bus_name
        if bus is not None and bus.startswith("arn:") and system.processing.coordinator.function.role is not None:
            CfnOutput(self, "EventPublisherRoleArn", value=system.processing.coordinator.function.role.role_arn,
                      description="The role that puts events: a bus in another account must allow it "
                                  "events:PutEvents in its resource policy (docs/events.md)")
        if system.event_bus is not None:
            CfnOutput(self, "EventDeadLetterQueueArn", value=system.event_bus.dead_letter_queue.queue_arn,
                      description="Dead-letter queue for your rules' targets on the events' bus (DeadLetterConfig)")
