"""Options a deployment would get wrong without a word at synth (issue 51, items 4, 5 and 10):
refused at synth with what to set instead, checked on the configuration alone (no synth) except
where the template is the point.

Given the context a deployer passes (``-c key=value`` strings, as the CDK CLI gives them),
when the stack reads it, then it is refused naming the option, or the template says what it built.
"""

from __future__ import annotations

import dataclasses

import pytest
from aws_cdk import App
from aws_cdk.assertions import Match, Template
from coworker.config import Settings
from coworker.errors import ConfigurationError
from coworker_cdk import constants as c
from coworker_cdk.config import _SETTINGS_CONTEXT, CONTEXT_OPTIONS, FALSE_WORDS, TRUE_WORDS, StackConfig

# Every boolean option, by context key: what the deployer spells.
BOOLEAN_CONTEXT = (
    c.CTX_API_CLOUDWATCH_ROLE,
    c.CTX_API_LOGS,
    c.CTX_RESULTS_BUCKET,
    c.CTX_LEGACY_STATUS_INDEX,
    c.CTX_CONTAINER_RUNNER,
    c.CTX_RUNNER_PUBLIC_IP,
    c.CTX_DISPATCH_ON_SUBMIT,
    c.CTX_EXAMPLE_HANDLERS,
)


def config(**context: object) -> StackConfig:
    return StackConfig.from_context(App(context={c.CTX_HANDLERS_DIR: "examples", **context}).node)


# --- item 4: a misspelled boolean is refused, not read as false --------------------------------


def test_the_boolean_options_listed_here_are_all_of_them() -> None:
    # Given the settings and the stack's own fields that are booleans and options
    settings = {key for key, field in _SETTINGS_CONTEXT.items() if Settings.model_fields[field].annotation is bool}
    stack = {key for key, name in CONTEXT_OPTIONS.items()
             if any(f.name == name and f.type == "bool" for f in dataclasses.fields(StackConfig))}
    # Then each is one this file checks (the runner's two are read by the runner's config)
    assert settings | stack <= set(BOOLEAN_CONTEXT)
    assert {c.CTX_DISPATCH_ON_SUBMIT, c.CTX_EXAMPLE_HANDLERS, c.CTX_API_CLOUDWATCH_ROLE, c.CTX_RESULTS_BUCKET,
            c.CTX_LEGACY_STATUS_INDEX, c.CTX_API_LOGS} <= settings | stack


@pytest.mark.parametrize("key", BOOLEAN_CONTEXT)
@pytest.mark.parametrize("word", ["flase", "ture", "treu", "2", "enabled"])
def test_a_misspelled_boolean_is_refused_naming_the_option_and_the_words_it_takes(key: str, word: str) -> None:
    # Given a boolean option with a value that is no boolean word
    # When the stack reads it
    # Then the synth fails naming the option, its context key and the accepted words
    with pytest.raises(ConfigurationError) as refused:
        config(**{key: word, c.CTX_CONTAINER_RUNNER: "true"} if key == c.CTX_RUNNER_PUBLIC_IP else {key: word})
    message = str(refused.value)
    assert f"option {CONTEXT_OPTIONS[key]} must be true or false, not {word!r} (context {key})" in message
    assert all(accepted in message for accepted in (*TRUE_WORDS, *FALSE_WORDS))


@pytest.mark.parametrize(("word", "value"), [(w, True) for w in (*TRUE_WORDS, "TRUE", " Yes ", True)]
                         + [(w, False) for w in (*FALSE_WORDS, "False", " OFF ", False)])
def test_every_boolean_option_takes_the_same_words(word: object, value: bool) -> None:
    cfg = config(**{c.CTX_RESULTS_BUCKET: word, c.CTX_LEGACY_STATUS_INDEX: word, c.CTX_DISPATCH_ON_SUBMIT: word,
                    c.CTX_API_CLOUDWATCH_ROLE: word, c.CTX_API_LOGS: word})
    assert (cfg.results_bucket, cfg.legacy_status_index, cfg.settings.dispatch_on_submit, cfg.api_cloudwatch_role,
            cfg.api_logs) == (value,) * 5


@pytest.mark.parametrize("word", ["t", "y", "f", "n"])
def test_a_library_boolean_takes_the_stacks_words_not_pydantics_longer_list(word: str) -> None:
    # pydantic alone would read "f" as false; the stack's other options would refuse it
    with pytest.raises(ConfigurationError, match="option dispatch_on_submit must be true or false"):
        config(**{c.CTX_DISPATCH_ON_SUBMIT: word})


# --- item 5: a coordinator run longer than the schedule's interval is refused ------------------


@pytest.mark.parametrize(("supervise", "schedule", "runs"), [(840, 1, 14), (300, 1, 5), (61, 1, 2), (121, 2, 2),
                                                             (840, 13, 2)])
def test_runs_that_would_overlap_on_the_schedule_are_refused_with_what_to_set(supervise, schedule, runs) -> None:
    # Given a coordinator run longer than the time between two scheduled runs
    # When the stack reads it
    # Then it is refused: the events that find a run still supervising would go to the DLQ
    with pytest.raises(ConfigurationError) as refused:
        config(**{c.CTX_SUPERVISE_SECONDS: str(supervise), c.CTX_SCHEDULE_MINUTES: str(schedule)})
    message = str(refused.value)
    assert f"up to {runs - 1} of every {runs} scheduled runs" in message
    assert "dead-letter queue" in message
    assert f"set superviseSeconds to at most {schedule * 60}" in message
    assert f"or scheduleMinutes to at least {runs}" in message


@pytest.mark.parametrize(("supervise", "schedule"), [(None, None), (60, None), (59.5, 1), (1, 1), (120, 2), (60, 10),
                                                     (300, 5), (840, 14), (3, None)])
def test_runs_that_follow_each_other_or_leave_a_gap_are_accepted(supervise, schedule) -> None:
    # the default (60 s every minute), the documented examples and a sparse schedule
    context = {key: str(value) for key, value in ((c.CTX_SUPERVISE_SECONDS, supervise),
                                                  (c.CTX_SCHEDULE_MINUTES, schedule)) if value is not None}
    cfg = config(**context)
    assert cfg.settings.supervise_seconds <= cfg.schedule_minutes * 60


def test_the_overlap_is_refused_through_the_construct_as_well() -> None:
    with pytest.raises(ConfigurationError, match="up to 13 of every 14"):
        StackConfig.from_options(handlers="examples", supervise_seconds=840)


# --- item 10: without the stack's CloudWatch role the deployer says whether the API logs ----------


def test_without_the_stacks_cloudwatch_role_the_deployer_must_say_whether_the_api_logs() -> None:
    # Given apiCloudWatchRole=false alone: the stage would log, and fail in an account without the role
    with pytest.raises(ConfigurationError) as refused:
        config(**{c.CTX_API_CLOUDWATCH_ROLE: "false"})
    message = str(refused.value)
    assert "apiLogs" in message and "aws apigateway get-account" in message and "rolls back" in message
    # Then either answer is taken
    assert config(**{c.CTX_API_CLOUDWATCH_ROLE: "false", c.CTX_API_LOGS: "true"}).api_logs is True
    assert config(**{c.CTX_API_CLOUDWATCH_ROLE: "false", c.CTX_API_LOGS: "false"}).api_logs is False
    # and with the role the stack makes (the default) the API logs unless told not to
    assert config().api_logs is True and config().api_cloudwatch_role is True


def test_a_stage_without_logs_asks_api_gateway_for_none(synthesize) -> None:
    # Given no CloudWatch role from the stack and no API logs
    stack, assembly = synthesize({c.CTX_API_CLOUDWATCH_ROLE: "false", c.CTX_API_LOGS: "false"})
    template = Template.from_json(assembly.get_stack_by_name(stack.stack_name).template)
    # Then the stage turns on neither execution nor access logging (each needs the account's role)
    template.has_resource_properties("AWS::ApiGateway::Stage", {
        "StageName": c.API_STAGE_NAME,
        "TracingEnabled": True,
        "AccessLogSetting": Match.absent(),
        "MethodSettings": [Match.object_like({"LoggingLevel": "OFF", "MetricsEnabled": True,
                                              "DataTraceEnabled": False})],
    })
    assert not template.find_resources("AWS::ApiGateway::Account")
    groups = template.find_resources("AWS::Logs::LogGroup")
    assert not [name for name, body in groups.items()
                if "API-Gateway-Execution-Logs_" in str(body["Properties"].get("LogGroupName", ""))
                or name.startswith("ApiAccessLogs")]
