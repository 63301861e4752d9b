"""``coworker preflight``: read the account's real limits before a first ``cdk deploy``.

The synth cannot look at the account: it trusts a stated Lambda concurrency quota (1,000 unless
``lambdaConcurrencyQuota`` says otherwise), and new accounts often have 10 or 50, so the first
deploy would fail half-way on the worker's reserved concurrency. With AWS credentials, this reads
what the account says (Lambda ``GetAccountSettings``, API Gateway ``GetAccount``) and compares it
with what the stack as configured needs, asking :mod:`coworker_cdk.account` as the synth does.

Run again once the stack is deployed, its functions' own reservations are among those the account
reports as taken: an update keeps them rather than asking anew, so they are counted back (read from
the stack's resources; none when it is not deployed).

Calls made (read-only): ``lambda:GetAccountSettings``, ``apigateway:GET`` on ``/account``,
``cloudformation:ListStackResources`` on the stack, and ``lambda:GetFunctionConcurrency`` on its
functions.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError
from coworker.config import Settings
from coworker_cdk import account
from coworker_cdk import constants as c
from pydantic import ValidationError

EXIT_PASSED: Final = 0
EXIT_WILL_FAIL: Final = 1
OK, WILL_FAIL = "ok", "will fail"
DEFAULT_STACK_NAME: Final = c.STACK_ID  # the app's (app.py) stack


class PreflightError(Exception):
    """The preflight could not run: no credentials or region, a refused call, bad context."""


@dataclass(frozen=True)
class Account:
    """What the account says, in one region."""

    region: str
    concurrency_quota: int  # Lambda AccountLimit.ConcurrentExecutions
    unreserved: int  # Lambda AccountLimit.UnreservedConcurrentExecutions
    cloudwatch_role_arn: str | None  # API Gateway's account setting
    stack_reserved: int = 0  # what the stack, when deployed already, reserves now (kept by an update)


@dataclass(frozen=True)
class Needs:
    """What the stack as configured (cdk.json's context and ``-c`` options) asks of the account."""

    settings: Settings
    stated_quota: int  # lambdaConcurrencyQuota: what the synth's own check trusts
    cloudwatch_role: bool  # apiCloudWatchRole: the stack makes and sets the account's role
    api_logs: bool | None  # apiLogs, as given (None: not said)

    @property
    def reserved(self) -> int:
        return account.reserved_concurrency(self.settings)

    @property
    def required(self) -> int:
        return account.required_lambda_quota(self.settings)


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # OK or WILL_FAIL
    detail: str


def context_of(cdk_json: Path | None, pairs: list[str]) -> dict[str, Any]:
    """The deployment's context: the ``context`` block of ``cdk_json`` (when there is one), then
    each ``key=value`` of ``pairs`` over it, as ``cdk deploy -c`` does."""
    context: dict[str, Any] = {}
    if cdk_json is not None and cdk_json.is_file():
        try:
            context.update(json.loads(cdk_json.read_text()).get("context") or {})
        except (ValueError, AttributeError) as exc:
            raise PreflightError(f"{cdk_json}: not a cdk.json ({exc})") from None
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise PreflightError(f"-c takes key=value, not {pair!r}")
        context[key.strip()] = value
    return context


def needs_of(context: dict[str, Any]) -> Needs:
    """What a deployment with ``context`` needs, validated as the synth validates those options."""
    values = {field: context[key] for key, field in ((c.CTX_MAX_CONCURRENCY, "max_concurrency"),
                                                      (c.CTX_BATCH_SIZE, "batch_size"))
              if context.get(key) not in (None, "")}
    try:
        settings = Settings.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(f"{e['loc'][0] if e['loc'] else ''}: {e['msg']}" for e in exc.errors())
        raise PreflightError(f"context {c.CTX_MAX_CONCURRENCY}/{c.CTX_BATCH_SIZE}: {problems}") from None
    stated = context.get(c.CTX_LAMBDA_QUOTA)
    try:
        stated_quota = int(stated) if stated not in (None, "") else c.DEFAULT_LAMBDA_CONCURRENCY_QUOTA
    except (TypeError, ValueError):
        raise PreflightError(f"context {c.CTX_LAMBDA_QUOTA} must be a whole number, not {stated!r}") from None
    role = _flag(context, c.CTX_API_CLOUDWATCH_ROLE)
    return Needs(settings=settings, stated_quota=stated_quota, cloudwatch_role=True if role is None else role,
                 api_logs=_flag(context, c.CTX_API_LOGS))


def _flag(context: dict[str, Any], key: str) -> bool | None:
    value = context.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in c.TRUE_WORDS or word in c.FALSE_WORDS:
        return word in c.TRUE_WORDS
    raise PreflightError(f"context {key} must be true or false, not {value!r}")


def aws_clients(region: str | None) -> tuple[Any, Any, Any]:
    """Lambda, API Gateway and CloudFormation clients for ``region`` (else the configured one),
    with the usual AWS credentials; PreflightError when there are none."""
    import boto3

    session = boto3.Session(region_name=region)
    if session.get_credentials() is None:
        raise PreflightError("no AWS credentials found (environment, ~/.aws, SSO or instance role): the "
                             "preflight reads the account you deploy to, so run it with the credentials "
                             "`cdk deploy` will use (e.g. AWS_PROFILE=...)")
    if not session.region_name:
        raise PreflightError("no region: pass --region, or set AWS_REGION / AWS_DEFAULT_REGION as for cdk deploy")
    return session.client("lambda"), session.client("apigateway"), session.client("cloudformation")


def read_account(lambda_client: Any, apigateway_client: Any, cloudformation_client: Any,
                 stack_name: str = DEFAULT_STACK_NAME) -> Account:
    """The account's Lambda concurrency limits and API Gateway CloudWatch role, in the clients'
    region, and what ``stack_name`` reserves if it is deployed there already."""
    try:
        limits = lambda_client.get_account_settings()["AccountLimit"]
        role = apigateway_client.get_account().get("cloudwatchRoleArn")
        stack_reserved = _stack_reserved(cloudformation_client, lambda_client, stack_name)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise PreflightError(f"AWS refused {exc.operation_name}: {error.get('Code')}: {error.get('Message')} "
                             "(the preflight needs lambda:GetAccountSettings, apigateway:GET on "
                             "arn:aws:apigateway:<region>::/account, cloudformation:ListStackResources on the "
                             "stack and lambda:GetFunctionConcurrency on its functions)") from None
    except BotoCoreError as exc:
        raise PreflightError(f"could not read the account: {exc}") from None
    return Account(region=lambda_client.meta.region_name, concurrency_quota=int(limits["ConcurrentExecutions"]),
                   unreserved=int(limits["UnreservedConcurrentExecutions"]), cloudwatch_role_arn=role or None,
                   stack_reserved=stack_reserved)


def _stack_reserved(cloudformation_client: Any, lambda_client: Any, stack_name: str) -> int:
    """The concurrent executions the functions of ``stack_name`` reserve now; 0 when no such
    stack is deployed (a first deploy)."""
    functions: list[str] = []
    try:
        for page in cloudformation_client.get_paginator("list_stack_resources").paginate(StackName=stack_name):
            functions += [resource["PhysicalResourceId"] for resource in page["StackResourceSummaries"]
                          if resource["ResourceType"] == "AWS::Lambda::Function"
                          and resource.get("PhysicalResourceId")]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") == "ValidationError" and "does not exist" in str(error.get("Message")):
            return 0
        raise
    return sum(int(lambda_client.get_function_concurrency(FunctionName=name).get("ReservedConcurrentExecutions", 0))
               for name in functions)


def checks(needs: Needs, found: Account) -> list[Check]:
    """One verdict per thing a first deploy of ``needs`` into ``found`` could fail on."""
    return [_quota_check(needs, found), *_stated_quota_check(needs, found), _unreserved_check(needs, found),
            _role_check(needs, found)]


def _quota_check(needs: Needs, found: Account) -> Check:
    name = "Lambda concurrency quota"
    have = (f"{found.concurrency_quota} in this account, {needs.required} needed ({needs.reserved} reserved + "
            f"{c.LAMBDA_UNRESERVED_MINIMUM} Lambda keeps unreserved)")
    if found.concurrency_quota >= needs.required:
        return Check(name, OK, have)
    code = account.LAMBDA_CONCURRENCY_QUOTA_CODE
    fits = account.max_concurrency_within(found.concurrency_quota, needs.settings.batch_size)
    smaller = (f"; or reserve less: -c {c.CTX_MAX_CONCURRENCY}={fits} fits this quota at {c.CTX_BATCH_SIZE} "
               f"{needs.settings.batch_size}" if fits else
               "; no maxConcurrency fits this quota (it holds not one worker slot beside what Lambda keeps)")
    return Check(name, WILL_FAIL,
                 f"{have}: the worker's reserved concurrency would fail the create. Ask AWS for at least "
                 f"{needs.required} (Service Quotas, AWS Lambda, Concurrent executions, quota code {code}: "
                 f"`aws service-quotas request-service-quota-increase --service-code lambda --quota-code {code} "
                 f"--desired-value {needs.required} --region {found.region}`){smaller}")


def _stated_quota_check(needs: Needs, found: Account) -> list[Check]:
    # The synth refuses a deployment needing more than the stated quota, even when the account has it.
    if needs.required <= needs.stated_quota or found.concurrency_quota < needs.required:
        return []
    return [Check("Stated quota (lambdaConcurrencyQuota)", WILL_FAIL,
                  f"the synth trusts {needs.stated_quota} and refuses {needs.required}: deploy with "
                  f"-c {c.CTX_LAMBDA_QUOTA}={found.concurrency_quota}")]


def _unreserved_check(needs: Needs, found: Account) -> Check:
    name = "Lambda unreserved concurrency"
    # The deployed stack's own reservations are taken already and kept by the update: count them back.
    available = found.unreserved + found.stack_reserved
    left = available - needs.reserved
    own = (f" + {found.stack_reserved} this stack reserves already (an update keeps them)"
           if found.stack_reserved else "")
    have = (f"{found.unreserved} unreserved{own}; reserving {needs.reserved} leaves {left} "
            f"(Lambda keeps at least {c.LAMBDA_UNRESERVED_MINIMUM})")
    if left >= c.LAMBDA_UNRESERVED_MINIMUM:
        return Check(name, OK, have)
    taken = found.concurrency_quota - available
    if taken <= 0:  # nothing else reserves: the quota itself is short
        return Check(name, WILL_FAIL, f"{have}: the quota is too low (above)")
    return Check(name, WILL_FAIL,
                 f"{have}: other functions in this account and region reserve {taken}. Lower their reserved "
                 "concurrency or raise the quota (above)")


def _role_check(needs: Needs, found: Account) -> Check:
    name = "API Gateway CloudWatch role"
    role = found.cloudwatch_role_arn
    has = f"the account's is {role}" if role else "the account has none"
    if needs.cloudwatch_role:
        return Check(name, OK, f"{has}; the stack makes its own and sets it ({c.CTX_API_CLOUDWATCH_ROLE}=true)"
                     + (f": -c {c.CTX_API_CLOUDWATCH_ROLE}=false -c {c.CTX_API_LOGS}=true keeps the account's"
                        if role else ""))
    if needs.api_logs is False:
        return Check(name, OK, f"{has}; the stage writes no access logs ({c.CTX_API_LOGS}=false), so none is needed")
    if role:
        if needs.api_logs is None:
            return Check(name, WILL_FAIL, f"{has}, and {c.CTX_API_CLOUDWATCH_ROLE}=false alone is refused at synth: "
                                          f"add -c {c.CTX_API_LOGS}=true")
        return Check(name, OK, f"{has}; the stage's access logs use it ({c.CTX_API_CLOUDWATCH_ROLE}=false)")
    return Check(name, WILL_FAIL,
                 f"{has}, and with {c.CTX_API_CLOUDWATCH_ROLE}=false the stage's access logs need one (its create "
                 f"would fail): deploy with {c.CTX_API_CLOUDWATCH_ROLE}=true (the default), or set the account's "
                 "role (`aws apigateway update-account --patch-operations "
                 "op=replace,path=/cloudwatchRoleArn,value=<role ARN>`), or deploy with "
                 f"-c {c.CTX_API_LOGS}=false")


def report(needs: Needs, found: Account, results: list[Check], as_json: bool) -> str:
    """The verdicts as printed: one line per check, then the outcome."""
    passed = all(check.verdict == OK for check in results)
    if as_json:
        return json.dumps({"region": found.region, "reserved": needs.reserved, "required": needs.required,
                           "passed": passed, "checks": [asdict(check) for check in results]}, indent=2) + "\n"
    settings = needs.settings
    lines = [f"region {found.region}: this deployment reserves {needs.reserved} concurrent Lambda executions "
             f"({settings.worker_slots} worker slots = ceil({c.CTX_MAX_CONCURRENCY} {settings.max_concurrency} / "
             f"{c.CTX_BATCH_SIZE} {settings.batch_size}), and the coordinator's "
             f"{c.COORDINATOR_RESERVED_CONCURRENCY})"]
    lines += [f"{check.verdict.upper():<10} {check.name}: {check.detail}" for check in results]
    lines.append("preflight passed: cdk deploy with the same -c options" if passed else
                 "preflight failed: a deploy as configured would fail (see above)")
    return "\n".join(lines) + "\n"
