"""Test doubles shared by several test modules (import them from here, never from another test
module: pytest imports test modules under their own names, so a second import runs a module's
registrations twice)."""

from __future__ import annotations

import json

from coworker.api.app import create_app
from coworker.data import layout
from coworker.engine import slots
from coworker.engine.worker import WorkerRequest
from coworker_local.database import dynamodb_client
from coworker_local.gateway import LocalLambdaContext, build_proxy_event


class Api:
    """Calls the resolver the way API Gateway's Lambda proxy integration does."""

    def __init__(self, settings, invoker=None) -> None:
        self.settings = settings
        self.app = create_app(settings, invoker)

    def call(self, method: str, path: str, body=None, headers=None, raw: str | None = None):
        headers = {"Content-Type": "application/json", **(headers or {})}
        text = raw if raw is not None else (None if body is None else json.dumps(body))
        response = self.app.resolve(build_proxy_event(method, path, headers, text), LocalLambdaContext())
        parsed = json.loads(response["body"]) if response["body"] and response["body"][0] in "{[" else None
        return response["statusCode"], parsed, response

    def counted_batch(self, batch_id: str):
        """GET /batches/{id} once the stream follower (the coordinator's, every tick) has counted
        every write made so far."""
        from coworker.engine import progress

        progress.catch_up(self.settings)
        return self.call("GET", f"/batches/{batch_id}")

    def items(self) -> list[dict]:
        """Every task and batch item of the table, to prove a request changed nothing (worker
        slots, which the fixture creates, and the cursor secret and listing states, which reads
        may make, are left out)."""
        client = dynamodb_client(self.settings)
        pages = client.get_paginator("scan").paginate(TableName=self.settings.table_name, ConsistentRead=True)
        items = (item for page in pages for item in page["Items"]
                 if not item["key"]["S"].startswith(layout.SLOT_KEY_PREFIX)
                 and item["key"]["S"] != layout.CURSOR_SECRET_KEY
                 and not item["key"]["S"].startswith(layout.CURSOR_STATE_PREFIX))
        return sorted(items, key=lambda i: i["key"]["S"])


class RecordingInvoker:
    """Invoker that only records what it was asked to start (implements dispatch.Invoker)."""

    def __init__(self) -> None:
        self.requests: list[WorkerRequest] = []

    def invoke(self, request: WorkerRequest) -> None:
        self.requests.append(request)

    @property
    def batches(self) -> list[list[str]]:
        return [list(request.keys) for request in self.requests]

    @property
    def keys(self) -> list[str]:
        return [key for batch in self.batches for key in batch]


def reserved_request(settings, keys=()) -> WorkerRequest:
    """A worker request holding a freshly reserved slot: the worker feeds itself."""
    slot = slots.free_slots(settings.worker_slots, 1)[0]
    token = slots.new_token()
    assert slots.reserve(slot, token, settings.reservation_seconds)
    return WorkerRequest(tuple(keys), slot, token)
