"""Handler registration from packages, the example switch, and the one-handler test kit."""

from __future__ import annotations

import sys
import threading
import time

import coworker.engine.examples  # noqa: F401  (registers the example types that follow-ups name)
import pytest
from coworker import TaskFailed
from coworker.config import EXAMPLE_HANDLER_MODULE, Settings
from coworker.engine import handlers
from coworker.engine.handlers import handler_package, load_handler_modules
from coworker.errors import ConfigurationError, UnknownTaskTypeError
from coworker.testing import HandlerTimeout, make_context, run_handler

from tests.support.handler_packages import write_handler_package


def test_examples_stay_registered_next_to_your_modules_unless_turned_off() -> None:
    assert Settings().handler_module_list == [EXAMPLE_HANDLER_MODULE]
    assert Settings(handler_modules="team.a, team.b").handler_module_list == [
        EXAMPLE_HANDLER_MODULE, "team.a", "team.b"]
    assert Settings(handler_modules="team.a", example_handlers=False).handler_module_list == ["team.a"]
    # Listing the examples explicitly keeps them, once.
    assert Settings(handler_modules="coworker.engine.examples,team.a",
                    example_handlers=False).handler_module_list == [EXAMPLE_HANDLER_MODULE, "team.a"]
    assert Settings.from_env({"COWORKER_EXAMPLE_HANDLERS": "false"}).example_handlers is False


def test_a_package_registers_every_module_in_it_but_its_tests(tmp_path, monkeypatch) -> None:
    package, name, task_type = write_handler_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    load_handler_modules([name])  # the test module would raise if imported
    assert {task_type, task_type + "-summary"} <= set(handlers.registered_types())
    assert f"{name}.test_math_tasks" not in sys.modules
    assert run_handler(task_type, {"n": 21}) == {"doubled": 42, "attempt": 1}


def test_a_module_that_does_not_import_is_a_configuration_error(tmp_path, monkeypatch) -> None:
    package, name, _ = write_handler_package(tmp_path)
    (package / "broken.py").write_text("import no_such_dependency_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigurationError, match="no_such_dependency_anywhere"):
        load_handler_modules([name])
    with pytest.raises(ConfigurationError, match="cannot import handler module 'not_a_module_xyz'"):
        load_handler_modules(["not_a_module_xyz"])


@pytest.mark.parametrize(
    ("folder", "init", "message"),
    [
        ("missing", False, "is not a folder"),
        ("my-tasks", True, "must be a Python identifier"),
        ("class", True, "must be a Python identifier"),
        ("coworker", True, "taken by Coworker itself"),
        ("handler", True, "taken by Coworker itself"),
        ("plain_folder", False, "has no __init__.py"),
    ],
)
def test_a_folder_that_cannot_be_a_handlers_package_is_refused_with_the_fix(
        tmp_path, folder: str, init: bool, message: str) -> None:
    path = tmp_path / folder
    if folder != "missing":
        path.mkdir()
        if init:
            (path / "__init__.py").write_text("")
    with pytest.raises(ConfigurationError, match=message):
        handler_package(path)


def test_handler_package_names_the_folder_to_put_on_the_path(tmp_path) -> None:
    package, name, _ = write_handler_package(tmp_path)
    assert handler_package(package) == (tmp_path.resolve(), name)


# --- coworker.testing.run_handler ------------------------------------------------------------


def test_run_handler_gives_a_real_context() -> None:
    seen = {}

    def handler(payload, context):
        seen.update(key=context.key, attempt=context.attempt, token=context.fencing_token,
                    remaining=context.remaining_seconds(), lost=context.claim_lost(),
                    thread=threading.current_thread().name)
        return payload

    assert run_handler(handler, {"a": 1}, key="k-1", attempt=2, timeout_seconds=30) == {"a": 1}
    assert seen["key"] == "k-1" and seen["attempt"] == 2 and seen["token"] == "test-worker:2"
    assert 29 < seen["remaining"] <= 30 and seen["lost"] is False
    assert seen["thread"] != threading.current_thread().name  # in a worker thread, as in a worker


def test_run_handler_raises_what_the_handler_raises() -> None:
    def refuse(payload, context):
        raise TaskFailed("card declined", retryable=False)

    with pytest.raises(TaskFailed, match="card declined") as caught:
        run_handler(refuse)
    assert caught.value.retryable is False
    with pytest.raises(UnknownTaskTypeError, match="known:"):
        run_handler("no-such-type-anywhere")


def test_run_handler_stops_at_the_deadline_and_signals_a_lost_claim() -> None:
    contexts = []

    def forever(payload, context):
        contexts.append(context)
        time.sleep(5)

    started = time.monotonic()
    with pytest.raises(HandlerTimeout):
        run_handler(forever, timeout_seconds=0.3)
    assert time.monotonic() - started < 2
    assert contexts[0].claim_lost()  # as the worker's heartbeat tells a handler past its deadline

    def polite(payload, context):
        while not context.claim_lost():
            time.sleep(0.01)
        return "stopped"

    assert run_handler(polite, lose_claim_after=0.1) == "stopped"


def test_run_handler_returns_the_result_as_the_record_keeps_it() -> None:
    assert run_handler(lambda payload, context: {"pair": (1, 2), "set": {3}}) == {"pair": [1, 2], "set": "{3}"}


def test_make_context_uses_the_workers_token_format() -> None:
    context = make_context("k", attempt=3, owner="req-1")
    assert context.fencing_token == "req-1:3" and context.max_attempts == 3


def test_run_handler_shows_the_follow_ups_a_handler_asked_for() -> None:
    def crawl(payload, context):
        for url in payload["links"]:
            context.spawn("quick", {"url": url}, key=f"page:{url}")
        return len(payload["links"])

    context = make_context("page:/")
    assert run_handler(crawl, {"links": ["/a", "/b"]}, context=context) == 2
    assert [(f.key, f.type, f.payload) for f in context.follow_ups] == [
        ("page:/a", "quick", {"url": "/a"}), ("page:/b", "quick", {"url": "/b"})]


def test_the_example_crawl_refuses_a_request_for_an_unbounded_crawl() -> None:
    from coworker.engine.examples import MAX_CRAWL_DEPTH, MAX_CRAWL_FANOUT

    with pytest.raises(TaskFailed, match="fanout must be a whole number from 0 to 10") as refused:
        run_handler("crawl", {"fanout": 1000, "max_depth": 50})
    assert refused.value.retryable is False
    context = make_context("crawl:seed")
    run_handler("crawl", {"fanout": MAX_CRAWL_FANOUT, "max_depth": MAX_CRAWL_DEPTH}, context=context)
    assert len(context.follow_ups) == MAX_CRAWL_FANOUT  # its links (a seed links back to nothing)


def test_the_priority_is_any_32_bit_signed_integer() -> None:
    from coworker.engine.tasks import NewTask
    from pydantic import ValidationError

    assert NewTask(type="quick", priority=-(2**31)).priority == -(2**31)
    assert NewTask(type="quick", priority=2**31 - 1).priority == 2**31 - 1
    for outside in (-(2**31) - 1, 2**31):
        with pytest.raises(ValidationError):
            NewTask(type="quick", priority=outside)
