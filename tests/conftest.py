"""Shared fixtures: embedded DynamoDB servers (one of each backend per test process, started on
first use) and a fresh table per test.

The database of the integration, API and CLI tiers is DynamoDB Local (``COWORKER_LOCAL_DB``
chooses another: ``moto``; ``auto`` falls back to moto when Java is missing). Tests marked
``both_backends`` (the lifecycle contract) run once on each backend, so any difference between
them shows up as a failing test. Where DynamoDB Local cannot run, its tests are skipped with the
reason, except in CI (``CI`` set), where that is a failure.
"""

from __future__ import annotations

import collections
import contextlib
import io
import itertools
import json
import os
from collections.abc import Callable, Iterator

import pytest

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")

from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.engine import slots  # noqa: E402
from coworker_local.database import (  # noqa: E402
    AUTO,
    BACKEND_VARIABLE,
    BACKENDS,
    DYNAMODB_LOCAL,
    MOTO,
    EmbeddedDatabase,
    admin_client,
    create_table,
    embedded_database,
)
from coworker_local.dynamodb_local import unavailable_reason  # noqa: E402

_table_numbers = itertools.count()

# The files that take longest, longest first (their summed test time in a whole CI run on a
# quiet machine, 2026-11-29, in seconds). ``scripts/test.sh`` hands files out to its workers in
# collection order (loadfile, without xdist's reordering by test count), so these start first and
# the short files fill the end: no worker is left alone on a long file while the others have finished.
LONGEST_FILES_FIRST = (
    "tests/e2e/test_local_runtime.py",  # 174
    "tests/integration/test_rate_log_chunks.py",  # 140
    "tests/rehearsal/test_grants.py",  # 100
    "tests/rehearsal/test_on_the_wire.py",  # 91
    "tests/integration/test_upgrade_in_flight.py",  # 47 (67 and 69 on a loaded machine)
    "tests/fuzz/test_api_fuzz.py",  # 73
    "tests/integration/test_slow_writes.py",  # 70
    "tests/integration/test_continuous_dispatch.py",  # 67
    "tests/cli/test_cli.py",  # 67
    "tests/integration/test_coordinator.py",  # 63
    "tests/integration/test_time_limits.py",  # 59
    "tests/integration/test_coordinator_cost.py",  # 56
    "tests/e2e/test_dashboard_browser.py",  # 56
    "tests/integration/test_follow_ups.py",  # 54
    "tests/integration/test_rate_limits.py",  # 52
    "tests/api/test_batch_counters.py",  # 43
    "tests/integration/test_batch_callbacks.py",  # 43
    "tests/integration/test_concurrency.py",  # 43
    "tests/integration/test_follow_up_batch_counts.py",  # 42
    "tests/api/test_bulk.py",  # 39
    "tests/integration/test_container_runner.py",  # 38
    "tests/integration/test_lifecycle.py",  # 38
    "tests/integration/test_sharded_index.py",  # 34
    "tests/api/test_api.py",  # 33
    "tests/rehearsal/test_fresh_app.py",  # 33
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "both_backends: run once on DynamoDB Local and once on moto")
    config.addinivalue_line("markers", "dynamodb_local: needs DynamoDB Local (real capacity figures)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: number for number, path in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # (stable: the rest keep their order)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("both_backends") and "db_backend" in metafunc.fixturenames:
        metafunc.parametrize("db_backend", BACKENDS, indirect=True)


def _default_backend() -> str:
    requested = os.environ.get(BACKEND_VARIABLE, AUTO).strip().lower()
    if requested == AUTO:
        return MOTO if unavailable_reason() and not os.environ.get("CI") else DYNAMODB_LOCAL
    return requested


def _require_dynamodb_local() -> None:
    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"DynamoDB Local must run in CI: {reason}")
    pytest.skip(reason)


# DynamoDB Local keeps every stream it was given, a deleted table's too, and each write costs it
# more with each one kept: in benchmarks/dynamodb_local_streams.py (100 writes and 100 reads on
# each new table, four kept) its CPU for ten tables grew from 2.0 to 7.7 s over the first 120
# tables, and stayed at 1.2-1.6 s with streams off. A test process makes hundreds of tables, so its
# server is started afresh, between two tests, once RENEW_AFTER_TABLES were made on it, unless a
# module's fixture is using it across tests (``dynamodb_local_kept``). A start costs about 2
# CPU-seconds; the whole suite took 826 CPU-s instead of 1,080 (2026-11-30).
RENEW_AFTER_TABLES = 20


class _SessionDynamoDBLocal:
    """The test process's DynamoDB Local, and what decides when it is started afresh."""

    server: EmbeddedDatabase | None = None
    tables_made = 0  # since it started
    kept_by = 0  # module fixtures using it across tests

    @classmethod
    def renew_if_due(cls) -> None:
        if cls.server is None or cls.tables_made < RENEW_AFTER_TABLES or cls.kept_by:
            return
        gone = cls.server.endpoint
        cls.server.stop()
        cls.server.start()  # (on the same port when it is still free)
        cls.tables_made = 0
        other_servers = [settings for settings in _made_tables if settings.dynamodb_endpoint != gone]
        _made_tables.clear()
        _made_tables.extend(other_servers)


@pytest.fixture(scope="session")
def dynamodb_local_server() -> Iterator[EmbeddedDatabase]:
    _require_dynamodb_local()
    server = _SessionDynamoDBLocal.server = embedded_database(DYNAMODB_LOCAL).start()
    yield server
    _SessionDynamoDBLocal.server = None
    server.stop()


@pytest.fixture(scope="module")
def dynamodb_local_kept(dynamodb_local_server: EmbeddedDatabase) -> Iterator[EmbeddedDatabase]:
    """The session's DynamoDB Local, not started afresh before the module ends (for a module's
    fixture that uses it across tests, such as a shared runtime)."""
    _SessionDynamoDBLocal.kept_by += 1
    yield dynamodb_local_server
    _SessionDynamoDBLocal.kept_by -= 1


@pytest.fixture(autouse=True)
def _fresh_dynamodb_local() -> None:
    """Start the session's DynamoDB Local afresh before this test when it is due (see above)."""
    _SessionDynamoDBLocal.renew_if_due()


@pytest.fixture(scope="session")
def moto_server() -> Iterator[EmbeddedDatabase]:
    server = embedded_database(MOTO).start()
    yield server
    server.stop()


@pytest.fixture
def db_backend(request: pytest.FixtureRequest) -> str:
    """The backend of this test: its parameter (``both_backends``), a marker, or the default."""
    if hasattr(request, "param"):
        return request.param
    if request.node.get_closest_marker("dynamodb_local"):
        return DYNAMODB_LOCAL
    return _default_backend()


@pytest.fixture
def dynamodb_server(db_backend: str, request: pytest.FixtureRequest) -> EmbeddedDatabase:
    return request.getfixturevalue("dynamodb_local_server" if db_backend == DYNAMODB_LOCAL else "moto_server")


# The tables of the last tests kept (a thread a test left behind may still be writing to its
# table); older ones are deleted. DynamoDB Local polls every table's stream, so the JVM's idle CPU
# grows with the tables it holds (measured: about 0.035 of a core at 1 table, 0.16 at 600).
KEPT_TABLES = 4
_made_tables: collections.deque[Settings] = collections.deque()


def _delete_old_tables() -> None:
    while len(_made_tables) > KEPT_TABLES:
        settings = _made_tables.popleft()
        with contextlib.suppress(Exception):  # (gone already, or its server stopped)
            admin_client(settings).delete_table(TableName=settings.table_name)


@pytest.fixture
def make_settings(dynamodb_server: EmbeddedDatabase):
    """Build settings bound to a new, empty table on the embedded server."""
    made: list[Settings] = []

    def make(**overrides) -> Settings:
        overrides.setdefault("table_name", f"tasks-{os.getpid()}-{next(_table_numbers)}")
        overrides.setdefault("dynamodb_endpoint", dynamodb_server.endpoint)
        overrides.setdefault("backoff_base_seconds", 0)
        overrides.setdefault("backoff_max_seconds", 0)
        settings = Settings(**overrides)
        create_table(settings)
        if dynamodb_server is _SessionDynamoDBLocal.server:
            _SessionDynamoDBLocal.tables_made += 1
        made.append(settings)
        configure(settings)
        slots.ensure_slots(settings.worker_slots)  # as the coordinator does when it starts
        return settings

    yield make
    _made_tables.extend(made)
    _delete_old_tables()


@pytest.fixture
def settings(make_settings) -> Settings:
    return make_settings()


@pytest.fixture
def log_lines() -> Iterator[Callable[[], list[dict]]]:
    """The library logger's lines (parsed) while the test runs, at INFO; the logger's keys are
    cleared before and after, so that no other test's handler call shows in them."""
    from coworker.observability import logger

    logger.clear_state()
    buffer = io.StringIO()
    streams = [(handler, handler.stream) for handler in logger.handlers if hasattr(handler, "setStream")]
    level = logger.log_level
    logger.setLevel("INFO")
    for handler, _ in streams:
        handler.setStream(buffer)
    yield lambda: [json.loads(line) for line in buffer.getvalue().splitlines()]
    for handler, stream in streams:
        handler.setStream(stream)
    logger.setLevel(level)
    logger.clear_state()
