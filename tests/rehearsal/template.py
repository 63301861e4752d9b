"""What the synthesized template says of the three functions: their roles' grants, their code
assets, their environments, and the IAM (action, resource) each AWS request needs.

Resources are named as the template names them (``Fn::GetAtt [Id, Arn]`` is ``Id.Arn``), so a
request's needs and a role's statements meet in one vocabulary whatever the deployed names are.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coworker.data import layout

ROLES = ("api", "coordinator", "worker")
# The functions' descriptions in the template name their role.
DESCRIPTION_PREFIX = {"api": "Coworker API", "coordinator": "Coworker coordinator", "worker": "Coworker worker"}
_TRANSACTION_ACTIONS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem",
                        "ConditionCheck": "ConditionCheckItem"}


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
    """The Allow statements of one function's role: (action patterns, resource patterns, the key
    patterns of a ``dynamodb:LeadingKeys`` condition or ``None``). No other condition is used."""

    statements: list[tuple[list[str], list[str], list[str] | None]] = field(default_factory=list)

    def allow(self, action: str, resource: str, leading_key: str | None = None) -> bool:
        return any(any(fnmatch.fnmatchcase(action, a) for a in actions)
                   and any(fnmatch.fnmatchcase(resource, r) for r in resources)
                   and (keys is None or (leading_key is not None
                                         and any(fnmatch.fnmatchcase(leading_key, k) for k in keys)))
                   for actions, resources, keys in self.statements)


def _leading_keys(statement: dict[str, Any]) -> list[str] | None:
    conditions = statement.get("Condition")
    if not conditions:
        return None
    assert set(conditions) == {"ForAllValues:StringLike"}, f"a condition this test cannot evaluate: {conditions}"
    assert set(conditions["ForAllValues:StringLike"]) == {"dynamodb:LeadingKeys"}, conditions
    return _as_list(conditions["ForAllValues:StringLike"]["dynamodb:LeadingKeys"])


def leading_key(service: str, operation: str, params: dict[str, Any]) -> str | None:
    """The partition key value one DynamoDB item request names (what ``dynamodb:LeadingKeys`` tests)."""
    if service != "dynamodb":
        return None
    item = params.get("Key") or params.get("Item") or {}
    value = item.get(layout.PARTITION_KEY, {})
    return value.get("S") if isinstance(value, dict) else None


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


def role_grants(template: dict[str, Any]) -> dict[str, Grants]:
    """Each function's role's Allow statements, from the policies attached to it."""
    role_of = {function["Properties"]["Role"]["Fn::GetAtt"][0]: role
               for role, function in functions_of(template).items()}
    assert sorted(role_of.values()) == sorted(ROLES)
    grants = {role: Grants() for role in ROLES}
    for body in template["Resources"].values():
        if body["Type"] != "AWS::IAM::Policy":
            continue
        for role_ref in body["Properties"]["Roles"]:
            role = role_of.get(role_ref["Ref"])
            if role is None:
                continue
            for statement in body["Properties"]["PolicyDocument"]["Statement"]:
                if statement.get("Effect", "Allow") == "Allow":
                    grants[role].statements.append(([str(a) for a in _as_list(statement["Action"])],
                                                    [render(r) for r in _as_list(statement["Resource"])],
                                                    _leading_keys(statement)))
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
    variables = function["Properties"].get("Environment", {}).get("Variables", {})
    deploy_time = deploy_time or {}
    return {name: value if isinstance(value, str) else deploy_time.get(render(value), f"rehearsal-{name.lower()}")
            for name, value in variables.items()}


@dataclass
class Targets:
    """The resources the code touches, as the template names them."""

    table: str
    stream: str
    bucket: str
    worker: str

    @classmethod
    def of(cls, template: dict[str, Any]) -> Targets:
        table = logical_id(template, "AWS::DynamoDB::GlobalTable")
        buckets = [lid for lid, body in template["Resources"].items() if body["Type"] == "AWS::S3::Bucket"]
        return cls(table=f"{table}.Arn", stream=f"{table}.StreamArn",
                   bucket=f"{buckets[0]}.Arn" if buckets else "NoBucket.Arn",
                   worker=f"{logical_id(template, 'AWS::Lambda::Function', 'Coworker worker')}.Arn")


def needs(service: str, operation: str, params: dict[str, Any], to: Targets) -> list[tuple[str, str]]:
    """The IAM (action, resource) pairs one request needs."""
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
    raise AssertionError(f"a call this test does not know the grant of: {service}.{operation}")
