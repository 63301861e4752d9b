"""How long the coordinator's ticks take while writes are held (issue 52), in one run.

    .venv/bin/python benchmarks/slow_ticks.py [--tasks 3000] [--batches 50] [--slow-share 0.3]
                                              [--slow-seconds 6] [--phase-seconds 20] [--spare slot#]

A supervisor (1-s ticks, 6 worker slots of 5 threads, workers run in this process, each task
sleeping 1 s) drains batch tasks from DynamoDB Local: first for ``--phase-seconds`` with every
write passing at once, then as long with ``--slow-share`` of the writes (every thread's: the
workers', the ticks', the batch counting's) held for a random time up to ``--slow-seconds``, as a
throttled table would. It prints each phase's tick durations (p50, p95, max) and the tasks that ended in
it, and the handlers running (of the 30 threads) over time. Figures, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import botocore.client

BENCHMARKS_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS_DIR))
from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.data.models import TaskModel, utcnow  # noqa: E402
from coworker.engine import batches, dispatch, lifecycle, slots  # noqa: E402
from coworker.engine.handlers import TaskContext, task_handler  # noqa: E402
from coworker.engine.tasks import TaskSpec  # noqa: E402
from coworker_local.database import create_table  # noqa: E402
from system import start_database  # noqa: E402

_running = 0  # handlers running now, in all of this process's workers
_running_lock = threading.Lock()


@task_handler("slow-ticks-sleep")
def _sleep(payload: dict | None, context: TaskContext) -> dict:
    """Sleep ``seconds`` (1 by default), counted among the handlers running."""
    global _running
    with _running_lock:
        _running += 1
    try:
        time.sleep(float((payload or {}).get("seconds", 1.0)))
    finally:
        with _running_lock:
            _running -= 1
    return {}

WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})


def percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def _tenths(samples: Sequence[int]) -> str:
    """The mean of each tenth of ``samples``, in order (how busy the threads were over time)."""
    size = max(1, len(samples) // 10)
    return " ".join(f"{statistics.fmean(samples[i:i + size]):.0f}" for i in range(0, size * 10, size)
                    if samples[i:i + size])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000,
                        help="enough that the second phase does not run out of work (1,500 did with 40-s phases)")
    parser.add_argument("--batches", type=int, default=50, help="batches the tasks are spread over")
    parser.add_argument("--slow-share", type=float, default=0.3)
    parser.add_argument("--slow-seconds", type=float, default=6.0)
    parser.add_argument("--phase-seconds", type=float, default=20.0)
    parser.add_argument("--spare", default="", metavar="PREFIX",
                        help="hold no write to a key starting with PREFIX (slot#: the slots' reservations, "
                             "acquisitions and heartbeats; lease#: the coordinator's lease), to see what a "
                             "held tick waits on")
    args = parser.parse_args(argv)
    database = start_database("dynamodb-local")
    try:
        settings = Settings(table_name=f"slow-ticks-{uuid.uuid4().hex[:8]}", dynamodb_endpoint=database.endpoint,
                            tick_seconds=1.0, idle_exit=False, max_concurrency=30, batch_size=5,
                            worker_timeout_seconds=30, lock_seconds=10, reservation_seconds=10,
                            dispatch_on_submit=False)
        create_table(settings)
        configure(settings)
        slots.ensure_slots(settings.worker_slots)
        now = utcnow()
        for number in range(args.batches):
            batch_id = f"b{number:03d}"
            tasks = [lifecycle.new_task(TaskSpec(key=f"{batch_id}-{i:04d}", type="slow-ticks-sleep", batch_id=batch_id,
                                                 payload={"seconds": 1.0}),
                                        settings, now) for i in range(args.tasks // args.batches)]
            batches.put_tasks(tasks, batch_id)

        held = threading.Event()
        chance = random.Random(1)
        chance_lock = threading.Lock()
        real_call = botocore.client.BaseClient._make_api_call

        def slow_writes(client: object, operation: str, params: dict) -> object:
            key = params.get("Key", params.get("Item", {})).get("key", {}).get("S", "")
            if held.is_set() and operation in WRITES and not (args.spare and key.startswith(args.spare)):
                with chance_lock:
                    pause = chance.uniform(0, args.slow_seconds) if chance.random() < args.slow_share else 0.0
                time.sleep(pause)
            return real_call(client, operation, params)

        botocore.client.BaseClient._make_api_call = slow_writes  # type: ignore[method-assign]
        durations: dict[bool, list[float]] = {False: [], True: []}
        busy: dict[bool, list[int]] = {False: [], True: []}  # handlers running, sampled twice a second
        real_tick = dispatch.tick

        def timed_tick(*a: object, **kw: object) -> dispatch.TickReport:
            phase, began = held.is_set(), time.monotonic()
            try:
                return real_tick(*a, **kw)  # type: ignore[arg-type]
            finally:
                durations[phase].append(time.monotonic() - began)

        dispatch.tick = timed_tick  # type: ignore[assignment]
        invoker = dispatch.InProcessInvoker(settings)
        stop = threading.Event()
        run = threading.Thread(target=dispatch.Supervisor(settings, invoker).run, args=(lambda: 3600.0, stop))

        def ended() -> int:
            return sum(1 for _ in TaskModel.scan(TaskModel.status == "finished", attributes_to_get=["key"]))

        def sample() -> None:
            while not stop.wait(0.5):
                busy[held.is_set()].append(_running)

        run.start()
        threading.Thread(target=sample, daemon=True).start()
        time.sleep(args.phase_seconds)
        ended_fast = ended()
        held.set()
        time.sleep(args.phase_seconds)
        ended_slow = ended() - ended_fast
        stop.set()
        run.join()
        held.clear()
        invoker.shutdown()
    finally:
        database.stop()
    print(f"slow ticks: {args.tasks} 1-s tasks in {args.batches} batches, 1-s ticks, 6 slots of 5 threads, "
          f"{args.phase_seconds:g} s a phase")
    spared = f" (none to {args.spare}*)" if args.spare else ""
    for phase, name in ((False, "writes pass at once"), (True, f"{args.slow_share:.0%} of writes held up to "
                                                                f"{args.slow_seconds:g} s{spared}")):
        values = durations[phase]
        print(f"  {name}: {len(values)} ticks, duration p50 {statistics.median(values) if values else 0:.2f} s, "
              f"p95 {percentile(values, 0.95):.2f} s, max {max(values, default=0):.2f} s; "
              f"tasks finished {ended_slow if phase else ended_fast}; handlers running of 30: "
              f"mean {statistics.fmean(busy[phase]) if busy[phase] else 0:.1f}, "
              f"by tenths of the phase {_tenths(busy[phase])}")
    if ended_fast + ended_slow >= args.tasks:
        print("  (every task finished: the second phase ran out of work and its figure is a floor; raise --tasks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
