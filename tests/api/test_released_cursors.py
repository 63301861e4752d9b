"""A listing cursor handed out by the previous release, presented after the upgrade (issue 51, item 6d).

The release signed cursors with the stack's ID (an ARN that anyone allowed DescribeStacks reads,
so anyone could forge a cursor); HEAD signs them with a random secret kept in the table. An old
cursor cannot keep working without trusting the forgeable key again: decided, it is refused with
400 before anything is read, and the client starts the listing again without a cursor. The
release's codec was HEAD's with the ARN as its secret (same layout version, deflate and HMAC), so
HEAD's :class:`CursorCodec` given that ARN makes the cursor the release made.
"""

from __future__ import annotations

import pytest
from coworker.api.cursors import CursorCodec

from tests.support.doubles import Api

STACK_ID = "arn:aws:cloudformation:eu-west-1:123456789012:stack/Coworker/0f6c3f40-cc2b-11f0-9f4e-0a1b2c3d4e5f"


def _released_cursor(settings) -> str:
    """The cursor of the release's first one-task page of ``GET /tasks?status=todo``."""
    listing = ["tasks", "todo", None, None, "oldest", settings.status_shards]
    cursor = CursorCodec(STACK_ID).encode([[0, 0]] * settings.status_shards, listing)
    assert cursor is not None
    return cursor


@pytest.fixture
def upgraded(make_settings):
    """HEAD's API as a deployment runs it (no cursor secret set: the table's), with tasks to list."""
    settings = make_settings(cursor_secret=None)
    api = Api(settings)
    for i in range(3):
        assert api.call("POST", "/tasks", {"key": f"t{i}", "type": "quick"})[0] == 201
    return settings, api


def test_a_cursor_of_the_release_is_refused_with_400_and_the_listing_starts_again_without_it(upgraded):
    settings, api = upgraded
    code, answer, _ = api.call("GET", f"/tasks?status=todo&limit=1&cursor={_released_cursor(settings)}")
    assert code == 400 and "cursor" in answer["message"], answer
    # Starting again without a cursor lists everything, page by page, with HEAD's cursors.
    keys, cursor = [], ""
    while True:
        code, page, _ = api.call("GET", f"/tasks?status=todo&limit=1{cursor}")
        assert code == 200, page
        keys += [item["key"] for item in page["items"]]
        if not page.get("cursor"):
            break
        cursor = f"&cursor={page['cursor']}"
    assert sorted(keys) == ["t0", "t1", "t2"]


def test_the_refusal_of_a_released_cursor_tells_the_client_to_start_again_without_one(upgraded):
    settings, api = upgraded
    code, answer, _ = api.call("GET", f"/tasks?status=todo&limit=1&cursor={_released_cursor(settings)}")
    assert code == 400 and "start again without a cursor" in answer["message"], answer
