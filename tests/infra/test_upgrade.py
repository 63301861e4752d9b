"""The upgrade rehearsal: HEAD's stack against the previous release's, by logical ID (issue 51, item 6).

The released template is a snapshot (tests/infra/released/, made by ``make released-template``
from the released commit: see the README there). CloudFormation matches an update's resources by
logical ID: one that disappears is deleted at the update's cleanup (or orphaned, when retained),
and one whose replacement-only property changes is created anew and the old one deleted. For a
resource that holds state, or that work in flight runs on, either loses something:

- a table, bucket, queue, topic or key: its data (or, retained, the deployment moves to an empty one);
- a function: its queued asynchronous invocations;
- a function's role: the permissions of the invocations still running on the old code.

Given the default option set of both (the deployment ``npx cdk deploy`` makes from a checkout).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.rehearsal.template import ROLES, Grants, functions_of, role_grants

RELEASED_DIR = Path(__file__).resolve().parent / "released"
# Per stateful type, the properties whose change makes CloudFormation replace the resource
# (the "Update requires: Replacement" of each property in the CloudFormation reference).
REPLACED_BY: dict[str, tuple[str, ...]] = {
    "AWS::DynamoDB::GlobalTable": ("TableName", "KeySchema", "LocalSecondaryIndexes"),
    "AWS::DynamoDB::Table": ("TableName", "KeySchema", "LocalSecondaryIndexes"),
    "AWS::S3::Bucket": ("BucketName", "ObjectLockEnabled"),
    "AWS::Logs::LogGroup": ("LogGroupName",),
    "AWS::SQS::Queue": ("QueueName", "FifoQueue"),
    "AWS::SNS::Topic": ("TopicName", "FifoTopic"),
    "AWS::KMS::Key": ("KeySpec", "KeyUsage", "MultiRegion"),
    "AWS::IAM::Role": ("RoleName", "Path"),
    "AWS::Lambda::Function": ("FunctionName",),
}
# AWS's managed policy the release's function roles held (Lambda's own log writes): the functions
# write only to their own log groups, which HEAD's roles grant by name (checked below instead).
BASIC_EXECUTION = "AWSLambdaBasicExecutionRole"


def released_template() -> tuple[str, dict[str, Any]]:
    (snapshot,) = RELEASED_DIR.glob("template-*.json")  # one release: the previous one
    return snapshot.stem.removeprefix("template-"), json.loads(snapshot.read_text())


@pytest.fixture(scope="module")
def released() -> dict[str, Any]:
    return released_template()[1]


@pytest.fixture(scope="module")
def head(synthesize) -> dict[str, Any]:
    """HEAD's stack with the checkout's cdk.json context, as the snapshot was made."""
    stack, assembly = synthesize({"removalPolicy": "retain"})
    return assembly.get_stack_by_name(stack.stack_name).template


def stateful(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The resources of the kinds in :data:`REPLACED_BY`; of the roles, those a function runs on."""
    function_roles = {fn["Properties"]["Role"]["Fn::GetAtt"][0] for fn in template["Resources"].values()
                      if fn["Type"] == "AWS::Lambda::Function"}
    return {lid: body for lid, body in template["Resources"].items() if body["Type"] in REPLACED_BY
            and (body["Type"] != "AWS::IAM::Role" or lid in function_roles)}


def lost_in_update(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each stateful resource of ``old`` that updating to ``new`` deletes or replaces, and why."""
    found = []
    for lid, body in stateful(old).items():
        kind = body["Type"]
        now = new["Resources"].get(lid)
        if now is None:
            found.append(f"{lid} ({kind}) is not in HEAD's template: the update deletes it (or orphans it, retained)")
        elif now["Type"] != kind:
            found.append(f"{lid} ({kind}) is a {now['Type']} in HEAD: replaced")
        else:
            found += [f"{lid} ({kind}) changes {name}: replaced" for name in REPLACED_BY[kind]
                      if body.get("Properties", {}).get(name) != now.get("Properties", {}).get(name)]
    return found


def test_the_snapshot_is_of_a_commit_of_this_history_and_holds_the_stack() -> None:
    commit, template = released_template()
    assert len(commit) == 12 and int(commit, 16) >= 0
    assert set(functions_of(template)) == set(ROLES)
    assert any(body["Type"].startswith("AWS::DynamoDB::") for body in template["Resources"].values())


def test_the_rehearsal_sees_a_replacement_and_a_removal() -> None:
    """The diff itself, on a copy of the release with a table renamed and a queue dropped."""
    _, old = released_template()
    new = json.loads(json.dumps(old))
    table = next(lid for lid, body in new["Resources"].items() if body["Type"].startswith("AWS::DynamoDB::"))
    new["Resources"][table]["Properties"]["TableName"] = "renamed"
    queue = next(lid for lid, body in new["Resources"].items() if body["Type"] == "AWS::SQS::Queue")
    del new["Resources"][queue]
    assert lost_in_update(old, old) == []
    assert sorted(lost_in_update(old, new)) == sorted([
        f"{table} ({old['Resources'][table]['Type']}) changes TableName: replaced",
        f"{queue} (AWS::SQS::Queue) is not in HEAD's template: the update deletes it (or orphans it, retained)",
    ])


def test_an_upgrade_from_the_release_deletes_or_replaces_nothing_that_holds_state(released, head) -> None:
    assert lost_in_update(released, head) == []


def test_the_functions_keep_the_roles_they_had_in_the_release(released, head) -> None:
    """(b) Old invocations run on the role their function had when they started: were the role a
    new resource, the old one would be deleted at the update's cleanup under work still running."""
    def role_of(template: dict[str, Any]) -> dict[str, str]:
        return {lid: body["Properties"]["Role"]["Fn::GetAtt"][0] for lid, body in template["Resources"].items()
                if body["Type"] == "AWS::Lambda::Function"}

    released_roles = role_of(released)
    assert {fn: role for fn, role in role_of(head).items() if fn in released_roles} == released_roles


def _covers(new: Grants, actions: list[str], resources: list[str], conditions: list) -> list[str]:
    """The (action, resource) pairs of one released statement no HEAD statement allows as widely
    (a HEAD statement with a condition the released one did not have allows less)."""
    missing = []
    for action in actions:
        for resource in resources:
            if not any(action in new_actions and resource in new_resources
                       and all(condition in conditions for condition in new_conditions)
                       for new_actions, new_resources, new_conditions in new.statements):
                missing.append(f"{action} on {resource}")
    return missing


def test_code_of_the_release_still_running_keeps_every_grant_it_had(released, head) -> None:
    """An invocation of the released code still running when the update's cleanup removes the
    released policy has HEAD's: everything the released role allowed, HEAD's allows too."""
    old, new = role_grants(released), role_grants(head)
    for role in ROLES:
        missing = [gap for actions, resources, conditions in old[role].statements
                   for gap in _covers(new[role], actions, resources, conditions)]
        assert missing == [], (role, missing)
        assert [arn for arn in old[role].managed if BASIC_EXECUTION not in arn] == [], role


def test_each_function_writes_to_the_log_group_it_had_and_may(released, head) -> None:
    """What the released roles' AWSLambdaBasicExecutionRole gave the code: its function's logs.
    The log group stays the released one, and HEAD's role may write to it by name."""
    grants = role_grants(head)
    for role, function in functions_of(released).items():
        group = function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
        assert functions_of(head)[role]["Properties"]["LoggingConfig"]["LogGroup"]["Ref"] == group
        for action in ("logs:CreateLogStream", "logs:PutLogEvents"):
            assert grants[role].allow(action, f"{group}.Arn"), (role, action)


def test_the_stack_makes_no_log_group_api_gateway_may_have_made_itself(released, head) -> None:
    """(a) API Gateway makes ``API-Gateway-Execution-Logs_<api id>/<stage>`` when its stage first
    writes execution logs; the release's stage wrote them (errors). A group of that name in the
    template fails the update where it exists (the stack rolls back): the stage writes none, and
    its errors go to the access log group the stack names itself."""
    names = [json.dumps(body["Properties"].get("LogGroupName", "")) for body in head["Resources"].values()
             if body["Type"] == "AWS::Logs::LogGroup"]
    assert not [name for name in names if "API-Gateway-Execution-Logs" in name]
    (stage,) = [body["Properties"] for body in head["Resources"].values() if body["Type"] == "AWS::ApiGateway::Stage"]
    assert [setting["LoggingLevel"] for setting in stage["MethodSettings"]] == ["OFF"]
    log_format = stage["AccessLogSetting"]["Format"]
    for field in ("$context.error.message", "$context.integration.error", "$context.status"):
        assert field in log_format, field
