"""Waiting on a condition, bounded by a number of looks (not by a wall-clock budget, which a
loaded machine stretches)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], what: str, attempts: int = 600, pause: float = 0.2) -> None:
    """Wait for ``condition`` a bounded number of times (not a wall-clock budget)."""
    for _ in range(attempts):
        if condition():
            return
        time.sleep(pause)
    raise AssertionError(f"never happened: {what}")
