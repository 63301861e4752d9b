"""The deploy rehearsal: the synthesized stack's three functions, each run from its own asset
with the environment and the role the template gives it, through a task's whole life.

Every AWS request the functions make goes through :class:`wire.Gateway`, which answers
``AccessDenied`` to whatever the caller's role does not grant; the API is driven with API Gateway
events, the coordinator with EventBridge's, and workers start only through ``lambda:Invoke``
requests of the API and the coordinator. Any denied request, any function that cannot start,
and any function error fails the rehearsal. It runs for the default options and for options that
change the roles or the environments (no results bucket, lowered limits, handler modules).
What stands in for AWS is described in :mod:`tests.rehearsal.rehearse`.
"""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.rehearsal.rehearse import run_lifecycle
from tests.rehearsal.template import ROLES
from tests.rehearsal.wire import access_key

pytest.importorskip("aws_cdk")


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    {},
    {"resultsBucket": "false", "maxConcurrency": "30", "batchSize": "5", "statusShards": "2",
     "handlerModules": "{package}.reports.summary", "dispatchOnSubmit": "false", "exampleHandlers": "true",
     "retentionDays": "7", "inlineResultBytes": "1024", "legacyStatusIndex": "true",
     "events": "eventbridge", "eventBus": "rehearsal-bus"},
], ids=["defaults", "other-options"])
def test_each_function_runs_the_lifecycle_from_its_asset_with_its_own_role(deploy, options) -> None:
    # Given the stack synthesized with a team's handlers package, deployed on the local services
    deployment = deploy(options)

    # When a task's whole life runs through the three functions
    run_lifecycle(deployment)

    # Then no request was denied, every function started and none failed
    assert not deployment.problems(), "\n".join(deployment.problems())
    # and each function ran from its asset, its library from the layer
    for pool in deployment.pools.values():
        assert pool.invocations, pool.role
        for files in pool.imported_files():
            assert files["coworker"].startswith(str(pool.layer)), files
            assert files["handler"].startswith(str(pool.code)), files
    # and the rehearsal reached what it is meant to prove
    allowed = {role: {action for action, _ in deployment.gateway.allowed(role)} for role in ROLES}
    assert "dynamodb:DeleteItem" in allowed["coordinator"]  # the extra slots retired
    assert "dynamodb:GetRecords" in allowed["coordinator"]  # the batch counted from the stream
    assert "dynamodb:TransactWriteItems" not in allowed["worker"]  # (IAM knows only the item actions)
    assert "lambda:InvokeFunction" in allowed["coordinator"]
    if options.get("events"):  # events published by the coordinator, on its bus alone
        assert "events:PutEvents" in allowed["coordinator"]
        assert not {"events:PutEvents"} & (allowed["api"] | allowed["worker"])
    if deployment.names.bucket:
        assert "lambda:InvokeFunction" in allowed["api"]  # dispatch on submit
        worker_objects = {resource.split("/")[1] for action, resource in deployment.gateway.allowed("worker")
                          if action == "s3:PutObject"}
        assert {"payloads", "results"} <= worker_objects
        assert "s3:GetObject" in allowed["api"] and "s3:PutObject" in allowed["api"]


def test_the_gateway_refuses_what_a_role_does_not_grant(deploy) -> None:
    # Given the default deployment
    deployment = deploy({})
    api = boto3.client("dynamodb", endpoint_url=deployment.gateway.endpoint, region_name="us-east-1",
                       aws_access_key_id=access_key("api"), aws_secret_access_key="rehearsal")

    # When the API's role deletes the table, or reads another one
    refused = []
    for call in (lambda: api.delete_table(TableName=deployment.names.table),
                 lambda: api.get_item(TableName="someone-elses", Key={"key": {"S": "x"}})):
        with pytest.raises(ClientError) as raised:
            call()
        refused.append(raised.value.response["Error"]["Code"])

    # Then both are denied as AWS denies them, and recorded
    assert refused == ["AccessDeniedException", "AccessDeniedException"]
    assert [d.action for d in deployment.gateway.denied()] == ["dynamodb:DeleteTable", "dynamodb:GetItem"]
    # while what it grants goes through
    assert api.get_item(TableName=deployment.names.table, Key={"key": {"S": "x"}}).get("Item") is None
