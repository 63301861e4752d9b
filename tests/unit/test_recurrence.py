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


def test_a_wall_clock_time_repeated_by_the_autumn_change_fires_once_at_its_first_pass():
    # Berlin, 31 October 2027: 03:00 CEST goes back to 02:00 CET at 01:00 UTC, so 02:30 happens at
    # 00:30 UTC (summer time) and again at 01:30 UTC (winter time): the first counts, once.
    nightly = Recurrence("cron(30 2 * * *)", "Europe/Berlin", T0)
    first = datetime(2027, 10, 31, 0, 30, tzinfo=UTC)
    assert nightly.next_after(datetime(2027, 10, 30, 12, tzinfo=UTC)) == first
    assert nightly.next_after(first) == datetime(2027, 11, 1, 1, 30, tzinfo=UTC)
    assert nightly.next_after(datetime(2027, 10, 31, 1, 10, tzinfo=UTC)) == datetime(2027, 11, 1, 1, 30, tzinfo=UTC)
    for moment in (datetime(2027, 10, 31, 1, 30, tzinfo=UTC), datetime(2027, 10, 31, 1, 45, tzinfo=UTC),
                   datetime(2027, 10, 31, 12, tzinfo=UTC), first):
        assert nightly.latest_at_or_before(moment) == first, moment
    assert nightly.latest_at_or_before(first - timedelta(seconds=1)) == datetime(2027, 10, 30, 0, 30, tzinfo=UTC)


def test_a_wall_clock_time_skipped_by_the_spring_change_fires_once_at_the_first_instant_after_the_gap():
    # Berlin, 28 March 2027: 02:00 CET jumps to 03:00 CEST at 01:00 UTC; 02:30 does not happen that
    # day, so it fires at 03:00 CEST (01:00 UTC), as cron does. Times in the gap fire as one.
    nightly = Recurrence("cron(30 2 * * *)", "Europe/Berlin", T0)
    after_gap = datetime(2027, 3, 28, 1, 0, tzinfo=UTC)
    assert nightly.next_after(datetime(2027, 3, 27, 12, tzinfo=UTC)) == after_gap
    assert nightly.next_after(after_gap) == datetime(2027, 3, 29, 0, 30, tzinfo=UTC)
    assert nightly.latest_at_or_before(after_gap) == after_gap
    assert nightly.latest_at_or_before(after_gap - timedelta(seconds=1)) == datetime(2027, 3, 27, 1, 30, tzinfo=UTC)
    quarterly = Recurrence("cron(*/15 2 * * *)", "Europe/Berlin", T0)
    assert quarterly.next_after(datetime(2027, 3, 27, 12, tzinfo=UTC)) == after_gap
    assert quarterly.next_after(after_gap) == datetime(2027, 3, 29, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("expression", "timezone", "says"), [
    ("rate(\uff15 minutes)", "UTC", "ASCII"),  # a fullwidth 5
    ("rate(\u0663 hours)", "UTC", "ASCII"),  # an Arabic-Indic 3
    ("cron(\u0663 9 * * *)", "UTC", "ASCII"),
    ("cron(0\u30009 * * *)", "UTC", "ASCII"),  # an ideographic space between fields
    ("cron(0 9 * * *)", "localtime", "unknown time zone"),
    ("cron(0 9 * * *)", "posixrules", "unknown time zone"),
])
def test_only_ascii_expressions_and_real_iana_zone_names_are_taken(expression, timezone, says):
    with pytest.raises(ValueError, match=says):
        Recurrence(expression, timezone, T0)
