"""End to end: ``--console`` serves dynamodb-admin on the runtime's table and stops with it;
``--events log`` says where its events go and keeps them after the runtime stops."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest
import requests

from tests.support.waits import wait_until

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"  # a zombie is not running
    except FileNotFoundError:
        return False


def _descendants_named(pid: int, word: str) -> list[int]:
    """Processes whose parent is ``pid`` and whose command line mentions ``word``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().split(") ", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid and word in command:
            found.append(int(entry))
    return found


def _port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return True
    except OSError:
        return False


def _banner_line(runtime, pattern: str) -> str:
    """What ``pattern`` captures in the banner (read on after the API line the start waited for)."""
    wait_until(lambda: re.search(pattern, runtime.text()) or "Serving until" in runtime.text(), "the banner")
    match = re.search(pattern, runtime.text())
    assert match, runtime.text()
    return match.group(1)


def _console(runtime) -> tuple[str, int]:
    """The console's address from the banner, checked against /local/info, and its process."""
    url = _banner_line(runtime, r"Console\s+(http://127\.0\.0\.1:\d+)")
    assert runtime.get("/local/info").json()["console"] == url
    (pid,) = _descendants_named(runtime.process.pid, "dynamodb-admin")
    return url, pid


def test_the_table_console_lists_the_table_and_stops_with_the_runtime(start_runtime):
    # Given a runtime started with the console
    runtime = start_runtime("--no-demo", "--console", "--console-port", "0")
    url, pid = _console(runtime)
    table = runtime.get("/local/info").json()["settings"]["table_name"]
    # Then the console answers on 127.0.0.1 and lists the runtime's table
    page = requests.get(url, timeout=30)
    assert page.status_code == 200 and table in page.text
    # and the dashboard's script links to it
    assert "console-link" in runtime.get("/dashboard/static/dashboard.js").text
    # When the runtime stops (Ctrl-C), then the console's port is closed and its process gone
    assert runtime.stop() == 0
    wait_until(lambda: not _alive(pid), "the console process to exit with the runtime")
    wait_until(lambda: not _port_open(url), "the console's port to close")


def test_the_table_console_does_not_outlive_a_killed_runtime(start_runtime):
    runtime = start_runtime("--no-demo", "--console", "--console-port", "0")
    url, pid = _console(runtime)
    os.kill(runtime.process.pid, signal.SIGKILL)  # the runtime alone, not its process group
    runtime.process.wait(timeout=30)
    wait_until(lambda: not _alive(pid), "the console process to exit with its killed runtime")
    wait_until(lambda: not _port_open(url), "the console's port to close")


def test_the_banner_says_where_events_go_and_the_file_is_kept_after_stop(start_runtime):
    # Given a runtime logging its events, without a data folder
    runtime = start_runtime("--no-demo", "--db", "moto", "--events", "log")
    events = Path(_banner_line(runtime, r"Events\s+(\S+\.jsonl)"))
    try:
        # When a batch completes
        response = runtime.post("/tasks", json={"batch_id": "events-kept", "tasks": [{"key": "e1", "type": "quick"}]})
        assert response.status_code == 201, response.text
        wait_until(lambda: events.is_file() and "events-kept" in events.read_text(), "the batch's event in the file")
        # Then after the runtime stops, the file is still there, and the last words say where
        assert runtime.stop() == 0
        kinds = [json.loads(line).get("detail-type") for line in events.read_text().splitlines()]
        assert kinds, events.read_text()
        assert f"Events kept in {events}" in runtime.text()
    finally:
        events.unlink(missing_ok=True)
