"""Counts every DynamoDB request a process makes, for ``benchmarks/system.py``.

Put on ``PYTHONPATH`` with ``COWORKER_BENCH_COUNT_DIR`` set, it is imported by every Python
process started under it (the local runtime and its worker processes). Each process writes its
counts (requests by operation, and ``<operation> refused`` for those that failed, a conditional
write's check included) to ``<dir>/<pid>.json`` every 0.2 s; the benchmark sums the files.
Without the variable it does nothing.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time

_DIRECTORY = os.environ.get("COWORKER_BENCH_COUNT_DIR")


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
