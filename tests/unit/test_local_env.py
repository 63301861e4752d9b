"""``--env`` of the local runtime: your handlers' own environment variables, checked before
anything starts."""

from __future__ import annotations

import pytest
from coworker.config import Settings
from coworker.errors import ConfigurationError
from coworker_local.runtime import LocalRuntime, function_environment


def test_a_value_is_given_or_taken_from_this_shell():
    shell = {"API_TOKEN": "from-the-shell"}
    assert function_environment(["REGION_NAME=eu", "API_TOKEN", "EMPTY=", "URL=a=b"], shell) == {
        "REGION_NAME": "eu", "API_TOKEN": "from-the-shell", "EMPTY": "", "URL": "a=b"}


@pytest.mark.parametrize(("entry", "message"), [
    ("MISSING", "MISSING is not set in this shell"),
    ("1ST=x", "'1ST' is not an environment variable name"),
    ("=x", "'' is not an environment variable name"),
    ("COWORKER_MAX_ATTEMPTS=9", "COWORKER_MAX_ATTEMPTS is set by the runtime"),
    ("AWS_REGION=eu-west-1", "AWS_REGION is set by the runtime"),
])
def test_a_bad_entry_is_refused_with_a_reason(entry, message):
    with pytest.raises(ConfigurationError, match=message):
        function_environment([entry], {})


def test_the_worker_processes_get_them_and_the_runtimes_own_variables_win():
    runtime = LocalRuntime(Settings(table_name="env-test"), function_env={"TEAM_KEY": "v", "PATH": "/custom"})
    environ = runtime.worker_environment()
    assert environ["TEAM_KEY"] == "v" and environ["PATH"] == "/custom"
    assert environ["COWORKER_TABLE_NAME"] == "env-test"
