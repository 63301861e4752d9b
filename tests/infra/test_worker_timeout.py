"""The worker's timeout follows the time limits the deployed task types declare (read from their
source at synth), and a limit no Lambda worker can give is refused, naming the type."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from coworker.engine import timing
from coworker.errors import ConfigurationError
from coworker_cdk.config import StackConfig
from coworker_cdk.declared import declared_limits

from tests.infra.test_stack import functions_by_role
from tests.infra.test_task_system import synth_system

MARGIN = 5.0  # the library's default timeout_margin_seconds


def _package(root: Path, body: str, name: str = "convert_tasks") -> Path:
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "files.py").write_text(textwrap.dedent(body))
    # A test module is never imported by the worker: its declarations do not count either.
    (package / "test_files.py").write_text(textwrap.dedent('''
        from coworker import task_handler

        @task_handler("only-in-tests", timeout_seconds=5000)
        def never(payload, context):
            return None
    '''))
    return package


FIVE_MINUTE_FILES = '''
    from coworker import task_handler
    import coworker

    MINUTE = 60

    @task_handler("convert", timeout_seconds=10 * MINUTE)
    def convert(payload, context):
        return None

    @coworker.task_handler("thumbnail", timeout_seconds=45.5)
    def thumbnail(payload, context):
        return None

    @task_handler("undeclared")
    def undeclared(payload, context):
        return None
'''


def test_declared_limits_are_read_from_the_source_without_running_it(tmp_path) -> None:
    package = _package(tmp_path, FIVE_MINUTE_FILES)
    assert declared_limits(package, examples=False) == {"convert": 600.0, "thumbnail": 45.5}


def test_the_worker_timeout_is_raised_to_fit_the_longest_declared_limit(tmp_path) -> None:
    # Given a handlers package whose longest type declares 10 minutes
    package = _package(tmp_path / "src", FIVE_MINUTE_FILES)

    # When it is deployed with no worker timeout of its own
    template, _, _ = synth_system(tmp_path, handlers=str(package))

    # Then the worker's timeout gives a fresh invocation those 10 minutes, margin and start included
    worker = functions_by_role(template)["worker"]
    needed = timing.worker_timeout_for(600, MARGIN)
    assert needed is not None and 600 + MARGIN < needed <= 630
    assert worker["Timeout"] == needed
    assert worker["Environment"]["Variables"]["COWORKER_WORKER_TIMEOUT_SECONDS"] == str(needed)
    assert timing.longest_limit(needed, MARGIN) >= 600 > timing.longest_limit(needed - 1, MARGIN)


def test_without_declared_limits_the_worker_keeps_its_default_timeout(tmp_path) -> None:
    package = _package(tmp_path, '''
        from coworker import task_handler

        @task_handler("plain")
        def plain(payload, context):
            return None
    ''')
    assert StackConfig.from_options(handlers=str(package)).settings.worker_timeout_seconds == 300


def test_a_worker_timeout_set_too_short_for_a_declared_limit_is_refused_naming_both(tmp_path) -> None:
    package = _package(tmp_path, FIVE_MINUTE_FILES)
    with pytest.raises(ConfigurationError) as refused:
        StackConfig.from_options(handlers=str(package), worker_timeout_seconds=300)
    message = str(refused.value)
    assert "'convert'" in message and "workerTimeoutSeconds" in message and "600 s" in message
    assert str(timing.worker_timeout_for(600, MARGIN)) in message
    # A timeout long enough is kept as set.
    assert StackConfig.from_options(handlers=str(package), worker_timeout_seconds=800).settings \
        .worker_timeout_seconds == 800


def test_a_limit_beyond_what_lambda_can_give_runs_on_the_container_runner_not_the_worker(tmp_path) -> None:
    # Given a type whose limit no Lambda worker gives, beside one the worker runs
    package = _package(tmp_path, '''
        from coworker import task_handler

        @task_handler("export", timeout_seconds=2 * 3600)
        def export(payload, context):
            return None

        @task_handler("resize", timeout_seconds=60)
        def resize(payload, context):
            return None
    ''')

    # When the stack reads them
    config = StackConfig.from_options(handlers=str(package))

    # Then the long one is the container runner's, and only the other sizes the worker
    assert config.settings.container_type_list == ["export"] and config.runner is not None
    assert config.settings.worker_timeout_seconds == 300  # the default already gives 60 s


def test_a_type_that_asks_for_lambda_with_a_limit_beyond_it_is_refused_at_synth(tmp_path) -> None:
    package = _package(tmp_path, '''
        from coworker import task_handler

        @task_handler("export", timeout_seconds=2 * 3600, runner="lambda")
        def export(payload, context):
            return None
    ''')
    with pytest.raises(ConfigurationError, match=r"'export' \(7200 s, .*files.py:4\) says runner=\"lambda\" but "
                                                 r"declares a time limit longer than a Lambda worker can give: at "
                                                 r"most 885 s"):
        StackConfig.from_options(handlers=str(package))


@pytest.mark.parametrize(("declaration", "problem"), [
    ("timeout_seconds=limit_from_env()", "must be a number"),
    ("timeout_seconds=0", "from 1 to"),
    ("timeout_seconds=True", "must be a number"),
])
def test_a_limit_the_stack_cannot_read_or_accept_is_refused_with_its_line(tmp_path, declaration, problem) -> None:
    package = _package(tmp_path, f'''
        from coworker import task_handler

        def limit_from_env():
            return 60

        @task_handler("odd", {declaration})
        def odd(payload, context):
            return None
    ''')
    with pytest.raises(ConfigurationError, match=problem) as refused:
        StackConfig.from_options(handlers=str(package))
    assert "files.py:" in str(refused.value)
