"""A Lambda proxy handler for the API environment tests: it tells which process answered and can
wait for other requests, raise, crash or hang."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

# How long a request waits for the others of its rendezvous before it gives up (below the 29 s
# API timeout): a pool that runs one request at a time never gets them together.
RENDEZVOUS_SECONDS = 25.0


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    query = event.get("queryStringParameters") or {}
    path = event["path"]
    answer: dict[str, Any] = {"pid": os.getpid(), "request_id": context.aws_request_id}
    if path == "/raise":
        raise RuntimeError("the handler failed")
    if path == "/crash":
        os._exit(3)
    if path == "/big":
        answer["filler"] = "x" * int(query["bytes"])
    if path == "/sleep":
        time.sleep(float(query["seconds"]))
    if path == "/rendezvous":
        # Arrive, then wait until ``count`` requests have arrived in ``folder``.
        folder = Path(query["folder"])
        (folder / str(os.getpid())).touch()
        end = time.monotonic() + RENDEZVOUS_SECONDS
        while len(list(folder.iterdir())) < int(query["count"]) and time.monotonic() < end:
            time.sleep(0.01)
        answer["met"] = len(list(folder.iterdir())) >= int(query["count"])
    return {"statusCode": 200, "headers": {"Content-Type": "application/json"}, "body": json.dumps(answer)}
