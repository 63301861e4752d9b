"""Pure logic: settings validation and retry backoff."""

import random

import pytest
from coworker.config import Settings
from coworker.engine.lifecycle import backoff_delay
from coworker.errors import ConfigurationError


def test_settings_read_environment_names_and_defaults():
    settings = Settings.from_env({"COWORKER_MAX_CONCURRENCY": "42", "COWORKER_TABLE_NAME": "t"})
    assert settings.max_concurrency == 42
    assert settings.table_name == "t"
    assert settings.batch_size == 10  # default
    assert settings.effective_lock_seconds == 60  # short: heartbeats extend it
    assert settings.effective_heartbeat_seconds == 20
    assert settings.worker_slots == 5  # ceil(42 / 10)


def test_settings_round_trip_through_environment():
    settings = Settings(max_attempts=7, dynamodb_endpoint="http://127.0.0.1:1")
    assert Settings.from_env(settings.as_environment()) == settings


def test_heartbeat_slower_than_half_the_lock_is_rejected_with_reason():
    with pytest.raises(ConfigurationError, match="at most half"):
        Settings.from_env({"COWORKER_LOCK_SECONDS": "30", "COWORKER_HEARTBEAT_SECONDS": "20"})


def test_lock_may_be_shorter_than_the_worker_timeout():
    settings = Settings.from_env({"COWORKER_LOCK_SECONDS": "15", "COWORKER_WORKER_TIMEOUT_SECONDS": "900"})
    assert settings.effective_heartbeat_seconds == 5


def test_bad_number_is_rejected():
    with pytest.raises(ConfigurationError, match="COWORKER_MAX_CONCURRENCY"):
        Settings.from_env({"COWORKER_MAX_CONCURRENCY": "lots"})


def test_backoff_grows_exponentially_with_jitter_and_is_capped():
    settings = Settings(backoff_base_seconds=2, backoff_max_seconds=30)
    rng = random.Random(7)
    for attempt, ceiling in [(1, 2), (2, 4), (3, 8), (4, 16), (5, 30), (9, 30)]:
        delays = [backoff_delay(attempt, settings, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 10  # jittered, not constant
