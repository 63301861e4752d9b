"""Shared fixtures: one embedded DynamoDB server (moto, over HTTP) per test session,
and a fresh table per test."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")

from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.embedded import EmbeddedDynamoDB, create_table  # noqa: E402

_table_numbers = itertools.count()


@pytest.fixture(scope="session")
def dynamodb_server() -> Iterator[EmbeddedDynamoDB]:
    with EmbeddedDynamoDB() as server:
        yield server


@pytest.fixture
def make_settings(dynamodb_server: EmbeddedDynamoDB):
    """Build settings bound to a new, empty table on the embedded server."""

    def make(**overrides) -> Settings:
        overrides.setdefault("table_name", f"tasks-{os.getpid()}-{next(_table_numbers)}")
        overrides.setdefault("dynamodb_endpoint", dynamodb_server.endpoint)
        overrides.setdefault("backoff_base_seconds", 0)
        overrides.setdefault("backoff_max_seconds", 0)
        settings = Settings(**overrides)
        create_table(settings)
        return configure(settings)

    return make


@pytest.fixture
def settings(make_settings) -> Settings:
    return make_settings()
