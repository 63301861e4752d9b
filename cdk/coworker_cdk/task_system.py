"""Coworker as one construct, to put into your own CDK app::

    from coworker_cdk import TaskSystem

    class MyStack(Stack):
        def __init__(self, scope, construct_id, **kwargs):
            super().__init__(scope, construct_id, **kwargs)
            tasks = TaskSystem(self, "Tasks", handlers="my_tasks", max_concurrency=500,
                               worker_memory_mb=1024)
            CfnOutput(self, "ApiUrl", value=tasks.api_url)

Options are the stack's context keys in snake case (docs/deploy.md lists them all), validated when
the construct is created: an unknown name or a bad value raises ConfigurationError saying which.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from aws_cdk import Annotations, Aws, RemovalPolicy, Stack, Token
from aws_cdk import aws_kms as kms
from constructs import Construct
from coworker.capacity import Capacity
from coworker.errors import ConfigurationError

from coworker_cdk import constants as c
from coworker_cdk.components.api import TaskApi
from coworker_cdk.components.event_bus import CompletionEventBus
from coworker_cdk.components.layer import CoworkerLayer
from coworker_cdk.components.monitoring import Monitoring
from coworker_cdk.components.processing import Processing
from coworker_cdk.components.results import ResultsBucket
from coworker_cdk.components.runners import ContainerRunner
from coworker_cdk.components.table import TaskTable
from coworker_cdk.config import StackConfig, context_key
from coworker_cdk.nag import acknowledge_findings


class TaskSystem(Construct):
    """The task table, the library layer, coordinator and workers (with your handlers), the API
    and its monitoring; and the container runner (ECS Fargate) when a task type runs on it.

    ``handlers`` (required) is your handlers package: a folder with ``__init__.py`` (and
    optionally ``requirements.txt``, resolved for Lambda's platform at synth), bundled into the
    worker and the API without Docker; ``"examples"`` deploys the example task types only.
    ``config`` takes an already validated :class:`StackConfig` instead of ``options``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig | None = None,
        functions_dir: Path = c.FUNCTIONS_DIR,
        **options: Any,
    ) -> None:
        super().__init__(scope, construct_id)
        if config is not None and options:
            raise TypeError("give TaskSystem either config or options, not both")
        config = config or StackConfig.from_options(**options)
        # Metrics, dashboard and alarms of this deployment only: its own ``service`` dimension.
        self.config = dataclasses.replace(config, service_name=self._service_name())
        # Retained on update and delete, but not when the first create fails: a failed create
        # leaves nothing behind to clean up by hand (CloudFormation's RetainExceptOnCreate).
        removal = RemovalPolicy.DESTROY if self.config.destroy_on_removal else RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE
        # What the account must allow, said at every synth: a quota below it fails the first create.
        Annotations.of(self).add_info(
            f"Coworker reserves {self.config.reserved_concurrency} concurrent Lambda executions: the account's "
            f"concurrency quota must be at least {self.config.required_lambda_quota} (`aws lambda "
            "get-account-settings` shows it; new accounts often have 10 or 50: ask AWS to raise it)")
        # What it can run, said at every synth: the figures docs/cost.md gives for the defaults.
        self.capacity = Capacity.of(self.config.settings, self.config.warm_write_units)
        Annotations.of(self).add_info(self.capacity.describe())

        self._refuse_another_region()
        # The customer-managed key (option kms_key_arn): the table, the results bucket, the dead-letter
        # queue, the stack's alarm topic and every log group are encrypted with it. Imported: the
        # stack neither owns nor edits its policy (docs/deploy.md, Regulated accounts, says what it allows).
        self.key: kms.IKey | None = None
        if self.config.kms_key_arn:
            self.key = kms.Key.from_key_arn(self, "CustomerKey", self.config.kms_key_arn)
            # What the stack cannot check, said at every synth: without it a log group's create fails.
            Annotations.of(self).add_info(
                "Coworker encrypts its table, bucket, queue, alarm topic and log groups with "
                f"{self.config.kms_key_arn}: its key policy must let CloudWatch Logs (logs.<region>.amazonaws.com) "
                "and CloudWatch alarms (cloudwatch.amazonaws.com) use it"
                + (", and EventBridge (events.amazonaws.com) for the events' bus, archive and queue"
                   if self.config.own_event_bus else "")
                + ", or the first log group's create fails and the stack rolls back (docs/deploy.md, Regulated "
                "accounts)")
        # The events' own bus, before the functions: its name is their COWORKER_EVENT_BUS.
        self.event_bus: CompletionEventBus | None = None
        if self.config.own_event_bus:
            self.event_bus = CompletionEventBus(self, "Events", archive_days=self.config.event_archive_days,
                                                accounts=self.config.event_bus_accounts,
                                                organization_id=self.config.event_bus_organization_id,
                                                removal_policy=removal,
                                                key=self.key)
            settings = self.config.settings.model_copy(update={"event_bus": self.event_bus.bus.event_bus_name})
            self.config = dataclasses.replace(self.config, settings=settings)

        self.tasks = TaskTable(self, "Tasks", removal_policy=removal,
                               legacy_status_index=self.config.legacy_status_index,
                               warm_write_units=self.config.warm_write_units,
                               warm_read_units=self.config.warm_read_units, encryption_key=self.key)
        self.results = (
            ResultsBucket(self, "Results", retention_days=self.config.settings.retention_days, encryption_key=self.key)
            if self.config.results_bucket else None
        )
        results_bucket = self.results.bucket if self.results else None
        self.layer = CoworkerLayer(
            self,
            "Library",
            source_dir=c.LAYER_SOURCE_DIR,
            requirements=c.LAYER_LOCK,
            install_dependencies=self.config.install_layer_dependencies,
        )
        shared: dict[str, Any] = dict(  # what the processing functions and the API are both built on
            config=self.config,
            table=self.tasks.table,
            layer=self.layer.layer,
            functions_dir=functions_dir,
            removal_policy=removal,
            key=self.key,
        )
        self.processing = Processing(self, "Processing", results_bucket=results_bucket, **shared)
        # Task types longer than Lambda allows (or that ask for it) run on ECS Fargate, started by
        # the coordinator; without such types there is none (and every function has max_runners 0).
        self.runner: ContainerRunner | None = None
        if self.config.runner is not None:
            self.runner = ContainerRunner(self, "Runners", config=self.config, runner=self.config.runner,
                                          table=self.tasks.table, removal_policy=removal,
                                          runner_dir=functions_dir / c.RUNNER_DIR_NAME, results_bucket=results_bucket,
                                          key=self.key)
            self.runner.allow_start(self.processing.coordinator.function)
        self.api = TaskApi(self, "Api", worker=self.processing.worker.function, results_bucket=results_bucket,
                           **shared)
        self.monitoring = Monitoring(
            self,
            "Monitoring",
            config=self.config,
            table=self.tasks.table,
            coordinator=self.processing.coordinator.function,
            worker=self.processing.worker.function,
            api_handler=self.api.handler.function,
            rest_api=self.api.rest_api,
            dead_letter_queue=self.processing.dead_letter_queue,
            runners=self.runner is not None,
            event_delivery_queue=self.event_bus.dead_letter_queue if self.event_bus else None,
            key=self.key,
        )
        acknowledge_findings(tasks=self.tasks, processing=self.processing, api=self.api, results=self.results,
                             runner=self.runner, event_bus=self.event_bus)

    def _refuse_another_region(self) -> None:
        """The key and the web ACL must be in the stack's region (KMS keys, but for multi-Region
        replicas, and regional web ACLs serve their own region only): refused at synth when both
        regions are known, rather than at deploy, half-way through."""
        region = Stack.of(self).region
        for name, arn in (("kms_key_arn", self.config.kms_key_arn), ("waf_web_acl_arn", self.config.waf_web_acl_arn)):
            if arn is None or Token.is_unresolved(region) or Token.is_unresolved(arn):
                continue
            if arn.split(":")[3] != region:
                raise ConfigurationError(f"option {name} (context {context_key(name)}) is in region "
                                         f"{arn.split(':')[3]}, and the stack deploys to {region}: give one of "
                                         f"{region}")

    def _service_name(self) -> str:
        """``coworker-<stack name>``, and ``-<construct id>`` for a system not named Default: the
        metrics' ``service`` dimension of this deployment."""
        stack_name = Stack.of(self).stack_name
        name = c.SERVICE_NAME if Token.is_unresolved(stack_name) else f"{c.SERVICE_NAME}-{stack_name}"
        return name if self.node.id == "Default" else f"{name}-{self.node.id}"

    @property
    def events_bus_name(self) -> str | None:
        """The bus the coordinator puts events on (the stack's own, or the one named), or ``None``
        without events=eventbridge."""
        if self.config.settings.events != "eventbridge":
            return None
        return self.config.settings.event_bus

    @property
    def events_bus_arn(self) -> str | None:
        """The ARN of :attr:`events_bus_name`'s bus (a name is a bus of the stack's account and region)."""
        bus = self.events_bus_name
        if bus is None:
            return None
        if self.event_bus is not None:
            return self.event_bus.bus.event_bus_arn
        return bus if bus.startswith("arn:") else Stack.of(self).format_arn(
            service="events", resource="event-bus", resource_name=bus)

    @property
    def api_url(self) -> str:
        """Base URL of the task API."""
        return self.api.rest_api.url

    @property
    def dashboard_url(self) -> str:
        """Console URL of the CloudWatch dashboard."""
        return (
            f"https://{Aws.REGION}.console.aws.amazon.com/cloudwatch/home?region={Aws.REGION}"
            f"#dashboards:name={self.monitoring.dashboard.dashboard_name}"
        )
