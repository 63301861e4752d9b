"""Template assertions on the Coworker stack (synthesized once for the module)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from aws_cdk import App
from aws_cdk.assertions import Match, Template
from coworker import schema
from coworker.errors import ConfigurationError
from coworker.observability import MetricName

from infra import constants as c
from infra.bundling import LocalLayerBundling
from infra.config import StackConfig
from tests.infra.support import missing_function_code

CONTEXT = {
    "maxConcurrency": 12,
    "batchSize": 5,
    "workerTimeoutSeconds": 120,
    "workerMemoryMb": 1024,
    "scheduleMinutes": 2,
    "maxAttempts": 4,
    "retentionDays": 7,
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


@pytest.fixture(scope="module")
def functions(template: Template) -> dict[str, dict]:
    """Lambda functions by role, recognised by the first word after 'Coworker ' in their description."""
    found = {}
    for logical_id, resource in template.find_resources("AWS::Lambda::Function").items():
        role = resource["Properties"]["Description"].split()[1].rstrip(":").lower()
        found[role] = {"id": logical_id, **resource["Properties"]}
    return found


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
            "KeySchema": [{"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"}],
            "AttributeDefinitions": Match.array_equals(
                [{"AttributeName": name, "AttributeType": kind} for name, kind in schema.key_schema().items()]
            ),
            "GlobalSecondaryIndexes": [
                {
                    "IndexName": schema.STATUS_INDEX_NAME,
                    "KeySchema": [
                        {"AttributeName": schema.STATUS_INDEX_PARTITION_KEY, "KeyType": "HASH"},
                        {"AttributeName": schema.STATUS_INDEX_SORT_KEY, "KeyType": "RANGE"},
                    ],
                    "Projection": {
                        "ProjectionType": "INCLUDE",
                        "NonKeyAttributes": list(schema.STATUS_INDEX_PROJECTED),
                    },
                }
            ],
            "TimeToLiveSpecification": {"AttributeName": schema.TTL_ATTRIBUTE, "Enabled": True},
        },
    )


def test_table_has_pitr_aws_managed_encryption_and_is_retained_by_default(template: Template) -> None:
    template.has_resource(
        "AWS::DynamoDB::GlobalTable",
        {
            "DeletionPolicy": "Retain",
            "UpdateReplacePolicy": "Retain",
            "Properties": Match.object_like(
                {
                    "SSESpecification": {"SSEEnabled": True, "SSEType": "KMS"},  # no key id: aws/dynamodb
                    "Replicas": [
                        Match.object_like(
                            {
                                "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
                            }
                        )
                    ],
                }
            ),
        },
    )


def test_the_schema_request_and_the_template_describe_the_same_table(template: Template) -> None:
    props = next(iter(resources(template, "AWS::DynamoDB::GlobalTable").values()))["Properties"]
    request = schema.create_table_request()
    assert props["KeySchema"] == request["KeySchema"]
    assert sorted(props["AttributeDefinitions"], key=str) == sorted(request["AttributeDefinitions"], key=str)
    assert props["GlobalSecondaryIndexes"] == request["GlobalSecondaryIndexes"]


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
    assert len(groups) == 4  # three functions and the API access log
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
        assert env["COWORKER_TICKS_PER_INVOCATION"] == "1"
        assert env["COWORKER_HANDLER_MODULES"]
        assert env["POWERTOOLS_SERVICE_NAME"] == c.SERVICE_NAME
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "Coworker"
        assert env["POWERTOOLS_LOG_LEVEL"] == "INFO"
        assert "AWS_REGION" not in env and "COWORKER_DYNAMODB_ENDPOINT" not in env
    coordinator_env = functions["coordinator"]["Environment"]["Variables"]
    assert coordinator_env["COWORKER_WORKER_FUNCTION"] == {"Ref": functions["worker"]["id"]}
    assert "COWORKER_WORKER_FUNCTION" not in functions["worker"]["Environment"]["Variables"]


def test_worker_limits_come_from_context(functions) -> None:
    worker = functions["worker"]
    assert worker["Timeout"] == 120
    assert worker["MemorySize"] == 1024
    assert worker["ReservedConcurrentExecutions"] == math.ceil(12 / 5) == 3
    assert functions["coordinator"]["ReservedConcurrentExecutions"] == 1
    assert "ReservedConcurrentExecutions" not in functions["api"]
    assert functions["api"]["Timeout"] <= 29


def test_worker_async_invocations_are_never_retried_and_fail_to_the_dlq(
    template: Template, functions
) -> None:
    (queue_id,) = resources(template, "AWS::SQS::Queue")
    template.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig",
        {
            "FunctionName": {"Ref": functions["worker"]["id"]},
            "MaximumRetryAttempts": 0,
            "MaximumEventAgeInSeconds": 120 + 30,  # the default lock: worker timeout + 30 s
            "DestinationConfig": {"OnFailure": {"Destination": {"Fn::GetAtt": [queue_id, "Arn"]}}},
        },
    )
    template.has_resource_properties(
        "AWS::Lambda::EventInvokeConfig",
        {
            "FunctionName": {"Ref": functions["coordinator"]["id"]},
            "MaximumRetryAttempts": 0,
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


def table_actions(template: Template, role_ref: str) -> set[str]:
    table = table_logical_id(template)
    actions: set[str] = set()
    for statement in policy_statements(template).get(role_ref, []):
        if table in json.dumps(statement["Resource"]):
            assert statement["Effect"] == "Allow"
            actions.update(actions_of(statement))
    return actions


def role_of(fn: dict) -> str:
    return fn["Role"]["Fn::GetAtt"][0]


def test_least_privilege_on_the_table(template: Template, functions) -> None:
    assert table_actions(template, role_of(functions["coordinator"])) == {
        "dynamodb:Query",
        "dynamodb:UpdateItem",
    }
    assert table_actions(template, role_of(functions["worker"])) == {
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
        "dynamodb:Query",
    }
    api_actions = table_actions(template, role_of(functions["api"]))
    assert {"dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem"} <= api_actions
    assert all(a.startswith("dynamodb:") and a != "dynamodb:*" for a in api_actions)


def test_only_the_coordinator_may_invoke_the_worker(template: Template, functions) -> None:
    worker = functions["worker"]["id"]
    for role, statements in policy_statements(template).items():
        invokes = [s for s in statements if "lambda:InvokeFunction" in actions_of(s)]
        if role == role_of(functions["coordinator"]):
            assert invokes and all(worker in json.dumps(s["Resource"]) for s in invokes)
        else:
            assert not invokes, role


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
    for name in (
        *library_metrics,
        "Throttles",
        "Errors",
        "ReadThrottleEvents",
        "WriteThrottleEvents",
        "ApproximateNumberOfMessagesVisible",
    ):
        assert name in body, name
    for percentile in c.DURATION_PERCENTILES:
        assert f'\\"stat\\":\\"{percentile}\\"' in body
    assert '\\"Coworker\\",\\"TaskClaimed\\",\\"service\\",\\"coworker\\"' in body


def test_alarms_watch_ignored_tasks_coordinator_errors_dlq_and_throttles(template: Template) -> None:
    alarms = list(resources(template, "AWS::CloudWatch::Alarm").values())
    assert len(alarms) == 4
    text = [json.dumps(a["Properties"]) for a in alarms]
    assert any('"MetricName": "TaskIgnored"' in t and '"Namespace": "Coworker"' in t for t in text)
    assert any('"MetricName": "Errors"' in t and "Coordinator" in t for t in text)
    assert any('"MetricName": "ApproximateNumberOfMessagesVisible"' in t for t in text)
    assert any('"MetricName": "WriteThrottleEvents"' in t for t in text)
    (topic_id,) = resources(template, "AWS::SNS::Topic")
    for alarm in alarms:  # alarmEmail is set in CONTEXT
        assert alarm["Properties"]["AlarmActions"] == [{"Ref": topic_id}]
    template.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ops@example.com"}
    )


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
    assert (asset_dir / "python" / "coworker" / "schema.py").is_file()
    assert not list(asset_dir.rglob("__pycache__"))


def fake_pip(calls: list):
    def run(command, **_):
        calls.append(command)
        target = Path(command[command.index("--target") + 1])
        (target / "pynamodb").mkdir(parents=True)

    return run


def test_layer_dependencies_are_wheels_for_lambda_arm64_installed_once(tmp_path, monkeypatch) -> None:
    calls: list = []
    monkeypatch.setattr("infra.bundling.subprocess.run", fake_pip(calls))
    bundler = LocalLayerBundling(
        c.LAYER_SOURCE_DIR,
        c.LAYER_REQUIREMENTS,
        install_dependencies=True,
        dependency_cache=tmp_path / "cache",
    )
    for out in ("first", "second"):
        assert bundler.try_bundle(str(tmp_path / out), image=None) is True
        assert (tmp_path / out / "python" / "coworker" / "schema.py").is_file()
        assert (tmp_path / out / "python" / "pynamodb").is_dir()
    (command,) = calls  # the second bundle reused the cached install
    assert command[command.index("--platform") + 1] == "manylinux2014_aarch64"
    assert command[command.index("--python-version") + 1] == c.PYTHON_VERSION
    assert command[command.index("--implementation") + 1] == "cp"
    assert "--only-binary=:all:" in command
    assert command[command.index("--requirement") + 1] == str(c.LAYER_REQUIREMENTS)


def test_layer_hash_changes_with_the_dependency_mode() -> None:
    install = LocalLayerBundling(c.LAYER_SOURCE_DIR, c.LAYER_REQUIREMENTS, install_dependencies=True)
    skip = LocalLayerBundling(c.LAYER_SOURCE_DIR, c.LAYER_REQUIREMENTS, install_dependencies=False)
    assert install.asset_hash() != skip.asset_hash()


# --- configuration -----------------------------------------------------------------------------


def config(**context) -> StackConfig:
    return StackConfig.from_context(App(context=context).node)


def test_context_defaults() -> None:
    cfg = config()
    assert not cfg.destroy_on_removal and cfg.install_layer_dependencies
    assert cfg.schedule_minutes == 1
    assert cfg.worker_reserved_concurrency == 2  # ceil(10 / 5)


def test_context_strings_from_the_command_line_are_accepted() -> None:
    cfg = config(maxConcurrency="7", batchSize="3", removalPolicy="destroy", apiCloudWatchRole="false")
    assert cfg.worker_reserved_concurrency == 3 and cfg.destroy_on_removal and not cfg.api_cloudwatch_role


@pytest.mark.parametrize(
    "context",
    [
        {"removalPolicy": "delete"},
        {"layerDependencies": "maybe"},
        {"workerTimeoutSeconds": 300, "lockSeconds": 200},  # a lock shorter than a worker run
        {"batchSize": 0},
        {"scheduleMinutes": 0},
    ],
)
def test_bad_context_fails_the_synth(context) -> None:
    with pytest.raises(ConfigurationError):
        config(**context)


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
