"""The real ``coworker`` command, run as a subprocess against the API served by LocalGateway."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from coworker.api.app import create_app
from coworker.engine import dispatch, progress
from coworker.engine.dispatch import InProcessInvoker
from coworker_local.database import free_port
from coworker_local.gateway import LocalGateway

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "layers" / "coworker" / "python"


def _command() -> list[str]:
    """The installed console script if there is one, else the module (same code)."""
    script = Path(sys.executable).parent / "coworker"
    if script.exists():
        return [str(script)]
    found = shutil.which("coworker")
    return [found] if found else [sys.executable, "-m", "coworker_local.cli"]


class Served:
    def __init__(self, settings, gateway: LocalGateway, events: list[dict]) -> None:
        self.settings = settings
        self.url = gateway.url
        self.events = events

    def run(self, *args: str, stdin: str | None = None, url: str | None = None, env: dict | None = None):
        environ = {**os.environ, "COWORKER_API_URL": url or self.url,
                   "PYTHONPATH": f"{LIBRARY}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {})}
        environ.pop("COWORKER_API_KEY", None) if "COWORKER_API_KEY" not in (env or {}) else None
        return subprocess.run([*_command(), *args], input=stdin or "", capture_output=True, text=True,
                              env=environ, timeout=60)

    def popen(self, *args: str) -> subprocess.Popen:
        environ = {**os.environ, "COWORKER_API_URL": self.url,
                   "PYTHONPATH": f"{LIBRARY}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        return subprocess.Popen([*_command(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=environ)

    def work(self) -> None:
        """Let the coordinator and in-process workers run everything that is due."""
        invoker = InProcessInvoker(self.settings)
        try:
            # Tasks submitted a moment ago are due at once (no wait for dispatch on submit here).
            settings = self.settings.model_copy(update={"dispatch_on_submit": False})
            for _ in range(10):
                report = dispatch.tick(settings, invoker)
                invoker.wait()
                if report.dispatched == 0:
                    return
        finally:
            invoker.shutdown()

    def count(self) -> None:
        """Count batch progress from the stream, as the coordinator does at every tick."""
        progress.catch_up(self.settings)


@pytest.fixture
def served(settings):
    app = create_app(settings)
    events: list[dict] = []

    def handler(event, context):
        events.append(event)
        return app.resolve(event, context)

    with LocalGateway(handler) as gateway:
        yield Served(settings, gateway, events)


def test_submit_one_task_then_status(served):
    result = served.run("submit", "--type", "quick", "--key", "order/1", "--payload", '{"n": 1}',
                        "--max-attempts", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "order/1: created\n"
    assert served.run("submit", "--type", "quick", "--key", "order/1").stdout == "order/1: exists\n"

    result = served.run("status", "order/1")
    assert result.returncode == 0
    task = json.loads(result.stdout)
    assert task["key"] == "order/1" and task["payload"] == {"n": 1} and task["max_attempts"] == 2


def test_submit_with_a_time_limit_and_one_too_long_for_the_worker(served):
    result = served.run("submit", "--type", "quick", "--key", "timed/1", "--timeout-seconds", "90")
    assert result.returncode == 0, result.stderr
    assert json.loads(served.run("status", "timed/1", "--json").stdout)["timeout_seconds"] == 90
    result = served.run("submit", "--type", "quick", "--key", "timed/2", "--timeout-seconds", "5000")
    assert result.returncode != 0 and "longer than a Lambda worker can give" in result.stderr
    assert 'runner="container"' in result.stderr  # what to do about it
    assert served.run("status", "timed/2").returncode != 0  # nothing was written


def test_submit_many_from_a_file_in_chunks_and_watch_the_batch(served, tmp_path):
    lines = [json.dumps({"key": f"t{i:02d}", "type": "quick"}) for i in range(23)]
    lines.insert(5, "")  # blank lines are skipped
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = served.run("submit", "--file", str(path), "--batch-id", "nightly", "--chunk-size", "10")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "batch nightly: 23 submitted, 23 created, 0 existing"
    assert "23/23" in result.stderr  # the progress bar
    posts = [e for e in served.events if e["httpMethod"] == "POST"]
    # three requests, sent up to four at once (--parallel's default), so in any order
    assert sorted(len(json.loads(e["body"])["tasks"]) for e in posts) == [3, 10, 10]

    # Re-running the same submission creates nothing and counts nothing twice.
    again = served.run("submit", "--file", str(path), "--batch-id", "nightly", "--quiet")
    assert again.stdout.splitlines()[0] == "batch nightly: 23 submitted, 0 created, 23 existing"

    served.count()
    once = served.run("batch", "nightly", "--once")
    assert once.stdout == "batch nightly: 23 tasks, finished 0, ignored 0, open 23\n"

    watcher = served.popen("batch", "nightly", "--interval", "0.1")
    served.work()
    out, err = watcher.communicate(timeout=30)
    assert watcher.returncode == 0, err
    assert out.strip().splitlines()[-1].endswith("23/23 finished 23, ignored 0, open 0 - done")


def test_submit_a_file_with_batch_callbacks(served, tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps({"key": f"c{i}", "type": "quick"}) for i in range(3)) + "\n")
    result = served.run("submit", "--file", str(path), "--batch-id", "crawl", "--chunk-size", "2",
                        "--on-complete", "quick", "--on-stopped", "quick", "--callback-payload", '{"to": "ops"}')
    assert result.returncode == 0, result.stderr
    posts = [json.loads(e["body"]) for e in served.events if e["httpMethod"] == "POST"]
    assert [post["callbacks"] for post in posts] == [
        {"complete": {"type": "quick", "payload": {"to": "ops"}},
         "stopped": {"type": "quick", "payload": {"to": "ops"}}}
    ] * 2
    served.work()
    served.count()
    served.work()  # a tick puts the callback and starts its worker
    task = json.loads(served.run("status", "crawl~complete").stdout)
    assert task["status"] == "finished" and task["payload"]["payload"] == {"to": "ops"}
    refused = served.run("submit", "--type", "quick", "--on-complete", "quick")
    assert refused.returncode != 0 and "--on-* go with --file" in refused.stderr
    bad = served.run("submit", "--file", str(path), "--on-complete", "quick", "--callback-payload", "{")
    assert bad.returncode != 0 and "--callback-payload is not valid JSON" in bad.stderr


def test_submit_from_stdin_and_list(served):
    stdin = "\n".join(json.dumps({"key": f"s{i}", "type": "slow" if i % 2 else "quick"}) for i in range(5))
    result = served.run("submit", "--file", "-", "--json")
    assert result.returncode == 2 and "holds no tasks" in result.stderr  # empty stdin
    result = served.run("--json", "submit", "--file", "-", stdin=stdin)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["created"] == 5

    result = served.run("list", "--status", "todo", "--type", "slow", "--limit", "1", "--all")
    assert result.returncode == 0
    rows = result.stdout.splitlines()
    assert rows[0].split() == ["KEY", "STATUS", "TYPE", "ATTEMPTS", "DUE_AT", "BATCH"]
    assert sorted(row.split()[0] for row in rows[1:]) == ["s1", "s3"]
    partial = served.run("list", "--status", "todo", "--limit", "2")
    assert partial.stdout.splitlines()[-1].startswith("more: coworker list --status todo --cursor ")


def test_api_errors_are_printed_as_worded_with_a_nonzero_exit(served, tmp_path):
    result = served.run("status", "nope")
    assert result.returncode == 1
    assert result.stderr == "error (404): no task with key 'nope'\n"

    result = served.run("submit", "--type", "quick", "--max-attempts", "0")
    assert result.returncode == 1
    assert ("error (422): Invalid request: body.max_attempts: Input should be greater than or equal to 1"
            in result.stderr)
    assert result.stderr.count("Input should be greater than or equal to 1") == 1  # printed once

    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"type": "quick"}) + "\n" + json.dumps({"type": "quick", "key": ""}) + "\n")
    result = served.run("submit", "--file", str(path), "--quiet")
    assert result.returncode == 2  # checked before anything is sent
    assert "1 bad line; nothing was sent" in result.stderr
    assert "line 2: key: String should have at least 1 character" in result.stderr
    assert served.run("list", "--status", "todo").stdout.count("\n") == 1  # header only: nothing written

    result = served.run("list", "--status", "todo", "--cursor", "garbage")
    assert result.returncode == 1 and "the cursor is not valid" in result.stderr


def test_cancel_retry_and_batch_redrive(served, tmp_path):
    assert served.run("submit", "--type", "quick", "--key", "c1").returncode == 0
    result = served.run("cancel", "c1")
    assert (result.returncode, result.stdout) == (0, "c1: ignored (cancelled)\n")
    result = served.run("cancel", "c1")
    assert result.returncode == 1 and "already ignored" in result.stderr
    result = served.run("retry", "c1")
    assert (result.returncode, result.stdout) == (0, "c1: todo (attempts reset, history kept)\n")

    path = tmp_path / "fail.jsonl"
    path.write_text("\n".join(json.dumps({"key": f"f{i}", "type": "always-fail", "max_attempts": 1})
                              for i in range(3)))
    served.run("submit", "--file", str(path), "--batch-id", "doomed", "--quiet")
    served.work()
    assert "ignored 3, open 0 - done" in served.run("batch", "doomed", "--once").stdout
    result = served.run("retry", "--batch", "doomed")
    assert (result.returncode, result.stdout) == (0, "batch doomed: 3 ignored tasks redriven\n")
    served.count()
    assert "ignored 0, open 3" in served.run("batch", "doomed", "--once").stdout

    stats = served.run("stats")
    assert stats.returncode == 0
    # c1 ran to finished meanwhile: the three redriven tasks are the todo ones.
    assert "todo        3" in stats.stdout and "finished    not counted" in stats.stdout


def test_api_key_is_sent_and_usage_and_connection_errors(served):
    served.run("stats", env={"COWORKER_API_KEY": "s3cret"})
    assert served.events[-1]["headers"]["X-Api-Key"] == "s3cret"
    served.run("--api-key", "other", "stats")
    assert served.events[-1]["headers"]["X-Api-Key"] == "other"

    result = served.run("retry")
    assert result.returncode == 2 and "give a task KEY or --batch ID" in result.stderr
    result = served.run("submit", "--file", "x.jsonl", "--chunk-size", "5000")
    assert result.returncode == 2 and "between 1 and 1000" in result.stderr

    result = served.run("stats", url=f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 3 and "cannot reach the API" in result.stderr


def test_a_tasks_file_that_is_not_utf8_is_a_usage_error_not_a_traceback(served, tmp_path):
    # Given a JSON-lines file whose second line is Latin-1, not UTF-8
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b'{"type": "quick", "key": "ok"}\n{"type": "quick", "key": "caf\xe9"}\n')
    before = len(served.events)
    for args, stdin in ((("submit", "--file", str(tasks)), None), (("submit", "--file", "-"), "stdin")):
        if stdin:  # the same bytes on standard input
            environ = {**os.environ, "COWORKER_API_URL": served.url,
                       "PYTHONPATH": f"{LIBRARY}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
            result = subprocess.run([*_command(), *args], input=tasks.read_bytes(), capture_output=True,
                                    env=environ, timeout=60)
            stderr = result.stderr.decode()
        else:
            result = served.run(*args)
            stderr = result.stderr
        # Then it says where and why, exits as a usage error, and sends nothing
        assert result.returncode == 2 and "line 2: not UTF-8 text (byte 0xe9)" in stderr, stderr
        assert "Traceback" not in stderr
    assert len(served.events) == before


def test_iam_requests_carry_a_sigv4_signature_for_execute_api_that_verifies(served):
    """``--iam`` (for a stack deployed with apiAuth=iam): each request is signed for execute-api
    with the caller's credentials; the signature is recomputed here from what the API received."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    env = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
           "AWS_DEFAULT_REGION": "eu-west-1", "AWS_REGION": "eu-west-1"}
    result = served.run("submit", "--iam", "--type", "quick", "--key", "signed-1", env=env)
    assert result.returncode == 0, result.stderr
    event = served.events[-1]
    headers = {k.lower(): v for k, v in event["headers"].items()}
    authorization = headers["authorization"]
    assert authorization.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/execute-api/aws4_request" in authorization and "x-api-key" not in headers
    signed = [h for h in authorization.split("SignedHeaders=")[1].split(",")[0].split(";")]
    request = AWSRequest(method="POST", url=served.url + "/tasks", data=event["body"].encode(),
                         headers={name: headers[name] for name in signed if name in headers})
    request.context["timestamp"] = headers["x-amz-date"]
    signer = SigV4Auth(Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]), "execute-api", "eu-west-1")
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    assert authorization.endswith(f"Signature={expected}")


def test_bulk_dry_run_then_cancel_with_a_progress_bar_and_a_resume_hint(served):
    lines = "\n".join(json.dumps({"key": f"crawl-{i:03d}", "type": "slow", "run_at": "2099-01-01T00:00:00Z"})
                      for i in range(250))
    lines += "\n" + json.dumps({"key": "keep", "type": "quick", "run_at": "2099-01-01T00:00:00Z"})
    assert served.run("submit", "--file", "-", "--quiet", stdin=lines).returncode == 0

    dry = served.run("bulk", "cancel", "--status", "todo", "--type", "slow", "--dry-run")
    assert (dry.returncode, dry.stdout) == (0, "250 todo tasks would be cancelled (dry run: nothing changed)\n")

    result = served.run("bulk", "cancel", "--status", "todo", "--type", "slow")
    assert (result.returncode, result.stdout) == (0, "250 todo tasks cancelled\n")
    assert "250/250" in result.stderr  # the progress bar, on stderr (not a terminal: a line per page)
    assert served.run("status", "keep", "--json").stdout.count('"status": "todo"') == 1
    again = served.run("bulk", "cancel", "--status", "todo", "--type", "slow", "--json")
    assert json.loads(again.stdout)["changed"] == 0  # re-running changes nothing more

    # A run that stops (here the API refuses the page size) says how far it got and how to resume
    stopped = served.run("bulk", "retry", "--status", "ignored", "--type", "slow", "--page", "500", "--no-count")
    assert stopped.returncode == 1
    assert "stopped after 0 tasks retried" in stopped.stderr and "limit is at most 200" in stopped.stderr
    assert "resume with: coworker bulk retry --status ignored --type slow --no-count" in stopped.stderr
    resumed = served.run("bulk", "retry", "--status", "ignored", "--type", "slow")
    assert (resumed.returncode, resumed.stdout) == (0, "250 ignored tasks retried\n")


def test_pause_resume_and_types(served):
    result = served.run("pause", "slow")
    assert (result.returncode, result.stdout) == (0, "slow: paused\n")
    result = served.run("pause", "slow")
    assert (result.returncode, result.stdout) == (0, "slow: paused (it was paused already)\n")
    assert "slow: paused\n" in served.run("types").stdout and "quick: running\n" in served.run("types").stdout
    result = served.run("resume", "slow")
    assert (result.returncode, result.stdout) == (0, "slow: running\n")
    result = served.run("pause", "no-such-type")
    assert result.returncode == 1 and "no task type 'no-such-type' here (known: always-fail" in result.stderr


def test_limit_a_type_and_submit_with_a_concurrency_key(served):
    result = served.run("limit", "slow", "2")
    assert (result.returncode, result.stdout) == (0, "slow: running, limit 2 (0 running, 0 waiting)\n")
    assert "slow: running, limit 2 (0 running, 0 waiting)\n" in served.run("types").stdout
    result = served.run("limit", "slow", "two")
    assert result.returncode == 2 and "LIMIT must be a whole number or 'none'" in result.stderr
    result = served.run("limit", "slow", "0")
    assert result.returncode == 1 and "limit" in result.stderr
    result = served.run("limit", "slow", "none")
    assert (result.returncode, result.stdout) == (0, "slow: running\n")

    result = served.run("submit", "--type", "quick", "--key", "c1", "--concurrency-key", "example.com",
                        "--concurrency-limit", "3")
    assert result.returncode == 0, result.stderr
    record = json.loads(served.run("status", "c1", "--json").stdout)
    assert (record["concurrency_key"], record["concurrency_limit"]) == ("example.com", 3)


def test_rate_limits_set_listed_lifted_and_carried_by_a_submitted_task(served):
    result = served.run("rate", "key:example.com", "5", "--per", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "key:example.com: 5 per 2 s (set), 0 started in the last interval\n"
    assert served.run("rate", "key:example.com", "5", "--per", "2").stdout.endswith("(unchanged)\n")
    assert served.run("rates").stdout == "key:example.com: 5 per 2 s (set), 0 started in the last interval\n"
    result = served.run("rate", "key:example.com", "five")
    assert result.returncode == 2 and "LIMIT must be a whole number or 'none'" in result.stderr
    result = served.run("rate", "example.com", "5")
    assert result.returncode == 1 and "key:<rate key> or type:<task type>" in result.stderr
    assert served.run("submit", "--type", "quick", "--key", "r0", "--rate-key", "example.com").returncode == 0
    served.work()  # a start under the limit set: lifting it leaves none in force (issue 52, item 4)
    result = served.run("rate", "key:example.com", "none")
    assert (result.returncode, result.stdout) == (0, "key:example.com: not limited (the limit set was lifted)\n")
    assert served.run("rates").stdout.startswith("no rate limit is set")

    result = served.run("submit", "--type", "quick", "--key", "r1", "--rate-key", "api.example.com",
                        "--rate-limit", "3", "--rate-interval", "0.5")
    assert result.returncode == 0, result.stderr
    record = json.loads(served.run("status", "r1", "--json").stdout)
    assert (record["rate_key"], record["rate_limit"], record["rate_interval_seconds"]) == ("api.example.com", 3, 0.5)
    served.work()
    assert served.run("rate", "key:api.example.com").stdout.startswith(
        "key:api.example.com: 3 per 0.5 s (carried by the task that started last; none is set), ")


def test_a_reader_that_goes_away_stops_the_output_quietly(served):
    # Given output piped to a reader that has already gone (`coworker stats | head -0`)
    served.run("submit", "--type", "quick", "--key", "piped/1")
    read_end, write_end = os.pipe()
    os.close(read_end)
    environ = {**os.environ, "COWORKER_API_URL": served.url,
               "PYTHONPATH": f"{LIBRARY}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        # When the command prints
        done = subprocess.run([*_command(), "stats"], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              env=environ, timeout=60)
    finally:
        os.close(write_end)
    # Then it stops with the shell's code for it, and no traceback
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_listing_the_queue_says_what_waits_outside_it(served):
    # Given tasks of a paused type, parked out of the queue by the coordinator
    for number in range(3):
        served.run("submit", "--type", "slow", "--key", f"held/{number}", "--payload", '{"seconds": 0}')
    assert served.run("pause", "slow").returncode == 0
    served.work()

    # When the queue is listed for that type
    result = served.run("list", "--status", "todo", "--type", "slow")

    # Then no task is listed, and the listing says where they are and what lets them run
    assert result.returncode == 0, result.stderr
    assert "held/" not in result.stdout
    assert "3 task(s) of type 'slow' are held out of the queue while it is paused" in result.stderr
    assert "coworker resume slow" in result.stderr


def test_the_python_client_submits_any_iterable_in_chunks_waits_for_the_batch_and_reads_results(served):
    from coworker_local.client import ApiError, Coworker

    client = Coworker(served.url)
    # Given a generator of tasks without keys, sent 20 per request
    told = []
    submitted = client.submit(({"type": "quick", "payload": {"n": n}} for n in range(45)), chunk_size=20,
                              on_progress=told.append)
    assert (submitted.submitted, submitted.created, submitted.existing) == (45, 45, 0)
    assert [p.submitted for p in told] == [20, 40, 45] and len(set(submitted.keys)) == 45
    # and sent again with the keys it was given: nothing is stored twice
    again = client.submit(({"key": key, "type": "quick"} for key in submitted.keys), batch_id=submitted.batch_id)
    assert (again.created, again.existing) == (0, 45)

    # and sent 4 requests at a time: progress is told in the order of the tasks
    told = []
    keyed = [{"key": f"par-{n:02d}", "type": "quick"} for n in range(45)]
    parallel = client.submit(iter(keyed), chunk_size=5, parallel=4, on_progress=told.append)
    assert (parallel.created, parallel.existing) == (45, 0)
    assert [p.submitted for p in told] == list(range(5, 50, 5))
    assert parallel.keys == tuple(task["key"] for task in keyed)
    assert client.submit(keyed, batch_id=parallel.batch_id, chunk_size=5, parallel=4).existing == 45
    served.work()
    served.count()
    assert client.batch(parallel.batch_id).total == 45

    # When the tasks run, the batch is followed until it is done (counted between looks)
    served.work()
    looks = []
    batch = client.wait(submitted.batch_id, poll_seconds=0, on_progress=looks.append, sleep=lambda _: served.count())
    assert batch.done and (batch.total, batch.finished, batch.ignored) == (45, 45, 0) and looks[-1] == batch

    # Then every result can be read, and each task
    results = dict(client.results(submitted.keys))
    assert len(results) == 45 and all(result is not None for result in results.values())
    task = client.task(submitted.keys[0])
    assert (task.status, task.attempts, task.last_error) == ("finished", 1, None)
    # and what the API refuses comes with its own words
    with pytest.raises(ApiError, match="only failed or ignored tasks can be retried"):
        client.retry(submitted.keys[0])


def test_schedules_from_the_command_line(served):
    put = served.run("schedule", "put", "nightly", "cron(0 3 * * *)", "--type", "quick", "--payload", '{"n": 1}',
                     "--timezone", "Europe/Berlin", "--missed", "skip")
    assert put.returncode == 0, put.stderr
    assert put.stdout.startswith("nightly: cron(0 3 * * *) (Europe/Berlin, missed: skip) -> quick; next ")
    assert put.stdout.rstrip().endswith("(created)")
    listed = served.run("schedules")
    assert listed.returncode == 0 and listed.stdout.startswith("nightly: cron(0 3 * * *)")
    paused = served.run("schedule", "pause", "nightly")
    assert paused.returncode == 0 and "; paused" in paused.stdout
    assert "(it was paused already)" in served.run("schedule", "pause", "nightly").stdout
    shown = served.run("schedule", "show", "nightly", "--json")
    assert json.loads(shown.stdout)["task"] == {"type": "quick", "payload": {"n": 1}}
    bad = served.run("schedule", "put", "hourly", "every hour", "--type", "quick")
    assert bad.returncode == 1 and "rate(N minutes|hours|days)" in bad.stderr
    assert served.run("schedule", "put", "hourly").returncode == 2  # no expression, no type
    assert served.run("schedule", "delete", "nightly").stdout.rstrip().endswith("(deleted)")
    gone = served.run("schedule", "show", "nightly")
    assert gone.returncode == 1 and "no schedule named 'nightly'" in gone.stderr


def test_a_refusal_lists_each_problem_once(served):
    # Given a task of a type no handler is registered for
    # When it is submitted
    result = served.run("submit", "--type", "nosuchtype")
    # Then the API's 422 is printed with each of its problems once
    assert result.returncode == 1
    assert result.stderr.count("no handler is registered for task type 'nosuchtype'") == 1, result.stderr


def _lines(count: int, start: int = 0, **fields) -> list[str]:
    return [json.dumps({"type": "quick", "payload": {"n": n}, **fields}) for n in range(start, start + count)]


def test_every_bad_line_of_a_file_is_named_by_its_line_and_nothing_is_sent(served, tmp_path):
    # Given a file of 1,500 good lines and 25 that the task rules refuse (and a blank line)
    lines = _lines(1500)
    lines[10:10] = _lines(25, max_attempts=0)
    lines.insert(0, "")
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    before = len(served.events)
    # When it is submitted
    result = served.run("submit", "--file", str(path), "--parallel", "1", "--quiet")
    # Then nothing is sent, and the first 20 bad lines are named by their line in the file (from 1)
    assert result.returncode == 2, result.stderr
    assert len(served.events) == before
    assert "25 bad lines; nothing was sent" in result.stderr
    assert "line 12: max_attempts: Input should be greater than or equal to 1" in result.stderr
    assert "line 31: max_attempts" in result.stderr and "line 32:" not in result.stderr
    assert "... and 5 more problems" in result.stderr
    assert "entry" not in result.stderr and "tasks[" not in result.stderr


def test_a_file_refused_part_way_says_what_was_stored_and_a_re_run_stores_only_the_rest(served, tmp_path):
    # Given 25 good lines without keys, then one of a type the API does not know, sent 10 at a time
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join([*_lines(25), json.dumps({"type": "nosuchtype"})]) + "\n")
    # When it is submitted one request at a time
    result = served.run("submit", "--file", str(path), "--parallel", "1", "--chunk-size", "10", "--quiet")
    # Then the message says how many tasks were stored, in which batch, where the refusal is, and how to
    # go on, numbering by the file's lines
    assert result.returncode == 1
    stderr = result.stderr
    assert "nothing was written" not in stderr and "entry" not in stderr and "tasks[" not in stderr, stderr
    assert "line 26: type: no handler is registered for task type 'nosuchtype'" in stderr, stderr
    assert stderr.count("no handler is registered") == 1
    assert "lines 21-26" in stderr
    batch_id = stderr.split("stored in batch ")[1].split(":")[0]
    assert f"stored in batch {batch_id}: 20 of 26 tasks (20 created, 0 existing)" in stderr
    assert f"--batch-id {batch_id}" in stderr

    # When the bad line is fixed and the file submitted again with that batch id
    path.write_text("\n".join([*_lines(25), json.dumps({"type": "quick"})]) + "\n")
    again = served.run("submit", "--file", str(path), "--batch-id", batch_id, "--chunk-size", "10", "--quiet")
    # Then only the tasks missing are created: the lines without keys have the same keys as before
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0] == f"batch {batch_id}: 26 submitted, 6 created, 20 existing"


def test_requests_sent_alongside_a_refused_one_are_counted_exactly(served, tmp_path):
    # Given three requests' worth of tasks, the first of which the API refuses (line 3)
    lines = _lines(30)
    lines[2] = json.dumps({"type": "nosuchtype"})
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    # When they are sent four requests at a time
    result = served.run("submit", "--file", str(path), "--chunk-size", "10", "--parallel", "4", "--quiet",
                        "--batch-id", "side")
    # Then the two requests sent beside it are counted as stored
    assert result.returncode == 1
    assert "stored in batch side: 20 of 30 tasks (20 created, 0 existing)" in result.stderr, result.stderr
    assert "line 3: type: no handler" in result.stderr and "lines 1-10" in result.stderr
