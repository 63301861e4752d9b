"""benchmarks/chaos.py's checks find what they look for: runs of one task that overlapped while
neither had been told its claim was lost, results kept from a stale attempt, tasks that never ran."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from unittest import mock

import pytest

BENCHMARKS = str(Path(__file__).parents[2] / "benchmarks")


@pytest.fixture(scope="module")
def chaos():
    with mock.patch.dict(os.environ), mock.patch.object(sys, "path", [BENCHMARKS, *sys.path]):
        return importlib.import_module("chaos")


def _run(attempt: int, started: float, ended: float | None, told: bool = False) -> dict:
    run = {"key": "k", "token": f"w:{attempt}", "attempt": attempt, "started": started}
    return run if ended is None else {**run, "ended": ended, "told": told}


def _finished(attempts: int, token: str) -> dict:
    return {"k": {"status": "finished", "attempts": attempts, "result": {"token": token}, "errors": []}}


def test_a_clean_history_breaks_no_promise(chaos) -> None:
    # A killed run (no end), then a told one that ran on past the next start, then the last
    runs = {"k": [_run(1, 0.0, None), _run(2, 1.0, 5.0, told=True), _run(3, 4.0, 6.0)]}
    assert not any(chaos.check(_finished(3, "w:3"), runs).values())


def test_overlapping_runs_that_were_not_told_are_found(chaos) -> None:
    runs = {"k": [_run(1, 0.0, 5.0), _run(2, 4.0, 6.0)]}
    assert chaos.check(_finished(2, "w:2"), runs)["ran twice at once"] == ["k: attempts 1 and 2"]


def test_a_result_from_a_stale_or_told_attempt_is_found(chaos) -> None:
    runs = {"k": [_run(1, 0.0, 1.0), _run(2, 2.0, 3.0, told=True), _run(3, 4.0, 5.0)]}
    assert chaos.check(_finished(3, "w:1"), runs)["stale result"]
    assert chaos.check(_finished(2, "w:2"), runs)["stale result"]


def test_a_task_that_never_ran_or_never_ended_is_found(chaos) -> None:
    tasks = {"k": {"status": "processing", "attempts": 1, "errors": []}}
    problems = chaos.check(tasks, {})
    assert problems["never ran"] and problems["not ended"]


def test_an_entry_seen_behind_its_lock_is_a_broken_promise(chaos):
    runs = {"k": [{"token": "w:1", "attempt": 1, "started": 0.0, "ended": 1.0, "told": False}]}
    problems = chaos.check(_finished(1, "w:1"), runs, ["k: due 1, lock 2"])
    assert problems["entry behind its lock"] == ["k: due 1, lock 2"]
    assert not any(found for name, found in problems.items() if name != "entry behind its lock")
