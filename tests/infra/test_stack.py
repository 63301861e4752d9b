"""Template assertions on the Coworker stack (synthesized once for the module)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
from aws_cdk import App, cx_api
from aws_cdk.assertions import Match, Template
from coworker.data import layout
from coworker.errors import ConfigurationError
from coworker.observability import MetricName
from coworker_cdk import constants as c
from coworker_cdk.bundling import function_bundling, layer_bundling
from coworker_cdk.config import StackConfig

from tests.infra.support import missing_function_code
from tests.support.handler_packages import write_handler_package

ROOT = Path(__file__).resolve().parents[2]

CONTEXT = {
    "maxConcurrency": 12,
    "batchSize": 5,
    "workerTimeoutSeconds": 120,
    "workerMemoryMb": 1024,
    "scheduleMinutes": 2,
    "maxAttempts": 4,
    "retentionDays": 7,
    "superviseSeconds": 120,
    "tickSeconds": 2,
    "heartbeatSeconds": 10,
    "reservationSeconds": 90,
    "dispatchOnSubmit": "false",  # a string, as `cdk -c dispatchOnSubmit=false` passes it
    "alarmEmail": "ops@example.com",
}


@pytest.fixture(scope="module")
def synthesized(synthesize):
    stack, assembly = synthesize(CONTEXT)
    artifact = assembly.get_stack_by_name(stack.stack_name)
    return stack, artifact, Template.from_json(artifact.template)


@pytest.fixture(scope="module")
def template(synthesized) -> Template:
    return synthesized[2]


def functions_by_role(template: Template) -> dict[str, dict]:
    """Lambda functions by role, recognised by the first word after 'Coworker ' in their description."""
    found = {}
    for logical_id, resource in template.find_resources("AWS::Lambda::Function").items():
        role = resource["Properties"]["Description"].split()[1].rstrip(":").lower()
        found[role] = {"id": logical_id, **resource["Properties"]}
    return found


@pytest.fixture(scope="module")
def functions(template: Template) -> dict[str, dict]:
    return functions_by_role(template)


@pytest.fixture(scope="module")
def default_artifact(synthesize) -> cx_api.CloudFormationStackArtifact:
    """The stack with no context at all: the deployment `npx cdk deploy` makes."""
    stack, assembly = synthesize({})
    return assembly.get_stack_by_name(stack.stack_name)


@pytest.fixture(scope="module")
def default_template(default_artifact: cx_api.CloudFormationStackArtifact) -> Template:
    return Template.from_json(default_artifact.template)


@pytest.fixture(scope="module")
def default_functions(default_template: Template) -> dict[str, dict]:
    return functions_by_role(default_template)


def resources(template: Template, kind: str) -> dict[str, dict]:
    return template.find_resources(kind)


def table_logical_id(template: Template) -> str:
    (logical_id,) = resources(template, "AWS::DynamoDB::GlobalTable")
    return logical_id


# --- table -------------------------------------------------------------------------------------


def test_table_keys_index_and_ttl_come_from_the_schema(template: Template) -> None:
    template.has_resource_properties(
        "AWS::DynamoDB::GlobalTable",
        {
            "BillingMode": "PAY_PER_REQUEST",
            "KeySchema": [{"AttributeName": layout.PARTITION_KEY, "KeyType": "HASH"}],
            "AttributeDefinitions": Match.array_equals(
                [{"AttributeName": name, "AttributeType": kind} for name, kind in layout.key_schema().items()]
            ),
            "GlobalSecondaryIndexes": [
                {
                    "IndexName": layout.STATUS_INDEX_NAME,
                    "KeySchema": [
                        {"AttributeName": layout.STATUS_INDEX_PARTITION_KEY, "KeyType": "HASH"},
                        {"AttributeName": layout.STATUS_INDEX_SORT_KEY, "KeyType": "RANGE"},
                    ],
                    "Projection": {
                        "ProjectionType": "INCLUDE",
                        "NonKeyAttributes": list(layout.STATUS_INDEX_PROJECTED),
                    },
                }
            ],
            "TimeToLiveSpecification": {"AttributeName": layout.TTL_ATTRIBUTE, "Enabled": True},
        },
    )


def test_table_has_pitr_aws_managed_encryption_and_is_retained_by_default(template: Template) -> None:
    template.has_resource(
        "AWS::DynamoDB::GlobalTable",
        {
            "DeletionPolicy": "RetainExceptOnCreate",  # a failed first create leaves nothing behind
            "UpdateReplacePolicy": "Retain",
            "Properties": Match.object_like(
                {
                    "SSESpecification": {"SSEEnabled": True, "SSEType": "KMS"},  # no key id: aws/dynamodb
                    "Replicas": [
                        Match.object_like(
                            {
                                "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                                "DeletionProtectionEnabled": True,  # a delete by hand is refused too
                            }
                        )
                    ],
                }
            ),
        },
    )


def test_a_destroyable_test_stack_leaves_its_table_unprotected(synthesize) -> None:
    stack, assembly = synthesize({"removalPolicy": "destroy"})
    (table,) = [body for body in assembly.get_stack_by_name(stack.stack_name).template["Resources"].values()
                if body["Type"] == "AWS::DynamoDB::GlobalTable"]
    assert table["DeletionPolicy"] == "Delete"
    assert not table["Properties"]["Replicas"][0].get("DeletionProtectionEnabled", False)


def test_the_schema_request_and_the_template_describe_the_same_table(template: Template) -> None:
    props = next(iter(resources(template, "AWS::DynamoDB::GlobalTable").values()))["Properties"]
    request = layout.create_table_request()
    assert props["KeySchema"] == request["KeySchema"]
    assert sorted(props["AttributeDefinitions"], key=str) == sorted(request["AttributeDefinitions"], key=str)
    assert props["GlobalSecondaryIndexes"] == request["GlobalSecondaryIndexes"]
    assert props["StreamSpecification"] == {"StreamViewType": request["StreamSpecification"]["StreamViewType"]}


# --- functions ---------------------------------------------------------------------------------


def test_three_functions_on_arm64_python_with_the_layer_and_tracing(template: Template, functions) -> None:
    assert set(functions) == {"coordinator", "worker", "api"}
    (layer_id,) = resources(template, "AWS::Lambda::LayerVersion")
    for fn in functions.values():
        assert fn["Runtime"] == f"python{c.PYTHON_VERSION}"
        assert fn["Architectures"] == ["arm64"]
        assert fn["Handler"] == "handler.handler"
        assert fn["Layers"] == [{"Ref": layer_id}]
        assert fn["TracingConfig"] == {"Mode": "Active"}
        assert "LogGroup" in fn["LoggingConfig"]
    template.has_resource_properties(
        "AWS::Lambda::LayerVersion",
        {
            "CompatibleArchitectures": ["arm64"],
            "CompatibleRuntimes": [f"python{c.PYTHON_VERSION}"],
        },
    )


def test_log_groups_keep_a_month(template: Template) -> None:
    groups = resources(template, "AWS::Logs::LogGroup")
    assert len(groups) == 4  # three functions and the API access log (no execution log: test_upgrade.py)
    assert {g["Properties"]["RetentionInDays"] for g in groups.values()} == {30}


def test_environment_carries_the_settings_from_context(template: Template, functions) -> None:
    table_ref = {"Ref": table_logical_id(template)}
    for role, fn in functions.items():
        env = fn["Environment"]["Variables"]
        assert env["COWORKER_TABLE_NAME"] == table_ref, role
        assert env["COWORKER_MAX_CONCURRENCY"] == "12"
        assert env["COWORKER_BATCH_SIZE"] == "5"
        assert env["COWORKER_WORKER_TIMEOUT_SECONDS"] == "120"
        assert env["COWORKER_MAX_ATTEMPTS"] == "4"
        assert env["COWORKER_RETENTION_DAYS"] == "7.0"
        assert env["COWORKER_SUPERVISE_SECONDS"] == "120.0"
        assert env["COWORKER_TICK_SECONDS"] == "2.0"
        assert env["COWORKER_HEARTBEAT_SECONDS"] == "10.0"
        assert env["COWORKER_RESERVATION_SECONDS"] == "90"
        assert env["COWORKER_DISPATCH_ON_SUBMIT"] == "False"  # "false" on the command line
        assert "COWORKER_TICKS_PER_INVOCATION" not in env
        assert "COWORKER_LAMBDA_ENDPOINT" not in env
        assert env["COWORKER_EXAMPLE_HANDLERS"] == "False"  # a deployment runs the examples only when asked
        assert env["POWERTOOLS_SERVICE_NAME"] == "coworker-Coworker"  # this deployment's metric dimension
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "Coworker"
        assert env["POWERTOOLS_LOG_LEVEL"] == "INFO"
        assert "AWS_REGION" not in env and "COWORKER_DYNAMODB_ENDPOINT" not in env
    # The coordinator and the API (dispatch on submit) both start workers.
    for role in ("coordinator", "api"):
        env = functions[role]["Environment"]["Variables"]
        assert env["COWORKER_WORKER_FUNCTION"] == {"Ref": functions["worker"]["id"]}, role
    assert "COWORKER_WORKER_FUNCTION" not in functions["worker"]["Environment"]["Variables"]
    # The worker and the API (which checks task types) have the handlers package in their code.
    for role in ("worker", "api"):
        assert functions[role]["Environment"]["Variables"]["COWORKER_HANDLER_MODULES"] == "handlers", role
    assert functions["coordinator"]["Environment"]["Variables"]["COWORKER_HANDLER_MODULES"] == ""


def test_worker_limits_come_from_context(functions) -> None:
    worker = functions["worker"]
    assert worker["Timeout"] == 120
    assert worker["MemorySize"] == 1024
    assert worker["ReservedConcurrentExecutions"] == math.ceil(12 / 5) == 3
    assert functions["coordinator"]["ReservedConcurrentExecutions"] == 1
    assert functions["coordinator"]["Timeout"] == 120 + c.COORDINATOR_TIMEOUT_SLACK_SECONDS == 150
    assert "ReservedConcurrentExecutions" not in functions["api"]
    assert functions["api"]["Timeout"] <= 29


def test_default_deployment(default_template: Template, default_functions) -> None:
    worker, coordinator, api = (default_functions[r] for r in ("worker", "coordinator", "api"))
    assert worker["Timeout"] == 300
    assert worker["ReservedConcurrentExecutions"] == 12  # ceil(120 / 10) worker slots
    assert coordinator["ReservedConcurrentExecutions"] == 1
    assert coordinator["Timeout"] == 90  # supervises 60 s, plus 30 s slack
    for role, fn in default_functions.items():
        env = fn["Environment"]["Variables"]
        assert env["COWORKER_MAX_CONCURRENCY"] == "120", role
        assert env["COWORKER_BATCH_SIZE"] == "10"
        assert env["COWORKER_SUPERVISE_SECONDS"] == "60.0"
        assert env["COWORKER_TICK_SECONDS"] == "5.0"
        assert env["COWORKER_LOCK_SECONDS"] == "60"
        assert env["COWORKER_RESERVATION_SECONDS"] == "30"
        assert env["COWORKER_DISPATCH_ON_SUBMIT"] == "True"
        assert "COWORKER_HEARTBEAT_SECONDS" not in env  # default: a third of the lock
    assert api["Environment"]["Variables"]["COWORKER_WORKER_FUNCTION"] == {"Ref": worker["id"]}
    # A reservation lasts 30 s, below Lambda's minimum event age of 60 s.
    default_template.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig",
        {"FunctionName": {"Ref": worker["id"]}, "MaximumRetryAttempts": 0, "MaximumEventAgeInSeconds": 60},
    )


def test_worker_async_invocations_are_never_retried_and_fail_to_the_dlq(
    template: Template, functions
) -> None:
    (queue_id,) = resources(template, "AWS::SQS::Queue")
    template.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig",
        {
            "FunctionName": {"Ref": functions["worker"]["id"]},
            "MaximumRetryAttempts": 0,
            "MaximumEventAgeInSeconds": 90,  # reservationSeconds: older events find their slot gone
            "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": [queue_id, "Arn"]}}},
        },
    )
    template.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig",
        {
            "FunctionName": {"Ref": functions["coordinator"]["id"]},
            "MaximumRetryAttempts": 0,
            # a run that failed is kept where the operator sees it
            "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": [queue_id, "Arn"]}}},
        },
    )


def test_dlq_is_encrypted_and_refuses_plain_http(template: Template) -> None:
    template.has_resource_properties("AWS::SQS::Queue", {"SqsManagedSseEnabled": True})
    template.has_resource_properties(
        "AWS::SQS::QueuePolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "Effect": "Deny",
                                "Action": "sqs:*",
                                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                            }
                        ),
                    ]
                )
            }
        },
    )


def test_coordinator_runs_on_the_schedule_from_context(template: Template, functions) -> None:
    template.has_resource_properties(
        "AWS::Events::Rule",
        {
            "ScheduleExpression": "rate(2 minutes)",
            "State": "ENABLED",
            "Targets": [Match.object_like({"Arn": {"Fn::GetAtt": [functions["coordinator"]["id"], "Arn"]}})],
        },
    )


# --- IAM -----------------------------------------------------------------------------------


def policy_statements(template: Template) -> dict[str, list[dict]]:
    """Statements of each inline policy, by the logical id of the role it is attached to."""
    found: dict[str, list[dict]] = {}
    for policy in resources(template, "AWS::IAM::Policy").values():
        for role in policy["Properties"]["Roles"]:
            found.setdefault(role["Ref"], []).extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return found


def actions_of(statement: dict) -> list[str]:
    actions = statement["Action"]
    return [actions] if isinstance(actions, str) else actions


def test_no_wildcard_actions_anywhere(template: Template) -> None:
    for statements in policy_statements(template).values():
        for statement in statements:
            for action in actions_of(statement):
                assert action != "*" and not action.endswith(":*"), statement


def table_actions(template: Template, role_ref: str, stream: bool = False) -> set[str]:
    """What the role may do on the table and its index (or, with ``stream``, on its stream)."""
    table = table_logical_id(template)
    actions: set[str] = set()
    for statement in policy_statements(template).get(role_ref, []):
        resource = json.dumps(statement["Resource"])
        if table in resource and ("StreamArn" in resource) == stream:
            assert statement["Effect"] == "Allow"
            actions.update(actions_of(statement))
    return actions


def stream_actions(template: Template, role_ref: str) -> set[str]:
    return table_actions(template, role_ref, stream=True)


def role_of(fn: dict) -> str:
    return fn["Role"]["Fn::GetAtt"][0]


def test_least_privilege_on_the_table(template: Template, functions) -> None:
    assert table_actions(template, role_of(functions["coordinator"])) == {
        "dynamodb:Query",
        "dynamodb:GetItem",  # reaping reads the error history it trims
        "dynamodb:UpdateItem",
        "dynamodb:BatchGetItem",  # worker-slot items are created at the start of a run
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",  # free slots left from a larger max_concurrency are retired
        "dynamodb:DescribeTable",  # finds the table's stream, which it alone reads:
    }
    stream_reads = {"dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator"}
    assert stream_reads <= stream_actions(template, role_of(functions["coordinator"]))
    for other in ("worker", "api"):
        assert not stream_actions(template, role_of(functions[other])) & stream_reads
    assert table_actions(template, role_of(functions["worker"])) == {
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",  # a batch callback's handler reads the batch's results (read_results)
        "dynamodb:UpdateItem",
        "dynamodb:Query",
        "dynamodb:PutItem",  # follow-up tasks
        "dynamodb:ConditionCheckItem",  # ... in transactions that check the parent's claim
    }
    # The API puts, reads, lists, redrives and cancels; it never scans, and deletes schedules only.
    assert table_actions(template, role_of(functions["api"])) == {
        "dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem",
        "dynamodb:BatchGetItem",  # a batch's progress: its head and counter items
        "dynamodb:DeleteItem"}  # DELETE /schedules/{name}
    deletes = [st for st in policy_statements(template).get(role_of(functions["api"]), [])
               if "dynamodb:DeleteItem" in actions_of(st)]
    assert [st.get("Condition") for st in deletes] == [
        {"ForAllValues:StringLike": {"dynamodb:LeadingKeys": ["schedule#*"]}}]


def events_statements(template: Template) -> dict[str, list[dict]]:
    return {role: [st for st in statements if "events:PutEvents" in actions_of(st)]
            for role, statements in policy_statements(template).items()}


def test_events_are_off_by_default_and_then_nothing_may_publish(default_template: Template) -> None:
    assert not [st for sts in events_statements(default_template).values() for st in sts]
    for fn in functions_by_role(default_template).values():
        assert fn["Environment"]["Variables"].get("COWORKER_EVENTS", "off") == "off"


def test_with_events_only_the_coordinator_may_publish_and_only_to_its_bus(synthesize) -> None:
    stack, assembly = synthesize({"events": "eventbridge", "eventBus": "orders"})
    template = Template.from_json(assembly.get_stack_by_name(stack.stack_name).template)
    functions = functions_by_role(template)
    publishing = {role: sts for role, sts in events_statements(template).items() if sts}
    assert set(publishing) == {role_of(functions["coordinator"])}
    (statement,) = publishing[role_of(functions["coordinator"])]
    assert actions_of(statement) == ["events:PutEvents"]
    assert "event-bus/orders" in json.dumps(statement["Resource"])
    for role in ("api", "worker", "coordinator"):  # the API watches batches for their events too
        env = functions[role]["Environment"]["Variables"]
        assert (env["COWORKER_EVENTS"], env["COWORKER_EVENT_BUS"]) == ("eventbridge", "orders"), role


def test_each_function_writes_logs_to_its_own_log_group_only(template: Template, functions) -> None:
    roles = template.find_resources("AWS::IAM::Role")
    for name, fn in functions.items():
        # no managed policy (AWSLambdaBasicExecutionRole: any log group in the account)
        assert not roles[role_of(fn)]["Properties"].get("ManagedPolicyArns"), name
        own = fn["LoggingConfig"]["LogGroup"]["Ref"]
        log_statements = [st for st in policy_statements(template).get(role_of(fn), [])
                          if any(action.startswith("logs:") for action in actions_of(st))]
        assert log_statements, name
        for statement in log_statements:
            assert set(actions_of(statement)) == {"logs:CreateLogStream", "logs:PutLogEvents"}, name
            assert statement["Resource"] == {"Fn::GetAtt": [own, "Arn"]}, name


def test_no_function_is_given_a_cursor_secret_anyone_may_read(functions) -> None:
    # The stack's id is readable by anyone allowed DescribeStacks: the API keeps its own in the table.
    for role in ("api", "worker", "coordinator"):
        assert "COWORKER_CURSOR_SECRET" not in functions[role]["Environment"]["Variables"], role


def test_x_ray_keeps_no_responses_or_error_bodies(functions) -> None:
    for role, fn in functions.items():
        env = fn["Environment"]["Variables"]
        assert env["POWERTOOLS_TRACER_CAPTURE_RESPONSE"] == "false", role
        assert env["POWERTOOLS_TRACER_CAPTURE_ERROR"] == "false", role


def test_only_the_coordinator_and_the_api_may_invoke_the_worker(template: Template, functions) -> None:
    worker = functions["worker"]["id"]
    invokers = {role_of(functions["coordinator"]), role_of(functions["api"])}
    seen = set()
    for role, statements in policy_statements(template).items():
        invokes = [s for s in statements if "lambda:InvokeFunction" in actions_of(s)]
        if role in invokers:
            seen.add(role)
            assert invokes, role
            for statement in invokes:
                assert statement["Effect"] == "Allow"
                assert actions_of(statement) == ["lambda:InvokeFunction"]
                targets = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                assert all(worker in json.dumps(resource) for resource in targets), statement
        else:
            assert not invokes, role
    assert seen == invokers


# --- API -----------------------------------------------------------------------------------


def test_every_api_method_requires_an_api_key(template: Template, functions) -> None:
    methods = resources(template, "AWS::ApiGateway::Method")
    assert len(methods) >= 2  # ANY on / and ANY on /{proxy+}
    for method in methods.values():
        props = method["Properties"]
        if props["HttpMethod"] == "OPTIONS":
            continue
        assert props["ApiKeyRequired"] is True, props
        assert props["Integration"]["Type"] == "AWS_PROXY"
        assert functions["api"]["id"] in json.dumps(props["Integration"]["Uri"])
    template.has_resource_properties("AWS::ApiGateway::Resource", {"PathPart": "{proxy+}"})


def test_usage_plan_throttles_and_holds_the_key(template: Template) -> None:
    template.has_resource_properties(
        "AWS::ApiGateway::UsagePlan",
        {
            "Throttle": {"RateLimit": c.DEFAULT_API_RATE_LIMIT, "BurstLimit": c.DEFAULT_API_BURST_LIMIT},
            "ApiStages": [Match.object_like({"Stage": Match.any_value()})],
        },
    )
    template.resource_count_is("AWS::ApiGateway::ApiKey", 1)
    template.resource_count_is("AWS::ApiGateway::UsagePlanKey", 1)


def test_stage_traces_throttles_and_writes_access_logs(template: Template) -> None:
    template.has_resource_properties(
        "AWS::ApiGateway::Stage",
        {
            "StageName": c.API_STAGE_NAME,
            "TracingEnabled": True,
            "AccessLogSetting": {"DestinationArn": Match.any_value(), "Format": Match.any_value()},
            "MethodSettings": [
                Match.object_like(
                    {
                        "ThrottlingRateLimit": c.DEFAULT_API_RATE_LIMIT,
                        "ThrottlingBurstLimit": c.DEFAULT_API_BURST_LIMIT,
                        "DataTraceEnabled": False,
                    }
                )
            ],
        },
    )


# --- monitoring ------------------------------------------------------------------------------


def test_dashboard_shows_the_task_metrics(template: Template) -> None:
    (dashboard,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dashboard["Properties"]["DashboardBody"])
    library_metrics = [v for k, v in vars(MetricName).items() if k.isupper()]
    assert {
        "TaskClaimed",
        "TaskFinished",
        "TaskFailed",
        "TaskIgnored",
        "LostClaim",
        "TaskDuration",
        "TasksDispatched",
        "WorkerInvocations",
    } <= set(library_metrics)
    # The container runner's are graphed only where there is one (tests/infra/test_runners.py).
    runner_metrics = {MetricName.RUNNERS_STARTED, MetricName.RUNNER_START_FAILED, MetricName.BUSY_RUNNERS}
    for name in runner_metrics:
        assert name not in body, name
    # The events' only with events=eventbridge (tests/infra/test_events_infra.py).
    events_metrics = {MetricName.EVENTS_PUBLISHED, MetricName.EVENTS_DROPPED}
    for name in events_metrics:
        assert f'\\"Coworker\\",\\"{name}\\"' not in body, name
    for name in (
        *(name for name in library_metrics if name not in runner_metrics | events_metrics),
        "Throttles",
        "Errors",
        "ReadThrottleEvents",
        "WriteThrottleEvents",
        "ApproximateNumberOfMessagesVisible",
        "AsyncEventAge",
        "AsyncEventsDropped",
        "4XXError",
        "5XXError",
    ):
        assert name in body, name
    # The backlog comes first: due tasks by status, then the oldest one's age
    first_titles = [widget for widget in body.split('\\"title\\":')[1:3]]
    assert "Backlog" in first_titles[0] and "Oldest due task" in first_titles[1]
    for percentile in c.DURATION_PERCENTILES:
        assert f'\\"stat\\":\\"{percentile}\\"' in body
    assert '\\"Coworker\\",\\"TaskClaimed\\",\\"service\\",\\"coworker-Coworker\\"' in body


def alarms_by_id(template: Template) -> dict[str, dict]:
    """Alarm properties by a short name: the logical id up to 'Alarm' (e.g. 'CoordinatorSilent')."""
    found = {}
    for logical_id, alarm in resources(template, "AWS::CloudWatch::Alarm").items():
        short = logical_id.split("Monitoring", 1)[-1].split("Alarm", 1)[0]
        found[short] = alarm["Properties"]
    return found


def alarm_metric(alarm: dict) -> tuple[str, str, str, int]:
    """(metric name, namespace, statistic, period) of a single-metric alarm, in either of the forms
    CloudFormation takes (a labelled metric is rendered as a one-entry Metrics list)."""
    if "MetricName" in alarm:
        return alarm["MetricName"], alarm["Namespace"], alarm["Statistic"], alarm["Period"]
    (entry,) = alarm["Metrics"]
    stat = entry["MetricStat"]
    return stat["Metric"]["MetricName"], stat["Metric"]["Namespace"], stat["Stat"], stat["Period"]


def test_alarms_watch_the_coordinator_the_backlog_ignored_tasks_the_dlq_and_throttles(template: Template) -> None:
    alarms = alarms_by_id(template)
    assert set(alarms) == {"CoordinatorSilent", "OldestTaskAge", "IgnoredShare", "CoordinatorErrors",
                           "DeadLetterQueue", "TableThrottles", "WorkerErrors", "ApiServerErrors",
                           "StreamFollowerLag", "SlotUpkeepFailed"}
    # events off: no EventsDropped (tests/infra/test_events_infra.py)
    text = {name: json.dumps(props) for name, props in alarms.items()}
    assert '"MetricName": "Errors"' in text["CoordinatorErrors"]
    assert '"MetricName": "Errors"' in text["WorkerErrors"] and "Worker" in text["WorkerErrors"]
    assert alarm_metric(alarms["ApiServerErrors"])[:3] == ("5XXError", "AWS/ApiGateway", "Sum")
    assert alarms["ApiServerErrors"]["Threshold"] == c.API_5XX_ALARM_COUNT
    assert '"MetricName": "ApproximateNumberOfMessagesVisible"' in text["DeadLetterQueue"]
    assert '"MetricName": "WriteThrottleEvents"' in text["TableThrottles"]
    (topic_id,) = resources(template, "AWS::SNS::Topic")
    for alarm in alarms.values():  # alarmEmail is set in CONTEXT
        assert alarm["AlarmActions"] == [{"Ref": topic_id}]
    template.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ops@example.com"}
    )


def test_the_heartbeat_alarm_fires_when_the_coordinator_stops_ticking(template: Template) -> None:
    silent = alarms_by_id(template)["CoordinatorSilent"]
    # No tick in any minute of the window, and no data at all (a disabled schedule) counts as none
    assert alarm_metric(silent) == (MetricName.COORDINATOR_TICKS, "Coworker", "Sum", 60)
    assert (silent["ComparisonOperator"], silent["Threshold"]) == ("LessThanThreshold", 1)
    assert silent["TreatMissingData"] == "breaching"
    # CONTEXT schedules a 120 s supervision every 2 minutes: no gap, so the default of 5 minutes
    assert silent["EvaluationPeriods"] == silent["DatapointsToAlarm"] == c.DEFAULT_SILENCE_ALARM_MINUTES


def test_oldest_task_and_ignored_share_alarms(template: Template) -> None:
    alarms = alarms_by_id(template)
    oldest = alarms["OldestTaskAge"]
    assert alarm_metric(oldest) == (MetricName.OLDEST_DUE_AGE, "Coworker", "Maximum", 300)
    assert (oldest["Threshold"], oldest["ComparisonOperator"]) == (
        c.DEFAULT_OLDEST_TASK_ALARM_SECONDS, "GreaterThanThreshold")
    assert oldest["TreatMissingData"] == "notBreaching"  # silence is the heartbeat alarm's business
    share = alarms["IgnoredShare"]
    assert (share["Threshold"], share["ComparisonOperator"]) == (
        c.DEFAULT_IGNORED_ALARM_PERCENT, "GreaterThanThreshold")
    assert (share["EvaluationPeriods"], share["DatapointsToAlarm"]) == (c.IGNORED_ALARM_PERIODS, 1)
    (expression,) = [m for m in share["Metrics"] if "Expression" in m]
    assert expression["Expression"] == (
        f"IF(FILL(i, 0) + FILL(f, 0) >= {c.IGNORED_ALARM_MIN_ENDED}, 100 * FILL(i, 0) / (FILL(i, 0) + FILL(f, 0)), 0)")
    used = {m["Id"]: m["MetricStat"]["Metric"]["MetricName"] for m in share["Metrics"] if "MetricStat" in m}
    assert used == {"i": MetricName.IGNORED, "f": MetricName.FINISHED}


def test_alarm_thresholds_are_options(synthesize) -> None:
    stack, assembly = synthesize({"oldestTaskAlarmSeconds": 120, "ignoredAlarmPercent": 20,
                                  "coordinatorSilenceAlarmMinutes": 8, "alarmTopic":
                                  "arn:aws:sns:us-east-1:123456789012:ops"})
    alarms = alarms_by_id(Template.from_json(assembly.get_stack_by_name(stack.stack_name).template))
    assert alarms["OldestTaskAge"]["Threshold"] == 120
    assert alarms["IgnoredShare"]["Threshold"] == 20
    assert alarms["CoordinatorSilent"]["EvaluationPeriods"] == 8
    for alarm in alarms.values():
        assert alarm["AlarmActions"] == ["arn:aws:sns:us-east-1:123456789012:ops"]


def test_the_heartbeat_alarm_allows_for_the_gaps_of_a_sparse_schedule() -> None:
    # A 60 s supervision every 10 minutes leaves the coordinator silent 9 minutes in 10
    config = StackConfig.from_options(handlers="examples", schedule_minutes=10, supervise_seconds=60)
    assert config.coordinator_silence_alarm_minutes == 11
    with pytest.raises(ConfigurationError, match="coordinator_silence_alarm_minutes.*at least 11"):
        StackConfig.from_options(handlers="examples", schedule_minutes=10, supervise_seconds=60,
                                  coordinator_silence_alarm_minutes=5)
    with pytest.raises(ConfigurationError, match="ignored_alarm_percent must be 1-100"):
        StackConfig.from_options(handlers="examples", ignored_alarm_percent=101)


def test_without_a_notification_target_synth_warns_that_alarms_notify_nobody(synthesize, synthesized) -> None:
    def warnings(artifact) -> list[str]:
        return [str(m.entry.data) for m in artifact.messages if m.level == cx_api.SynthesisMessageLevel.WARNING]

    stack, assembly = synthesize({})
    artifact = assembly.get_stack_by_name(stack.stack_name)
    assert [w for w in warnings(artifact) if "alarms notify nobody" in w and "alarmEmail" in w]
    template = Template.from_json(artifact.template)
    (topic_id,) = resources(template, "AWS::SNS::Topic")  # the stack's own, for someone to subscribe to
    assert all(alarm["AlarmActions"] == [{"Ref": topic_id}] for alarm in alarms_by_id(template).values())
    assert not [w for w in warnings(synthesized[1]) if "notify nobody" in w]  # an e-mail is set there


def test_outputs(template: Template) -> None:
    for name in ("ApiUrl", "TableName", "DashboardUrl", "ApiKeyId"):
        template.has_output(name, {"Value": Match.any_value()})
    template.has_output("TableName", {"Value": {"Ref": table_logical_id(template)}})


# --- layer -------------------------------------------------------------------------------------


def test_layer_asset_holds_the_library_under_python(synthesized) -> None:
    _, artifact, template = synthesized
    (layer,) = resources(template, "AWS::Lambda::LayerVersion").values()
    asset_hash = layer["Properties"]["Content"]["S3Key"].removesuffix(".zip")
    asset_dir = Path(artifact.assembly.directory) / f"asset.{asset_hash}"
    library = asset_dir / "python" / "coworker"
    for folder in ("data", "engine", "api"):
        assert (library / folder / "__init__.py").is_file()
    assert (library / "data" / "layout.py").is_file()
    # client-side tools (the CLI, the index migration) stay out of what Lambda loads
    assert not list(asset_dir.rglob("cli.py")) and not list(asset_dir.rglob("migration.py"))
    assert not list(asset_dir.rglob("__pycache__"))


def fake_pip(calls: list):
    def run(command, **_):
        calls.append(command)
        target = Path(command[command.index("--target") + 1])
        (target / "pynamodb").mkdir(parents=True)

    return run


def test_layer_dependencies_are_the_locked_wheels_for_lambda_arm64_installed_once(tmp_path, monkeypatch) -> None:
    calls: list = []
    locks: list = []

    def pip(command, **kwargs):
        locks.append(Path(command[command.index("--requirement") + 1]).read_text())
        fake_pip(calls)(command, **kwargs)

    monkeypatch.setattr("coworker_cdk.bundling.subprocess.run", pip)
    bundler = layer_bundling(
        c.LAYER_SOURCE_DIR,
        c.LAYER_LOCK,
        install_dependencies=True,
        dependency_cache=tmp_path / "cache",
    )
    for out in ("first", "second"):
        assert bundler.try_bundle(str(tmp_path / out), image=None) is True
        assert (tmp_path / out / "python" / "coworker" / "data" / "layout.py").is_file()
        assert (tmp_path / out / "python" / "pynamodb").is_dir()
    (command,) = calls  # the second bundle reused the cached install
    platforms = [command[i + 1] for i, word in enumerate(command) if word == "--platform"]
    assert platforms == ["manylinux_2_34_aarch64", "manylinux_2_28_aarch64", "manylinux2014_aarch64"]
    assert command[command.index("--python-version") + 1] == c.PYTHON_VERSION
    assert command[command.index("--implementation") + 1] == "cp"
    assert {"--only-binary=:all:", "--no-deps", "--require-hashes"} <= set(command)  # exactly the lock
    assert locks == [c.LAYER_LOCK.read_text()]


def test_the_layer_lock_pins_every_requirement_of_the_library_with_a_hash() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pinned = {}
    for line in c.LAYER_LOCK.read_text().splitlines():
        if line and not line.startswith("#"):
            requirement, _, digest = line.partition(" --hash=sha256:")
            name, _, version = requirement.partition("==")
            assert len(digest) == 64, line
            pinned[canonicalize_name(name)] = version
    wanted = [Requirement(line) for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is not in the lock: run make lock"
        assert requirement.specifier.contains(pinned[name]), f"{name}=={pinned[name]} is not {requirement}"


def test_the_asset_hash_follows_the_resolved_versions_not_the_requirements_text(tmp_path, monkeypatch) -> None:
    # Given a handlers package whose requirements.txt never changes
    package, _, _ = write_handler_package(tmp_path, requirements="markupsafe>=2\n")
    resolutions = iter(["markupsafe==3.0.2 --hash=sha256:" + "a" * 64 + "\n",
                        "markupsafe==3.0.3 --hash=sha256:" + "b" * 64 + "\n"])
    monkeypatch.setattr("coworker_cdk.bundling.resolve", lambda text: next(resolutions))

    # When it is bundled before and after a new release of its dependency
    before = function_bundling(c.FUNCTIONS_DIR / c.WORKER_DIR_NAME, package, install_dependencies=True)
    after = function_bundling(c.FUNCTIONS_DIR / c.WORKER_DIR_NAME, package, install_dependencies=True)

    # Then the asset changes with it (the text alone would have kept the old asset)
    assert before.asset_hash() != after.asset_hash()


def test_layer_hash_changes_with_the_dependency_mode() -> None:
    install = layer_bundling(c.LAYER_SOURCE_DIR, c.LAYER_LOCK, install_dependencies=True)
    skip = layer_bundling(c.LAYER_SOURCE_DIR, c.LAYER_LOCK, install_dependencies=False)
    assert install.asset_hash() != skip.asset_hash()


# --- configuration -----------------------------------------------------------------------------


def config(**context) -> StackConfig:
    return StackConfig.from_context(App(context=context).node)


def test_context_defaults() -> None:
    cfg = config()
    assert not cfg.destroy_on_removal and cfg.install_layer_dependencies
    assert cfg.schedule_minutes == 1
    assert cfg.worker_reserved_concurrency == cfg.settings.worker_slots == 12  # ceil(120 / 10)
    assert cfg.coordinator_timeout_seconds == 90  # 60 s supervising + 30 s
    assert cfg.worker_max_event_age_seconds == 60  # the 30 s reservation, raised to Lambda's minimum
    assert cfg.settings.dispatch_on_submit is True


def test_context_strings_from_the_command_line_are_accepted() -> None:
    cfg = config(
        maxConcurrency="7",
        batchSize="3",
        removalPolicy="destroy",
        apiCloudWatchRole="false",
        apiLogs="true",  # the account has the role already
        dispatchOnSubmit="false",
        superviseSeconds="300",
        scheduleMinutes="5",  # a run a schedule's interval: runs never overlap
        reservationSeconds="120",
        heartbeatSeconds="5",
    )
    assert cfg.worker_reserved_concurrency == 3 and cfg.destroy_on_removal and not cfg.api_cloudwatch_role
    assert cfg.settings.dispatch_on_submit is False
    assert cfg.coordinator_timeout_seconds == 330
    assert cfg.worker_max_event_age_seconds == 120
    assert cfg.settings.effective_heartbeat_seconds == 5
    assert cfg.function_environment()["COWORKER_DISPATCH_ON_SUBMIT"] == "False"
    assert config(dispatchOnSubmit="true").settings.dispatch_on_submit is True


@pytest.mark.parametrize(
    ("max_concurrency", "batch_size", "slots"),
    [(120, 10, 12), (125, 10, 13), (1, 10, 1), (100, 1, 100), (12, 5, 3)],
)
def test_worker_reserved_concurrency_is_the_number_of_worker_slots(max_concurrency, batch_size, slots) -> None:
    cfg = config(maxConcurrency=max_concurrency, batchSize=batch_size)
    assert cfg.worker_reserved_concurrency == slots == math.ceil(max_concurrency / batch_size)


@pytest.mark.parametrize(
    ("supervise", "timeout"),
    [(60, 90), (59.5, 90), (1, 31), (840, 870)],
)
def test_coordinator_timeout_covers_its_supervision_plus_slack(supervise, timeout) -> None:
    cfg = config(superviseSeconds=supervise, scheduleMinutes=math.ceil(supervise / 60))  # runs may not overlap
    assert cfg.coordinator_timeout_seconds == timeout <= c.LAMBDA_MAX_TIMEOUT_SECONDS


@pytest.mark.parametrize(
    ("reservation", "age"),
    [(30, 60), (60, 60), (61, 61), (3600, 3600), (7 * 3600, 6 * 3600)],
)
def test_worker_event_age_is_the_reservation_within_lambda_limits(reservation, age) -> None:
    assert config(reservationSeconds=reservation).worker_max_event_age_seconds == age


@pytest.mark.parametrize(
    "context",
    [
        {"removalPolicy": "delete"},
        {"layerDependencies": "maybe"},
        {"lockSeconds": 30, "heartbeatSeconds": 20},  # a heartbeat too rare to keep the lock
        {"superviseSeconds": 900},  # more than a Lambda invocation can hold
        {"reservationSeconds": 1},
        {"dispatchOnSubmit": "maybe"},
        {"ticksPerInvocation": 3},  # retired: superviseSeconds replaced it
        {"batchSize": 0},
        {"scheduleMinutes": 0},
    ],
)
def test_bad_context_fails_the_synth(context) -> None:
    with pytest.raises(ConfigurationError):
        config(**context)


def test_a_deployment_no_default_account_can_hold_is_refused_with_what_it_needs() -> None:
    # 13 executions reserved by default: a default account (1,000, 100 kept unreserved) holds it
    assert (config().reserved_concurrency, config().required_lambda_quota) == (13, 113)
    with pytest.raises(ConfigurationError, match=r"reserves 1001 .* at least 1101, above 1000: raise batchSize"):
        config(maxConcurrency=10_000)
    # an account whose quota was raised says so, and may
    assert config(maxConcurrency=10_000, lambdaConcurrencyQuota=5000).reserved_concurrency == 1001


def test_two_deployments_in_one_account_share_no_metric_graph_or_alarm() -> None:
    from aws_cdk import App, Stack
    from coworker_cdk.task_system import TaskSystem

    def services(stack_name: str, system_id: str = "Default") -> set[str]:
        app = App(context={"layerDependencies": "skip"})
        stack = Stack(app, stack_name)
        TaskSystem(stack, system_id, handlers="examples")
        template = Template.from_stack(stack).to_json()
        found = {fn["Properties"]["Environment"]["Variables"]["POWERTOOLS_SERVICE_NAME"]
                 for fn in template["Resources"].values() if fn["Type"] == "AWS::Lambda::Function"
                 and "POWERTOOLS_SERVICE_NAME" in fn["Properties"].get("Environment", {}).get("Variables", {})}
        alarms = json.dumps([r for r in template["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"])
        assert all(f'"Value": "{name}"' in alarms for name in found)
        return found

    assert services("Prod") == {"coworker-Prod"}
    assert services("Staging") == {"coworker-Staging"}
    assert services("Prod", "Crawls") == {"coworker-Prod-Crawls"}


def test_a_misspelled_context_key_fails_the_synth_with_the_key_it_meant() -> None:
    meant = r"unknown context key 'maxConcurency' \(did you mean 'maxConcurrency'\?\)"
    with pytest.raises(ConfigurationError, match=meant):
        config(maxConcurency="50")
    with pytest.raises(ConfigurationError, match="unknown context key 'frobnicate'"):
        config(frobnicate="1")
    # the CDK's own keys and namespaced keys of your app are left alone
    assert config(**{"@aws-cdk/core:newStyleStackSynthesis": True, "myapp:stage": "prod",
                     "acknowledged-issue-numbers": [1]}).settings.max_concurrency == 120


def test_the_stack_synthesizes_without_the_api_gateway_cloudwatch_role(synthesize) -> None:
    stack, assembly = synthesize({"apiCloudWatchRole": "false", "apiLogs": "true"})  # the account has one
    resources = assembly.get_stack_by_name(stack.stack_name).template["Resources"]
    assert not [body for body in resources.values() if body["Type"] == "AWS::ApiGateway::Account"]


def test_function_code_is_present() -> None:
    missing = missing_function_code()
    if missing:
        pytest.skip(
            f"functions/{{{','.join(missing)}}}/handler.py not written yet; synthesized with stand-ins"
        )
    for name in ("coordinator", "worker", "api"):
        assert (
            "def handler" in (c.FUNCTIONS_DIR / name / "handler.py").read_text()
            or "handler =" in (c.FUNCTIONS_DIR / name / "handler.py").read_text()
        )


def test_the_bill_prices_the_stack_cdk_deploy_makes(default_template: Template, default_functions) -> None:
    """benchmarks/bill.py prices the fixed monthly cost from constants: they are this template's."""
    spec = importlib.util.spec_from_file_location("prices", Path(__file__).parents[2] / "benchmarks" / "prices.py")
    assert spec is not None and spec.loader is not None
    prices = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prices)
    alarms = resources(default_template, "AWS::CloudWatch::Alarm").values()
    alarm_metrics = sum(sum("MetricStat" in entry for entry in alarm["Properties"]["Metrics"])
                        if "Metrics" in alarm["Properties"] else 1 for alarm in alarms)
    assert alarm_metrics == prices.STACK_ALARM_METRICS
    assert len(resources(default_template, "AWS::CloudWatch::Dashboard")) == prices.STACK_DASHBOARDS
    assert len(resources(default_template, "AWS::KMS::Key")) == prices.STACK_KMS_KEYS
    assert default_functions["coordinator"]["MemorySize"] / 1024 == prices.COORDINATOR_MEMORY_GB
    (rule,) = resources(default_template, "AWS::Events::Rule").values()
    assert rule["Properties"]["ScheduleExpression"] == "rate(1 minute)"
    assert prices.COORDINATOR_RUNS_A_MONTH == prices.HOURS_A_MONTH * 60


def test_the_scale_model_and_the_bill_start_from_the_template_cdk_deploy_makes(default_template: Template,
                                                                               default_functions) -> None:
    """benchmarks/scale_model.py and bill.py take their concurrency, threads and shards from
    coworker.capacity (issue 50): they are this template's, so docs/cost.md speaks of the deployment."""
    from coworker import capacity

    worker = default_functions["worker"]
    env = worker["Environment"]["Variables"]
    assert int(env["COWORKER_MAX_CONCURRENCY"]) == capacity.DEFAULT_MAX_CONCURRENCY
    assert int(env["COWORKER_BATCH_SIZE"]) == capacity.DEFAULT_BATCH_SIZE
    assert int(env["COWORKER_STATUS_SHARDS"]) == capacity.DEFAULT_STATUS_SHARDS
    assert float(env["COWORKER_TICK_SECONDS"]) == capacity.DEFAULT_TICK_SECONDS
    assert worker["ReservedConcurrentExecutions"] == capacity.Capacity().worker_invocations
    # A new on-demand table with no warm throughput: the 4,000 write units/s the model starts from.
    (table,) = resources(default_template, "AWS::DynamoDB::GlobalTable").values()
    assert table["Properties"]["BillingMode"] == "PAY_PER_REQUEST"
    assert "WarmThroughput" not in table["Properties"]


def test_synth_says_what_the_stack_can_run(default_artifact, synthesized) -> None:
    """Tasks at once, and tasks/s at 1 s and at 50 ms with the table and the shards it has: the
    figures docs/cost.md gives, said at every synth (coworker.capacity has the arithmetic)."""
    def capacity_line(artifact) -> str:
        (line,) = [str(m.entry.data) for m in artifact.messages if m.level == cx_api.SynthesisMessageLevel.INFO
                   and "tasks at once" in str(m.entry.data)]
        return line

    default = capacity_line(default_artifact)
    assert "120 tasks at once (12 worker invocations x 10 threads)" in default
    assert "118 tasks/s of 1-s tasks (bound by the workers)" in default
    assert "1,000 tasks/s of 50-ms tasks (bound by the on-demand table)" in default
    assert "a new on-demand table (4,000 write units/s" in default and "4 status shards" in default
    assert "1,000,000 1-s tasks take 2.4 h" in default
    small = capacity_line(synthesized[1])  # maxConcurrency 12, batchSize 5
    assert "12 tasks at once (3 worker invocations x 5 threads)" in small
    assert "171 tasks/s of 50-ms tasks (bound by the workers)" in small
