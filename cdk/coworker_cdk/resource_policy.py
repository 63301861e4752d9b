"""The API's resource policy of the deployer's own (option ``api_resource_policy``, context
``apiResourcePolicy``): read from a JSON file, inline JSON or a mapping, and checked at synth.

A resource policy is where a mistake is quiet: API Gateway takes a statement about another
service's actions, or a resource outside the API, and it then guards nothing; a misspelled key
(``Conditions``) drops the condition and lets in what it meant to keep out. So the statements are
held to what API Gateway enforces for the API itself (``execute-api:`` actions on
``execute-api:/...`` resources), every key is one IAM defines for them, and each is refused at
synth naming the statement and what it takes. See docs/deploy.md, "Regulated accounts".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aws_cdk import Token
from coworker.errors import ConfigurationError

from coworker_cdk import constants as c

OPTION = f"option api_resource_policy (context {c.CTX_API_RESOURCE_POLICY})"
# The actions of a REST API's own resource policy (API Gateway's execute-api service), as IAM
# compares them: without regard to case.
ACTIONS = ("execute-api:Invoke", "execute-api:InvalidateCache", "execute-api:*")
_ACTIONS = frozenset(action.lower() for action in ACTIONS)
# Every method of every stage: API Gateway reads ``execute-api:/`` as this API's ARN.
EVERY_METHOD = "execute-api:/*"
RESOURCE_PREFIX = "execute-api:/"
# The statements the stack writes itself (components/api.py), whose Sids one of yours may not take.
SID_VPC_ENDPOINTS = "InvokeThroughTheVpcEndpoints"
SID_DENY_OTHERWISE = "DenyOtherwise"
SID_ALLOW_UNLESS_DENIED = "InvokeUnlessDenied"
_STACK_SIDS = (SID_VPC_ENDPOINTS, SID_DENY_OTHERWISE, SID_ALLOW_UNLESS_DENIED)
_DOCUMENT_KEYS = ("Version", "Id", "Statement")
_VERSIONS = ("2012-10-17", "2008-10-17")
_STATEMENT_KEYS = ("Sid", "Effect", "Principal", "Action", "Resource", "Condition")
_PRINCIPAL_KEYS = ("AWS", "Service", "Federated", "CanonicalUser")
_FORMS = ("a path to a JSON file (relative to the folder the CDK app runs in, or absolute), inline JSON "
          "starting with '{', or (in cdk.json or TaskSystem) the document itself")


def read_statements(value: Any) -> tuple[dict[str, Any], ...]:
    """The statements of the policy ``value`` gives (see :data:`_FORMS`), checked and made explicit:
    ``Action`` and ``Resource`` as lists, ``Resource`` ``execute-api:/*`` where omitted. ``None``
    (the option unset) gives none. Raises :class:`ConfigurationError` naming what to fix."""
    if value is None:
        return ()
    document = _document(value)
    if not isinstance(document, Mapping):
        raise ConfigurationError(f"{OPTION} must be an IAM policy document, a JSON object with a Statement "
                                 f"list, not {type(document).__name__} {document!r}")
    unknown = [key for key in document if key not in _DOCUMENT_KEYS]
    if unknown:
        raise ConfigurationError(f"{OPTION} has {', '.join(map(repr, unknown))}, which a policy document does not: "
                                 f"it takes {', '.join(_DOCUMENT_KEYS)}")
    if "Version" in document and document["Version"] not in _VERSIONS:
        raise ConfigurationError(f"{OPTION}: Version must be {' or '.join(_VERSIONS)} (or left out), "
                                 f"not {document['Version']!r}")
    raw = document.get("Statement")
    if isinstance(raw, Mapping):  # IAM's grammar takes a lone statement for a list of one
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise ConfigurationError(f"{OPTION} must have a Statement list, with at least one statement, "
                                 f"not {raw!r}")
    statements = tuple(_statement(number, item) for number, item in enumerate(raw, start=1))
    sids = [s["Sid"] for s in statements if "Sid" in s]
    taken = sorted({sid for sid in sids if sids.count(sid) > 1 or sid in _STACK_SIDS})
    if taken:
        raise ConfigurationError(f"{OPTION}: Sid {', '.join(map(repr, taken))} is given twice or is one the "
                                 f"stack's own statements take ({', '.join(_STACK_SIDS)}): give each its own")
    return statements


def allows(statements: tuple[dict[str, Any], ...]) -> bool:
    """Whether any of ``statements`` allows: API Gateway refuses what a resource policy does not allow."""
    return any(statement["Effect"] == "Allow" for statement in statements)


def _document(value: Any) -> Any:
    """The policy document: ``value`` itself (a mapping), parsed (inline JSON), or read from the file it names."""
    if isinstance(value, Mapping):
        return value
    if not isinstance(value, str | os.PathLike):
        raise ConfigurationError(f"{OPTION} must be an IAM policy document (a JSON object with a Statement list) "
                                 f"given as {_FORMS}; not {value!r}")
    text = str(value).strip()
    if Token.is_unresolved(text):
        raise ConfigurationError(f"{OPTION} must be known at synth, to be checked, not a token ({text})")
    if isinstance(value, str) and text.startswith("{"):
        return _parse(text, "inline JSON")
    path = Path(text).expanduser()
    if not text or not path.is_file():
        raise ConfigurationError(f"{OPTION} names the file {str(path.absolute())!r}, which is not there: it "
                                 f"must be {_FORMS}")
    return _parse(path.read_text(encoding="utf-8"), f"the file {str(path.absolute())!r}")


def _parse(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{OPTION}: {where} is not JSON: {exc.msg} (line {exc.lineno}, column "
                                 f"{exc.colno})") from None


def _statement(number: int, raw: Any) -> dict[str, Any]:
    """Statement ``number`` (from 1), checked, with ``Action`` and ``Resource`` as lists."""
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{OPTION}: statement {number} must be a JSON object, not {raw!r}")
    where = f"{OPTION}: statement {number}" + (f" ({raw['Sid']!r})" if "Sid" in raw else "")
    unknown = [key for key in raw if key not in _STATEMENT_KEYS]
    if unknown:
        raise ConfigurationError(
            f"{where} has {', '.join(map(repr, unknown))}, which the option does not take: a statement takes "
            f"{', '.join(_STATEMENT_KEYS)} (no NotPrincipal, NotAction or NotResource: deny with a Condition "
            "instead)")
    if "Sid" in raw and not isinstance(raw["Sid"], str):
        raise ConfigurationError(f"{where}: Sid must be a string, not {raw['Sid']!r}")
    if raw.get("Effect") not in ("Allow", "Deny"):
        raise ConfigurationError(f"{where}: Effect must be Allow or Deny, not {raw.get('Effect')!r}")
    if not _principal(raw.get("Principal")):
        raise ConfigurationError(
            f"{where} has no Principal, or a malformed one ({raw.get('Principal')!r}): a resource policy names "
            'whom it allows or denies, e.g. "Principal": "*" (with a Condition) or {"AWS": '
            '"arn:aws:iam::123456789012:root"}')
    actions = _strings(raw.get("Action"))
    if not actions or any(action.lower() not in _ACTIONS for action in actions):
        raise ConfigurationError(f"{where}: Action must be {', '.join(ACTIONS)} (calls to this API), or a list "
                                 f"of them, not {raw.get('Action')!r}")
    resources = _strings(raw.get("Resource", EVERY_METHOD))
    if not resources or any(not resource.startswith(RESOURCE_PREFIX) for resource in resources):
        raise ConfigurationError(
            f"{where}: Resource must be this API's methods as {RESOURCE_PREFIX}<stage>/<method>/<path> (e.g. "
            f"{RESOURCE_PREFIX}{c.API_STAGE_NAME}/GET/tasks/*), or a list of them, or left out for "
            f"{EVERY_METHOD}; not {raw.get('Resource')!r}")
    if "Condition" in raw and not (isinstance(raw["Condition"], Mapping) and raw["Condition"]
                                   and all(isinstance(test, Mapping) for test in raw["Condition"].values())):
        raise ConfigurationError(f'{where}: Condition must map operators to keys and values, e.g. {{"IpAddress": '
                                 f'{{"aws:SourceIp": ["203.0.113.0/24"]}}}}, not {raw["Condition"]!r}')
    return {**raw, "Action": actions, "Resource": resources}


def _principal(value: Any) -> bool:
    """Whether ``value`` is a principal as IAM writes one: ``"*"``, or a mapping of principal types to ids."""
    if value == "*":
        return True
    return (isinstance(value, Mapping) and bool(value)
            and all(key in _PRINCIPAL_KEYS and _strings(ids) for key, ids in value.items()))


def _strings(value: Any) -> list[str]:
    """A string or a list of strings as a list; ``[]`` for anything else (refused by the caller)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return list(value)
    return []
