"""A handler's megabyte exception message must not become a megabyte log line."""

from __future__ import annotations

import json

from coworker.observability import MAX_LOG_EXCEPTION_CHARS, MAX_LOG_FIELD_CHARS, clip, logger


def test_every_field_and_the_exception_are_clipped(log_lines) -> None:
    logger.warning("task raised", extra={"error": "é" * 1_200_000, "task_key": "k"})
    try:
        raise ValueError("y" * 1_200_000)
    except ValueError:
        logger.exception("worker thread stopped on an error")
    warning, failure = log_lines()
    assert warning["task_key"] == "k" and warning["error"].endswith("[1198000 more characters not logged]")
    assert len(warning["error"]) < MAX_LOG_FIELD_CHARS + 50
    assert len(json.dumps(failure)) < MAX_LOG_EXCEPTION_CHARS + 4 * MAX_LOG_FIELD_CHARS
    assert failure["exception_name"] == "ValueError" and "more characters not logged" in failure["exception"]


def test_clip_leaves_short_text_alone() -> None:
    assert clip("short", 10) == "short"
    assert clip("x" * 12, 10) == "x" * 10 + "... [2 more characters not logged]"
