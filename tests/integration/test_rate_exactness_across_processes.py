"""A rate limit is exact across processes: a process that starts from an older view of a group's
start log cannot add a start beyond the limit, because every token's write is conditional on the
log's version it read (issue 52, item 5).

Threads of one process take turns on a group and share the log they cached, so only a second
process, with its own older view of the log, can tell whether that condition is there:

    process A   takes a token      log v1 [a1]       A keeps v1 [a1]
    process B   reads, takes one   log v2 [a1, b1]   (the limit, 2, is reached)
    process A   takes from v1 [a1]: one start seen, room for one more
                  with the condition:    refused (v2 is not v1), reads v2, no room: turned away
                  without it:            written: a third start in the window
"""

from __future__ import annotations

import pytest
from coworker.data.models import utcnow
from coworker.engine import rates
from coworker.engine.control import Rate

from tests.support.rate_races import take_in_a_second_process

# Long enough that no window closes while the test runs, however busy the machine.
RATE = Rate(2, 600_000)

def _take(group: rates.RateGroup) -> int | None:
    tokens, _, _ = rates.admit([group], now=utcnow())
    return tokens[0].stamp if tokens else None


@pytest.mark.parametrize("condition", ["kept", "dropped"])
def test_a_process_with_an_older_view_of_the_log_cannot_start_beyond_the_limit(settings, monkeypatch, condition):
    group = rates.RateGroup(f"key:cross-process-{condition}", RATE)
    if condition == "dropped":  # what the write would be without its version condition
        monkeypatch.setattr(rates, "_version_is", lambda version: None)

    # Given this process took a token and keeps the log it wrote
    first = _take(group)
    assert first is not None
    # and another process then took the group's last free one
    second = take_in_a_second_process(settings, group)
    assert second is not None, "the second process was refused a token while one was free"
    seen, stored = rates._recall(group.gate_key), rates.read_log(group.name)
    assert seen is not None and stored is not None
    assert (seen.version, stored.version, len(stored.starts)) == (1, 2, RATE.limit)  # this process's view is older

    # When this process takes another token from its older view
    third = _take(group)

    # Then, with the version condition, it is turned away: at most the limit in the window
    if condition == "kept":
        assert third is None, "a third start was admitted in one window of a limit of 2"
        assert len(rates.read_log(group.name).starts) == RATE.limit
    else:  # without it, a third start passes in the same window: the condition is what prevents it
        assert third is not None
        assert max(first, second, third) - min(first, second, third) < RATE.interval_ms
