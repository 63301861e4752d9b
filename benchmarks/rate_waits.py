"""Where rate-limited tasks spend their time when writes are slow (issue 52, item 1's repro).

    .venv/bin/python benchmarks/rate_waits.py [--tasks 20] [--limit 2] [--slow-share 0.33]
                                              [--slow-seconds 5] [--seconds 120] [--db moto]

One worker invocation (10 threads, a self-feeding slot, the local runtime's 10-s lock) runs
``--tasks`` tasks of one rate key at ``--limit`` starts per second and as many free tasks, on an
embedded database, while a share of all writes is held for a random time up to
``--slow-seconds`` (as ``benchmarks/chaos.py`` does through its proxy, and as a loaded machine's
database does). It prints, from the handlers' own start times and the engine's calls:

* the rate reached against the limit, and the time from creation to first start;
* thread-seconds spent waiting for this process's turn at the group's start log (one writer per
  group at a time: every waiting thread holds a claim meanwhile), and in token writes;
* start attempts whose token write came back past its stamp (the token is given back, or wasted
  when another start was stamped after it, and taken again; after four, the task is booked behind
  every waiter);
* claims per rate-limited task, and every warning by its text, and what the tasks ended as;
* lock warnings (a lock that could not be extended, a claim lost) per task, rate-limited
  against free;
* for the tasks turned away with a booked start, the time from that booked start (the last one
  booked) to their handler's start: p50, p95 and the most.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import random
import statistics
import threading
import time

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.data import writes  # noqa: E402
from coworker.engine import lifecycle, rates, slots, submit, worker  # noqa: E402
from coworker.engine.handlers import task_handler  # noqa: E402
from coworker.engine.tasks import TaskSpec  # noqa: E402
from coworker.engine.worker import WorkerRequest  # noqa: E402
from coworker_local.database import create_table, embedded_database  # noqa: E402

_started: dict[str, float] = {}
_claims: collections.Counter[str] = collections.Counter()
_warnings: collections.Counter[str] = collections.Counter()
_lock_warnings: collections.Counter[str] = collections.Counter()  # "rated" / "free" -> lock warnings
_spent: collections.Counter[str] = collections.Counter()
_booked: dict[str, float] = {}  # key -> the start last booked for it (epoch s)
_guard = threading.Lock()


@task_handler("bench-rate-wait")
def _handler(payload, context):
    with _guard:
        _started.setdefault(context.key, time.time())
    time.sleep(0.2)
    return {}


class _Warnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            key = str(getattr(record, "task_key", ""))
            with _guard:
                _warnings[record.getMessage()] += 1
                if key and ("lock could not be extended" in record.getMessage() or "claim lost" in record.getMessage()):
                    _lock_warnings["rated" if key.startswith("rated-") else "free"] += 1


class _TimedTurn:
    """The group's turn lock, with the time spent waiting for it and holding it."""

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        asked = time.monotonic()
        self.lock.acquire()
        self.held = time.monotonic()
        with _guard:
            _spent["waiting for the group's turn"] += self.held - asked

    def __exit__(self, *exc) -> None:
        with _guard:
            _spent["holding the turn (token writes)"] += time.monotonic() - self.held
        self.lock.release()


def _instrument(share: float, slowest: float, chance: random.Random) -> None:
    update, claim, turn, start_on = writes.update, lifecycle.claim, rates._turn, rates.start_on
    take_rate_tokens = worker._take_rate_tokens

    def slow_update(item, *args, **kwargs):
        if chance.random() < share:
            time.sleep(chance.uniform(0, slowest))
        return update(item, *args, **kwargs)

    def counted_claim(key, *args, **kwargs):
        taken = claim(key, *args, **kwargs)
        if taken is not None:
            with _guard:
                _claims[key] += 1
        return taken

    def timed_start_on(tokens):
        on_time = start_on(tokens)
        with _guard:
            _spent["start attempts"] += 1
            _spent["token writes back past their stamp"] += not on_time
        return on_time

    def booking_noted(claim, *args, **kwargs):
        turned_away, retry_at = take_rate_tokens(claim, *args, **kwargs)
        if retry_at is not None:
            with _guard:
                _booked[claim.key] = retry_at.timestamp()
        return turned_away, retry_at

    writes.update = slow_update
    worker._take_rate_tokens = booking_noted
    lifecycle.claim = counted_claim
    rates._turn = lambda key: _TimedTurn(turn(key))
    rates.start_on = timed_start_on
    log = logging.getLogger("coworker")  # the library's warnings, counted here rather than printed
    log.setLevel(logging.WARNING)
    for handler in log.handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(open(os.devnull, "w"))  # noqa: SIM115 - for the life of the process
    log.addHandler(_Warnings())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20)
    parser.add_argument("--limit", type=int, default=2, help="starts per second of the key")
    parser.add_argument("--slow-share", type=float, default=0.33)
    parser.add_argument("--slow-seconds", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=120.0, help="the invocation's time")
    parser.add_argument("--db", default="moto", choices=("moto", "dynamodb-local"))
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()

    database = embedded_database(options.db).start()
    try:
        settings = Settings(table_name="rate-waits", dynamodb_endpoint=database.endpoint, lock_seconds=10,
                            batch_size=10, max_concurrency=10, backoff_base_seconds=0, backoff_max_seconds=0)
        create_table(settings)
        configure(settings)
        slots.ensure_slots(settings.worker_slots)
        created = {}
        for number in range(options.tasks):
            key = f"rated-{number:03d}"
            submit.put_task(TaskSpec(key=key, type="bench-rate-wait", payload={}, rate_key="bench.example",
                                     rate_limit=options.limit, rate_interval_seconds=1), settings)
            created[key] = time.time()
            submit.put_task(TaskSpec(key=f"free-{number:03d}", type="bench-rate-wait", payload={}), settings)
        _instrument(options.slow_share, options.slow_seconds, random.Random(options.seed))
        slot, token = slots.free_slots(settings.worker_slots, 1)[0], slots.new_token()
        assert slots.reserve(slot, token, settings.reservation_seconds)
        worker.Invocation(WorkerRequest((), slot, token), "bench", settings, time.monotonic() + options.seconds).run()

        starts = sorted(_started[key] for key in created if key in _started)
        waits = [_started[key] - created[key] for key in created if key in _started]
        print(f"rate-limited tasks started: {len(starts)} of {len(created)}")
        if len(starts) > 1:
            reached = (len(starts) - 1) / (starts[-1] - starts[0])
            print(f"rate reached: {reached:.2f} starts/s of {options.limit} ({reached / options.limit:.0%})")
        if waits:
            print(f"creation to first start: median {statistics.median(waits):.1f} s, most {max(waits):.1f} s")
        for what, amount in _spent.items():
            print(f"{what}: {amount:.1f}" + (" thread-seconds" if "turn" in what else ""))
        print("claims per rate-limited task:", sorted(_claims[key] for key in created))
        late = sorted(_started[key] - _booked[key] for key in _booked if key in _started)
        if late:
            p95 = late[min(len(late) - 1, round(0.95 * (len(late) - 1)))]
            print(f"booked start to handler start ({len(late)} tasks booked): p50 {statistics.median(late):.2f} s, "
                  f"p95 {p95:.2f} s, most {late[-1]:.2f} s")
        statuses = collections.Counter(lifecycle.get_task(key).status for key in created)
        print("rate-limited tasks now:", dict(statuses))
        print(f"lock warnings per task (could not be extended, claim lost): rate-limited "
              f"{_lock_warnings['rated'] / options.tasks:.2f}, free {_lock_warnings['free'] / options.tasks:.2f}")
        for message, count in _warnings.most_common():
            print(f"warning x{count}: {message}")
    finally:
        database.stop()


if __name__ == "__main__":
    main()
