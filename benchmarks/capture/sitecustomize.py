"""Captures every DynamoDB request a process sends, on the wire, for ``benchmarks/replay.py``.

The benchmark copies it into a folder of its own with a file named ``capture-requests-here`` and
puts that folder on its worker processes' ``PYTHONPATH``: every Python process started with it
imports it. Each process appends what it sent (when, on the machine's monotonic clock, so that
the processes' requests can be put in one order; operation; and body, as botocore's
``Endpoint._send`` sends them) to ``<folder>/<pid>.jsonl`` every 0.2 s; the benchmark reads the
files. Anywhere else it does nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time

MARKER = "capture-requests-here"
_HERE = os.path.dirname(os.path.abspath(__file__))
_DIRECTORY = _HERE if os.path.exists(os.path.join(_HERE, MARKER)) else None


def _install(directory: str) -> None:
    from botocore.endpoint import Endpoint

    sent: list[tuple[float, str, str]] = []
    lock = threading.Lock()
    original = Endpoint._send

    def send(endpoint: Endpoint, request: object) -> object:
        target = request.headers.get("X-Amz-Target", b"")  # type: ignore[attr-defined]
        body = request.body  # type: ignore[attr-defined]
        with lock:
            sent.append((time.monotonic(), target.decode() if isinstance(target, bytes) else str(target),
                         body.decode() if isinstance(body, bytes) else str(body or "")))
        return original(endpoint, request)

    def dump() -> None:
        path = os.path.join(directory, f"{os.getpid()}.jsonl")
        while True:
            time.sleep(0.2)
            with lock:
                taken = sent[:]
                del sent[:]
            if taken:
                with open(path, "a") as out:
                    out.writelines(json.dumps([at, target.rpartition(".")[2], body]) + "\n"
                                   for at, target, body in taken)

    Endpoint._send = send  # type: ignore[method-assign]
    threading.Thread(target=dump, name="capture-requests", daemon=True).start()


if _DIRECTORY is not None:
    _install(_DIRECTORY)
