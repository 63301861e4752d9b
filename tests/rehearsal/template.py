"""What the synthesized template says of the three functions and the container runner: their
roles' grants, their code assets, their environments, and the IAM (action, resource) each AWS
request needs, with the condition keys it carries.

Resources are named as the template names them (``Fn::GetAtt [Id, Arn]`` is ``Id.Arn``), so a
request's needs and a role's statements meet in one vocabulary whatever the deployed names are.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coworker.data import layout

ROLES = ("api", "coordinator", "worker")  # the functions' roles
RUNNER = "runner"  # the container runner's task role, when the stack has one
ECS_TASKS = "ecs-tasks.amazonaws.com"  # the service RunTask passes the runner's roles to
# An event bus named in the stack's own account and region, as the template renders its ARN
# (``Stack.format_arn``: partition, region and account are pseudo-parameter references).
EVENT_BUS_IN_STACK = "arn:AWS::Partition:events:AWS::Region:AWS::AccountId:event-bus/"
# The functions' descriptions in the template name their role.
DESCRIPTION_PREFIX = {"api": "Coworker API", "coordinator": "Coworker coordinator", "worker": "Coworker worker"}
_TRANSACTION_ACTIONS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                        "ConditionCheck": "ConditionCheckItem"}
# A statement's condition: (operator, condition key, value patterns).
Condition = tuple[str, str, list[str]]
# The condition operators the stack's statements use, by how a value meets a pattern (the ARN
# operators take wildcards, as StringLike does).
_MATCH: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": str.__eq__, "StringLike": fnmatch.fnmatchcase,
    "ArnEquals": fnmatch.fnmatchcase, "ArnLike": fnmatch.fnmatchcase}


def render(value: Any) -> str:
    """A template value as text: ``Fn::GetAtt [Id, Arn]`` -> ``Id.Arn``, joins joined, refs by id."""
    if isinstance(value, str):
        return value
    if "Fn::GetAtt" in value:
        return ".".join(value["Fn::GetAtt"])
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(render(part) for part in parts)
    if "Ref" in value:
        return str(value["Ref"])
    raise AssertionError(f"an intrinsic this test does not render: {value}")


@dataclass
class Grants:
    """The Allow statements of one role: (action patterns, resource patterns, conditions). What
    this module cannot read as such is kept apart, never allowing a request: managed policies not
    in the template (an AWS managed policy, by its ARN) and statements written with ``NotAction``
    or ``NotResource``."""

    statements: list[tuple[list[str], list[str], list[Condition]]] = field(default_factory=list)
    managed: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)

    def granted(self) -> set[tuple[str, str]]:
        """Each (action, resource) a statement names, as written (wildcards kept, conditions aside)."""
        return {(action, resource) for actions, resources, _ in self.statements
                for action in actions for resource in resources}

    def add(self, statement: dict[str, Any]) -> None:
        """One statement of a policy attached to the role (a Deny only narrows: left out)."""
        if statement.get("Effect", "Allow") != "Allow":
            return
        if "Action" not in statement or "Resource" not in statement:  # NotAction, NotResource
            self.unreadable.append(json.dumps(statement, sort_keys=True, default=str))
            return
        self.statements.append(([str(a) for a in _as_list(statement["Action"])],
                                [render(r) for r in _as_list(statement["Resource"])], _conditions(statement)))

    def allow(self, action: str, resource: str, context: Mapping[str, Sequence[str]] | None = None) -> bool:
        """Whether a statement allows ``action`` on ``resource`` to a request carrying the
        condition keys ``context`` (:func:`request_context`)."""
        return any(any(fnmatch.fnmatchcase(action, a) for a in actions)
                   and any(fnmatch.fnmatchcase(resource, r) for r in resources)
                   and all(_holds(condition, context or {}) for condition in conditions)
                   for actions, resources, conditions in self.statements)


def _holds(condition: Condition, context: Mapping[str, Sequence[str]]) -> bool:
    """One condition against the request's keys. A key the request does not carry fails it (IAM
    would let a ``ForAllValues:`` condition hold then: a grant relying on that is refused here)."""
    operator, key, patterns = condition
    values = context.get(key)
    if not values:
        return False
    match = _MATCH[operator.removeprefix("ForAllValues:")]
    matched = [any(match(value, pattern) for pattern in patterns) for value in values]
    return all(matched) if operator.startswith("ForAllValues:") else any(matched)


def _conditions(statement: dict[str, Any]) -> list[Condition]:
    found = []
    for operator, tests in statement.get("Condition", {}).items():
        assert operator.removeprefix("ForAllValues:") in _MATCH, f"a condition this test cannot evaluate: {operator}"
        found += [(operator, key, [render(value) for value in _as_list(values)]) for key, values in tests.items()]
    return found


def request_context(service: str, operation: str, params: dict[str, Any]) -> dict[str, list[str]]:
    """The condition keys one request carries that the stack's statements test: the partition key
    value a DynamoDB item request names (``dynamodb:LeadingKeys``); for ECS RunTask, the cluster
    it runs in (``ecs:cluster``; ``default`` when it names none) and the service the task
    definition's roles are passed to (``iam:PassedToService``)."""
    if service == "dynamodb":
        item = params.get("Key") or params.get("Item") or {}
        value = item.get(layout.PARTITION_KEY, {})
        return {"dynamodb:LeadingKeys": [value["S"]]} if isinstance(value, dict) and "S" in value else {}
    if service == "ecs" and operation == "RunTask":
        return {"ecs:cluster": [params.get("cluster") or "default"], "iam:PassedToService": [ECS_TASKS]}
    return {}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def functions_of(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The three functions' resources, by role."""
    found = {}
    for body in template["Resources"].values():
        if body["Type"] == "AWS::Lambda::Function":
            for role, prefix in DESCRIPTION_PREFIX.items():
                if body["Properties"].get("Description", "").startswith(prefix):
                    found[role] = body
    return found


def task_definition_of(template: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The container runner's task definition (logical id, properties), or ``None`` without one."""
    found = [(lid, body["Properties"]) for lid, body in template["Resources"].items()
             if body["Type"] == "AWS::ECS::TaskDefinition"]
    assert len(found) <= 1, [lid for lid, _ in found]
    return found[0] if found else None


def runner_role(template: dict[str, Any]) -> str | None:
    """The logical id of the runner's task role: the task definition's ``TaskRoleArn``, a role
    only ECS tasks may assume. ``None`` without a runner."""
    definition = task_definition_of(template)
    if definition is None:
        return None
    role = str(definition[1]["TaskRoleArn"]["Fn::GetAtt"][0])
    trust = template["Resources"][role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert [statement["Principal"] for statement in trust] == [{"Service": ECS_TASKS}], trust
    return role


def role_grants(template: dict[str, Any]) -> dict[str, Grants]:
    """Each function's role's Allow statements, wherever the template attaches them: a policy
    naming the role (``AWS::IAM::Policy``, ``AWS::IAM::ManagedPolicy``), the role's own inline
    ``Policies``, and the template's managed policies its ``ManagedPolicyArns`` name (any other
    ARN there is kept in :attr:`Grants.managed`); with a container runner, its task role's too
    (as :data:`RUNNER`)."""
    role_of = {function["Properties"]["Role"]["Fn::GetAtt"][0]: role
               for role, function in functions_of(template).items()}
    assert sorted(role_of.values()) == sorted(ROLES)
    task_role = runner_role(template)
    if task_role is not None:
        role_of[task_role] = RUNNER
    grants = {role: Grants() for role in role_of.values()}
    resources = template["Resources"]

    def attach(role: str, document: dict[str, Any]) -> None:
        for statement in _as_list(document["Statement"]):
            grants[role].add(statement)

    for logical, body in resources.items():
        properties = body.get("Properties", {})
        if body["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            for role_ref in properties.get("Roles", []):
                role = role_of.get(role_ref.get("Ref", "") if isinstance(role_ref, dict) else role_ref)
                if role is not None:
                    attach(role, properties["PolicyDocument"])
        elif body["Type"] == "AWS::IAM::Role" and logical in role_of:
            for policy in properties.get("Policies", []):
                attach(role_of[logical], policy["PolicyDocument"])
            for arn in properties.get("ManagedPolicyArns", []):
                named = resources.get(arn.get("Ref", "") if isinstance(arn, dict) else "", {})
                if named.get("Type") == "AWS::IAM::ManagedPolicy":
                    attach(role_of[logical], named["Properties"]["PolicyDocument"])
                else:
                    grants[role_of[logical]].managed.append(render(arn))
    return grants


def logical_id(template: dict[str, Any], kind: str, description_prefix: str | None = None) -> str:
    found = [lid for lid, body in template["Resources"].items() if body["Type"] == kind
             and body["Properties"].get("Description", "").startswith(description_prefix or "")]
    assert len(found) == 1, (kind, found)
    return found[0]


def asset_dir(assembly_dir: Path, code: dict[str, Any]) -> Path:
    """The folder of a synthesized code asset (a function's ``Code`` or a layer's ``Content``)."""
    return assembly_dir / f"asset.{code['S3Key'].removesuffix('.zip')}"


def layer_dir(template: dict[str, Any], assembly_dir: Path) -> Path:
    (layer,) = [body for body in template["Resources"].values() if body["Type"] == "AWS::Lambda::LayerVersion"]
    return asset_dir(assembly_dir, layer["Properties"]["Content"])


def environment_of(function: dict[str, Any], deploy_time: dict[str, str] | None = None) -> dict[str, str]:
    """The function's environment variables; a value known only at deploy time (a ``Ref`` to a
    table, bucket or function) becomes ``deploy_time[logical id]``, or a stand-in."""
    return resolved(function["Properties"].get("Environment", {}).get("Variables", {}), deploy_time)


def resolved(variables: dict[str, Any], deploy_time: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables as deployed: a value known only at deploy time becomes
    ``deploy_time[its rendering]`` (``Id`` for a ``Ref``, ``Id.Arn`` for a ``GetAtt``), or a stand-in."""
    deploy_time = deploy_time or {}
    return {name: value if isinstance(value, str) else deploy_time.get(render(value), f"rehearsal-{name.lower()}")
            for name, value in variables.items()}


def rendered(variables: dict[str, Any]) -> dict[str, str]:
    """Environment variables in the template's own vocabulary (each value rendered): requests made
    with them name resources as the roles' statements do."""
    return {name: render(value) for name, value in variables.items()}


@dataclass(frozen=True)
class TaskDefinition:
    """What RunTask of one task definition involves: the roles ECS is handed (its task role and its
    execution role, as the template names them) and its containers (what overrides may name)."""

    task_role: str | None
    execution_role: str | None
    containers: tuple[str, ...]


@dataclass
class Targets:
    """The resources the code touches, as the template names them."""

    table: str
    stream: str
    bucket: str
    worker: str
    # The task definitions RunTask may start, by their ``Ref``: the runner's, when the stack has one.
    task_definitions: dict[str, TaskDefinition] = field(default_factory=dict)

    @classmethod
    def of(cls, template: dict[str, Any]) -> Targets:
        table = logical_id(template, "AWS::DynamoDB::GlobalTable")
        buckets = [lid for lid, body in template["Resources"].items() if body["Type"] == "AWS::S3::Bucket"]
        definitions = {}
        runner = task_definition_of(template)
        if runner is not None:
            definition_id, properties = runner
            definitions[definition_id] = TaskDefinition(
                task_role=render(properties["TaskRoleArn"]) if "TaskRoleArn" in properties else None,
                execution_role=render(properties["ExecutionRoleArn"]) if "ExecutionRoleArn" in properties else None,
                containers=tuple(container["Name"] for container in properties["ContainerDefinitions"]))
        return cls(table=f"{table}.Arn", stream=f"{table}.StreamArn",
                   bucket=f"{buckets[0]}.Arn" if buckets else "NoBucket.Arn",
                   worker=f"{logical_id(template, 'AWS::Lambda::Function', 'Coworker worker')}.Arn",
                   task_definitions=definitions)


def needs(service: str, operation: str, params: dict[str, Any], to: Targets) -> list[tuple[str, str]]:
    """The IAM (action, resource) pairs one request needs.

    ECS RunTask needs ``ecs:RunTask`` on the task definition it names, and ``iam:PassRole`` on the
    roles that definition hands to ECS (those its overrides name instead, if any). A RunTask
    request names its task definition and cluster as the template does: the rehearsal deploys the
    runner's ECS names as the template renders them (there is no ECS behind them to name others).
    EventBridge's PutEvents needs ``events:PutEvents`` on the bus of each entry (a name is a bus
    of the stack's account and region).
    """
    if service == "dynamodb":
        if operation == "TransactWriteItems":
            return [(f"dynamodb:{_TRANSACTION_ACTIONS[next(iter(item))]}", to.table)
                    for item in params["TransactItems"]]
        if operation == "Query" and params.get("IndexName"):
            return [("dynamodb:Query", f"{to.table}/index/{params['IndexName']}")]
        return [(f"dynamodb:{operation}", to.table)]
    if service == "dynamodbstreams":
        return [(f"dynamodb:{operation}", "*" if operation == "ListStreams" else to.stream)]
    if service == "lambda" and operation == "Invoke":
        return [("lambda:InvokeFunction", to.worker)]
    if service == "ecs" and operation == "RunTask":
        named = params["taskDefinition"]
        definition = to.task_definitions.get(named, TaskDefinition(None, None, ()))
        overrides = params.get("overrides") or {}
        passed = (overrides.get("taskRoleArn") or definition.task_role,
                  overrides.get("executionRoleArn") or definition.execution_role)
        return [("ecs:RunTask", named), *(("iam:PassRole", role) for role in passed if role)]
    if service == "events" and operation == "PutEvents":
        buses = sorted({entry.get("EventBusName") or "default" for entry in params["Entries"]})
        return [("events:PutEvents", bus if bus.startswith("arn:") else EVENT_BUS_IN_STACK + bus) for bus in buses]
    raise AssertionError(f"a call this test does not know the grant of: {service}.{operation}")


def run_task_problem(params: dict[str, Any], to: Targets) -> str | None:
    """What ECS refuses (``InvalidParameterException``) in a RunTask request the roles allow, or
    ``None``: a task definition it does not know, an override of a container the definition does
    not have, Fargate without subnets."""
    definition = to.task_definitions.get(params.get("taskDefinition", ""))
    if definition is None:
        return f"TaskDefinition not found: {params.get('taskDefinition')}"
    for override in (params.get("overrides") or {}).get("containerOverrides", []):
        if override.get("name") not in definition.containers:
            return f"Override for container named {override.get('name')} is not a container in the TaskDefinition."
    network = (params.get("networkConfiguration") or {}).get("awsvpcConfiguration") or {}
    if params.get("launchType") == "FARGATE" and not network.get("subnets"):
        return "Network Configuration must be provided when networkMode 'awsvpc' is specified."
    return None
