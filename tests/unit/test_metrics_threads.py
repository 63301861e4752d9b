"""Metrics from many threads at once: a worker's threads all add them, and Powertools flushes
the set from whichever thread adds the hundredth value of one metric."""

from __future__ import annotations

import contextlib
import io
import sys
import threading

from aws_lambda_powertools.metrics import MetricUnit
from coworker.observability import metrics


def test_threads_adding_metrics_while_one_flushes_all_succeed():
    errors: list[str] = []

    def add(offset: int) -> None:
        try:
            for i in range(3000):
                metrics.add_metric(name=f"Test{(i + offset) % 7}", unit=MetricUnit.Count, value=1)
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            errors.append(repr(exc))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows in a few rounds
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            for _ in range(20):
                threads = [threading.Thread(target=add, args=(n,)) for n in range(8)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
    finally:
        sys.setswitchinterval(interval)
        metrics.clear_metrics()
    assert errors == []
