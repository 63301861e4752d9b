"""Helpers of the rate-limit tests: a token taken in a second process, and the most starts in a window."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from coworker.engine import rates

# The second process: its own interpreter, so its own view of the log (none cached: it reads the
# head and its chunks). It takes one token and prints its stamp, or null when refused.
SECOND_PROCESS = """
import json, sys
from coworker.bootstrap import configure
from coworker.config import Settings
from coworker.engine import rates
from coworker.engine.control import Rate

configure(Settings.from_env())
group = rates.RateGroup(sys.argv[1], Rate(int(sys.argv[2]), int(sys.argv[3])))
tokens, _, _ = rates.admit([group])
print(json.dumps(tokens[0].stamp if tokens else None))
"""


def take_in_a_second_process(settings, group: rates.RateGroup) -> int | None:
    """The stamp of the token a second process took of ``group``, or ``None`` if it was refused."""
    env = {**os.environ, **settings.as_environment(), "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", SECOND_PROCESS, group.name, str(group.rate.limit),
                           str(group.rate.interval_ms)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def most_in_a_window(stamps: list[int], interval_ms: int) -> int:
    """The most stamps (epoch ms) in any half-open window (t - interval, t]."""
    stamps = sorted(stamps)
    most, first = 0, 0
    for last, stamp in enumerate(stamps):
        while stamps[first] <= stamp - interval_ms:
            first += 1
        most = max(most, last - first + 1)
    return most
