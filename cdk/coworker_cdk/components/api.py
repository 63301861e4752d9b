"""The REST API: API Gateway, Lambda proxy integration, and one of two ways to authenticate.

``apiAuth=api-key`` (default): an API key on every method (``api_key_required``), the simplest
scheme for machines (a header, ``x-api-key``); the usage plan attached to the key throttles it.
``apiAuth=iam``: IAM authorization on every method (SigV4-signed requests); callers get the
managed policy this construct creates. See docs/deploy.md, "Choosing how callers authenticate".

The endpoint is regional, or private (``apiEndpoint=private``): reached only through the interface
VPC endpoints the deployer lists, which its resource policy holds to. The deployer's own resource
policy statements (``apiResourcePolicy``) follow the private ones. A WAF web ACL of the team's
(``wafWebAclArn``) may be associated with the stage. See docs/deploy.md, "Regulated accounts".
"""

from __future__ import annotations

import json
from pathlib import Path

from aws_cdk import Annotations, RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct
from coworker.data import layout

from coworker_cdk import constants as c
from coworker_cdk import resource_policy as rp
from coworker_cdk.bundling import function_code
from coworker_cdk.components.function import CoworkerFunction, log_group
from coworker_cdk.components.grants import grant_delete_items, grant_invoke, grant_key_use, grant_table
from coworker_cdk.components.results import PAYLOAD_PREFIX, RESULT_PREFIX, grant_objects
from coworker_cdk.config import StackConfig

# What the API's library code calls on the table, nothing more: tasks are put (PutItem; a batch's
# head item is opened first, UpdateItem), read (GetItem; a batch's progress is its head and its
# counter items, BatchGetItem), listed and counted on the index (Query), redriven or cancelled
# and worker slots reserved (UpdateItem). Schedules are put, paused and resumed the same way, and
# deleted (DeleteItem, of schedule items only).
API_TABLE_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query",
                     "dynamodb:BatchGetItem")

_FIELD = apigw.AccessLogField
# One JSON line a request: who called what and the answer (CDK's standard fields), and why it
# failed: the gateway's own error (an unknown key, throttling, a body refused), the Lambda
# integration's (a timeout, throttling, an invalid answer) and the function's status code.
ACCESS_LOG_FORMAT = apigw.AccessLogFormat.custom(json.dumps({
    "requestId": _FIELD.context_request_id(), "ip": _FIELD.context_identity_source_ip(),
    "user": _FIELD.context_identity_user(), "caller": _FIELD.context_identity_caller(),
    "requestTime": _FIELD.context_request_time(), "httpMethod": _FIELD.context_http_method(),
    "resourcePath": _FIELD.context_resource_path(), "status": _FIELD.context_status(),
    "protocol": _FIELD.context_protocol(), "responseLength": _FIELD.context_response_length(),
    "errorMessage": _FIELD.context_error_message(), "errorType": _FIELD.context_error_response_type(),
    "integrationError": "$context.integration.error", "integrationStatus": _FIELD.context_integration_status(),
    "integrationLatency": _FIELD.context_integration_latency(),
}, separators=(",", ":")))


class TaskApi(Construct):
    """``ANY /`` and ``ANY /{proxy+}`` to the api function, every method behind an API key."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StackConfig,
        table: dynamodb.ITableV2,
        layer: lambda_.ILayerVersion,
        functions_dir: Path,
        removal_policy: RemovalPolicy,
        worker: lambda_.IFunction,
        results_bucket: s3.IBucket | None = None,
        key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._removal_policy = removal_policy
        self._results_bucket = results_bucket
        self._key = key  # the customer-managed key (option kms_key_arn), when there is one
        self.handler = self._build_handler(table, layer, functions_dir / c.API_DIR_NAME, worker)
        # API Gateway writes the stage's logs only in an account whose settings name a CloudWatch
        # role (apiCloudWatchRole sets it); without one the deployer turns them off (apiLogs=false).
        self.access_logs = (log_group(self, "AccessLogs", retention_days=config.log_retention_days,
                                      removal_policy=removal_policy, encryption_key=key)
                            if config.api_logs else None)
        self.rest_api = self._build_rest_api(self.handler.function)
        self.web_acl_association = self._associate_web_acl(config.waf_web_acl_arn)
        self.api_key: apigw.IApiKey | None = None
        self.usage_plan: apigw.UsagePlan | None = None
        self.invoke_policy: iam.ManagedPolicy | None = None
        if config.api_auth == c.API_AUTH_IAM:
            self.invoke_policy = self._build_invoke_policy()
        else:
            self.api_key, self.usage_plan = self._build_usage_plan()

    def _build_handler(
        self,
        table: dynamodb.ITableV2,
        layer: lambda_.ILayerVersion,
        code_dir: Path,
        worker: lambda_.IFunction,
    ) -> CoworkerFunction:
        handler = CoworkerFunction(
            self,
            "Handler",
            code_dir=code_dir,
            # Your handlers package too: the API refuses task types that have no handler.
            code=function_code(code_dir, self._config.handlers_dir,
                               install_dependencies=self._config.install_layer_dependencies),
            layer=layer,
            # The worker's name: put tasks start a worker at once when a slot is free
            # (dispatch on submit, COWORKER_DISPATCH_ON_SUBMIT).
            environment=self._config.function_environment(
                with_handlers=True, table_name=table.table_name, worker_function=worker.function_name,
                api_auth=self._config.api_auth,  # declared in its OpenAPI document
                # No cursor secret: the API keeps a random one in the table (control#cursor-secret).
                result_bucket=self._results_bucket.bucket_name if self._results_bucket else None,
            ),
            timeout_seconds=c.API_TIMEOUT_SECONDS,
            memory_mb=self._config.api_memory_mb,
            removal_policy=self._removal_policy,
            log_retention_days=self._config.log_retention_days,
            description="Coworker API: submit, list and inspect tasks",
            encryption_key=self._key,
        )
        grant_key_use(self._key, handler.function)  # the table and the results bucket
        grant_table(table, handler.function, API_TABLE_ACTIONS)
        grant_delete_items(table, handler.function, layout.SCHEDULE_KEY_PREFIX)
        grant_invoke(worker, handler.function)
        if self._results_bucket is not None:  # reads large results, writes large payloads
            grant_objects(self._results_bucket, handler.function, "s3:GetObject", RESULT_PREFIX)
            grant_objects(self._results_bucket, handler.function, "s3:PutObject", PAYLOAD_PREFIX)
        return handler

    def _build_rest_api(self, function: lambda_.IFunction) -> apigw.RestApi:
        config = self._config
        api = apigw.RestApi(
            self,
            "RestApi",
            # The API's metrics go by this name (ApiName): the deployment's own, coworker-<stack name>
            # like its metrics' service, so no other stack's API shares its alarm and graphs.
            rest_api_name=config.service_name,
            description="Coworker task API",
            endpoint_configuration=self._endpoint_configuration(),
            policy=self._resource_policy(),
            # Access and execution logs need the account-wide API Gateway CloudWatch role; this
            # creates it unless the deployer says the account already has one.
            cloud_watch_role=config.api_cloudwatch_role,
            # (A removal policy is only for a role it creates: the CDK refuses one without.)
            cloud_watch_role_removal_policy=(RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE if config.api_cloudwatch_role
                                             else None),
            deploy_options=apigw.StageOptions(
                stage_name=c.API_STAGE_NAME,
                tracing_enabled=True,
                access_log_destination=(apigw.LogGroupLogDestination(self.access_logs) if self.access_logs
                                        else None),
                access_log_format=ACCESS_LOG_FORMAT if self.access_logs else None,
                # No execution logs: API Gateway writes them to a group it names and makes itself
                # (API-Gateway-Execution-Logs_<api id>/<stage>, kept for ever), which the stack can
                # neither make (where a release's stage already made it, the create fails and the
                # update rolls back) nor own. Their errors are in the access log, a group of ours.
                logging_level=apigw.MethodLoggingLevel.OFF,
                data_trace_enabled=False,
                metrics_enabled=True,
                throttling_rate_limit=config.api_rate_limit,
                throttling_burst_limit=config.api_burst_limit,
            ),
            default_method_options=(
                apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM)
                if config.api_auth == c.API_AUTH_IAM else apigw.MethodOptions(api_key_required=True)
            ),
        )
        validator = api.add_request_validator(
            "RequestValidator", validate_request_parameters=True, validate_request_body=True
        )
        integration = apigw.LambdaIntegration(function, proxy=True)
        api.root.add_method("ANY", integration, request_validator=validator)
        api.root.add_resource("{proxy+}").add_method("ANY", integration, request_validator=validator)
        return api

    def _endpoint_configuration(self) -> apigw.EndpointConfiguration:
        """Regional, or private through the deployer's interface VPC endpoints (named on the API too,
        so each endpoint gets the API's alias, ``<api id>-<vpce id>.execute-api.<region>.amazonaws.com``,
        which callers without the endpoint's private DNS can use)."""
        if self._config.api_endpoint != c.API_ENDPOINT_PRIVATE:
            return apigw.EndpointConfiguration(types=[apigw.EndpointType.REGIONAL])
        endpoints = [ec2.InterfaceVpcEndpoint.from_interface_vpc_endpoint_attributes(
            self, f"VpcEndpoint{index}", vpc_endpoint_id=endpoint_id, port=443)
            for index, endpoint_id in enumerate(self._config.api_vpc_endpoint_ids)]
        return apigw.EndpointConfiguration(types=[apigw.EndpointType.PRIVATE], vpc_endpoints=endpoints)

    def _resource_policy(self) -> iam.PolicyDocument | None:
        """The API's resource policy: the private API's statements, then the deployer's own (option
        api_resource_policy); none without either (API Gateway then takes every request apiAuth
        lets in). API Gateway refuses what a resource policy does not allow, so to a policy of
        denies only the stack adds the allow a private API has: the denies then decide."""
        config = self._config
        statements = [*self._private_statements(),
                      *(iam.PolicyStatement.from_json(statement) for statement in config.api_resource_policy)]
        if not statements:
            return None
        if not rp.allows(config.api_resource_policy) and config.api_endpoint != c.API_ENDPOINT_PRIVATE:
            statements.insert(0, iam.PolicyStatement(sid=rp.SID_ALLOW_UNLESS_DENIED, principals=[self._caller()],
                                                     actions=["execute-api:Invoke"], resources=[rp.EVERY_METHOD]))
            Annotations.of(self).add_info(
                f"The API's resource policy ({c.CTX_API_RESOURCE_POLICY}) has only Deny statements, and API Gateway "
                f"refuses what a resource policy does not allow: the stack adds {rp.SID_ALLOW_UNLESS_DENIED}, an "
                "Allow of execute-api:Invoke on every method to "
                + ("this account's IAM principals (each still needs the invoke policy)"
                   if config.api_auth == c.API_AUTH_IAM else "everyone (API Gateway checks the API key)")
                + ", so that your denies decide (docs/deploy.md, Regulated accounts)")
        return iam.PolicyDocument(statements=statements)

    def _caller(self) -> iam.IPrincipal:
        """Whom the stack's allow names: with IAM authorization this account, so a caller still needs
        an IAM policy of its own (the invoke policy); with API keys everyone, since the caller is
        anonymous to IAM and the key is checked by the usage plan."""
        return iam.AccountRootPrincipal() if self._config.api_auth == c.API_AUTH_IAM else iam.AnyPrincipal()

    def _private_statements(self) -> list[iam.PolicyStatement]:
        """A private API's resource policy (API Gateway refuses to deploy one without): invoked only
        through the listed VPC endpoints."""
        config = self._config
        if config.api_endpoint != c.API_ENDPOINT_PRIVATE:
            return []
        invoke, every_method = ["execute-api:Invoke"], [rp.EVERY_METHOD]
        return [
            iam.PolicyStatement(sid=rp.SID_VPC_ENDPOINTS, principals=[self._caller()], actions=invoke,
                                resources=every_method),
            iam.PolicyStatement(sid=rp.SID_DENY_OTHERWISE, effect=iam.Effect.DENY, principals=[iam.AnyPrincipal()],
                                actions=invoke, resources=every_method,
                                conditions={"StringNotEquals": {"aws:SourceVpce": list(config.api_vpc_endpoint_ids)}}),
        ]

    def _associate_web_acl(self, web_acl_arn: str | None) -> wafv2.CfnWebACLAssociation | None:
        """The team's regional WAFv2 web ACL (option waf_web_acl_arn) in front of the stage."""
        if web_acl_arn is None:
            return None
        return wafv2.CfnWebACLAssociation(self, "WebAclAssociation", web_acl_arn=web_acl_arn,
                                          resource_arn=self.rest_api.deployment_stage.stage_arn)

    def _build_invoke_policy(self) -> iam.ManagedPolicy:
        """With IAM authorization: the policy to attach to the users and roles that may call the API."""
        return iam.ManagedPolicy(
            self,
            "InvokePolicy",
            description="May call the Coworker task API (SigV4-signed requests, e.g. coworker --iam)",
            statements=[iam.PolicyStatement(actions=["execute-api:Invoke"],
                                            resources=[self.rest_api.arn_for_execute_api()])],
        )

    def _build_usage_plan(self) -> tuple[apigw.IApiKey, apigw.UsagePlan]:
        key = self.rest_api.add_api_key("ApiKey", description="Coworker API key")
        plan = self.rest_api.add_usage_plan(
            "UsagePlan",
            description="Coworker API clients",
            throttle=apigw.ThrottleSettings(
                rate_limit=self._config.api_rate_limit, burst_limit=self._config.api_burst_limit
            ),
            api_stages=[apigw.UsagePlanPerApiStage(api=self.rest_api, stage=self.rest_api.deployment_stage)],
        )
        plan.add_api_key(key)
        return key, plan
