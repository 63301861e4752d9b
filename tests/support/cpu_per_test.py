"""Opt-in pytest plugin: the CPU each test costs, from /proc, to aim the suite's next cut.

Use: ``.venv/bin/python -m pytest -p tests.support.cpu_per_test ...`` and set ``COWORKER_CPU_LOG``
to a file; each test process (each xdist worker) appends one JSON line per test:
``{"test", "own", "reaped", "live"}`` in CPU-seconds, where ``own`` is the test process's own
user and system time, ``reaped`` that of the children it waited for during the test (a
subprocess, a runtime stopped), and ``live`` the change in every descendant still running
(chiefly the session's DynamoDB Local JVM). Sum by file or tier with a few lines of Python.
Linux only; without ``COWORKER_CPU_LOG`` it records nothing. A child reaped after the test that
started it (a module's runtime, a server process) puts its whole life's CPU in the ``reaped`` of
the test that reaps it: read large ``reaped`` figures with that in mind.
"""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _live_descendants_cpu(root: int) -> dict[int, float]:
    """CPU-seconds so far of each running descendant of ``root`` (user + system)."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None:
            continue
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / _TICKS
    found: dict[int, float] = {}
    for pid in cpu:
        ancestor = parents.get(pid)
        while ancestor is not None and ancestor not in (root, 0, 1):
            ancestor = parents.get(ancestor)
        if ancestor == root and pid != root:
            found[pid] = cpu[pid]
    return found


def _usage(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    log = os.environ.get("COWORKER_CPU_LOG")
    if not log:
        yield
        return
    me = os.getpid()
    own, reaped, live = _usage(resource.RUSAGE_SELF), _usage(resource.RUSAGE_CHILDREN), _live_descendants_cpu(me)
    yield
    live_after = _live_descendants_cpu(me)
    # A child that lived through the test counts by its change; one born during it, whole.
    live_change = sum(seconds - live.get(pid, 0.0) for pid, seconds in live_after.items())
    line = {"test": item.nodeid, "own": round(_usage(resource.RUSAGE_SELF) - own, 3),
            "reaped": round(_usage(resource.RUSAGE_CHILDREN) - reaped, 3), "live": round(live_change, 3)}
    with open(log, "a") as out:
        out.write(json.dumps(line) + "\n")
