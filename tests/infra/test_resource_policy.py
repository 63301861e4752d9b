"""The API's resource policy of the deployer's own (option apiResourcePolicy; issue 51, item 9).

Given a policy document as a JSON file, inline JSON or (cdk.json) the document itself, when the
stack reads it, then a malformed one is refused at synth naming the statement and what it takes,
and the template's ``AWS::ApiGateway::RestApi`` ``Policy`` holds its statements: after a private
API's (whose deny stays), and behind the allow a private API has when they only deny, since API
Gateway refuses what a resource policy does not allow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Annotations, Match, Template
from cdk_nag import AwsSolutionsChecks
from coworker.errors import ConfigurationError
from coworker_cdk import constants as c
from coworker_cdk.config import StackConfig

ENDPOINTS = "vpce-0123456789abcdef0"
OFFICE = ["203.0.113.0/24", "198.51.100.7/32"]
# Allow calls from the office only: the example of docs/deploy.md.
FROM_THE_OFFICE = {"Version": "2012-10-17", "Statement": [{
    "Sid": "FromTheOffice", "Effect": "Allow", "Principal": "*", "Action": "execute-api:Invoke",
    "Condition": {"IpAddress": {"aws:SourceIp": OFFICE}}}]}
# Deny everyone outside the office (and keep a listed range away from the schedules).
DENY_OUTSIDE = {"Statement": [
    {"Sid": "NotOutsideTheOffice", "Effect": "Deny", "Principal": "*", "Action": "execute-api:*",
     "Resource": "execute-api:/*", "Condition": {"NotIpAddress": {"aws:SourceIp": OFFICE}}},
    {"Effect": "Deny", "Principal": {"AWS": "*"}, "Action": ["execute-api:Invoke"],
     "Resource": ["execute-api:/v1/POST/schedules", "execute-api:/v1/DELETE/schedules/*"],
     "Condition": {"IpAddress": {"aws:SourceIp": OFFICE[1]}}}]}
ADDED_NOTE = r"has only Deny statements, and API Gateway refuses what a resource policy does not allow"


def config(**context: object) -> StackConfig:
    return StackConfig.from_context(App(context={c.CTX_HANDLERS_DIR: "examples", **context}).node)


def refused(policy: object) -> str:
    with pytest.raises(ConfigurationError) as caught:
        config(**{c.CTX_API_RESOURCE_POLICY: policy})
    return str(caught.value)


def statement(**fields: Any) -> str:
    """Inline JSON of a policy of one statement: an allow from everyone, with ``fields`` over it
    (a field given None is left out)."""
    base = {"Effect": "Allow", "Principal": "*", "Action": "execute-api:Invoke", **fields}
    return json.dumps({"Statement": [{k: v for k, v in base.items() if v is not None}]})


def _api_policy(template: Template) -> list[dict[str, Any]]:
    (api,) = template.find_resources("AWS::ApiGateway::RestApi").values()
    return api["Properties"]["Policy"]["Statement"]


def _synth(synthesize, context: dict[str, object], **kwargs: Any) -> tuple[Template, Stack, Path]:
    stack, assembly = synthesize(context, **kwargs)
    return Template.from_json(assembly.get_stack_by_name(stack.stack_name).template), stack, Path(assembly.directory)


@pytest.fixture(scope="module")
def from_a_file(synthesize, tmp_path_factory) -> tuple[Template, Stack, Path]:
    """A regional API with API keys and the office policy from a file, checked by cdk-nag."""
    path = tmp_path_factory.mktemp("policy") / "api-policy.json"
    path.write_text(json.dumps(FROM_THE_OFFICE, indent=2))
    return _synth(synthesize, {c.CTX_API_RESOURCE_POLICY: str(path)}, plugins=lambda app: [AwsSolutionsChecks(app)])


# --- what the template holds --------------------------------------------------------------------


def test_a_policy_from_a_file_is_the_apis_resource_policy_with_every_method_by_default(from_a_file) -> None:
    template, *_ = from_a_file
    # Given the office allow, Resource left out, then it is the API's one statement, on every method
    assert _api_policy(template) == [{
        "Sid": "FromTheOffice", "Effect": "Allow", "Principal": "*", "Action": "execute-api:Invoke",
        "Resource": "execute-api:/*", "Condition": {"IpAddress": {"aws:SourceIp": OFFICE}}}]


def test_a_policy_that_allows_gets_no_allow_of_the_stacks_and_no_note(from_a_file) -> None:
    _, stack, _ = from_a_file
    Annotations.from_stack(stack).has_no_info("*", Match.string_like_regexp(ADDED_NOTE))


def test_cdk_nag_passes_with_a_resource_policy(from_a_file) -> None:
    *_, directory = from_a_file
    report = json.loads((directory / "validation-report.json").read_text())
    (plugin,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert plugin["conclusion"] == "success" and plugin["violations"] == []


def test_an_inline_policy_follows_a_private_apis_statements_whose_deny_stays(synthesize) -> None:
    # Given a private API with IAM authorization and denies of its own, inline
    template, stack, _ = _synth(synthesize, {
        c.CTX_API_AUTH: c.API_AUTH_IAM, c.CTX_API_ENDPOINT: "private", c.CTX_API_VPC_ENDPOINTS: ENDPOINTS,
        c.CTX_API_RESOURCE_POLICY: f"  {json.dumps(DENY_OUTSIDE)}"})
    allow, deny, outside, schedules = _api_policy(template)
    # Then the private API's allow (this account) and deny (other than through its endpoint) come first
    assert (allow["Sid"], allow["Effect"], allow["Principal"]["AWS"]["Fn::Join"][1][-1]) == (
        "InvokeThroughTheVpcEndpoints", "Allow", ":root")
    assert (deny["Sid"], deny["Effect"], deny["Condition"]) == (
        "DenyOtherwise", "Deny", {"StringNotEquals": {"aws:SourceVpce": [ENDPOINTS]}})
    # and the deployer's follow as given; the private allow is there, so the stack adds none
    assert outside == {**DENY_OUTSIDE["Statement"][0], "Action": "execute-api:*"}
    assert schedules == {**DENY_OUTSIDE["Statement"][1], "Action": "execute-api:Invoke"}
    Annotations.from_stack(stack).has_no_info("*", Match.string_like_regexp(ADDED_NOTE))


def test_a_policy_of_denies_only_gets_an_allow_for_everyone_with_api_keys(synthesize) -> None:
    # Given a regional API with API keys and the denies as a document (as cdk.json gives it)
    template, stack, _ = _synth(synthesize, {c.CTX_API_RESOURCE_POLICY: DENY_OUTSIDE})
    added, outside, schedules = _api_policy(template)
    # Then the stack's allow comes first: everyone (the key is checked by API Gateway), every method
    assert added == {"Sid": "InvokeUnlessDenied", "Effect": "Allow", "Principal": {"AWS": "*"},
                     "Action": "execute-api:Invoke", "Resource": "execute-api:/*"}
    assert (outside["Sid"], schedules["Effect"]) == ("NotOutsideTheOffice", "Deny")
    # and the synth says so
    Annotations.from_stack(stack).has_info("*", Match.string_like_regexp(ADDED_NOTE + r".*everyone"))


def test_a_policy_of_denies_only_gets_an_allow_for_this_account_with_iam_authorization(synthesize) -> None:
    template, stack, _ = _synth(synthesize, {c.CTX_API_AUTH: c.API_AUTH_IAM,
                                             c.CTX_API_RESOURCE_POLICY: json.dumps(DENY_OUTSIDE)})
    added, *denies = _api_policy(template)
    assert (added["Sid"], added["Effect"], added["Action"], added["Resource"]) == (
        "InvokeUnlessDenied", "Allow", "execute-api:Invoke", "execute-api:/*")
    assert added["Principal"] == {"AWS": {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::",
                                                              {"Ref": "AWS::AccountId"}, ":root"]]}}
    assert [d["Effect"] for d in denies] == ["Deny", "Deny"]
    Annotations.from_stack(stack).has_info("*", Match.string_like_regexp(ADDED_NOTE + r".*this account's IAM"))


# --- the forms the option takes ---------------------------------------------------------------


def test_a_relative_path_is_read_from_the_folder_the_app_runs_in(tmp_path, monkeypatch) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "api.json").write_text(json.dumps(FROM_THE_OFFICE))
    monkeypatch.chdir(tmp_path)
    (read,) = config(**{c.CTX_API_RESOURCE_POLICY: "policies/api.json"}).api_resource_policy
    assert read["Sid"] == "FromTheOffice" and read["Resource"] == ["execute-api:/*"]


def test_a_path_a_lone_statement_and_actions_in_any_case_are_taken(tmp_path) -> None:
    # Given TaskSystem's option as a Path, to a document whose Statement is one object
    path = tmp_path / "api.json"
    path.write_text(json.dumps({"Statement": {
        "Effect": "Deny", "Principal": {"AWS": ["arn:aws:iam::123456789012:root"]},
        "Action": ["execute-api:invoke", "Execute-Api:InvalidateCache"], "Resource": "execute-api:/v1/GET/tasks/*"}}))
    (read,) = StackConfig.from_options(handlers="examples", api_resource_policy=path).api_resource_policy
    assert read["Action"] == ["execute-api:invoke", "Execute-Api:InvalidateCache"]
    assert read["Resource"] == ["execute-api:/v1/GET/tasks/*"]


def test_by_default_there_is_no_policy_of_the_deployers() -> None:
    assert config().api_resource_policy == ()


# --- malformed policies are refused, saying what to fix -------------------------------------------

OPTION = f"option api_resource_policy (context {c.CTX_API_RESOURCE_POLICY})"


def test_inline_json_that_is_not_json_is_refused() -> None:
    assert f"{OPTION}: inline JSON is not JSON: Expecting property name" in refused('{Statement: []}')


def test_a_file_that_is_not_there_is_refused(tmp_path) -> None:
    message = refused(str(tmp_path / "no-such-policy.json"))
    assert f"{OPTION} names the file {str(tmp_path / 'no-such-policy.json')!r}, which is not there" in message
    assert "inline JSON starting with '{'" in message


def test_a_file_that_is_not_json_is_refused(tmp_path) -> None:
    (tmp_path / "policy.json").write_text('{"Statement": [}')
    message = refused(str(tmp_path / "policy.json"))
    assert f"{OPTION}: the file {str(tmp_path / 'policy.json')!r} is not JSON" in message


@pytest.mark.parametrize("policy", [["a", "list"], '{"Version": "2012-10-17"}', '{"Statement": []}',
                                    '{"Statement": "Allow"}'])
def test_a_document_without_a_statement_list_is_refused(policy: object) -> None:
    message = refused(policy)
    assert f"{OPTION} must" in message
    assert "Statement list" in message


@pytest.mark.parametrize(("fields", "expected"), [
    ({"Effect": "allow"}, "statement 1: Effect must be Allow or Deny, not 'allow'"),
    ({"Effect": None}, "statement 1: Effect must be Allow or Deny, not None"),
    ({"Action": "s3:GetObject"}, "statement 1: Action must be execute-api:Invoke, execute-api:InvalidateCache, "
                                 "execute-api:* (calls to this API), or a list of them, not 's3:GetObject'"),
    ({"Action": ["execute-api:Invoke", "execute-api:ManageConnections"]}, "statement 1: Action must be"),
    ({"Action": None}, "statement 1: Action must be"),
    ({"Principal": None}, "statement 1 has no Principal"),
    ({"Principal": {"Users": "*"}}, "statement 1 has no Principal, or a malformed one"),
    ({"Resource": "arn:aws:s3:::bucket/*"}, "statement 1: Resource must be this API's methods as "
                                            "execute-api:/<stage>/<method>/<path>"),
    ({"Resource": "*"}, "statement 1: Resource must be"),
    ({"Condition": {"IpAddress": "203.0.113.0/24"}}, "statement 1: Condition must map operators"),
    ({"Conditions": {"IpAddress": {"aws:SourceIp": OFFICE}}}, "statement 1 has 'Conditions', which the option "
                                                              "does not take"),
    ({"Sid": "Open", "NotPrincipal": {"AWS": "*"}}, "statement 1 ('Open') has 'NotPrincipal'"),
    ({"Sid": "DenyOtherwise"}, "Sid 'DenyOtherwise' is given twice or is one the stack's own statements take"),
])
def test_a_malformed_statement_is_refused_naming_it_and_what_it_takes(fields: dict[str, Any], expected: str) -> None:
    assert f"{OPTION}: {expected}" in refused(statement(**fields))


def test_a_second_statement_is_named_by_its_number() -> None:
    policy = {"Statement": [json.loads(statement())["Statement"][0], {"Effect": "Deny", "Action": "execute-api:*"}]}
    assert f"{OPTION}: statement 2 has no Principal" in refused(json.dumps(policy))


def test_a_repeated_sid_is_refused() -> None:
    one = json.loads(statement(Sid="Office"))["Statement"][0]
    assert "Sid 'Office' is given twice" in refused({"Statement": [one, one]})


def test_an_unknown_version_is_refused() -> None:
    assert f"{OPTION}: Version must be 2012-10-17 or 2008-10-17" in refused({**FROM_THE_OFFICE, "Version": "2024"})


def test_the_example_in_deploy_md_is_the_one_tested_here() -> None:
    # Given the example policy docs/deploy.md gives (the first JSON block after the option's bullet)
    text = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    example = text[text.index("**A resource policy of your own**"):].split("```json", 1)[1].split("```", 1)[0]
    # Then it is the office policy, and the option takes it
    assert json.loads(example) == FROM_THE_OFFICE
    assert config(**{c.CTX_API_RESOURCE_POLICY: example}).api_resource_policy[0]["Sid"] == "FromTheOffice"
