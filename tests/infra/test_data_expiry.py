"""Data that expires (issue 51, item 8) and log groups kept as long as the deployer says (item 9).

A deployment deletes a finished task's record 90 days after it finished (``retentionDays``; 0
keeps it for ever), and a large result of that task a week after its record; payloads never
expire, since a record points at its payload for as long as the task waits. Every log group the
stack makes keeps its events ``logRetentionDays`` (30 by default), one of CloudWatch's periods.

Given the options a deployer passes, when the stack reads them (or synthesizes, where the
template is the point), then the records, the objects and the logs expire as documented.
"""

from __future__ import annotations

import json
import time

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template
from coworker.data import layout
from coworker.data.models import BatchModel, utcnow
from coworker.engine import batches, lifecycle, offload, progress
from coworker.engine.handlers import task_handler
from coworker.engine.outcomes import TaskOutcome
from coworker.engine.tasks import TaskSpec
from coworker.engine.worker import run_batch
from coworker.errors import ConfigurationError
from coworker_cdk import constants as c
from coworker_cdk.components.results import RESULT_EXPIRY_MARGIN_DAYS, ResultsBucket
from coworker_cdk.config import StackConfig

from tests.infra.test_stack import functions_by_role

DAY = 24 * 3600
LARGE_RESULT = "test-data-expiry-large-result"


@task_handler(LARGE_RESULT)
def large_result(payload, context) -> str:
    return "r" * 5_000  # over the record's budget: it goes to the object store


def options(**given: object) -> StackConfig:
    return StackConfig.from_options(handlers="examples", **given)


def expiry_rules(retention_days: float) -> list[dict]:
    """The lifecycle rules of a results bucket built for ``retention_days`` (no assets: instant)."""
    stack = Stack(App())
    ResultsBucket(stack, "Results", retention_days=retention_days)
    (bucket,) = Template.from_stack(stack).find_resources("AWS::S3::Bucket").values()
    return [rule for rule in bucket["Properties"]["LifecycleConfiguration"]["Rules"] if "ExpirationInDays" in rule]


# --- item 8: finished tasks and their results expire by default ----------------------------------


def test_a_deployment_keeps_finished_tasks_90_days_unless_told_and_0_keeps_them_for_ever() -> None:
    # Given no retention option, then a deployment's finished tasks expire after a quarter
    assert options().settings.retention_days == 90
    assert c.DEFAULT_RETENTION_DAYS == 90
    # Given retentionDays=0 (a string, as -c passes it), then they are kept for ever, as said
    assert options(retention_days="0").settings.retention_days == 0
    assert options(retention_days=7).settings.retention_days == 7


@pytest.fixture(scope="module")
def synthesized(synthesize) -> dict:
    """One synth for this module: the retention defaults, a container runner (its log groups),
    and logs kept 400 days (the value the CLI gives as a string)."""
    stack, assembly = synthesize({c.CTX_CONTAINER_RUNNER: "true", c.CTX_LOG_RETENTION_DAYS: "400"})
    return assembly.get_stack_by_name(stack.stack_name).template


def test_by_default_every_function_expires_finished_tasks_and_the_bucket_their_results_after(synthesized) -> None:
    template = Template.from_json(synthesized)
    for role, fn in functions_by_role(template).items():
        assert fn["Environment"]["Variables"]["COWORKER_RETENTION_DAYS"] == "90.0", role
    (bucket,) = template.find_resources("AWS::S3::Bucket").values()
    rules = bucket["Properties"]["LifecycleConfiguration"]["Rules"]
    expiring = [rule for rule in rules if "ExpirationInDays" in rule]
    # Only the results of tasks kept 90 days, a week after their records (TTL may delete late)
    assert expiring == [{"Id": "ExpireResults", "Prefix": offload.result_prefix(90), "Status": "Enabled",
                         "ExpirationInDays": 90 + RESULT_EXPIRY_MARGIN_DAYS}]
    assert offload.result_prefix(90) == "results/kept-90d/"
    # Payloads never expire (a task may wait any time for its run); uploads left half-way do
    assert not any(rule.get("Prefix", "").startswith(offload.PAYLOAD_PREFIX) for rule in rules)
    assert {"AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}, "Status": "Enabled"} in rules


def test_retention_0_expires_no_object_and_a_fraction_of_a_day_rounds_up() -> None:
    assert expiry_rules(0) == []
    assert expiry_rules(0.5) == [{"Id": "ExpireResults", "Prefix": "results/kept-1d/", "Status": "Enabled",
                                  "ExpirationInDays": 1 + RESULT_EXPIRY_MARGIN_DAYS}]


def test_the_expiry_rule_reaches_no_result_written_under_another_retention() -> None:
    # Given results written while tasks were kept for ever (the default before), or 365 days
    forever = offload.object_name("k", 1, "w")
    longer = offload.object_name("k", 1, "w", retention_days=365)
    kept_90 = offload.object_name("k", 1, "w", retention_days=90)
    # When the deployment keeps its tasks 90 days, then its rule expires only what it wrote itself
    (rule,) = expiry_rules(90)
    assert kept_90.startswith(rule["Prefix"])
    assert not forever.startswith(rule["Prefix"]) and not longer.startswith(rule["Prefix"])
    assert forever.startswith(offload.RESULT_PREFIX)  # the worker's and the API's grants cover both
    assert kept_90.startswith(offload.RESULT_PREFIX)


def test_a_finished_task_of_a_deployment_expires_with_its_result_and_its_batch_does_not(make_settings,
                                                                                        tmp_path) -> None:
    # Given the library settings a deployment gets by default, with a result store
    deployed = options().settings
    settings = make_settings(retention_days=deployed.retention_days, result_dir=str(tmp_path),
                             inline_result_bytes=1024)
    # When a task of a batch finishes with a large result
    task = lifecycle.new_task(TaskSpec(key="expiring", type=LARGE_RESULT, batch_id="b"), settings, utcnow())
    assert batches.put_tasks([task], "b") == [True]
    reports = run_batch(["expiring"], "w", settings, time.monotonic() + 60)
    assert [report.outcome for report in reports] == [TaskOutcome.FINISHED]
    progress.catch_up(settings)
    # Then the record is deleted (TTL) 90 days after it finished, its result sits where the bucket
    # expires results a week later, and no item of the batch (head, counters) has a TTL at all
    finished = lifecycle.get_task("expiring")
    kept = (finished.delete_after_epoch - finished.finished_at).total_seconds()
    assert abs(kept - 90 * DAY) < 2
    assert f"/{offload.result_prefix(90)}" in finished.result_ref["uri"]
    items = [item for item in BatchModel._get_connection().scan()["Items"]  # raw: every attribute written
             if item[layout.PARTITION_KEY]["S"].startswith(layout.BATCH_KEY_PREFIX + "b")]
    assert len(items) >= 2 and not [item for item in items if layout.TTL_ATTRIBUTE in item]  # head, counters
    assert batches.get_batch("b").finished == 1  # counted; a TTL delete later takes none back


# --- item 9: how long every log group keeps its events -------------------------------------------


def test_every_log_group_the_stack_makes_keeps_its_events_as_long_as_said(synthesized) -> None:
    groups = {logical_id: resource["Properties"] for logical_id, resource in synthesized["Resources"].items()
              if resource["Type"] == "AWS::Logs::LogGroup"}
    # the three functions, the API's access logs, the runner's and its VPC's flow logs (API Gateway's
    # execution logs are off: their group would be API Gateway's own, test_upgrade.py)
    assert len(groups) == 6
    assert {logical_id: props.get("RetentionInDays") for logical_id, props in groups.items()} == {
        logical_id: 400 for logical_id in groups}
    assert not any("API-Gateway-Execution-Logs_" in json.dumps(props.get("LogGroupName", ""))
                   for props in groups.values())
    assert any("FlowLogs" in logical_id for logical_id in groups) and any("Runners" in lid for lid in groups)


def test_log_retention_defaults_to_a_month_and_takes_cloudwatchs_periods() -> None:
    assert options().log_retention_days == 30
    assert options(log_retention_days="3653").log_retention_days == 3653
    assert options(log_retention_days=1).log_retention_days == 1


@pytest.mark.parametrize("days", [0, 45, "366", 9999])
def test_a_log_retention_cloudwatch_does_not_take_is_refused_with_the_ones_it_does(days) -> None:
    with pytest.raises(ConfigurationError) as refused:
        options(log_retention_days=days)
    message = str(refused.value)
    assert "log_retention_days" in message and c.CTX_LOG_RETENTION_DAYS in message
    assert "CloudWatch Logs" in message and "30, 60, 90" in message and "3653" in message


def test_a_log_retention_that_is_no_number_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="log_retention_days must be a whole number"):
        options(log_retention_days="a month")


def test_log_retention_is_a_context_key_of_the_stack() -> None:
    config = StackConfig.from_context(App(context={c.CTX_HANDLERS_DIR: "examples",
                                                   c.CTX_LOG_RETENTION_DAYS: "90"}).node)
    assert config.log_retention_days == 90
