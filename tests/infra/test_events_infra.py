"""The events option's infrastructure (issue 51, item 7): with events=eventbridge and no bus named,
the stack makes a bus, its archive, a dead-letter queue for consumers' rules and outputs naming
them; a bus named is used as it is; dropped events and the stream follower's lag raise alarms that
notify the alarm topic both ways, and show on the dashboard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks
from coworker.errors import ConfigurationError
from coworker.observability import MetricName
from coworker_cdk import constants as c
from coworker_cdk.config import StackConfig

from tests.infra.test_stack import alarm_metric, alarms_by_id, functions_by_role, policy_statements, resources, role_of

OTHER_ACCOUNT = "210987654321"
ORGANIZATION = "o-a1b2c3d4e5"
EVENTS_ON = {"events": "eventbridge", "alarmEmail": "ops@example.com"}


def synth(synthesize, context: dict[str, object]) -> tuple[Template, dict]:
    stack, assembly = synthesize(context)
    artifact = assembly.get_stack_by_name(stack.stack_name)
    return Template.from_json(artifact.template), artifact.template


@pytest.fixture(scope="module")
def own_bus(synthesize) -> tuple[Template, dict]:
    """events=eventbridge, no bus named, another account allowed to put events."""
    return synth(synthesize, {**EVENTS_ON, "eventBusAccounts": OTHER_ACCOUNT})


@pytest.fixture(scope="module")
def named_bus(synthesize) -> tuple[Template, dict]:
    return synth(synthesize, {**EVENTS_ON, "eventBus": f"arn:aws:events:eu-west-1:{OTHER_ACCOUNT}:event-bus/ops"})


@pytest.fixture(scope="module")
def events_off(synthesize) -> tuple[Template, dict]:
    return synth(synthesize, {"alarmEmail": "ops@example.com"})


def only(template: Template, kind: str) -> tuple[str, dict]:
    (found,) = resources(template, kind).items()
    return found


# --- the bus and what goes with it ---------------------------------------------------------------


def test_events_on_makes_a_bus_the_functions_publish_to(own_bus) -> None:
    template, _ = own_bus
    bus_id, _ = only(template, "AWS::Events::EventBus")
    for role, function in functions_by_role(template).items():
        assert function["Environment"]["Variables"]["COWORKER_EVENT_BUS"] == {"Ref": bus_id}, role
    # only the coordinator may put, and on this bus alone
    coordinator = role_of(functions_by_role(template)["coordinator"])
    puts = [st for role, sts in policy_statements(template).items() for st in sts
            if "events:PutEvents" in json.dumps(st["Action"])]
    assert len(puts) == 1 and bus_id in json.dumps(puts[0]["Resource"])
    assert puts[0] in policy_statements(template)[coordinator]


def test_the_bus_is_archived_for_replay_with_a_default_retention(own_bus) -> None:
    template, _ = own_bus
    bus_id, _ = only(template, "AWS::Events::EventBus")
    _, archive = only(template, "AWS::Events::Archive")
    properties = archive["Properties"]
    assert properties["SourceArn"] == {"Fn::GetAtt": [bus_id, "Arn"]}
    assert properties["RetentionDays"] == c.DEFAULT_EVENT_ARCHIVE_DAYS == 30
    assert properties["EventPattern"] == {"source": [{"prefix": ""}]}  # every event on the bus


def test_the_archive_retention_is_an_option(synthesize) -> None:
    template, _ = synth(synthesize, {**EVENTS_ON, "eventArchiveDays": 90})
    template.has_resource_properties("AWS::Events::Archive", {"RetentionDays": 90})


def test_event_archive_days_none_makes_no_archive_and_the_default_keeps_one(own_bus, synthesize) -> None:
    template, _ = synth(synthesize, {**EVENTS_ON, "eventArchiveDays": "none"})
    assert not resources(template, "AWS::Events::Archive")
    only(template, "AWS::Events::EventBus")  # the bus and its queue stay
    assert [lid for lid in resources(template, "AWS::SQS::Queue") if "Events" in lid]
    assert resources(own_bus[0], "AWS::Events::Archive")  # eventArchiveDays unset: archived


def test_event_archive_days_reads_none_and_whole_days_and_refuses_anything_else() -> None:
    def days(value: object) -> int | None:
        return StackConfig.from_options(handlers="examples", events="eventbridge",
                                        event_archive_days=value).event_archive_days

    assert (days("none"), days(" None "), days("0"), days(0), days("7")) == (None, None, 0, 0, 7)
    for bad in ("off", "forever", -1, "1.5", True):
        with pytest.raises(ConfigurationError, match=r"option event_archive_days \(context eventArchiveDays\) "
                                                     r"must be .* or none for no archive"):
            days(bad)


def test_the_bus_policy_lets_the_accounts_named_put_events_and_nobody_else(own_bus, synthesize) -> None:
    template, _ = own_bus
    bus_id, _ = only(template, "AWS::Events::EventBus")
    _, policy = only(template, "AWS::Events::EventBusPolicy")
    statement = policy["Properties"]["Statement"]
    assert statement["Action"] == "events:PutEvents"
    assert statement["Resource"] == {"Fn::GetAtt": [bus_id, "Arn"]}
    assert OTHER_ACCOUNT in json.dumps(statement["Principal"])
    assert policy["Properties"]["EventBusName"] == {"Ref": bus_id}
    # without eventBusAccounts the bus has no policy: only its own account puts
    template, _ = synth(synthesize, EVENTS_ON)
    assert not resources(template, "AWS::Events::EventBusPolicy")


def bus_policies(template: Template) -> dict[str, dict]:
    """The own bus's policy statements, by the Sid given in event_bus.py (CDK makes one
    AWS::Events::EventBusPolicy each, and writes the Sid as cdk-<Sid>)."""
    statements = [p["Properties"]["Statement"] for p in resources(template, "AWS::Events::EventBusPolicy").values()]
    return {st["Sid"].removeprefix("cdk-"): st for st in statements}


def test_the_bus_policy_lets_an_organization_put_events_alongside_the_accounts(synthesize) -> None:
    template, _ = synth(synthesize, {**EVENTS_ON, "eventBusAccounts": OTHER_ACCOUNT,
                                     "eventBusOrganizationId": ORGANIZATION})
    bus_id, _ = only(template, "AWS::Events::EventBus")
    policies = bus_policies(template)
    assert set(policies) == {"OtherAccountsPutEvents", "OrganizationPutEvents"}
    organization = policies["OrganizationPutEvents"]
    assert organization == {
        "Sid": "cdk-OrganizationPutEvents", "Effect": "Allow", "Principal": {"AWS": "*"},
        "Action": "events:PutEvents", "Resource": {"Fn::GetAtt": [bus_id, "Arn"]},
        "Condition": {"StringEquals": {"aws:PrincipalOrgID": ORGANIZATION}}}  # what an account is let do
    assert {k: v for k, v in policies["OtherAccountsPutEvents"].items() if k not in ("Sid", "Principal")} == {
        k: v for k, v in organization.items() if k not in ("Sid", "Principal", "Condition")}
    # the organization alone: its statement and no account's
    template, _ = synth(synthesize, {**EVENTS_ON, "eventBusOrganizationId": ORGANIZATION})
    assert set(bus_policies(template)) == {"OrganizationPutEvents"}


def test_a_dead_letter_queue_takes_what_rules_on_the_bus_cannot_deliver(own_bus) -> None:
    template, _ = own_bus
    bus_id, _ = only(template, "AWS::Events::EventBus")
    queues = {lid: q for lid, q in resources(template, "AWS::SQS::Queue").items() if "Events" in lid}
    ((queue_id, queue),) = queues.items()
    assert queue["Properties"]["SqsManagedSseEnabled"] is True
    assert queue["Properties"]["MessageRetentionPeriod"] == c.EVENT_DLQ_RETENTION_DAYS * 24 * 3600
    (policy,) = [p for p in resources(template, "AWS::SQS::QueuePolicy").values()
                 if {"Ref": queue_id} in p["Properties"]["Queues"]]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert any(st["Effect"] == "Deny" and st["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for st in statements)  # SSL only
    (send,) = [st for st in statements if st["Effect"] == "Allow"]
    assert send["Principal"] == {"Service": "events.amazonaws.com"} and send["Action"] == "sqs:SendMessage"
    source = json.dumps(send["Condition"]["ArnLike"]["aws:SourceArn"])
    assert ":rule/" in source and bus_id in source  # rules on this bus only


def test_outputs_name_the_bus_and_the_dead_letter_queue(own_bus) -> None:
    _, body = own_bus
    outputs = body["Outputs"]
    bus_id, _ = only(Template.from_json(body), "AWS::Events::EventBus")
    assert outputs["EventBusName"]["Value"] == {"Ref": bus_id}
    assert outputs["EventBusArn"]["Value"] == {"Fn::GetAtt": [bus_id, "Arn"]}
    assert "Events" in json.dumps(outputs["EventDeadLetterQueueArn"]["Value"])
    assert "EventPublisherRoleArn" not in outputs


def test_events_off_makes_no_bus_archive_queue_or_output(events_off) -> None:
    template, body = events_off
    for kind in ("AWS::Events::EventBus", "AWS::Events::Archive", "AWS::Events::EventBusPolicy"):
        assert not resources(template, kind), kind
    assert not [lid for lid in resources(template, "AWS::SQS::Queue") if "Events" in lid]
    assert not {"EventBusName", "EventBusArn", "EventDeadLetterQueueArn"} & set(body["Outputs"])


def test_a_bus_named_is_used_as_it_is(named_bus) -> None:
    template, body = named_bus
    arn = f"arn:aws:events:eu-west-1:{OTHER_ACCOUNT}:event-bus/ops"
    for kind in ("AWS::Events::EventBus", "AWS::Events::Archive", "AWS::Events::EventBusPolicy"):
        assert not resources(template, kind), kind
    functions = functions_by_role(template)
    assert functions["coordinator"]["Environment"]["Variables"]["COWORKER_EVENT_BUS"] == arn
    assert (body["Outputs"]["EventBusName"]["Value"], body["Outputs"]["EventBusArn"]["Value"]) == (arn, arn)
    # the other account's bus must allow this role: the output names it (docs/events.md)
    assert body["Outputs"]["EventPublisherRoleArn"]["Value"] == {
        "Fn::GetAtt": [role_of(functions["coordinator"]), "Arn"]}
    assert "EventDeadLetterQueueArn" not in body["Outputs"]


def test_options_of_the_own_bus_are_refused_without_one() -> None:
    with pytest.raises(ConfigurationError, match="event_archive_days.*eventBus names a bus of yours"):
        StackConfig.from_options(handlers="examples", events="eventbridge", event_bus="orders", event_archive_days=7)
    with pytest.raises(ConfigurationError, match="event_bus_accounts.*events is off"):
        StackConfig.from_options(handlers="examples", event_bus_accounts=OTHER_ACCOUNT)
    with pytest.raises(ConfigurationError, match="event_bus_accounts must list ids like 123456789012"):
        StackConfig.from_options(handlers="examples", events="eventbridge", event_bus_accounts="12345")
    with pytest.raises(ConfigurationError, match="event_bus_organization_id.*eventBus names a bus of yours"):
        StackConfig.from_options(handlers="examples", events="eventbridge", event_bus="orders",
                                 event_bus_organization_id=ORGANIZATION)
    with pytest.raises(ConfigurationError, match="event_bus_organization_id.*events is log"):
        StackConfig.from_options(handlers="examples", events="log", event_bus_organization_id=ORGANIZATION)
    config = StackConfig.from_options(handlers="examples", events="eventbridge",
                                      event_bus_accounts=f"{OTHER_ACCOUNT}, 111122223333", event_archive_days=0)
    assert config.own_event_bus and config.event_bus_accounts == (OTHER_ACCOUNT, "111122223333")
    assert config.event_archive_days == 0  # EventBridge keeps the archive's events for ever
    assert config.event_bus_organization_id is None


def test_the_organization_id_is_checked() -> None:
    def organization(value: object) -> str | None:
        return StackConfig.from_options(handlers="examples", events="eventbridge",
                                        event_bus_organization_id=value).event_bus_organization_id

    assert organization(f" {ORGANIZATION} ") == ORGANIZATION
    assert organization("o-" + "z9" * 16) == "o-" + "z9" * 16  # 32 after o-
    for bad in ("o-a1b2c3d4e", "o-" + "a" * 33, "O-A1B2C3D4E5", "o_a1b2c3d4e5", "a1b2c3d4e5", "o-a1b2c3d4e5,o-b"):
        with pytest.raises(ConfigurationError, match=r"option event_bus_organization_id \(context "
                                                     r"eventBusOrganizationId\) must be an AWS Organizations id, "
                                                     r"o- and 10 to 32 lowercase letters or digits"):
            organization(bad)


# --- alarms and dashboard ------------------------------------------------------------------------


def test_dropped_events_and_the_followers_lag_raise_alarms_that_notify_both_ways(own_bus) -> None:
    template, _ = own_bus
    alarms = alarms_by_id(template)
    (topic_id,) = resources(template, "AWS::SNS::Topic")
    for name in ("EventsDropped", "StreamFollowerLag", "EventDeliveryDeadLetter"):
        assert alarms[name]["AlarmActions"] == [{"Ref": topic_id}], name
        assert alarms[name]["OKActions"] == [{"Ref": topic_id}], name
        assert alarms[name]["TreatMissingData"] == "notBreaching", name
    dropped = alarms["EventsDropped"]
    assert alarm_metric(dropped) == (MetricName.EVENTS_DROPPED, c.METRICS_NAMESPACE, "Sum", 300)
    assert (dropped["ComparisonOperator"], dropped["Threshold"]) == ("GreaterThanThreshold", 0)
    lag = alarms["StreamFollowerLag"]
    assert alarm_metric(lag) == (MetricName.STREAM_FOLLOWER_LAG, c.METRICS_NAMESPACE, "Maximum", 300)
    assert (lag["ComparisonOperator"], lag["Threshold"]) == (
        "GreaterThanThreshold", c.DEFAULT_STREAM_LAG_ALARM_SECONDS)
    assert "ApproximateNumberOfMessagesVisible" in json.dumps(alarms["EventDeliveryDeadLetter"])


def test_without_events_the_followers_lag_still_alarms_and_nothing_of_events_does(events_off, synthesize) -> None:
    template, _ = events_off
    alarms = alarms_by_id(template)
    assert "StreamFollowerLag" in alarms  # batch counts and callbacks wait on the follower too
    assert not {"EventsDropped", "EventDeliveryDeadLetter"} & set(alarms)
    template, _ = synth(synthesize, {"streamLagAlarmSeconds": 120})
    assert alarms_by_id(template)["StreamFollowerLag"]["Threshold"] == 120


def shown_on_dashboard(template: Template, name: str) -> bool:
    """Whether the dashboard graphs Coworker's metric ``name``."""
    (dashboard,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    return f'\\"{c.METRICS_NAMESPACE}\\",\\"{name}\\"' in json.dumps(dashboard["Properties"]["DashboardBody"])


def test_the_dashboard_shows_the_lag_and_the_events(own_bus, events_off) -> None:
    for (template, _), events_shown in ((own_bus, True), (events_off, False)):
        assert shown_on_dashboard(template, MetricName.STREAM_FOLLOWER_LAG)
        assert shown_on_dashboard(template, MetricName.EVENTS_DROPPED) is events_shown
        assert shown_on_dashboard(template, MetricName.EVENTS_PUBLISHED) is events_shown


def test_cdk_nag_passes_with_the_own_bus(synthesize) -> None:
    # an unacknowledged finding makes the synth raise; the report says what was acknowledged
    _, assembly = synthesize({**EVENTS_ON, "eventBusAccounts": OTHER_ACCOUNT, "eventBusOrganizationId": ORGANIZATION},
                             plugins=lambda app: [AwsSolutionsChecks(app)])
    report = json.loads((Path(assembly.directory) / "validation-report.json").read_text())
    (plugin,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert plugin["conclusion"] == "success" and plugin["violations"] == []
    on_queue = [f for f in plugin["suppressedViolations"]
                if f["ruleName"] == "AwsSolutions-SQS3" and "Events" in json.dumps(f)]
    assert on_queue and "consumers' rules" in on_queue[0]["reason"]
