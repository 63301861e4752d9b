"""The demo's progress bar measures the whole demo, not what has been submitted so far."""

from __future__ import annotations

from coworker_local.demo import Progress, _bar


def test_the_bar_counts_against_the_demos_size_while_tasks_still_arrive() -> None:
    # 731 of 902 submitted tasks ended, out of a 2,000-task demo: 36.6 %, not 81 %
    line = _bar(Progress(total=902, finished=700, ignored=31), elapsed=36, size=2000)
    assert "731/2000" in line and "36.5%" in line and "submitted 902" in line
    # before any count arrives it still shows the size, and once all are in, no "submitted"
    assert "0/2000   0.0%" in _bar(Progress(0, 0, 0), elapsed=5, size=2000)
    assert "submitted" not in _bar(Progress(2000, 1990, 10), elapsed=60, size=2000)
