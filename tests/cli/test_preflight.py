"""``coworker preflight`` against moto: the account's real limits checked against what the stack needs.

moto answers API Gateway's GetAccount (and keeps the CloudWatch role set with UpdateAccount) but not
Lambda's GetAccountSettings (404 "Not yet implemented"), so that one answer is given by botocore's
Stubber on the very client the command makes; credentials and region are found as in AWS.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from coworker.config import Settings
from coworker_cdk import account
from coworker_local import cli, preflight
from moto import mock_aws

REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/ApiGatewayCloudWatch"


@pytest.fixture
def aws(monkeypatch, tmp_path):
    """Fake credentials and moto; no cdk.json unless a test writes one."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.chdir(tmp_path)
    with mock_aws():
        yield


def lambda_answers(monkeypatch, quota: int = 1000, unreserved: int | None = None, error: str | None = None,
                   deployed: dict[str, int] | None = None):
    """Lambda's GetAccountSettings answers this on the client the command makes. With
    ``deployed`` (function name -> its reserved concurrency), the stack is deployed already:
    CloudFormation lists those functions, and Lambda answers each one's concurrency."""
    made = preflight.aws_clients

    def clients(region):
        lambda_client, apigateway, cloudformation = made(region)
        stub = Stubber(lambda_client)
        if error:
            stub.add_client_error("get_account_settings", service_error_code=error, service_message="not allowed")
        else:
            stub.add_response("get_account_settings", {"AccountLimit": {
                "TotalCodeSize": 80530636800, "CodeSizeUnzipped": 262144000, "CodeSizeZipped": 52428800,
                "ConcurrentExecutions": quota,
                "UnreservedConcurrentExecutions": quota if unreserved is None else unreserved}})
        if deployed is not None:
            stack = Stubber(cloudformation)
            stack.add_response("list_stack_resources", {"StackResourceSummaries": [
                {"LogicalResourceId": f"Fn{n}", "PhysicalResourceId": name, "ResourceType": "AWS::Lambda::Function",
                 "LastUpdatedTimestamp": "2026-11-01T00:00:00Z", "ResourceStatus": "UPDATE_COMPLETE"}
                for n, name in enumerate(deployed)] + [
                {"LogicalResourceId": "Table", "PhysicalResourceId": "coworker-tasks",
                 "ResourceType": "AWS::DynamoDB::Table", "LastUpdatedTimestamp": "2026-11-01T00:00:00Z",
                 "ResourceStatus": "CREATE_COMPLETE"}]}, {"StackName": preflight.DEFAULT_STACK_NAME})
            stack.activate()
            for name, reserved in deployed.items():
                stub.add_response("get_function_concurrency",
                                  {"ReservedConcurrentExecutions": reserved} if reserved else {},
                                  {"FunctionName": name})
        stub.activate()
        return lambda_client, apigateway, cloudformation

    monkeypatch.setattr(preflight, "aws_clients", clients)


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["preflight", "--region", REGION, *args], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def lines(out: str) -> dict[str, str]:
    """Verdict by check name."""
    found = {}
    for line in out.splitlines():
        for verdict in ("OK", "WILL FAIL"):
            if line.startswith(verdict + " "):
                found[line[10:].split(":")[0].strip()] = verdict
    return found


def test_the_default_deployment_needs_113_as_the_synth_says():
    # Given the default settings, then the shared arithmetic (the synth's and the preflight's) says 13 + 100
    assert account.reserved_concurrency(Settings()) == 13
    assert account.required_lambda_quota(Settings()) == 113


def test_a_default_account_passes(aws, monkeypatch):
    # Given an account with the default quota and no API Gateway role
    lambda_answers(monkeypatch, quota=1000)
    # When the preflight runs with the default options
    code, out, err = run()
    # Then every check passes, and it says what it compared
    assert code == 0, out + err
    assert lines(out) == {"Lambda concurrency quota": "OK", "Lambda unreserved concurrency": "OK",
                          "API Gateway CloudWatch role": "OK"}
    assert "1000 in this account, 113 needed" in out
    assert "the account has none; the stack makes its own" in out
    assert "preflight passed" in out


def test_a_new_account_with_a_low_quota_fails_with_what_to_do(aws, monkeypatch):
    # Given a new account's quota of 50
    lambda_answers(monkeypatch, quota=50)
    # When the preflight runs
    code, out, _ = run()
    # Then the quota check fails, naming the Service Quotas code and the value to ask for
    assert code == 1
    assert lines(out)["Lambda concurrency quota"] == "WILL FAIL"
    assert f"--quota-code {account.LAMBDA_CONCURRENCY_QUOTA_CODE} --desired-value 113 --region {REGION}" in out
    assert "no maxConcurrency fits this quota" in out
    assert "preflight failed" in out


def test_a_quota_that_holds_fewer_slots_names_the_max_concurrency_that_fits(aws, monkeypatch):
    # Given a quota of 150 and a deployment of 50 worker slots (151 needed)
    lambda_answers(monkeypatch, quota=150)
    code, out, _ = run("-c", "maxConcurrency=500")
    # Then the way out is 49 slots of 10
    assert code == 1
    assert "151 needed" in out
    assert "-c maxConcurrency=490 fits" in out
    # And that value passes
    lambda_answers(monkeypatch, quota=150)
    assert run("-c", "maxConcurrency=490")[0] == 0


def test_cdk_json_context_is_read_and_c_options_override_it(aws, monkeypatch, tmp_path):
    # Given a cdk.json asking for 500 at once, in an account whose quota is 150
    (tmp_path / "cdk.json").write_text(json.dumps({"app": "python3 app.py", "context": {"maxConcurrency": 500}}))
    lambda_answers(monkeypatch, quota=150)
    assert run()[0] == 1
    # When -c raises the batch size: 500 / 50 = 10 slots, 111 needed
    lambda_answers(monkeypatch, quota=150)
    code, out, _ = run("-c", "batchSize=50")
    assert code == 0, out
    assert "111 needed" in out


def test_more_than_the_stated_quota_needs_lambda_concurrency_quota_even_when_the_account_has_it(aws, monkeypatch):
    # Given an account raised to 5000, and 1000 worker slots (the synth trusts 1000 unless told)
    lambda_answers(monkeypatch, quota=5000)
    code, out, _ = run("-c", "maxConcurrency=10000")
    assert code == 1
    assert lines(out) == {"Lambda concurrency quota": "OK", "Stated quota (lambdaConcurrencyQuota)": "WILL FAIL",
                          "Lambda unreserved concurrency": "OK", "API Gateway CloudWatch role": "OK"}
    assert "-c lambdaConcurrencyQuota=5000" in out
    # When told, it passes
    lambda_answers(monkeypatch, quota=5000)
    assert run("-c", "maxConcurrency=10000", "-c", "lambdaConcurrencyQuota=5000")[0] == 0


def test_reservations_of_other_functions_fail_the_unreserved_check(aws, monkeypatch):
    # Given a quota of 1000 of which other functions reserve 895 (105 unreserved)
    lambda_answers(monkeypatch, quota=1000, unreserved=105)
    code, out, _ = run()
    assert code == 1
    assert lines(out)["Lambda unreserved concurrency"] == "WILL FAIL"
    assert "other functions in this account and region reserve 895" in out


def test_run_again_on_the_deployed_stack_its_own_reservations_count_as_available(aws, monkeypatch):
    # Given a quota of 120 of which the deployed stack's worker (12) and coordinator (1) reserve 13,
    # leaving 107 unreserved: a first deploy of 13 more would leave 94, but an update keeps its own
    lambda_answers(monkeypatch, quota=120, unreserved=107,
                   deployed={"Coworker-Worker": 12, "Coworker-Coordinator": 1, "Coworker-Api": 0})
    code, out, _ = run()
    assert code == preflight.EXIT_PASSED, out
    assert lines(out)["Lambda unreserved concurrency"] == "OK"
    assert "13 this stack reserves already" in out


def test_other_functions_reservations_still_fail_a_deployed_stacks_update(aws, monkeypatch):
    # Given the same deployed stack, and other functions reserving 10 more (97 unreserved)
    lambda_answers(monkeypatch, quota=120, unreserved=97,
                   deployed={"Coworker-Worker": 12, "Coworker-Coordinator": 1})
    code, out, _ = run()
    assert code == preflight.EXIT_WILL_FAIL
    assert "other functions in this account and region reserve 10" in out


def test_without_the_stacks_role_the_stage_logs_need_the_accounts(aws, monkeypatch):
    # Given apiCloudWatchRole=false with logs, in an account without a role
    lambda_answers(monkeypatch)
    code, out, _ = run("-c", "apiCloudWatchRole=false", "-c", "apiLogs=true")
    assert code == 1
    assert lines(out)["API Gateway CloudWatch role"] == "WILL FAIL"
    assert "apigateway update-account" in out
    # When the account's role is set, the same options pass, naming it
    boto3.client("apigateway", region_name=REGION).update_account(
        patchOperations=[{"op": "replace", "path": "/cloudwatchRoleArn", "value": ROLE}])
    lambda_answers(monkeypatch)
    code, out, _ = run("-c", "apiCloudWatchRole=false", "-c", "apiLogs=true")
    assert code == 0, out
    assert ROLE in out
    # And without logs no role is needed
    lambda_answers(monkeypatch)
    assert run("-c", "apiCloudWatchRole=false", "-c", "apiLogs=false")[0] == 0


def test_role_false_alone_is_refused_as_the_synth_refuses_it(aws, monkeypatch):
    boto3.client("apigateway", region_name=REGION).update_account(
        patchOperations=[{"op": "replace", "path": "/cloudwatchRoleArn", "value": ROLE}])
    lambda_answers(monkeypatch)
    code, out, _ = run("-c", "apiCloudWatchRole=false")
    assert code == 1
    assert "add -c apiLogs=true" in out


def test_json_output(aws, monkeypatch):
    lambda_answers(monkeypatch, quota=50)
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["preflight", "--region", REGION, "--json"], out=out, err=err)
    answer = json.loads(out.getvalue())
    assert code == 1
    assert (answer["required"], answer["passed"]) == (113, False)
    assert answer["checks"][0] == {"name": "Lambda concurrency quota", "verdict": "will fail",
                                   "detail": answer["checks"][0]["detail"]}


def test_no_credentials_is_a_usage_error_without_a_traceback(monkeypatch, tmp_path):
    # Given no credentials anywhere boto3 looks
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.chdir(tmp_path)
    code, out, err = run()
    assert code == 2
    assert out == ""
    assert err.startswith("coworker: error: no AWS credentials found")
    assert "Traceback" not in err


def test_a_refused_read_names_the_permission(aws, monkeypatch):
    lambda_answers(monkeypatch, error="AccessDeniedException")
    code, _, err = run()
    assert code == 2
    assert "AccessDeniedException" in err and "lambda:GetAccountSettings" in err


@pytest.mark.parametrize("option", ["maxConcurrency=0", "batchSize=many", "apiLogs=ture", "lambdaConcurrencyQuota=x",
                                    "novalue"])
def test_bad_context_is_a_usage_error(aws, monkeypatch, option):
    lambda_answers(monkeypatch)
    code, out, err = run("-c", option)
    assert code == 2
    assert out == "" and err.startswith("coworker: error: ")


def test_the_deploy_guide_runs_it_before_cdk_deploy():
    guide = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    steps = guide[guide.index("### Steps"):]
    assert -1 < steps.index("coworker preflight") < steps.index("npx cdk deploy")
