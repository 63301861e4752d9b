"""Alarms that reach someone, and that belong to one deployment (issue 51, items 1 and 2).

Three synths: the stack as `npx cdk deploy` makes it with no option; a stack of another name
deployed with the first-deploy command docs/deploy.md gives; and a stack sending its alarms to a
team's existing topic, with an e-mail subscribed to it.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from aws_cdk import App, cx_api
from aws_cdk.assertions import Template
from coworker_cdk import constants as c
from coworker_cdk.stack import CoworkerStack

from tests.infra.test_stack import alarms_by_id, resources

ROOT = Path(__file__).resolve().parents[2]
TEAM_TOPIC = "arn:aws:sns:eu-west-1:123456789012:ops-alerts"
OTHER_STACK = "CoworkerStaging"


def first_deploy_context() -> dict[str, str]:
    """The `-c key=value` options of the first `npx cdk deploy` in docs/deploy.md's Steps."""
    steps = (ROOT / "docs" / "deploy.md").read_text().split("### Steps", 1)[1]
    command = next(line for line in steps.splitlines() if line.startswith("npx cdk deploy"))
    words = shlex.split(command, comments=True)
    return dict(words[i + 1].split("=", 1) for i, word in enumerate(words) if word == "-c")


@pytest.fixture(scope="module")
def synth_stack(functions_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    def run(stack_id: str, context: dict[str, object]) -> tuple[cx_api.CloudFormationStackArtifact, Template]:
        app = App(context={"layerDependencies": "skip", **context},
                  outdir=str(tmp_path_factory.mktemp("cdk.out")))
        stack = CoworkerStack(app, stack_id, functions_dir=functions_dir)
        artifact = app.synth().get_stack_by_name(stack.stack_name)
        return artifact, Template.from_json(artifact.template)

    return run


@pytest.fixture(scope="module")
def bare(synth_stack):
    """`npx cdk deploy` with no option at all."""
    return synth_stack(c.STACK_ID, {})


@pytest.fixture(scope="module")
def documented(synth_stack):
    """The first-deploy command of docs/deploy.md, as a stack of another name."""
    return synth_stack(OTHER_STACK, first_deploy_context())


@pytest.fixture(scope="module")
def team_topic(synth_stack):
    return synth_stack(c.STACK_ID, {"alarmTopic": TEAM_TOPIC, "alarmEmail": "oncall@example.com"})


def warnings(artifact: cx_api.CloudFormationStackArtifact) -> list[str]:
    return [str(m.entry.data) for m in artifact.messages if m.level == cx_api.SynthesisMessageLevel.WARNING]


def the_topic(template: Template) -> tuple[str, dict]:
    (topic_id, topic), = resources(template, "AWS::SNS::Topic").items()
    return topic_id, topic["Properties"]


# --- item 1: every alarm notifies a topic, on ALARM and on OK ------------------------------------


def test_with_no_option_the_stack_has_its_own_alarm_topic_and_every_alarm_notifies_it(bare) -> None:
    _, template = bare
    topic_id, _ = the_topic(template)
    alarms = alarms_by_id(template)
    assert len(alarms) >= 8
    for name, alarm in alarms.items():
        assert alarm["AlarmActions"] == [{"Ref": topic_id}], name
        assert alarm["OKActions"] == [{"Ref": topic_id}], name  # "resolved" is heard too
    template.has_output("AlarmTopicArn", {"Value": {"Ref": topic_id}})


def test_the_alarm_topic_is_encrypted_with_a_key_cloudwatch_may_use_and_takes_only_tls(bare) -> None:
    _, template = bare
    topic_id, topic = the_topic(template)
    (key_id, key), = resources(template, "AWS::KMS::Key").items()
    # A key of the stack's: CloudWatch cannot publish to a topic under the AWS-managed aws/sns key
    assert topic["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert key["Properties"]["EnableKeyRotation"] is True
    (cloudwatch_use,) = [s for s in key["Properties"]["KeyPolicy"]["Statement"]
                         if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert set(cloudwatch_use["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey*"}
    (policy,) = resources(template, "AWS::SNS::TopicPolicy").values()
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert policy["Properties"]["Topics"] == [{"Ref": topic_id}]
    assert [s for s in statements if s["Effect"] == "Deny"
            and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}]
    (publish,) = [s for s in statements if s["Effect"] == "Allow"]
    assert publish["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert publish["Action"] == "sns:Publish" and "aws:SourceArn" in json.dumps(publish["Condition"])


def test_with_nobody_subscribed_synth_warns_and_says_how_to_subscribe(bare) -> None:
    artifact, template = bare
    assert not resources(template, "AWS::SNS::Subscription")
    (warning,) = [w for w in warnings(artifact) if "notify nobody" in w]
    for how in ("-c alarmEmail=", "-c alarmTopic=", "AlarmTopicArn", "aws sns subscribe"):
        assert how in warning, how


def test_the_documented_first_deploy_subscribes_an_address_and_prints_no_warning(documented) -> None:
    assert "alarmEmail" in first_deploy_context()
    artifact, template = documented
    topic_id, _ = the_topic(template)
    template.has_resource_properties("AWS::SNS::Subscription", {
        "Protocol": "email", "Endpoint": first_deploy_context()["alarmEmail"], "TopicArn": {"Ref": topic_id}})
    assert warnings(artifact) == []


def test_a_team_topic_is_used_as_it_is_and_the_email_subscribes_to_it(team_topic) -> None:
    artifact, template = team_topic
    assert not resources(template, "AWS::SNS::Topic") and not resources(template, "AWS::KMS::Key")
    for name, alarm in alarms_by_id(template).items():
        assert alarm["AlarmActions"] == alarm["OKActions"] == [TEAM_TOPIC], name
    template.has_output("AlarmTopicArn", {"Value": TEAM_TOPIC})
    template.has_resource_properties("AWS::SNS::Subscription", {
        "Protocol": "email", "Endpoint": "oncall@example.com", "TopicArn": TEAM_TOPIC})
    assert not [w for w in warnings(artifact) if "notify nobody" in w]


# --- item 2: two stacks in one account and region share no alarm metric --------------------------


def rest_api_name(template: Template) -> str:
    (api,) = resources(template, "AWS::ApiGateway::RestApi").values()
    return api["Properties"]["Name"]


def alarm_metrics(template: Template) -> dict[str, list[tuple[str, str, tuple]]]:
    """Each alarm's metrics as (namespace, name, dimensions), in either form CloudFormation takes.
    A dimension's value is JSON; a stage's Ref is its name ("v1" in every stack, as deployed)."""
    stages = {logical_id: stage["Properties"]["StageName"]
              for logical_id, stage in resources(template, "AWS::ApiGateway::Stage").items()}

    def value(raw: object) -> str:
        if isinstance(raw, dict) and raw.get("Ref") in stages:
            raw = stages[raw["Ref"]]
        return json.dumps(raw)

    found: dict[str, list[tuple[str, str, tuple]]] = {}
    for name, alarm in alarms_by_id(template).items():
        metrics = ([alarm] if "MetricName" in alarm
                   else [m["MetricStat"]["Metric"] for m in alarm["Metrics"] if "MetricStat" in m])
        found[name] = [(m["Namespace"], m["MetricName"],
                        tuple(sorted((d["Name"], value(d["Value"])) for d in m.get("Dimensions", []))))
                       for m in metrics]
    return found


def test_each_stack_names_its_rest_api_after_itself(bare, documented) -> None:
    names = {rest_api_name(bare[1]), rest_api_name(documented[1])}
    assert names == {f"{c.SERVICE_NAME}-{c.STACK_ID}", f"{c.SERVICE_NAME}-{OTHER_STACK}"}


def test_the_api_alarm_and_widgets_watch_this_stacks_api_and_stage(bare, documented) -> None:
    for _, template in (bare, documented):
        name = rest_api_name(template)
        (metric,) = alarm_metrics(template)["ApiServerErrors"]
        assert metric[:2] == ("AWS/ApiGateway", "5XXError")
        assert dict(metric[2]) == {"ApiName": json.dumps(name), "Stage": json.dumps(c.API_STAGE_NAME)}
        (dashboard,) = resources(template, "AWS::CloudWatch::Dashboard").values()
        body = json.dumps(dashboard["Properties"]["DashboardBody"])
        api_metrics = re.findall(r'\\"AWS/ApiGateway\\",\\"([^\\]+)\\",\\"ApiName\\",\\"([^\\]+)\\"', body)
        assert {metric for metric, _ in api_metrics} == {"Count", "4XXError", "5XXError", "Latency"}
        assert {api for _, api in api_metrics} == {name}


def test_two_stacks_share_no_alarm_metric(bare, documented) -> None:
    """A metric is the stack's own when a dimension names one of its resources by a Ref (a function,
    the queue, the table: names CloudFormation makes unique), or else by a name the stack gives it
    (the API's, the functions' ``service``): no alarm of one stack reads a metric of the other."""
    def shared_by_name(template: Template) -> set[tuple[str, str, tuple]]:
        return {metric for metrics in alarm_metrics(template).values() for metric in metrics
                if not any('"Ref"' in value or "Fn::" in value for _, value in metric[2])}

    first, second = shared_by_name(bare[1]), shared_by_name(documented[1])
    assert first and second
    assert first.isdisjoint(second)
    assert {dict(metric[2]).get("ApiName") for metric in first | second} - {None} == {
        json.dumps(rest_api_name(bare[1])), json.dumps(rest_api_name(documented[1]))}
    services = {dict(metric[2]).get("service") for metric in first | second} - {None}
    assert services == {json.dumps(f"{c.SERVICE_NAME}-{c.STACK_ID}"), json.dumps(f"{c.SERVICE_NAME}-{OTHER_STACK}")}
