"""Rate limits under competing workers: the most starts of one key in any window of its interval,
whether other keys keep their speed, and the write units a rate-limited task costs.

    .venv/bin/python benchmarks/rates.py [--limited 120] [--free 600] [--seconds 0.2]

One DynamoDB Local. **Exactness** (a): two local runtimes (each an API, a coordinator and worker
processes, as ``python -m coworker_local`` runs them), each with 10 worker threads, so 20
threads in 2 processes race for the same tasks. The tasks are ``bench-sleep`` (``--seconds``
each) whose result is the time the handler started:

* key ``a.example``: 5 starts per 1 s (``--limited`` tasks);
* key ``b.example``: 2 starts per 0.25 s (``--limited`` tasks);
* ``--free`` tasks with no rate key, put with them.

Measured from the handlers' own start times (not the tokens' stamps): the most starts of each key
in any window of its interval (half-open, so a start exactly one interval after another is in the
next window), the rate each key reached, and how long the free tasks took, against the same free
tasks beside the same work without rate keys, run first by the same runtimes (a ratio: the
machine is noisy).

**Cost** (b): in process, with every request metered (``coworker_local.capacity``: DynamoDB
Local's own consumed capacity, and the documented rules where it is silent, for failed
conditional writes), 40 tasks of one key put at once, run by two invocations of 10 threads, and 40
free tasks beside them: write units per rate-limited task (its own item's writes and its group's
start log) against a free task's; once at 1,000 per second (none waits), once at 10 (30 wait).

**The start log's own cost** (c; ``--only log``): one thread takes N starts of one group (a log
as long as it gets), then 200 more, one write each, metered: the largest head item written and
the write units per start (DynamoDB Local's reported figure, and the rules'), at N = 10, 100
and 1,000. Above 100 starts per interval the head keeps only its newest starts and seals the
older into chunk items (``coworker.engine.rates``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import time
from datetime import timedelta

os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")

from coworker.bootstrap import configure  # noqa: E402
from coworker.config import Settings  # noqa: E402
from coworker.data import connection  # noqa: E402
from coworker.data.layout import RATE_GATE_PREFIX  # noqa: E402
from coworker.data.models import LeaseModel, RateChunkModel, RateGateModel, TaskModel, utcnow  # noqa: E402
from coworker.engine import dispatch, rates, slots, submit  # noqa: E402
from coworker.engine.control import Rate  # noqa: E402
from coworker.engine.outcomes import TaskOutcome  # noqa: E402
from coworker.engine.tasks import TaskSpec  # noqa: E402
from coworker.observability import metrics  # noqa: E402
from coworker_local.api_client import ApiClient  # noqa: E402
from coworker_local.capacity import CapacityMeter, item_size  # noqa: E402
from coworker_local.database import create_table, dynamodb_client, start_database  # noqa: E402
from system import Runtime  # noqa: E402

TABLE = "rates-bench"
KEYS = {"a.example": (5, 1.0), "b.example": (2, 0.25)}  # rate key -> (starts, per seconds)
THREADS_PER_RUNTIME = 10


def most_in_a_window(starts: list[float], interval: float) -> int:
    """The most of ``starts`` (seconds) in any half-open window of ``interval``."""
    ordered, most, first = sorted(starts), 0, 0
    for last, start in enumerate(ordered):
        while ordered[first] <= start - interval:
            first += 1
        most = max(most, last - first + 1)
    return most


def start_runtime(endpoint: str) -> Runtime:
    return Runtime(endpoint, env={"COWORKER_TABLE_NAME": TABLE, "COWORKER_HANDLER_MODULES": "bench_handlers",
                                  "COWORKER_BATCH_SIZE": str(THREADS_PER_RUNTIME),
                                  "COWORKER_MAX_CONCURRENCY": str(THREADS_PER_RUNTIME)},
                   args=("--prewarm-workers", "1"))


def put_all(api: ApiClient, tasks: list[dict]) -> None:
    for first in range(0, len(tasks), 500):
        api.request("POST", "/tasks", body={"tasks": tasks[first:first + 500]})


def wait_finished(keys: list[str], limit_seconds: float) -> dict[str, TaskModel]:
    deadline = time.monotonic() + limit_seconds
    while True:
        found = {task.key: task for task in TaskModel.batch_get(keys)}
        if all(task.status in ("finished", "ignored") for task in found.values()) and len(found) == len(keys):
            return found
        if time.monotonic() > deadline:
            open_ = sum(task.status not in ("finished", "ignored") for task in found.values())
            raise RuntimeError(f"{open_} tasks still open after {limit_seconds:g} s")
        time.sleep(0.5)


def span(tasks: list[TaskModel]) -> float:
    started = min(float(task.result["started_at"]) for task in tasks)
    return max(task.finished_at.timestamp() for task in tasks) - started


def exactness(endpoint: str, limited: int, free: int, seconds: float) -> None:
    runtimes = [start_runtime(endpoint), start_runtime(endpoint)]
    try:
        assert runtimes[0].url is not None
        api = ApiClient(runtimes[0].url)
        sleep = {"seconds": seconds}

        def workload(run: str, rated: bool) -> list[dict]:
            tasks = [{"key": f"{run}-free-{i:05d}", "type": "bench-sleep", "payload": sleep} for i in range(free)]
            for key, (limit, per) in KEYS.items():
                rate = {"rate_key": key, "rate_limit": limit, "rate_interval_seconds": per} if rated else {}
                tasks += [{"key": f"{run}-{key}-{i:05d}", "type": "bench-sleep", "payload": sleep, **rate}
                          for i in range(limited)]
            # interleaved, as a crawl's pages of several sites arrive
            return sorted(tasks, key=lambda task: task["key"].rsplit("-", 1)[1])

        loads = [os.getloadavg()[0]]
        # the same work without rate keys first: what the free tasks take beside it
        unlimited = workload("plain", rated=False)
        put_all(api, unlimited)
        done_plain = wait_finished([t["key"] for t in unlimited], 900)
        loads.append(os.getloadavg()[0])
        tasks = workload("rated", rated=True)
        put_all(api, tasks)
        done = wait_finished([t["key"] for t in tasks], 1200)
        loads.append(os.getloadavg()[0])
    finally:
        for runtime in runtimes:
            runtime.stop()

    print(f"a) 2 runtimes x {THREADS_PER_RUNTIME} worker threads on one DynamoDB Local; tasks of "
          f"{seconds:g} s; load {min(loads):.1f}-{max(loads):.1f}")
    ok = True
    for key, (limit, per) in KEYS.items():
        mine = [task for task in done.values() if task.key.startswith(f"rated-{key}")]
        starts = [float(task.result["started_at"]) for task in mine if task.result]
        most = most_in_a_window(starts, per)
        reached = (len(starts) - 1) / (max(starts) - min(starts)) if len(starts) > 1 else 0.0
        attempts = collections.Counter(int(task.attempts) for task in mine)
        print(f"   {key}: limit {limit} per {per:g} s; {len(starts)} started; most in any {per:g}-s window: "
              f"{most}; reached {reached * per:.2f} starts per {per:g} s ({reached / (limit / per):.0%} of the "
              f"limit); attempts {dict(attempts)}")
        for task in mine:
            if int(task.attempts) > 1:  # why an attempt was repeated, as recorded
                print(f"      {task.key}: attempts {int(task.attempts)}: "
                      + "; ".join(f"{e.kind}: {e.message}" for e in task.errors or ()))
        ok &= most <= limit and len(starts) == limited
    def free_span(finished: dict[str, TaskModel]) -> float:
        return span([task for key, task in finished.items() if "-free-" in key])

    plain_span, rated_span = free_span(done_plain), free_span(done)
    print(f"   {free} free tasks: {plain_span:.1f} s beside {limited * len(KEYS)} tasks of the same work without "
          f"rate keys, {rated_span:.1f} s beside them rate-limited (ratio {plain_span / rated_span:.2f}; above 1: "
          f"faster); the rate-limited keys need at least "
          f"{max(limited / (limit / per) for limit, per in KEYS.values()):.0f} s by their limits")
    print(f"   exact: {'yes' if ok else 'NO'}")


def cost(endpoint: str, limit: int) -> None:
    settings = Settings(table_name=f"{TABLE}-cost-{limit}", dynamodb_endpoint=endpoint, dispatch_on_submit=False,
                        max_concurrency=2 * THREADS_PER_RUNTIME, batch_size=THREADS_PER_RUNTIME)
    create_table(settings)
    configure(settings)
    slots.ensure_slots(settings.worker_slots)
    meter = CapacityMeter.for_model(TaskModel, dynamodb_client(settings), connection.transaction_connection(),
                                    LeaseModel._get_connection().connection,
                                    RateGateModel._get_connection().connection).attach()
    now = utcnow() - timedelta(seconds=5)
    count = 40
    for i in range(count):
        submit.put_task(TaskSpec(key=f"limited-{i:03d}", type="quick", rate_key="api.example", rate_limit=limit,
                                 rate_interval_seconds=1.0), settings, now=now)
        submit.put_task(TaskSpec(key=f"free-{i:03d}", type="quick"), settings, now=now)
    invoker = dispatch.InProcessInvoker(settings)
    outcomes: collections.Counter[TaskOutcome] = collections.Counter()
    emf_sink = open(os.devnull, "w")  # noqa: SIM115 - Powertools prints EMF every 100 metrics
    for _ in range(100):
        if outcomes[TaskOutcome.FINISHED] >= 2 * count:
            break
        with contextlib.redirect_stdout(emf_sink):
            dispatch.tick(settings, invoker)
            # the invocations feed themselves, and hold their deferred keys, until nothing is due
            outcomes.update(report.outcome for report in invoker.wait())
        metrics.clear_metrics()
    invoker.shutdown()
    meter.detach()
    by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for record in meter.writes:
        key = (record.new or record.old or {}).get("key", {}).get("S", "")
        kind = ("start log" if key.startswith(RATE_GATE_PREFIX) else "limited task" if key.startswith("limited-")
                else "free task" if key.startswith("free-") else "other (slots, lease)")
        if not record.succeeded:
            kind += " (condition failed)"
        reported = record.reported.units if record.reported is not None else record.table_units + record.index_units
        by_kind[kind][0] += 1
        by_kind[kind][1] += reported
    print(f"b) cost: {count} tasks of one key at {limit} per 1 s and {count} free tasks, 2 invocations x "
          f"{THREADS_PER_RUNTIME} threads; outcomes {dict((o.value, n) for o, n in outcomes.items())}")
    for kind, (writes, units) in sorted(by_kind.items()):
        print(f"   {kind:40s} {int(writes):5d} writes {units:8.1f} write units")
    for kind in ("limited task", "start log", "free task"):  # a failed conditional write is billed too
        by_kind[kind][1] += by_kind[f"{kind} (condition failed)"][1]
    limited_units = by_kind["limited task"][1] + by_kind["start log"][1]
    free_units = by_kind["free task"][1]
    print(f"   write units per rate-limited task: {limited_units / count:.2f} "
          f"(its item {by_kind['limited task'][1] / count:.2f} + start log {by_kind['start log'][1] / count:.2f}); "
          f"per free task: {free_units / count:.2f}; "
          f"deferrals per rate-limited task: {outcomes[TaskOutcome.DEFERRED] / count:.2f}")


def log_cost(endpoint: str, limit: int, metered: int = 200) -> None:
    settings = Settings(table_name=f"{TABLE}-log-{limit}", dynamodb_endpoint=endpoint)
    create_table(settings)
    configure(settings)
    # A 10-ms interval: starts beyond the limit are let in at once (a log keeps its last N, old or not).
    group = rates.RateGroup("key:api.example", Rate(limit, 10))

    def start(count: int) -> None:
        for _ in range(count):
            while not rates.admit([group])[0]:
                time.sleep(0.01)

    start(limit)
    with CapacityMeter.for_model(RateGateModel, dynamodb_client(settings),
                                 RateChunkModel._get_connection().connection) as meter:
        start(metered)
    logs = [record for record in meter.writes if (record.new or record.old or {}).get("key", {}).get("S", "")
            .startswith(RATE_GATE_PREFIX)]
    largest = max(max(item_size(record.old), item_size(record.new)) for record in logs)
    rules = sum(record.table_units for record in meter.writes)
    reported = sum(record.reported.table_units for record in meter.writes if record.reported is not None)
    print(f"c) start log at {limit:5d} per interval: {len(meter.writes)} writes for {metered} starts "
          f"({len(meter.writes) - len(logs)} chunks sealed); largest head {largest} bytes; write units per start "
          f"{reported / metered:.3f} reported, {rules / metered:.3f} by the rules")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limited", type=int, default=120, help="tasks per rate-limited key")
    parser.add_argument("--free", type=int, default=600, help="tasks without a rate key")
    parser.add_argument("--seconds", type=float, default=0.2, help="each task's handler time")
    parser.add_argument("--only", choices=["exactness", "cost", "log"])
    args = parser.parse_args(argv)
    database = start_database("dynamodb-local")
    try:
        settings = Settings(table_name=TABLE, dynamodb_endpoint=database.endpoint)
        create_table(settings)
        configure(settings)
        if args.only in (None, "exactness"):
            exactness(database.endpoint, args.limited, args.free, args.seconds)
        if args.only in (None, "cost"):
            cost(database.endpoint, 1000)  # under the rate: no task waits
            cost(database.endpoint, 10)  # 40 at once at 10 a second: 30 must wait
        if args.only in (None, "log"):
            for limit in (10, 100, 1000):
                log_cost(database.endpoint, limit)
    finally:
        database.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
