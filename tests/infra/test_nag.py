"""cdk-nag AwsSolutions checks: no unacknowledged finding, and every acknowledgment has a reason.

cdk-nag v3 is a CDK validation plugin: an unacknowledged error makes ``app.synth()`` raise,
so the fixture itself is the first assertion; the report written to the cloud assembly is the
second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_cdk import Validations
from aws_cdk.assertions import Annotations, Match
from cdk_nag import AwsSolutionsChecks


@pytest.fixture(scope="module")
def nagged(synthesize):
    # Both optional branches on: the e-mail topic and the API Gateway CloudWatch role.
    stack, assembly = synthesize(
        {"alarmEmail": "ops@example.com"}, plugins=lambda app: [AwsSolutionsChecks(app)]
    )
    return stack, assembly


@pytest.fixture(scope="module")
def report(nagged) -> dict:
    _, assembly = nagged
    path = Path(assembly.directory) / "validation-report.json"
    return json.loads(path.read_text())


def test_aws_solutions_checks_pass(report: dict) -> None:
    (plugin,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert plugin["conclusion"] == "success"
    assert plugin["violations"] == []


def test_every_acknowledged_finding_has_a_reason(report: dict) -> None:
    (plugin,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert plugin["suppressedViolations"], "expected the documented acknowledgments"
    for finding in plugin["suppressedViolations"]:
        assert len(finding.get("reason", "").strip()) >= 20, finding["ruleName"]


def test_acknowledgments_recorded_on_constructs_all_have_reasons(nagged) -> None:
    stack, _ = nagged
    key = Validations.ACKNOWLEDGED_RULES_METADATA_KEY
    entries = [
        entry.data
        for construct in stack.node.find_all()
        for entry in construct.node.metadata
        if entry.type == key
    ]
    assert entries
    for data in entries:  # {acknowledged id: reason}
        for rule_id, reason in data.items():
            assert rule_id.startswith("AwsSolutions::AwsSolutions-"), rule_id
            assert len(str(reason).strip()) >= 20, rule_id


def test_no_error_annotations(nagged) -> None:
    stack, _ = nagged
    Annotations.from_stack(stack).has_no_error("*", Match.any_value())


def test_aws_solutions_checks_pass_with_iam_authorization(synthesize) -> None:
    _, assembly = synthesize({"apiAuth": "iam"}, plugins=lambda app: [AwsSolutionsChecks(app)])
    report = json.loads((Path(assembly.directory) / "validation-report.json").read_text())
    (plugin,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert plugin["conclusion"] == "success" and plugin["violations"] == []
    rules = {finding["ruleName"] for finding in plugin["suppressedViolations"]}
    assert "AwsSolutions-APIG4" not in rules  # IAM authorization satisfies it: nothing to acknowledge


@pytest.mark.parametrize("network", [
    {},  # the VPC, security group and cluster the stack builds
    {"runnerSubnets": "subnet-0123456789abcdef0", "runnerSecurityGroups": "sg-0123456789abcdef0",
     "runnerCluster": "batch"},  # yours
])
def test_aws_solutions_checks_pass_with_the_container_runner(synthesize, tmp_path, network) -> None:
    from tests.infra.test_runners import long_tasks_package

    package, _ = long_tasks_package(tmp_path)
    stack, assembly = synthesize({"handlersDir": str(package), "alarmEmail": "ops@example.com", **network},
                                 plugins=lambda app: [AwsSolutionsChecks(app)])
    assert stack.system.runner is not None
    report = json.loads((Path(assembly.directory) / "validation-report.json").read_text())
    (plugin,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert plugin["conclusion"] == "success" and plugin["violations"] == []
    rules = {finding["ruleName"] for finding in plugin["suppressedViolations"]}
    assert "AwsSolutions-ECS2" in rules  # the settings in the runner's environment, as in the functions'
    assert ("AwsSolutions-ECS4" in rules) == (not network)  # a cluster of its own, without Container Insights
