"""What a regulated platform team asks of the stack (issue 51, item 9): a customer-managed KMS key
for everything the stack keeps, a WAF web ACL in front of the API, a private API reached through
VPC endpoints only.

Given the context a deployer passes, when the stack reads it, then a malformed value is refused
naming the option and its context key, and the template holds what each option builds; without
the options the template is as before (AWS-owned or managed keys, no web ACL, a regional API).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Environment, Stack
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Annotations, Match, Template
from cdk_nag import AwsSolutionsChecks
from coworker.errors import ConfigurationError
from coworker_cdk import TaskSystem
from coworker_cdk import constants as c
from coworker_cdk.config import StackConfig

KEY = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
WEB_ACL = "arn:aws:wafv2:eu-west-1:123456789012:regional/webacl/platform/a1b2c3d4-5678-90ab-cdef-0a1b2c3d4e5f"
ENDPOINTS = "vpce-0123456789abcdef0, vpce-0fedcba9876543210"
ENDPOINT_IDS = ["vpce-0123456789abcdef0", "vpce-0fedcba9876543210"]
SECURE = {c.CTX_KMS_KEY: KEY, c.CTX_WAF_WEB_ACL: WEB_ACL, c.CTX_API_ENDPOINT: "private",
          c.CTX_API_VPC_ENDPOINTS: ENDPOINTS, c.CTX_CONTAINER_RUNNER: "true", c.CTX_EVENTS: "eventbridge",
          "alarmEmail": "ops@example.com"}
KEY_USE = ["kms:Decrypt", "kms:GenerateDataKey"]


def config(**context: object) -> StackConfig:
    return StackConfig.from_context(App(context={c.CTX_HANDLERS_DIR: "examples", **context}).node)


def refused(**context: object) -> str:
    with pytest.raises(ConfigurationError) as caught:
        config(**context)
    return str(caught.value)


@pytest.fixture(scope="module")
def secure(synthesize) -> tuple[Template, dict[str, Any], Stack]:
    """The stack with every option of this file (and the container runner), checked by cdk-nag."""
    stack, assembly = synthesize(SECURE, plugins=lambda app: [AwsSolutionsChecks(app)])
    report = json.loads((Path(assembly.directory) / "validation-report.json").read_text())
    return Template.from_json(assembly.get_stack_by_name(stack.stack_name).template), report, stack


@pytest.fixture(scope="module")
def default(synthesize) -> Template:
    stack, assembly = synthesize({"alarmEmail": "ops@example.com"})
    return Template.from_json(assembly.get_stack_by_name(stack.stack_name).template)


def _statements(template: Template) -> dict[str, list[dict[str, Any]]]:
    """Each role's statements, by the role's logical id."""
    found: dict[str, list[dict[str, Any]]] = {}
    for policy in template.find_resources("AWS::IAM::Policy").values():
        for role in policy["Properties"]["Roles"]:
            found.setdefault(role["Ref"], []).extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return found


def _key_grants(template: Template) -> dict[str, list[dict[str, Any]]]:
    return {role: [s for s in statements if any(str(a).startswith("kms:") for a in _list(s["Action"]))]
            for role, statements in _statements(template).items()}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


# --- malformed values are refused, naming the option and its context key ------------------------


@pytest.mark.parametrize("value", [
    "1234abcd-12ab-34cd-56ef-1234567890ab",  # a key id, not its ARN
    "arn:aws:kms:eu-west-1:123456789012:alias/coworker",  # an alias: grants and the services need the key
    "arn:aws:kms:eu-west-1:1234:key/1234abcd-12ab-34cd-56ef-1234567890ab",  # no account
    "arn:aws:s3:::my-bucket",
    "alias/aws/dynamodb",
])
def test_a_malformed_kms_key_arn_is_refused(value: str) -> None:
    message = refused(**{c.CTX_KMS_KEY: value})
    assert f"option kms_key_arn (context {c.CTX_KMS_KEY}) must be a customer-managed KMS key's ARN" in message
    assert repr(value) in message


@pytest.mark.parametrize("value", [
    KEY,
    "arn:aws:kms:eu-west-1:123456789012:key/mrk-1234abcd12ab34cd56ef1234567890ab",  # a multi-Region key
    "arn:aws-us-gov:kms:us-gov-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
])
def test_a_key_arn_is_taken(value: str) -> None:
    assert config(**{c.CTX_KMS_KEY: f" {value} "}).kms_key_arn == value


def test_a_key_of_your_own_cdk_app_is_taken_as_it_is() -> None:
    # Given a key made in the deployer's own app: its ARN is a token until deploy
    key = kms.Key(Stack(App(), "Own"), "Key")
    # When TaskSystem's options name it, then it is taken unchecked (CloudFormation resolves it)
    assert StackConfig.from_options(handlers="examples", kms_key_arn=key.key_arn).kms_key_arn == key.key_arn


@pytest.mark.parametrize("value", [
    WEB_ACL.replace(":regional/", ":global/"),  # CLOUDFRONT scope: API Gateway takes none
    "arn:aws:wafv2:eu-west-1:123456789012:regional/ipset/platform/a1b2c3d4-5678-90ab-cdef-0a1b2c3d4e5f",
    "arn:aws:waf-regional:eu-west-1:123456789012:webacl/a1b2c3d4-5678-90ab-cdef-0a1b2c3d4e5f",  # WAF Classic
    "platform",
])
def test_a_malformed_web_acl_arn_is_refused(value: str) -> None:
    message = refused(**{c.CTX_WAF_WEB_ACL: value})
    assert f"option waf_web_acl_arn (context {c.CTX_WAF_WEB_ACL}) must be a regional WAFv2 web ACL's ARN" in message


def test_an_unknown_endpoint_type_is_refused() -> None:
    message = refused(**{c.CTX_API_ENDPOINT: "edge"})
    assert f"option api_endpoint (context {c.CTX_API_ENDPOINT}) must be regional or private, not 'edge'" in message


def test_a_private_api_without_vpc_endpoints_is_refused() -> None:
    message = refused(**{c.CTX_API_ENDPOINT: "private"})
    assert f"option api_vpc_endpoint_ids (context {c.CTX_API_VPC_ENDPOINTS}) must list" in message
    assert "can be called by nobody" in message


@pytest.mark.parametrize("value", ["vpc-0123456789abcdef0", "vpce-XYZ", "endpoint", " , "])
def test_malformed_vpc_endpoint_ids_are_refused(value: str) -> None:
    message = refused(**{c.CTX_API_ENDPOINT: "private", c.CTX_API_VPC_ENDPOINTS: value})
    assert f"option api_vpc_endpoint_ids (context {c.CTX_API_VPC_ENDPOINTS}) must list" in message
    assert repr(value) in message


def test_vpc_endpoints_of_a_regional_api_are_refused_rather_than_left_unused() -> None:
    message = refused(**{c.CTX_API_VPC_ENDPOINTS: ENDPOINTS})
    assert f"set {c.CTX_API_ENDPOINT}=private" in message


def test_vpc_endpoints_are_read_from_a_comma_list_or_a_json_list() -> None:
    assert config(**{c.CTX_API_ENDPOINT: "Private", c.CTX_API_VPC_ENDPOINTS: ENDPOINTS}).api_vpc_endpoint_ids == \
        tuple(ENDPOINT_IDS)
    assert config(**{c.CTX_API_ENDPOINT: "private", c.CTX_API_VPC_ENDPOINTS: ENDPOINT_IDS}).api_vpc_endpoint_ids == \
        tuple(ENDPOINT_IDS)


@pytest.mark.parametrize(("option", "arn"), [("kms_key_arn", KEY), ("waf_web_acl_arn", WEB_ACL)])
def test_a_key_or_web_acl_of_another_region_is_refused_when_the_stack_has_one(option: str, arn: str) -> None:
    # Given a stack deployed to us-east-1 and a key or web ACL of eu-west-1 (they serve their own region)
    stack = Stack(App(), "Regional", env=Environment(account="123456789012", region="us-east-1"))
    # When the construct reads it, then it is refused at synth, not half-way through the deploy
    with pytest.raises(ConfigurationError, match=f"option {option} .* is in region eu-west-1, and the stack "
                                                 "deploys to us-east-1"):
        TaskSystem(stack, "Tasks", handlers="examples", **{option: arn})


# --- what each option builds ------------------------------------------------------------------


def test_the_customer_key_encrypts_the_table_bucket_queue_topic_and_every_log_group(secure) -> None:
    template, *_ = secure
    # the table: SSE of type KMS, the key named on its replica
    template.has_resource_properties("AWS::DynamoDB::GlobalTable", {
        "SSESpecification": {"SSEEnabled": True, "SSEType": "KMS"},
        "Replicas": [Match.object_like({"SSESpecification": {"KMSMasterKeyId": KEY}})]})
    # the results bucket: SSE-KMS with a bucket key
    template.has_resource_properties("AWS::S3::Bucket", {"BucketEncryption": {"ServerSideEncryptionConfiguration": [
        {"BucketKeyEnabled": True, "ServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms",
                                                                     "KMSMasterKeyID": KEY}}]}})
    # the dead-letter queue and the alarm topic, which no longer needs a key of the stack's
    template.has_resource_properties("AWS::SQS::Queue", {"KmsMasterKeyId": KEY,
                                                         "SqsManagedSseEnabled": Match.absent()})
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": KEY})
    template.resource_count_is("AWS::KMS::Key", 0)
    # every log group: the functions', the API's access logs, the runner's and its VPC's flow logs
    groups = template.find_resources("AWS::Logs::LogGroup")
    assert len(groups) == 6
    assert {logical_id: group["Properties"].get("KmsKeyId") for logical_id, group in groups.items()} == \
        dict.fromkeys(groups, KEY)


def test_the_events_bus_its_archive_and_its_queue_are_under_the_customer_key_too(secure) -> None:
    template, *_ = secure
    template.has_resource_properties("AWS::Events::EventBus", {"KmsKeyIdentifier": KEY})
    template.has_resource_properties("AWS::Events::Archive", {"KmsKeyIdentifier": KEY})
    queues = template.find_resources("AWS::SQS::Queue")
    assert len(queues) == 2  # the functions' dead-letter queue and the events' delivery one
    assert {logical_id: queue["Properties"].get("KmsMasterKeyId") for logical_id, queue in queues.items()} == \
        dict.fromkeys(queues, KEY)


def test_each_role_that_touches_encrypted_data_may_use_the_key_and_no_more(secure) -> None:
    template, *_ = secure
    grants = _key_grants(template)
    functions = template.find_resources("AWS::Lambda::Function")
    function_roles = {f["Properties"]["Role"]["Fn::GetAtt"][0] for f in functions.values()}
    (task_definition,) = template.find_resources("AWS::ECS::TaskDefinition").values()
    task_role = task_definition["Properties"]["TaskRoleArn"]["Fn::GetAtt"][0]
    execution_role = task_definition["Properties"]["ExecutionRoleArn"]["Fn::GetAtt"][0]
    # The three functions (table, bucket, dead-letter queue) and the runner's task role (table,
    # bucket): Decrypt and GenerateDataKey on the key, in one statement each, on nothing else.
    assert len(function_roles) == 3
    for role in (*function_roles, task_role):
        assert grants[role] == [{"Action": KEY_USE, "Effect": "Allow", "Resource": KEY}], role
    # The runner's execution role writes logs, which CloudWatch Logs encrypts with its own principal.
    assert not grants.get(execution_role)


def test_the_web_acl_is_associated_with_the_api_stage(secure) -> None:
    template, *_ = secure
    (stage_id,) = template.find_resources("AWS::ApiGateway::Stage")
    (association,) = template.find_resources("AWS::WAFv2::WebACLAssociation").values()
    assert association["Properties"]["WebACLArn"] == WEB_ACL
    assert {"Ref": stage_id} in association["Properties"]["ResourceArn"]["Fn::Join"][1]


def test_a_private_api_is_invoked_through_its_vpc_endpoints_only(secure) -> None:
    template, *_ = secure
    (api,) = template.find_resources("AWS::ApiGateway::RestApi").values()
    properties = api["Properties"]
    assert properties["EndpointConfiguration"] == {"Types": ["PRIVATE"], "VpcEndpointIds": ENDPOINT_IDS}
    allow, deny = properties["Policy"]["Statement"]
    assert (allow["Effect"], allow["Principal"], allow["Action"], allow["Resource"]) == (
        "Allow", {"AWS": "*"}, "execute-api:Invoke", "execute-api:/*")  # API keys: callers are anonymous to IAM
    assert "Condition" not in allow
    assert (deny["Effect"], deny["Principal"], deny["Action"], deny["Resource"]) == (
        "Deny", {"AWS": "*"}, "execute-api:Invoke", "execute-api:/*")
    assert deny["Condition"] == {"StringNotEquals": {"aws:SourceVpce": ENDPOINT_IDS}}


def test_with_iam_authorization_a_private_api_allows_this_accounts_signed_callers_only(synthesize) -> None:
    stack, assembly = synthesize({c.CTX_API_AUTH: c.API_AUTH_IAM, c.CTX_API_ENDPOINT: "private",
                                  c.CTX_API_VPC_ENDPOINTS: ENDPOINTS})
    template = Template.from_json(assembly.get_stack_by_name(stack.stack_name).template)
    (api,) = template.find_resources("AWS::ApiGateway::RestApi").values()
    allow, deny = api["Properties"]["Policy"]["Statement"]
    # the account, not anyone: each caller still needs an IAM policy (the invoke policy) of its own
    assert allow["Principal"] == {"AWS": {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":iam::",
                                                            {"Ref": "AWS::AccountId"}, ":root"]]}}
    assert deny["Effect"] == "Deny"


def test_cdk_nag_passes_and_the_waf_finding_is_no_longer_acknowledged(secure) -> None:
    _, report, _ = secure
    (plugin,) = [r for r in report["pluginReports"] if r["pluginName"] == "AwsSolutions"]
    assert plugin["conclusion"] == "success" and plugin["violations"] == []
    assert "AwsSolutions-APIG3" not in {finding["ruleName"] for finding in plugin["suppressedViolations"]}


def test_every_synth_says_what_the_keys_policy_must_allow(secure) -> None:
    # The stack imports the key and cannot edit its policy: the deployer is told what it needs.
    *_, stack = secure
    Annotations.from_stack(stack).has_info("*", Match.string_like_regexp(
        r"encrypts its table, bucket, queue, alarm topic and log groups with arn:aws:kms:.*logs\.<region>\."
        r"amazonaws\.com.*cloudwatch\.amazonaws\.com.*events\.amazonaws\.com"))
    Annotations.from_stack(stack).has_no_warning("*", Match.string_like_regexp("kms|KMS|key policy"))


# --- without the options, the template is as before ---------------------------------------------


def test_by_default_nothing_uses_a_customer_key(default) -> None:
    # the table under the AWS-managed key, named on no replica (an upgrade replaces nothing)
    (table,) = default.find_resources("AWS::DynamoDB::GlobalTable").values()
    assert table["Properties"]["SSESpecification"] == {"SSEEnabled": True, "SSEType": "KMS"}
    assert all("SSESpecification" not in replica for replica in table["Properties"]["Replicas"])
    default.has_resource_properties("AWS::S3::Bucket", {"BucketEncryption": {"ServerSideEncryptionConfiguration": [
        {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]}})
    default.has_resource_properties("AWS::SQS::Queue", {"SqsManagedSseEnabled": True, "KmsMasterKeyId": Match.absent()})
    # the alarm topic under the stack's own key, as before
    default.resource_count_is("AWS::KMS::Key", 1)
    (key_id,) = default.find_resources("AWS::KMS::Key")
    default.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [key_id, "Arn"]}})
    assert all("KmsKeyId" not in group["Properties"]
               for group in default.find_resources("AWS::Logs::LogGroup").values())
    assert not any(_key_grants(default).values())


def test_by_default_the_api_is_regional_without_a_web_acl_or_a_resource_policy(default) -> None:
    default.resource_count_is("AWS::WAFv2::WebACLAssociation", 0)
    (api,) = default.find_resources("AWS::ApiGateway::RestApi").values()
    assert api["Properties"]["EndpointConfiguration"] == {"Types": ["REGIONAL"]}
    assert "Policy" not in api["Properties"]
