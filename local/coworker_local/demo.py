"""The demo workload: a realistic mix of the example task types, submitted through the HTTP API,
followed in the terminal with a progress bar, and summed up at the end.

======================  ======  ===================================================================
type                    share   what it does
======================  ======  ===================================================================
``quick``               55 %    hashes its payload (milliseconds)
``slow``                15 %    sleeps 0.2-1.5 s (a download, a file)
``flaky``               22 %    fails with a system error 30 % of the time; retried with backoff
``always-fail``          8 %    a business failure every time: ignored at ``max_attempts``
======================  ======  ===================================================================

Each type is one batch (``demo-<run>-<type>``), so the dashboard shows four progress bars.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import requests
from coworker.engine import handlers

from coworker_local.api_client import ApiClient, ApiError, Unreachable
from coworker_local.client import Coworker, Submitted

if TYPE_CHECKING:
    from coworker_local.runtime import LocalRuntime

MIX = (("quick", 0.55), ("slow", 0.15), ("flaky", 0.22), ("always-fail", 0.08))
CHUNK = 250  # tasks per POST /tasks request (the API takes up to 1000)
REASONS = ("the order references an unknown product", "the card was declined",
           "the address cannot be geocoded")


def build_workload(count: int, run_id: str, seed: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """``count`` tasks as API request entries, grouped by batch id (one batch per type)."""
    rng = random.Random(seed)
    types = [name for name, _ in MIX]
    weights = [share for _, share in MIX]
    batches: dict[str, list[dict[str, Any]]] = {}
    for number in range(count):
        kind = rng.choices(types, weights)[0]
        task: dict[str, Any] = {"key": f"demo-{run_id}-{number:05d}", "type": kind}
        if kind == "quick":
            task["payload"] = {"order": number, "sku": f"SKU-{rng.randrange(10_000):04d}"}
        elif kind == "slow":
            task["payload"] = {"seconds": round(rng.uniform(0.2, 1.5), 2)}
        elif kind == "flaky":
            task["payload"] = {"failure_rate": 0.3}
        else:
            task["payload"] = {"reason": rng.choice(REASONS)}
            task["max_attempts"] = 3
        batches.setdefault(f"demo-{run_id}-{kind}", []).append(task)
    return batches


def submit(client: ApiClient, batches: dict[str, list[dict[str, Any]]]) -> int:
    """POST every batch in chunks, the types interleaved so the work arrives mixed. Returns the count."""
    chunks = {batch_id: [tasks[i:i + CHUNK] for i in range(0, len(tasks), CHUNK)]
              for batch_id, tasks in batches.items()}
    created = 0
    for round_ in range(max((len(c) for c in chunks.values()), default=0)):
        for batch_id, parts in chunks.items():
            if round_ < len(parts):
                created += post_tasks(client, batch_id, parts[round_]).created
    return created


def post_tasks(client: ApiClient, batch_id: str, tasks: list[dict[str, Any]]) -> Submitted:
    """One ``POST /tasks`` through the Python client, which re-sends it as the API advises (503: the
    batch's tasks are keyed, so a re-send stores only what is missing; 429: after backing off);
    :class:`SubmitError` once it gives up."""
    try:
        return Coworker(api=client).submit(tasks, batch_id=batch_id, chunk_size=len(tasks))
    except ApiError as exc:
        raise SubmitError(f"POST /tasks answered {exc.status}: {exc.message}") from None
    except Unreachable as exc:
        raise SubmitError(f"POST /tasks: {exc}") from None


class SubmitError(RuntimeError):
    """The API kept refusing the demo's tasks after every re-send it advises."""


@dataclasses.dataclass
class Progress:
    total: int
    finished: int
    ignored: int

    @property
    def done(self) -> int:
        return self.finished + self.ignored


def progress(base_url: str, batch_ids: list[str], session: requests.Session) -> Progress:
    """Sum of the batches' counters (``GET /batches/{id}``)."""
    total = finished = ignored = 0
    for batch_id in batch_ids:
        response = session.get(f"{base_url}/batches/{batch_id}", timeout=30)
        if response.status_code == 404:  # not submitted yet
            continue
        response.raise_for_status()
        body = response.json()
        total += body["total"]
        finished += body["finished"]
        ignored += body["ignored"]
    return Progress(total, finished, ignored)


def _bar(state: Progress, elapsed: float, size: int, width: int = 32) -> str:
    """The demo's progress against its whole size (not what has been submitted so far)."""
    share = min(1.0, state.done / size) if size else 0.0
    filled = int(share * width)
    rate = state.done / elapsed if elapsed > 0 else 0.0
    submitted = "" if state.total >= size else f"  submitted {state.total}"
    return (f"[{'#' * filled}{'.' * (width - filled)}] {state.done:>5}/{size} {share:6.1%}  "
            f"finished {state.finished}  ignored {state.ignored}{submitted}  {rate:5.1f} tasks/s  {elapsed:5.0f} s")


@dataclasses.dataclass
class Summary:
    total: int
    by_status: dict[str, int]
    complete: bool
    text: str


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def summarise(keys: set[str], started: float, ended: float) -> Summary:
    """Read the demo's tasks back (one scan of the local table) and tabulate them."""
    from coworker.data.models import TaskModel

    rows: dict[str, list[Any]] = collections.defaultdict(list)
    by_status: collections.Counter[str] = collections.Counter()
    attempts: collections.Counter[int] = collections.Counter()
    error_kinds: collections.Counter[str] = collections.Counter()
    durations: dict[str, list[float]] = collections.defaultdict(list)
    first_created: datetime | None = None
    last_done: datetime | None = None
    for task in TaskModel.scan(TaskModel.key.startswith("demo-")):
        if task.key not in keys:
            continue
        rows[task.task_type].append(task)
        by_status[task.status] += 1
        attempts[int(task.attempts)] += 1
        for error in task.errors or []:
            error_kinds[error.kind] += 1
        end = task.finished_at if task.status == "finished" else task.updated_at
        if task.status in ("finished", "ignored"):
            durations[task.task_type].append((end - task.created_at).total_seconds())
            last_done = max(last_done, end) if last_done else end
        first_created = min(first_created, task.created_at) if first_created else task.created_at

    lines = [f"{'type':<12} {'tasks':>6} {'finished':>9} {'ignored':>8} {'open':>5} {'avg attempts':>13} "
             f"{'p50 s':>7} {'p95 s':>7}"]
    all_durations: list[float] = []
    for kind, _ in MIX:
        tasks = rows.get(kind, [])
        if not tasks:
            continue
        counts = collections.Counter(t.status for t in tasks)
        spent = durations.get(kind, [])
        all_durations += spent
        lines.append(
            f"{kind:<12} {len(tasks):>6} {counts['finished']:>9} {counts['ignored']:>8} "
            f"{len(tasks) - counts['finished'] - counts['ignored']:>5} "
            f"{statistics.mean(int(t.attempts) for t in tasks):>13.2f} "
            f"{_percentile(spent, 0.5):>7.1f} {_percentile(spent, 0.95):>7.1f}")
    total = sum(by_status.values())
    terminal = by_status["finished"] + by_status["ignored"]
    lines.append(f"{'all':<12} {total:>6} {by_status['finished']:>9} {by_status['ignored']:>8} "
                 f"{total - terminal:>5} "
                 f"{(sum(k * v for k, v in attempts.items()) / total if total else 0):>13.2f} "
                 f"{_percentile(all_durations, 0.5):>7.1f} {_percentile(all_durations, 0.95):>7.1f}")
    span = (last_done - first_created).total_seconds() if last_done and first_created else 0.0
    lines += [
        "",
        "attempts per task: " + ", ".join(f"{n}: {c}" for n, c in sorted(attempts.items())),
        "errors recorded:   " + (", ".join(f"{k} {c}" for k, c in error_kinds.most_common()) or "none"),
        f"throughput:        {terminal / span if span else 0:.1f} tasks/s "
        f"({terminal} terminal tasks, first created to last finished {span:.1f} s; "
        f"{ended - started:.1f} s wall clock with submission)",
        "p50/p95: time from created_at to finished_at (ignored tasks: to when they were ignored)",
    ]
    return Summary(total=total, by_status=dict(by_status), complete=terminal == len(keys),
                   text="\n".join(lines))


def banner(runtime: LocalRuntime, log_path: Path) -> str:
    s = runtime.settings
    return "\n".join([
        "Coworker local runtime is up",
        f"  API         {runtime.url}   (OpenAPI: {runtime.url}/docs)",
        f"  Dashboard   {runtime.url}/dashboard",
        f"  DynamoDB    {runtime.database.describe() if runtime.database else s.dynamodb_endpoint}, "
        f"table {s.table_name}" + ("" if runtime.table_created else " (existing: tasks kept)"),
        f"  Workers     up to {runtime.max_invocations} processes, batch {s.batch_size}, "
        f"timeout {s.worker_timeout_seconds} s, lock {s.effective_lock_seconds} s",
        f"  Coordinator every {s.tick_seconds} s, at most {s.max_concurrency} tasks in flight, "
        f"{s.max_attempts} attempts, backoff {s.backoff_base_seconds}-{s.backoff_max_seconds} s",
        f"  Task types  {', '.join(handlers.registered_types()) or 'none'}"
        + (f"   (handlers: {runtime.handlers_dir})" if runtime.handlers_dir else ""),
        f"  Results     over {s.inline_result_bytes} bytes: "
        + (f"s3://{s.result_bucket}" if s.result_bucket else str(s.result_dir)),
        f"  Logs        {log_path}",
    ])


def run_demo(runtime: LocalRuntime, count: int, seed: int | None = None,
             stop: threading.Event | None = None, out: Any = None) -> Summary:
    """Submit ``count`` demo tasks over HTTP, show progress until all are terminal, print a summary."""
    out = out or sys.stdout
    stop = stop or threading.Event()
    run_id = uuid.uuid4().hex[:6]
    batches = build_workload(count, run_id, seed)
    keys = {task["key"] for tasks in batches.values() for task in tasks}
    runtime.batches.extend(batches)
    session = requests.Session()
    started = time.monotonic()
    print(f"\nDemo: submitting {count} tasks in {len(batches)} batches through POST /tasks ...",
          file=out, flush=True)
    # Submit in the background: the progress bar shows work starting while tasks still arrive.
    errors: list[BaseException] = []

    def submit_all() -> None:
        try:
            submit(ApiClient(runtime.url), batches)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    submitter = threading.Thread(target=submit_all, name="demo-submit", daemon=True)
    submitter.start()
    interactive = out.isatty() if hasattr(out, "isatty") else False
    last_print = 0.0
    state = Progress(0, 0, 0)
    while not stop.is_set():
        if errors:
            raise RuntimeError(f"submitting the demo failed: {errors[0]}") from errors[0]
        try:
            state = progress(runtime.url, list(batches), session)
        except requests.RequestException:
            pass  # a batch not created yet answers 404: keep polling
        except (KeyError, ValueError):
            pass
        elapsed = time.monotonic() - started
        if interactive:
            print("\r" + _bar(state, elapsed, len(keys)), end="", file=out, flush=True)
        elif elapsed - last_print >= 5:
            print(_bar(state, elapsed, len(keys)), file=out, flush=True)
            last_print = elapsed
        if not submitter.is_alive() and state.total >= len(keys) and state.done >= state.total:
            break
        stop.wait(0.5)
    ended = time.monotonic()
    print(("\r" if interactive else "") + _bar(state, ended - started, len(keys)), file=out, flush=True)
    summary = summarise(keys, started, ended)
    print("\nDemo summary\n" + summary.text + "\n", file=out, flush=True)
    return summary
