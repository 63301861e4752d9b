"""The web dashboard in a real browser: Debian's Chromium, headless, driven by Playwright.

Needs ``apt-get install -y chromium`` and ``pip install playwright`` (never ``playwright install``:
no browser download, the machine may be offline). Skipped with a reason when they are missing,
except in CI (``CI`` set), where it fails instead.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("COWORKER_CHROMIUM", "/usr/bin/chromium")
SCREENSHOT = Path(tempfile.gettempdir()) / "coworker-dashboard.png"
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; do not run `playwright install`)"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"Chromium not found at {CHROMIUM} (apt-get install -y chromium)"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"browser test cannot run in CI: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="coworker-chromium-")
    with sync_playwright() as playwright:
        # A fresh profile directory (Playwright's way of passing --user-data-dir).
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS,
            viewport={"width": 1400, "height": 1100},
        )
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)


def _open_dashboard(browser, runtime):
    """A new page on the local dashboard, with the list its script errors are collected in."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(runtime.url + "/dashboard")
    return page, errors


def _number(text: str) -> int:
    return int(text.replace(",", "").rstrip("+")) if text.strip() not in ("", "–") else -1


def test_dashboard_follows_tasks_and_shows_a_tasks_history(browser, runtime):
    """Given the dashboard open, when tasks are submitted and run, then its counts change as they
    finish, the failures appear, and a click shows a task's detail with its error history."""
    page, errors = _open_dashboard(browser, runtime)
    page.wait_for_function("document.getElementById('live').textContent.startsWith('updated')")
    finished_before = _number(page.text_content("#count-finished"))
    assert finished_before == 0

    run = uuid.uuid4().hex[:6]
    tasks = [{"key": f"{run}-q{i}", "type": "quick", "payload": {"i": i}} for i in range(40)]
    tasks += [{"key": f"{run}-s{i}", "type": "slow", "payload": {"seconds": 0.5}} for i in range(10)]
    tasks += [{"key": f"{run}-bad{i}", "type": "always-fail", "payload": {"reason": f"card {i} declined"},
               "max_attempts": 2} for i in range(3)]
    response = runtime.post("/tasks", json={"batch_id": f"browser-{run}", "tasks": tasks})
    assert response.status_code == 201, response.text
    long_key = f"{run}-long-" + "k" * 400  # must not push the failures table out of its card
    response = runtime.post("/tasks", json={"key": long_key, "type": "always-fail", "max_attempts": 1,
                                            "payload": {"reason": "declined " * 60}})
    assert response.status_code == 201, response.text

    # The counts move as tasks finish: first somewhere in between, then all 50 finished.
    page.wait_for_function(
        "Number(document.getElementById('count-finished').textContent.replace(/,/g, '')) > 0", timeout=60_000)
    page.wait_for_function("document.getElementById('count-finished').textContent === '50'", timeout=60_000)
    page.wait_for_function("document.getElementById('count-ignored').textContent === '4'", timeout=60_000)

    # Failures are listed with their last error; the batch shows up with its progress.
    row = page.locator(f"#failures tr[data-key='{run}-bad1']")
    row.wait_for(timeout=30_000)
    assert "card 1 declined" in row.text_content()
    page.locator(f"#batches [data-batch='browser-{run}']").wait_for(timeout=30_000)
    page.wait_for_function(
        f"document.querySelector(\"[data-batch='browser-{run}'] .top\").textContent.includes('53 / 53')",
        timeout=30_000)

    page.locator(f"#failures tr[data-key='{long_key}']").wait_for(timeout=30_000)
    # The cards never lag the table: each listed ignored task is in the ignored count
    listed = page.locator("#failures .pill.ignored").count()
    assert 0 < listed <= _number(page.text_content("#count-ignored"))
    # and the table stays within its card at 1,400 px, the long key cut with an ellipsis
    widths = page.evaluate("""() => {
        const table = document.getElementById('failures-table');
        return [table.scrollWidth, table.parentElement.clientWidth, document.documentElement.scrollWidth,
                window.innerWidth];
    }""")
    assert widths[0] <= widths[1] and widths[2] <= widths[3], widths

    # The backlog the coordinator measures is on the page: nothing is due once all have ended
    page.wait_for_function("document.getElementById('backlog-note').textContent.startsWith('measured')",
                           timeout=30_000)
    page.wait_for_function("document.getElementById('backlog-todo').textContent === '0'", timeout=30_000)
    assert _number(page.text_content("#backlog-running")) >= 0
    # (a retry may still be due a moment after the last todo task started: wait for the age too)
    page.wait_for_function("['0.0 s', '0 s'].includes(document.getElementById('backlog-age').textContent.trim())",
                           timeout=30_000)

    row.click()
    page.wait_for_selector("#detail-history")
    detail = page.text_content("#detail")
    assert f"{run}-bad1" in detail and "ignored" in detail and "2 of 2" in detail
    history = page.locator("#detail-history tbody tr")
    assert history.count() == 2
    assert all("business" in history.nth(i).text_content() for i in range(2))

    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert not errors, errors
    page.close()


def test_swagger_try_it_out_reaches_the_api_and_the_favicon_is_served(browser, runtime):
    favicon = runtime.get("/favicon.ico")
    assert favicon.status_code == 200 and favicon.headers["Content-Type"] == "image/svg+xml"
    assert favicon.content.startswith(b"<svg")
    page = browser.new_page()
    page.goto(runtime.url + "/docs")
    # Swagger UI sends requests to the document's server: the root, where the API answers
    server = page.evaluate("() => window.ui.specSelectors.servers().toJS()[0].url")
    assert server == "/"
    stats = page.evaluate("async (server) => (await fetch(server + 'stats')).status", server)
    assert stats == 200
    page.close()


def test_a_bulk_retry_from_the_dashboard(browser, runtime):
    """Count the ignored tasks of one batch from the dashboard, then retry them: each runs again."""
    run = uuid.uuid4().hex[:6]
    batch = f"bulk-{run}"
    tasks = [{"key": f"{run}-f{i}", "type": "always-fail", "max_attempts": 1, "payload": {"reason": "no"}}
             for i in range(3)]
    assert runtime.post("/tasks", json={"batch_id": batch, "tasks": tasks}).status_code == 201
    runtime.wait_for(lambda: runtime.get(f"/batches/{batch}").json()["ignored"] == 3, 60, "3 ignored tasks")

    page, errors = _open_dashboard(browser, runtime)
    page.select_option("#bulk-action", "retry")
    page.select_option("#bulk-status", "ignored")
    page.fill("#bulk-batch", batch)
    page.click("#bulk-count")
    page.wait_for_function("document.getElementById('bulk-result').textContent.startsWith('3 ignored tasks match')",
                           timeout=30_000)
    assert runtime.get(f"/batches/{batch}").json()["ignored"] == 3  # counting changed nothing
    assert page.text_content("#bulk-apply") == "Retry 3 tasks"
    page.click("#bulk-apply")
    page.wait_for_function("document.getElementById('bulk-result').textContent === '3 tasks retried'",
                           timeout=30_000)
    # Each ran once more (and, always failing, was ignored again, with two errors now)
    runtime.wait_for(lambda: all(len(runtime.task(t["key"])["errors"]) == 2 for t in tasks), 60,
                     "every task retried once")
    assert not errors, errors
    page.close()


def test_pause_and_resume_a_type_from_the_dashboard(browser, runtime):
    page, errors = _open_dashboard(browser, runtime)
    pause = page.locator("#types button[data-type='slow'][data-verb='pause']")
    pause.wait_for(timeout=30_000)
    pause.click()
    page.locator("#types tr[data-type='slow'] .pill.paused").wait_for(timeout=30_000)
    slow = next(t for t in runtime.get("/types").json()["types"] if t["type"] == "slow")
    assert slow["paused"] is True

    run = uuid.uuid4().hex[:6]
    tasks = [{"key": f"{run}-slow{i}", "type": "slow", "payload": {"seconds": 0.1}} for i in range(3)]
    assert runtime.post("/tasks", json={"batch_id": f"paused-{run}", "tasks": tasks}).status_code == 201
    # paused: nothing runs (the coordinator ticks every second here); they are parked, still todo
    page.wait_for_function(
        "Number(document.querySelector(\"#types tr[data-type='slow'] td.num\").textContent) === 3", timeout=30_000)
    time.sleep(2)
    assert {runtime.task(t["key"])["status"] for t in tasks} == {"todo"}

    page.locator("#types button[data-type='slow'][data-verb='resume']").click()
    page.locator("#types tr[data-type='slow'] .pill.running").wait_for(timeout=30_000)
    runtime.wait_for(lambda: runtime.get(f"/batches/paused-{run}").json()["done"], 60, "the slow tasks to finish")
    assert {runtime.task(t["key"])["status"] for t in tasks} == {"finished"}
    assert not errors, errors
    page.close()


def test_limit_a_type_from_the_dashboard(browser, runtime):
    page, errors = _open_dashboard(browser, runtime)
    row = "#types tr[data-type='slow']"
    page.locator(f"{row} input.limit-input").wait_for(timeout=30_000)
    page.locator(f"{row} input.limit-input").fill("1")
    page.locator(f"{row} button[data-verb='limit']").click()
    page.wait_for_function(
        f"document.querySelector(\"{row} .limit-usage\").textContent.includes('of 1 running')", timeout=30_000)
    assert next(t for t in runtime.get("/types").json()["types"] if t["type"] == "slow")["limit"] == 1
    time.sleep(1.5)  # claimers see a new limit within COWORKER_CONTROL_CACHE_SECONDS (1 s here)

    run = uuid.uuid4().hex[:6]
    tasks = [{"key": f"{run}-lim{i}", "type": "slow", "payload": {"seconds": 0.6}} for i in range(3)]
    assert runtime.post("/tasks", json={"batch_id": f"limited-{run}", "tasks": tasks}).status_code == 201
    runtime.wait_for(lambda: runtime.get(f"/batches/limited-{run}").json()["done"], 60, "the limited tasks")
    # one at a time: each finished at least a handler's run after the one before
    finished = sorted(datetime.fromisoformat(runtime.task(t["key"])["finished_at"]) for t in tasks)
    assert all((b - a).total_seconds() >= 0.5 for a, b in zip(finished, finished[1:], strict=False)), finished

    page.locator(f"{row} input.limit-input").fill("")
    page.locator(f"{row} button[data-verb='limit']").click()
    page.wait_for_function(
        f"document.querySelector(\"{row} .limit-usage\").textContent === 'none'", timeout=30_000)
    assert next(t for t in runtime.get("/types").json()["types"] if t["type"] == "slow")["limit"] is None
    assert not errors, errors
    page.close()


def test_rate_limit_a_key_from_the_dashboard_and_lift_it(browser, runtime):
    page, errors = _open_dashboard(browser, runtime)
    run = uuid.uuid4().hex[:6]
    group = f"key:dash-{run}"
    page.locator("#rate-group").wait_for(timeout=30_000)
    page.locator("#rate-group").fill(group)
    page.locator("#rate-limit").fill("2")
    page.locator("#rate-per").fill("0.5")
    page.locator("#rate-form button[type='submit']").click()
    row = f"#rates tr[data-group='{group}']"
    page.locator(row).wait_for(timeout=30_000)
    assert "2 per 0.5 s" in page.locator(row).inner_text()
    answer = runtime.get(f"/rate-limits/{group}").json()
    assert (answer["limit"], answer["interval_seconds"], answer["source"]) == (2, 0.5, "set")
    time.sleep(1.5)  # claimers see a new limit within COWORKER_CONTROL_CACHE_SECONDS (1 s here)

    # its tasks wait their turn in the queue and all run
    tasks = [{"key": f"{run}-rate{i}", "type": "quick", "rate_key": f"dash-{run}"} for i in range(6)]
    assert runtime.post("/tasks", json={"batch_id": f"rated-{run}", "tasks": tasks}).status_code == 201
    # (180 s: a ceiling on a loaded machine, not a budget)
    runtime.wait_for(lambda: runtime.get(f"/batches/rated-{run}").json()["done"], 180, "the rate-limited tasks")
    assert {runtime.task(t["key"])["status"] for t in tasks} == {"finished"}

    page.locator(f"{row} button[data-verb='lift']").click()
    page.locator(row).wait_for(state="detached", timeout=30_000)
    assert runtime.get(f"/rate-limits/{group}").json()["source"] == "lifted"  # ran under the limit set, lifted since
    assert not errors, errors
    page.close()


def test_schedules_on_the_dashboard_pause_resume_and_delete(browser, runtime):
    name = f"dash-{uuid.uuid4().hex[:6]}"
    put = requests.put(f"{runtime.url}/schedules/{name}", timeout=30,
                       json={"expression": "cron(0 3 * * *)", "timezone": "Europe/Berlin", "task": {"type": "quick"}})
    assert put.status_code == 201, put.text
    page, errors = _open_dashboard(browser, runtime)
    page.on("dialog", lambda dialog: dialog.accept())  # the delete button asks first
    pause = page.locator(f"#schedules button[data-schedule='{name}'][data-verb='pause']")
    pause.wait_for(timeout=30_000)
    assert "cron(0 3 * * *)" in page.locator("#schedules").inner_text()
    pause.click()
    page.locator(f"#schedules button[data-schedule='{name}'][data-verb='resume']").wait_for(timeout=30_000)
    assert runtime.get(f"/schedules/{name}").json()["paused"] is True
    page.locator(f"#schedules button[data-schedule='{name}'][data-verb='resume']").click()
    page.locator(f"#schedules button[data-schedule='{name}'][data-verb='pause']").wait_for(timeout=30_000)
    assert runtime.get(f"/schedules/{name}").json()["paused"] is False
    page.locator(f"#schedules button[data-schedule='{name}'][data-verb='delete']").click()
    page.locator(f"#schedules button[data-schedule='{name}']").first.wait_for(state="detached", timeout=30_000)
    assert runtime.get(f"/schedules/{name}").status_code == 404
    assert not errors, errors
    page.close()


def test_each_panel_is_drawn_as_its_answer_arrives_with_one_request_per_panel(browser, runtime):
    """Given the counts' request held back (a loaded machine makes /stats the slowest), the other
    panels are drawn meanwhile; and a refresh sends one request per panel, not one per listed task
    or batch."""
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    held = []
    page.route("**/stats", lambda route: held.append(route))
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url.removeprefix(runtime.url)))
    run = uuid.uuid4().hex[:6]
    failing = [{"key": f"{run}-panel{i}", "type": "always-fail", "max_attempts": 1} for i in range(3)]
    assert runtime.post("/tasks", json={"batch_id": f"panels-{run}", "tasks": failing}).status_code == 201
    runtime.wait_for(lambda: runtime.get(f"/batches/panels-{run}").json()["done"], 60, "the failing tasks")

    page.goto(runtime.url + "/dashboard")
    # While /stats has not answered, the failures, the batches, the types and the runtime are drawn
    page.locator(f"#failures tr[data-key='{run}-panel0']").wait_for(timeout=30_000)
    page.locator(f"#batches [data-batch='panels-{run}']").wait_for(timeout=30_000)
    page.locator("#types tr[data-type='slow']").wait_for(timeout=30_000)
    page.wait_for_function("document.getElementById('runtime').textContent.includes('coordinator')")
    assert held and page.text_content("#count-todo").strip() == "–"
    for route in held:
        route.continue_()
    page.unroute("**/stats")
    page.wait_for_function("document.getElementById('live').textContent.startsWith('updated')", timeout=30_000)

    # and no refresh asked for a task or a batch one by one
    assert not [url for url in requests if url.startswith(("/tasks/", "/batches/"))], requests
    assert any(url.startswith("/local/failures") for url in requests)
    assert not errors, errors
    page.close()


def test_events_of_a_runtime_started_with_them_are_on_the_dashboard(browser, start_runtime):
    runtime = start_runtime("--no-demo", "--events", "log")
    run = uuid.uuid4().hex[:6]
    tasks = [{"key": f"{run}-ok", "type": "quick"}, {"key": f"{run}-bad", "type": "always-fail", "max_attempts": 1}]
    assert runtime.post("/tasks", json={"batch_id": f"ev-{run}", "tasks": tasks}).status_code == 201
    page, errors = _open_dashboard(browser, runtime)
    page.locator(f"#events a[data-key='{run}-bad']").wait_for(timeout=60_000)
    page.wait_for_function(f"document.getElementById('events').textContent.includes('batch ev-{run}')",
                           timeout=60_000)
    text = page.locator("#events").inner_text()
    assert "Task Ignored" in text and "Batch Completed" in text and "1 finished, 1 ignored of 2" in text
    items = runtime.get("/local/events").json()["items"]
    assert [item["detail-type"] for item in items if run in json.dumps(item)] == ["Batch Completed", "Task Ignored"]
    assert not errors, errors
    page.close()
