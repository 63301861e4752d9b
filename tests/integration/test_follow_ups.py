"""Follow-up tasks: a handler's ``context.spawn`` puts new tasks with its completion, fenced by its
claim, idempotent by key, in its batch when asked; the example crawl fans one seed out to 85 pages,
and its pages keep the seed's limits."""

from __future__ import annotations

import pytest
from coworker.data import writes
from coworker.data.models import TaskModel
from coworker.engine import batches, lifecycle, submit
from coworker.engine.examples import crawl_key
from coworker.engine.handlers import MAX_FOLLOW_UPS, task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import process_task
from coworker.errors import StorageError
from coworker.testing import make_context
from coworker_local.testing import LocalTaskSystem

_spawned_by: dict[str, list[str]] = {}


@task_handler("test-spawn")
def spawn_children(payload: dict, context) -> dict:
    """Spawn ``children`` follow-ups (keys from the payload or by default), then maybe fail."""
    keys = [context.spawn(payload.get("child_type", "quick"), {"n": n}, key=key,
                          inherit_batch=payload.get("inherit", False))
            for n, key in enumerate(payload.get("keys") or [None] * payload.get("children", 0))]
    _spawned_by[context.key] = keys
    if payload.get("fail"):
        raise RuntimeError("the parent failed after spawning")
    return {"spawned": len(keys)}


@pytest.fixture
def system(dynamodb_server):
    with LocalTaskSystem(dynamodb_endpoint=dynamodb_server.endpoint) as system:
        yield system


def test_follow_ups_are_put_with_the_parents_success(system) -> None:
    parent = system.put("test-spawn", {"children": 3})
    system.drain()
    assert system.get(parent)["status"] == "finished"
    children = [system.get(key) for key in _spawned_by[parent]]
    assert [key for key in _spawned_by[parent]] == [f"{parent}/1", f"{parent}/2", f"{parent}/3"]
    assert {(c["status"], c["parent"], c["type"]) for c in children} == {("finished", parent, "quick")}


def test_a_failed_attempt_puts_no_follow_ups(system) -> None:
    parent = system.put("test-spawn", {"children": 2, "fail": True}, max_attempts=2)
    system.drain()
    assert system.get(parent)["status"] == "ignored"
    for key in _spawned_by[parent]:
        with pytest.raises(Exception, match="no task"):
            system.get(key)


def test_existing_keys_are_left_as_they_are_and_asked_twice_put_once(system) -> None:
    existing = system.put("quick", {"original": True}, key="shared-page")
    system.drain()
    parent = system.put("test-spawn", {"keys": ["shared-page", "new-page", "new-page"]})
    system.drain()
    shared = system.get(existing)
    assert (shared["payload"], shared["parent"], shared["attempts"]) == ({"original": True}, None, 1)
    assert system.get("new-page")["status"] == "finished"
    assert system.get(parent)["result"] == {"spawned": 3}


def test_a_stale_attempt_puts_no_follow_ups(system) -> None:
    """An attempt whose lock expired and was taken over must not add tasks: its puts are fenced."""
    settings = system.settings
    parent = system.put("test-spawn", {"children": 2})
    stale = lifecycle.claim(parent, "stale-worker", settings)
    assert stale is not None
    # Another worker takes the task over (as after a lock expiry) before the stale one records.
    TaskModel(parent).update(actions=[TaskModel.lock_owner.set("newer-worker"),
                                      TaskModel.attempts.set(2)])
    context = make_context(parent, attempt=stale.attempt)
    for n in range(2):
        context.spawn("quick", {"n": n})
    assert lifecycle.complete(stale, settings, follow_ups=context.follow_ups) is lifecycle.RecordOutcome.LOST
    for follow_up in context.follow_ups:
        with pytest.raises(Exception, match="no task"):
            system.get(follow_up.key)


def test_follow_ups_in_the_batch_keep_it_open_until_they_finish(system) -> None:
    parent = system.put("test-spawn", {"children": 150, "inherit": True}, batch_id="wide")
    system.drain()
    progress = batches.get_batch("wide")
    # 150 follow-ups need two transactions (at most 99 puts next to the check of the claim).
    assert (progress.total, progress.finished, progress.ignored, progress.done) == (151, 151, 0, True)
    assert system.get(f"{parent}/150")["batch_id"] == "wide"
    other = system.put("test-spawn", {"children": 2}, batch_id="narrow")  # not inherited
    system.drain()
    assert batches.get_batch("narrow").total == 1
    assert system.get(f"{other}/1")["batch_id"] is None


def test_spawn_refuses_what_the_api_would_refuse() -> None:
    context = make_context("k")
    with pytest.raises(ValueError, match="reserved for batches"):
        context.spawn("quick", key="batch#x")
    with pytest.raises(ValueError, match="type"):
        context.spawn("")
    with pytest.raises(ValueError, match="max_attempts"):
        context.spawn("quick", max_attempts=0)
    for _ in range(MAX_FOLLOW_UPS - len(context.follow_ups)):
        context.spawn("quick")
    with pytest.raises(ValueError, match=f"at most {MAX_FOLLOW_UPS}"):
        context.spawn("quick")


@pytest.mark.parametrize("children", [2, 150], ids=["folded", "chunked-then-folded"])
def test_a_completion_that_cannot_be_written_fails_the_attempt_and_its_retry_puts_each_once(
        system, monkeypatch, children) -> None:
    """Up to 99 follow-ups are put in the completion's own transaction: all or nothing. More are
    put first (fenced); if the completion then fails, the retry finds them and counts none twice."""
    parent = system.put("test-spawn", {"children": children, "inherit": True}, max_attempts=3,
                        batch_id=f"b-{children}")
    calls = []
    real = writes.update_task_and_put

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise StorageError("DynamoDB is throttling")
        return real(*args, **kwargs)

    monkeypatch.setattr(writes, "update_task_and_put", failing_once)
    report = process_task(parent, "w-1", system.settings, deadline=float("inf"))
    assert report.outcome is TaskOutcome.FAILED
    record = system.get(parent)
    assert record["errors"][0]["kind"] == "system" and "throttling" in record["errors"][0]["message"]
    written_before = [key for key in _spawned_by[parent] if _exists(key)]
    assert len(written_before) == max(0, children - writes.FOLD_ROOM)  # the folded ones went with the failed write
    system.drain()
    assert system.get(parent)["status"] == "finished"
    assert all(system.get(key)["status"] == "finished" for key in _spawned_by[parent])
    counted = batches.get_batch(f"b-{children}")
    assert (counted.total, counted.finished, counted.done) == (children + 1, children + 1, True)


def _exists(key: str) -> bool:
    try:
        lifecycle.get_task(key)
    except Exception:  # noqa: BLE001 - TaskNotFoundError
        return False
    return True


@pytest.mark.slow
def test_the_example_crawl_fans_one_seed_out_to_85_pages_each_crawled_once(dynamodb_server) -> None:
    # 1 + 4 + 16 + 64 pages: each page above the last level puts its 4 links, and every page
    # below the seed links back to the seed and its parent (link_back): 248 idempotent puts by
    # key, 164 of them finding their page already there.
    with LocalTaskSystem(dynamodb_endpoint=dynamodb_server.endpoint, max_concurrency=20, batch_size=10) as system:
        system.put("crawl", {"fanout": 4, "max_depth": 3, "link_back": True}, key=crawl_key("/"), batch_id="crawl")
        system.drain(timeout_seconds=300)
        pages = [task for task in TaskModel.scan() if task.task_type == "crawl"]
        urls = [task.payload.get("url", "/") for task in pages]
        assert len(pages) == len(set(urls)) == 1 + 4 + 16 + 64
        assert {(task.status, int(task.attempts)) for task in pages} == {("finished", 1)}
        assert sorted({task.payload.get("depth", 0) for task in pages}) == [0, 1, 2, 3]
        assert sum(int(task.result["links"]) for task in pages) == 248
        progress = batches.get_batch("crawl")
        assert (progress.total, progress.finished, progress.done) == (85, 85, True)
        # No page ran twice: every page's one attempt (attempts 1, above), and no page reported
        # finished twice. (An invocation that reaches its deadline returns without the reports of
        # threads still recording, as Lambda would: on a loaded machine a few can be missing.)
        finished_reports = [r.key for r in system.reports if r.outcome is TaskOutcome.FINISHED]
        assert len(finished_reports) == len(set(finished_reports)) and len(finished_reports) > 70


def test_a_crawl_from_a_url_stays_small_and_every_page_keeps_the_seeds_concurrency_limit(dynamodb_server) -> None:
    """The README's and docs' crawl: a seed with a URL and a concurrency key, the defaults."""
    with LocalTaskSystem(dynamodb_endpoint=dynamodb_server.endpoint, max_concurrency=20, batch_size=10) as system:
        seed = TaskSpec(key="site-seed", type="crawl", payload={"url": "https://example.com/docs"},
                        batch_id="site", concurrency_key="example.com", concurrency_limit=2)
        submit.put_task(seed, system.settings)
        system.drain()
        pages = [task for task in TaskModel.scan() if task.task_type == "crawl" and task.batch_id == "site"]
        assert len(pages) == 1 + 3 + 9 and {task.status for task in pages} == {"finished"}
        assert all(task.payload["url"].startswith("https://example.com/docs") for task in pages)
        assert {(task.concurrency_key, int(task.concurrency_limit)) for task in pages} == {("example.com", 2)}
        assert batches.get_batch("site").done


def test_the_example_crawls_callback_summarises_every_page_once_the_batch_is_done(dynamodb_server) -> None:
    with LocalTaskSystem(dynamodb_endpoint=dynamodb_server.endpoint, max_concurrency=20, batch_size=10) as system:
        shape = {"fanout": 3, "max_depth": 2, "key_prefix": "small"}
        system.put("crawl", shape, key=crawl_key("/", "small"), batch_id="small-crawl",
                   callbacks={"complete": {"type": "crawl-summary", "payload": shape}})
        system.drain()  # the crawl
        system.drain()  # a tick puts the callback once the batch is counted done, and runs it
        summary = system.result("small-crawl~complete")
        assert (summary["pages_crawled"], summary["pages_on_site"], summary["not_crawled_count"]) == (13, 13, 0)
        assert summary["by_depth"] == {"0": 1, "1": 3, "2": 9}
        assert summary["batch"] == {"batch_id": "small-crawl", "total": 13, "finished": 13, "ignored": 0,
                                    "state": "done"}


def test_a_polite_crawl_fetches_at_most_its_rate_of_pages_per_second(dynamodb_server) -> None:
    with LocalTaskSystem(dynamodb_endpoint=dynamodb_server.endpoint, max_concurrency=20, batch_size=10) as system:
        shape = {"fanout": 3, "max_depth": 2, "key_prefix": "polite", "domain": "polite.test", "rate_per_second": 4}
        system.put("crawl", shape, key=crawl_key("/", "polite"), batch_id="polite-crawl")
        system.drain()
        pages = [task for task in TaskModel.scan() if task.task_type == "crawl" and task.key.startswith("polite:")]
        assert len(pages) == 13 and {task.status for task in pages} == {"finished"}
        spawned = [task for task in pages if task.payload.get("url", "/") != "/"]
        assert {(task.rate_key, int(task.rate_limit)) for task in spawned} == {("polite.test", 4)}
        fetched = sorted(float(task.result["fetched_at"]) for task in spawned)
        # 12 pages at 4 a second: the last 4 start at least 2 s after the first 4 (less however
        # late the first began on a loaded machine; the exact rule is tested in test_rate_limits)
        assert fetched[-1] - fetched[0] >= 1.5


def test_a_crawl_with_a_bad_rate_is_refused_not_retried(dynamodb_server) -> None:
    with LocalTaskSystem(dynamodb_endpoint=dynamodb_server.endpoint) as system:
        system.put("crawl", {"fanout": 2, "max_depth": 1, "rate_per_second": 0}, key="bad-rate")
        system.drain()
        task = lifecycle.get_task("bad-rate")
        assert (task.status, int(task.attempts)) == ("ignored", 1)
        assert "rate_per_second" in task.errors[-1].message
