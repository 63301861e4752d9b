"""When a schedule's occurrences fall: rate and cron expressions, time zones, refusals."""

from datetime import UTC, datetime, timedelta

import pytest
from coworker.engine.schedules import Recurrence, name_problem, occurrence_key

T0 = datetime(2026, 3, 1, 12, 0, 7, 123456, tzinfo=UTC)


def test_a_rate_counts_whole_steps_from_when_the_schedule_was_put():
    every_5 = Recurrence("rate(5 minutes)", "UTC", T0)
    anchor = T0.replace(microsecond=0)
    assert every_5.next_after(T0) == anchor + timedelta(minutes=5)
    assert every_5.latest_at_or_before(T0 + timedelta(minutes=4)) is None
    assert every_5.latest_at_or_before(anchor + timedelta(minutes=5)) == anchor + timedelta(minutes=5)
    assert every_5.latest_at_or_before(anchor + timedelta(minutes=17)) == anchor + timedelta(minutes=15)
    assert every_5.next_after(anchor + timedelta(minutes=15)) == anchor + timedelta(minutes=20)
    assert Recurrence("rate(1 day)", "UTC", T0).interval == timedelta(days=1)
    assert Recurrence(" rate( 2  hours ) ", "UTC", T0).interval == timedelta(hours=2)


def test_cron_is_read_in_the_schedules_time_zone_across_a_daylight_saving_change():
    # 09:00 in Berlin is 08:00 UTC in winter and 07:00 UTC in summer (from 29 March 2026)
    nine_in_berlin = Recurrence("cron(0 9 * * *)", "Europe/Berlin", T0)
    assert nine_in_berlin.next_after(datetime(2026, 3, 27, 10, tzinfo=UTC)) == datetime(2026, 3, 28, 8, tzinfo=UTC)
    assert nine_in_berlin.next_after(datetime(2026, 3, 28, 10, tzinfo=UTC)) == datetime(2026, 3, 29, 7, tzinfo=UTC)
    summer_nine = datetime(2026, 3, 29, 7, tzinfo=UTC)
    assert nine_in_berlin.latest_at_or_before(summer_nine) == summer_nine
    winter_nine = datetime(2026, 3, 28, 8, tzinfo=UTC)
    assert nine_in_berlin.latest_at_or_before(summer_nine - timedelta(minutes=1)) == winter_nine
    # A bare five-field expression is cron too
    assert Recurrence("*/15 * * * *", "UTC", T0).next_after(T0) == datetime(2026, 3, 1, 12, 15, tzinfo=UTC)


@pytest.mark.parametrize(("expression", "timezone", "says"), [
    ("rate(0 minutes)", "UTC", "at least 1"),
    ("rate(5 seconds)", "UTC", "rate(N minutes|hours|days)"),
    ("every day", "UTC", "five cron fields"),
    ("cron(0 9 * * * 2026)", "UTC", "five cron fields"),
    ("cron(61 * * * *)", "UTC", "not a valid cron expression"),
    ("cron(0 9 31 2 *)", "UTC", "not a valid cron expression"),
    ("cron(0 9 * * *)", "Mars/Olympus", "unknown time zone"),
    ("cron(0 9 * * *)", "../../etc/passwd", "unknown time zone"),
    ("cron(0 9 * * *)", "", "unknown time zone"),
])
def test_an_expression_or_time_zone_that_cannot_be_used_is_refused_with_a_reason(expression, timezone, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)").replace("|", r"\|")):
        Recurrence(expression, timezone, T0)


def test_names_and_occurrence_keys():
    assert name_problem("nightly-crawl.v2") is None
    for bad in ("", "-x", "a b", "a/b", "x" * 81, "é"):
        assert name_problem(bad) is not None
    assert occurrence_key("nightly", datetime(2026, 3, 1, 3, 0, tzinfo=UTC)) == "nightly@2026-03-01T03:00:00Z"
