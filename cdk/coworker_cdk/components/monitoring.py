"""Dashboard and alarms over the Powertools metrics, the functions, the DLQ and the table.

The functions publish EMF metrics in namespace ``Coworker`` with the single dimension
``service`` (POWERTOOLS_SERVICE_NAME: the same for every function of one deployment, and another
for each deployment), so each metric below is the total over this deployment's functions,
whichever one emits it, and nothing of another deployment's. The API's metrics are its stage's
(ApiName and Stage): TaskApi names the REST API after the deployment too.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Annotations, ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct
from coworker.data import layout
from coworker.observability import MetricName

from coworker_cdk import constants as c
from coworker_cdk.config import StackConfig

_MINUTE = Duration.minutes(c.METRIC_PERIOD_MINUTES)
_ALARM_PERIOD = Duration.minutes(c.ALARM_PERIOD_MINUTES)


class Monitoring(Construct):
    """One dashboard, its alarms, and the SNS topic every alarm notifies when it fires and when it
    is OK again: the team's own (``alarmTopic``) or one of the stack's, encrypted, which
    ``alarmEmail`` subscribes an address to (without either, synth and deploy print a warning:
    alarms that notify nobody go unseen)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        table: dynamodb.ITableV2,
        coordinator: lambda_.IFunction,
        worker: lambda_.IFunction,
        api_handler: lambda_.IFunction,
        rest_api: apigw.RestApi,
        dead_letter_queue: sqs.IQueue,
        runners: bool = False,
        event_delivery_queue: sqs.IQueue | None = None,
        key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._table = table
        self._config = config
        self._key = key  # the customer-managed key (option kms_key_arn), when there is one
        self.topic = self._build_topic(config)
        self.alarms = self._build_alarms(coordinator, dead_letter_queue, worker, rest_api)
        if runners:  # the container runner: the coordinator's RunTask calls
            self.alarms.append(self._runner_alarm())
        self.alarms += self._events_alarms(event_delivery_queue)
        for alarm in self.alarms:
            self.notify(alarm)
        if not (config.alarm_email or config.alarm_topic_arn):
            Annotations.of(self).add_warning_v2(
                "coworker:alarms-notify-nobody",
                "Coworker's alarms notify nobody yet: the stack's alarm topic has no subscriber (no alarmEmail "
                "or alarmTopic is set). Deploy with -c alarmEmail=you@example.com (and confirm the e-mail AWS "
                "sends), or -c alarmTopic=<ARN of your SNS topic>, or subscribe to the AlarmTopicArn output "
                "(aws sns subscribe --topic-arn <AlarmTopicArn> --protocol email --notification-endpoint "
                "you@example.com; PagerDuty or AWS Chatbot alike) and acknowledge this warning; "
                "docs/operations.md, Getting notified, says how.",
            )
        self.dashboard = self._build_dashboard(coordinator, worker, api_handler, rest_api, dead_letter_queue)
        if runners:
            self.dashboard.add_widgets(*self._runner_widgets())
        self.dashboard.add_widgets(*self._events_widgets(event_delivery_queue))

    # --- metrics -----------------------------------------------------------------------------
    def task_metric(
        self, name: str, statistic: str = cloudwatch.Stats.SUM, period: Duration = _MINUTE
    ) -> cloudwatch.Metric:
        """One of the functions' metrics, of this deployment only (its ``service`` dimension)."""
        return cloudwatch.Metric(
            namespace=c.METRICS_NAMESPACE,
            metric_name=name,
            dimensions_map={"service": self._config.service_name},
            statistic=statistic,
            period=period,
            label=name if statistic == cloudwatch.Stats.SUM else f"{name} {statistic}",
        )

    def _table_throttles(self, period: Duration) -> cloudwatch.MathExpression:
        def metric(name: str, index: bool) -> cloudwatch.Metric:
            dimensions = {"TableName": self._table.table_name}
            if index:
                dimensions["GlobalSecondaryIndexName"] = layout.STATUS_INDEX_NAME
            return cloudwatch.Metric(
                namespace="AWS/DynamoDB",
                metric_name=name,
                dimensions_map=dimensions,
                statistic=cloudwatch.Stats.SUM,
                period=period,
            )

        return cloudwatch.MathExpression(
            expression="FILL(tr, 0) + FILL(tw, 0) + FILL(ir, 0) + FILL(iw, 0)",
            using_metrics={
                "tr": metric("ReadThrottleEvents", False),
                "tw": metric("WriteThrottleEvents", False),
                "ir": metric("ReadThrottleEvents", True),
                "iw": metric("WriteThrottleEvents", True),
            },
            label="DynamoDB throttle events (table + status index)",
            period=period,
        )

    # --- notifications and alarms ------------------------------------------------------------
    def notify(self, alarm: cloudwatch.Alarm) -> None:
        """Send the alarm's changes to the alarm topic both ways: into ALARM and back to OK."""
        action = cw_actions.SnsAction(self.topic)
        alarm.add_alarm_action(action)
        alarm.add_ok_action(action)

    def _build_topic(self, config: StackConfig) -> sns.ITopic:
        """The team's topic (``alarmTopic``) as it is, or one of the stack's; ``alarmEmail``
        subscribes to whichever it is."""
        if config.alarm_topic_arn:
            topic = sns.Topic.from_topic_arn(self, "AlarmTopic", config.alarm_topic_arn)
        else:
            topic = self._own_topic()
        if config.alarm_email:
            topic.add_subscription(subscriptions.EmailSubscription(config.alarm_email))
        return topic

    def _own_topic(self) -> sns.Topic:
        # Encrypted with a key of the stack's: CloudWatch cannot publish to a topic under the
        # AWS-managed key (aws/sns), whose policy does not let it use the key and cannot be edited.
        # Under the customer-managed key (option kms_key_arn) instead, whose policy the stack cannot
        # edit either: it must let cloudwatch.amazonaws.com use it (docs/deploy.md, Regulated accounts).
        if self._key is not None:
            return self._topic(self._key)
        key = kms.Key(
            self, "AlarmTopicKey", description="Encrypts Coworker's alarm topic (CloudWatch alarms publish to it)",
            enable_key_rotation=True,
            # The topic is its only user and holds no message at rest for long: it goes with the stack.
            removal_policy=RemovalPolicy.DESTROY, pending_window=Duration.days(7),
        )
        cloudwatch_service = iam.ServicePrincipal("cloudwatch.amazonaws.com")
        key.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsPublishToTheTopic", principals=[cloudwatch_service],
            actions=["kms:Decrypt", "kms:GenerateDataKey*"], resources=["*"],
        ))
        return self._topic(key)

    def _topic(self, key: kms.IKey) -> sns.Topic:
        cloudwatch_service = iam.ServicePrincipal("cloudwatch.amazonaws.com")
        topic = sns.Topic(self, "AlarmTopic", display_name="Coworker alarms", enforce_ssl=True, master_key=key)
        # The topic's policy replaces SNS's default one: the alarms of this account may publish.
        topic.add_to_resource_policy(iam.PolicyStatement(
            sid="CloudWatchAlarmsPublish", principals=[cloudwatch_service], actions=["sns:Publish"],
            resources=[topic.topic_arn],
            conditions={"ArnLike": {"aws:SourceArn": Stack.of(self).format_arn(
                service="cloudwatch", resource="alarm", resource_name="*", arn_format=ArnFormat.COLON_RESOURCE_NAME)}},
        ))
        return topic

    def _ignored_share(self, period: Duration) -> cloudwatch.MathExpression:
        return cloudwatch.MathExpression(
            expression=f"IF(FILL(i, 0) + FILL(f, 0) >= {c.IGNORED_ALARM_MIN_ENDED}, "
                       "100 * FILL(i, 0) / (FILL(i, 0) + FILL(f, 0)), 0)",
            using_metrics={"i": self.task_metric(MetricName.IGNORED, period=period),
                           "f": self.task_metric(MetricName.FINISHED, period=period)},
            label="Ignored share of ended tasks (%)",
            period=period,
        )

    def _alarm(self, construct_id: str, metric: cloudwatch.IMetric, description: str, threshold: float = 1,
               **options: Any) -> cloudwatch.Alarm:
        """An alarm at or above ``threshold`` in one period, missing data not breaching, unless told."""
        return cloudwatch.Alarm(
            self,
            construct_id,
            metric=metric,
            threshold=threshold,
            evaluation_periods=options.pop("evaluation_periods", 1),
            comparison_operator=options.pop(
                "comparison_operator", cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD),
            treat_missing_data=options.pop("treat_missing_data", cloudwatch.TreatMissingData.NOT_BREACHING),
            alarm_description=description,
            **options,
        )

    def _build_alarms(
        self, coordinator: lambda_.IFunction, dead_letter_queue: sqs.IQueue, worker: lambda_.IFunction,
        rest_api: apigw.RestApi,
    ) -> list[cloudwatch.Alarm]:
        return [*self._work_alarms(), *self._failure_alarms(coordinator, dead_letter_queue, worker, rest_api)]

    def _work_alarms(self) -> list[cloudwatch.Alarm]:
        """The work itself: the coordinator ticks, due tasks start, few end ignored."""
        config, alarm = self._config, self._alarm
        silence = config.coordinator_silence_alarm_minutes
        return [
            alarm(
                "CoordinatorSilentAlarm",
                self.task_metric(MetricName.COORDINATOR_TICKS, period=_MINUTE),
                f"The coordinator has not ticked for {silence} minutes (its schedule is disabled, it "
                "cannot start, or it fails before its first tick): retries and tasks of lost workers "
                "wait, and the backlog metrics stop. New tasks still start on submit.",
                threshold=1,
                comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
                evaluation_periods=silence,
                datapoints_to_alarm=silence,
                treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
            ),
            alarm(
                "OldestTaskAgeAlarm",
                self.task_metric(MetricName.OLDEST_DUE_AGE, cloudwatch.Stats.MAXIMUM, _ALARM_PERIOD),
                f"A due task has waited over {config.oldest_task_alarm_seconds} s to start: capacity is "
                "short for the backlog (raise maxConcurrency), its type is paused, or nothing dispatches.",
                threshold=config.oldest_task_alarm_seconds,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            ),
            alarm(
                "IgnoredShareAlarm",
                self._ignored_share(_ALARM_PERIOD),
                f"Over {config.ignored_alarm_percent}% of the tasks that ended in "
                f"{c.IGNORED_ALARM_PERIODS * c.ALARM_PERIOD_MINUTES} minutes were ignored (attempt "
                "ceiling or a non-retryable failure); list them with GET /tasks?status=ignored "
                "(or `coworker list --status ignored`).",
                threshold=config.ignored_alarm_percent,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=c.IGNORED_ALARM_PERIODS,
                datapoints_to_alarm=1,
            ),
        ]

    def _failure_alarms(
        self, coordinator: lambda_.IFunction, dead_letter_queue: sqs.IQueue, worker: lambda_.IFunction,
        rest_api: apigw.RestApi,
    ) -> list[cloudwatch.Alarm]:
        """What fails around the work: the functions, the API, the dead-letter queue, the table."""
        alarm = self._alarm
        return [
            alarm(
                "CoordinatorErrorsAlarm",
                coordinator.metric_errors(period=_ALARM_PERIOD),
                "The coordinator failed; while it keeps failing, retries and tasks of lost workers "
                "wait (new tasks still start on submit and running workers keep feeding).",
            ),
            alarm(
                "DeadLetterQueueAlarm",
                dead_letter_queue.metric_approximate_number_of_messages_visible(
                    period=_ALARM_PERIOD, statistic=cloudwatch.Stats.MAXIMUM
                ),
                "Worker invocations failed outside the task handlers (crash, timeout, throttled "
                "too long); their tasks are re-dispatched once their lock expires.",
            ),
            alarm(
                "WorkerErrorsAlarm",
                worker.metric_errors(period=_ALARM_PERIOD),
                "Worker invocations failed outside the task handlers (a handler's own errors are recorded "
                "on its task, not here): an import error, a crash, the function's timeout. Their tasks run "
                "again once their locks expire; the worker's logs say why.",
            ),
            alarm(
                "ApiServerErrorsAlarm",
                rest_api.deployment_stage.metric_server_error(period=_ALARM_PERIOD, statistic=cloudwatch.Stats.SUM),
                f"The task API answered {c.API_5XX_ALARM_COUNT} or more 5xx in "
                f"{c.ALARM_PERIOD_MINUTES} minutes: DynamoDB or the object store refused or failed (503, "
                "clients re-send), or the API function failed (502/500): its logs say why.",
                threshold=c.API_5XX_ALARM_COUNT,
            ),
            alarm(
                "SlotUpkeepFailedAlarm",
                self.task_metric(MetricName.SLOT_UPKEEP_FAILED, period=_ALARM_PERIOD),
                "A coordinator run could not create or delete worker or runner slots at its start (DynamoDB "
                "throttled or failed the write); the run went on, and the next one tries again. Lasting, "
                "workers may be short of slots or keep surplus ones: the coordinator's logs say which write.",
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                threshold=0,
            ),
            alarm(
                "TableThrottlesAlarm",
                self._table_throttles(_ALARM_PERIOD),
                "DynamoDB throttled requests on the task table or its status index.",
            ),
        ]

    def _runner_alarm(self) -> cloudwatch.Alarm:
        return self._alarm(
            "RunnerStartFailedAlarm",
            self.task_metric(MetricName.RUNNER_START_FAILED, period=_ALARM_PERIOD),
            "The coordinator could not start a container runner (ECS RunTask refused or failed: capacity, "
            "the image, the network, a quota); container work waits and is tried again every tick. The "
            "coordinator's logs say why.",
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            threshold=0,
        )

    def _runner_widgets(self) -> list[cloudwatch.IWidget]:
        m = self.task_metric
        return [
            cloudwatch.GraphWidget(
                title="Container runners",
                left=[m(MetricName.RUNNERS_STARTED), m(MetricName.RUNNER_START_FAILED)],
                right=[m(MetricName.BUSY_RUNNERS, cloudwatch.Stats.MAXIMUM)],
                width=c.DASHBOARD_WIDGET_WIDTH,
                height=c.DASHBOARD_WIDGET_HEIGHT,
            ),
        ]

    @property
    def _events_on(self) -> bool:
        return self._config.settings.events == "eventbridge"

    def _events_alarms(self, delivery_queue: sqs.IQueue | None) -> list[cloudwatch.Alarm]:
        """The stream follower, which batch counts, callbacks and Task Ignored events wait on; with
        events=eventbridge, the events it gave up on; with the stack's own bus, its rules' failed
        deliveries."""
        lag = self._config.stream_lag_alarm_seconds
        alarms = [self._alarm(
            "StreamFollowerLagAlarm",
            self.task_metric(MetricName.STREAM_FOLLOWER_LAG, cloudwatch.Stats.MAXIMUM, _ALARM_PERIOD),
            f"The coordinator's stream follower is over {lag} s behind the table's writes (or failing: its "
            "lag then grows from its last pass that caught up): batch progress, batch callbacks and "
            "completion events wait. The coordinator's logs say why (throttled counter writes, stream "
            "reads refused); past 24 h the stream drops records and counts come up short.",
            threshold=lag,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        )]
        if self._events_on:
            alarms.append(self._alarm(
                "EventsDroppedAlarm",
                self.task_metric(MetricName.EVENTS_DROPPED, period=_ALARM_PERIOD),
                "Task Ignored events were dropped: EventBridge refused them on every one of the publisher's "
                "attempts (the bus is missing, its policy denies the coordinator, or PutEvents is throttled). "
                "The coordinator's logs hold each dropped event's detail; consumers never saw them.",
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                threshold=0,
            ))
        if delivery_queue is not None:
            alarms.append(self._alarm(
                "EventDeliveryDeadLetterAlarm",
                delivery_queue.metric_approximate_number_of_messages_visible(
                    period=_ALARM_PERIOD, statistic=cloudwatch.Stats.MAXIMUM),
                "A rule on Coworker's event bus could not deliver an event to its target (after EventBridge's "
                "retries): it waits in the events' dead-letter queue, with the error in its attributes.",
            ))
        return alarms

    def _events_widgets(self, delivery_queue: sqs.IQueue | None) -> list[cloudwatch.IWidget]:
        m = self.task_metric
        left: list[cloudwatch.IMetric] = [m(MetricName.STREAM_FOLLOWER_LAG, cloudwatch.Stats.MAXIMUM)]
        right: list[cloudwatch.IMetric] = []
        if self._events_on:
            right += [m(MetricName.EVENTS_PUBLISHED), m(MetricName.EVENTS_DROPPED)]
        if delivery_queue is not None:
            right.append(delivery_queue.metric_approximate_number_of_messages_visible(
                period=_MINUTE, statistic=cloudwatch.Stats.MAXIMUM, label="Events dead-letter queue"))
        title = "Stream follower lag (s)" + (" and completion events" if right else "")
        return [cloudwatch.GraphWidget(title=title, left=left, right=right,
                                       width=c.DASHBOARD_WIDGET_WIDTH, height=c.DASHBOARD_WIDGET_HEIGHT)]

    # --- dashboard -----------------------------------------------------------------------------
    def _build_dashboard(
        self,
        coordinator: lambda_.IFunction,
        worker: lambda_.IFunction,
        api_handler: lambda_.IFunction,
        rest_api: apigw.RestApi,
        dead_letter_queue: sqs.IQueue,
    ) -> cloudwatch.Dashboard:
        def graph(title: str, left: list[cloudwatch.IMetric], right: list[cloudwatch.IMetric] | None = None):
            return cloudwatch.GraphWidget(
                title=title,
                left=left,
                right=right or [],
                width=c.DASHBOARD_WIDGET_WIDTH,
                height=c.DASHBOARD_WIDGET_HEIGHT,
            )

        m = self.task_metric
        maximum = cloudwatch.Stats.MAXIMUM
        api_stage = rest_api.deployment_stage  # its ApiName is the stack's own (TaskApi), and its stage
        dashboard = cloudwatch.Dashboard(self, "Dashboard", default_interval=Duration.hours(3))
        dashboard.add_widgets(
            graph(
                "Backlog: due tasks by status (counted up to COWORKER_BACKLOG_COUNT_CAP each)",
                [m(MetricName.DUE_TODO, maximum), m(MetricName.DUE_RETRY, maximum),
                 m(MetricName.LOST_TASKS, maximum)],
                [m(MetricName.RUNNING_TASKS, maximum), m(MetricName.BLOCKED_TASKS, maximum)],
            ),
            graph(
                "Oldest due task: seconds waiting",
                [m(MetricName.OLDEST_DUE_AGE, maximum)],
                [m(MetricName.COORDINATOR_TICKS)],
            ),
        )
        dashboard.add_widgets(
            cloudwatch.AlarmStatusWidget(
                alarms=self.alarms,
                title="Alarms",
                width=2 * c.DASHBOARD_WIDGET_WIDTH,
                height=c.DASHBOARD_WIDGET_HEIGHT // 2,
            )
        )
        dashboard.add_widgets(
            graph(
                "Tasks per minute",
                [
                    m(MetricName.CLAIMED),
                    m(MetricName.FINISHED),
                    m(MetricName.FAILED),
                    m(MetricName.IGNORED),
                    m(MetricName.LOST_CLAIM),
                    m(MetricName.TIMED_OUT),
                ],
                [m(MetricName.NOT_CLAIMED), m(MetricName.LOST_CLAIM_SIGNALLED), m(MetricName.BLOCKED),
                 m(MetricName.WOKEN), m(MetricName.RATE_LIMITED), m(MetricName.TOO_LONG),
                 m(MetricName.WORKER_ERRORS)],
            ),
            graph("Task duration (ms)", [m(MetricName.DURATION, p) for p in c.DURATION_PERCENTILES]),
        )
        dashboard.add_widgets(
            graph(
                "Dispatch per minute",
                [
                    m(MetricName.DISPATCHED),
                    m(MetricName.WORKER_INVOCATIONS),
                    m(MetricName.DISPATCHED_ON_SUBMIT),
                    m(MetricName.REAPED),
                    m(MetricName.SLOT_TAKEN_OVER),
                    m(MetricName.PARKED),
                    m(MetricName.RELEASED),
                    m(MetricName.SLOT_UPKEEP_FAILED),
                ],
                [m(MetricName.FEED_PAGES)],
            ),
            graph(
                "Capacity",
                [m(MetricName.BUSY_SLOTS, maximum), m(MetricName.RUNNING_TASKS, maximum)],
                [m(MetricName.BACKLOG, maximum)],
            ),
        )
        dashboard.add_widgets(
            graph(
                "Coordinator",
                [coordinator.metric_invocations(period=_MINUTE), coordinator.metric_errors(period=_MINUTE)],
                [coordinator.metric_duration(period=_MINUTE, statistic=maximum)],
            ),
            graph(
                "Worker",
                [
                    worker.metric_invocations(period=_MINUTE),
                    worker.metric_errors(period=_MINUTE),
                    worker.metric_throttles(period=_MINUTE),
                ],
                [worker.metric_duration(period=_MINUTE, statistic=cloudwatch.Stats.p(90))],
            ),
        )
        dashboard.add_widgets(
            graph(
                "Worker invocation events (asynchronous)",
                [
                    worker.metric("AsyncEventsReceived", period=_MINUTE, statistic=cloudwatch.Stats.SUM),
                    worker.metric("AsyncEventsDropped", period=_MINUTE, statistic=cloudwatch.Stats.SUM),
                ],
                [worker.metric("AsyncEventAge", period=_MINUTE, statistic=maximum, label="AsyncEventAge max (ms)")],
            ),
            graph(
                "API requests",
                [
                    api_stage.metric_count(period=_MINUTE),
                    api_stage.metric_client_error(period=_MINUTE),
                    api_stage.metric_server_error(period=_MINUTE),
                ],
                [api_stage.metric_latency(period=_MINUTE, statistic=cloudwatch.Stats.p(90))],
            ),
        )
        dashboard.add_widgets(
            graph(
                "API function",
                [
                    api_handler.metric_invocations(period=_MINUTE),
                    api_handler.metric_errors(period=_MINUTE),
                    api_handler.metric_throttles(period=_MINUTE),
                ],
            ),
            graph("DynamoDB throttles", [self._table_throttles(_MINUTE)]),
        )
        dashboard.add_widgets(
            graph(
                "Worker dead-letter queue",
                [
                    dead_letter_queue.metric_approximate_number_of_messages_visible(
                        period=_MINUTE, statistic=maximum
                    )
                ],
            ),
            graph("Ignored share of ended tasks (%)", [self._ignored_share(_ALARM_PERIOD)]),
        )
        return dashboard
