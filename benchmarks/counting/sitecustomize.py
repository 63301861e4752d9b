"""Counts every DynamoDB request a process makes, for ``benchmarks/system.py``.

The benchmark copies it into a folder of its own with a file named ``count-requests-here`` and
puts that folder on the runtime's ``PYTHONPATH``, which the runtime hands on to its worker
processes (their environment is otherwise the runtime's settings only): every Python process
started under it imports it. Each process writes its counts (requests by operation, and
``<operation> refused`` for those that failed, a conditional write's check included) to
``<folder>/<pid>.json`` every 0.2 s; the benchmark sums the files. Anywhere else it does nothing.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time

MARKER = "count-requests-here"
_HERE = os.path.dirname(os.path.abspath(__file__))
_DIRECTORY = _HERE if os.path.exists(os.path.join(_HERE, MARKER)) else None


def _install(directory: str) -> None:
    import botocore.client

    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    original = botocore.client.BaseClient._make_api_call

    def counted(client: object, operation: str, params: dict) -> dict:
        with lock:
            counts[operation] += 1
        try:
            return original(client, operation, params)
        except Exception:
            with lock:
                counts[f"{operation} refused"] += 1
            raise

    def dump() -> None:
        path = os.path.join(directory, f"{os.getpid()}.json")
        while True:
            time.sleep(0.2)
            with lock:
                data = json.dumps(counts)
            with open(path + ".tmp", "w") as out:
                out.write(data)
            os.replace(path + ".tmp", path)

    botocore.client.BaseClient._make_api_call = counted  # type: ignore[method-assign]
    threading.Thread(target=dump, name="request-count-dump", daemon=True).start()


if _DIRECTORY:
    _install(_DIRECTORY)
