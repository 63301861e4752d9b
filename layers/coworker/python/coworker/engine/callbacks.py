"""Batch callbacks (fan-in) and batch events, each fired exactly once per batch.

A batch may name a callback task for each of three events (``POST /tasks`` with ``callbacks``)::

    complete   every task of the batch is finished or ignored, and counted: the batch is done
    success    done with no task ignored and not stopped (also later: after a redrive ends well)
    stopped    the batch stopped at its failure threshold (its open tasks are then cancelled,
               so ``complete`` follows)

The callback is an ordinary task, put under the key ``<batch id>~<event>`` with the payload
``{"event": ..., "batch": <the batch's counts, as GET /batches/{id} answers>, "payload": <the
payload named>}``. Its handler reads its batch's results by key (:func:`read_results`); the
ignored ones are listed with ``GET /tasks?status=ignored&batch_id=...``.

**Exactly once.** A batch with callbacks (or every batch, when completion events are on) keeps
its head item in the index partition ``batches#watched``. Each coordinator tick reads that
partition (one query) and each watched batch's counts (:func:`batches.read_batch`). For each
event that has happened and is not yet in the head's ``fired`` set, the callback is put only if
its key is new, so two coordinators, or one killed between the put and what follows, put it once;
then the event is published (:mod:`coworker.engine.events`) and added to ``fired``. Before
``complete`` (or ``success``) fires, the batch is closed to new tasks (``completed_at``, on the
condition that no put request came since it was read done: :func:`batches.close`), so the counts
the callback and the event carry are its last. Once the batch
is done, its head leaves the partition, on the condition that nothing changed since it was read
(no put request opened or closed, no redrive, no stop); a redrive, a put naming callbacks, or a
stop puts it back.

**Cost.** A tick with nothing watched reads one empty query page (0.5 read units). A watched batch
costs its counts' read each tick while it runs (a consistent read of the head and a BatchGetItem
of its counters: 1-2 read units; the follower's watermark is read once per pass), and about three writes in all: into
the partition with its first put (the head's own write, one more index write), ``fired``, and out.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from pynamodb.exceptions import PynamoDBException

from coworker.config import Settings
from coworker.data import writes
from coworker.data.layout import BATCH_KEY_PREFIX, WATCHED_BATCHES_PARTITION
from coworker.data.models import BatchModel, TaskModel, TaskStatus, iso_utc, utcnow
from coworker.engine import batches, events, lifecycle, offload
from coworker.engine.batches import BatchProgress
from coworker.engine.tasks import NewTask
from coworker.errors import StorageError
from coworker.observability import logger

COMPLETE = "complete"
SUCCESS = "success"
STOPPED = "stopped"
CALLBACK_EVENTS = (COMPLETE, SUCCESS, STOPPED)
# Watched batches looked at per tick; with more watched, those looked at move to the back.
MAX_WATCHED_PER_TICK = 100
# Watched batches looked at at once (each look is two or three reads).
LOOK_THREADS = 8
# The callbacks a batch names, payloads included, as stored on its head.
MAX_CALLBACKS_BYTES = 16 * 1024
# Keys read per BatchGetItem by read_results.
KEYS_PER_READ = 100

_EVENT_TYPES = {COMPLETE: events.BATCH_COMPLETED, STOPPED: events.BATCH_STOPPED}


def callback_key(batch_id: str, event: str) -> str:
    """The key of a batch's callback task for ``event``: derived, so it is put once."""
    return f"{batch_id}~{event}"


@dataclasses.dataclass(frozen=True)
class CallbackReport:
    """What one :func:`fire_due` pass did."""

    watched: int = 0  # watched batches looked at
    put: tuple[tuple[str, str], ...] = ()  # (key, type) of the callback tasks this pass created
    published: int = 0  # batch events published
    settling: bool = False  # a watched batch has no open task but is not yet counted through

    @property
    def created(self) -> int:
        return len(self.put)


def happened(progress: BatchProgress) -> list[str]:
    """The events that have happened to a batch with these counts."""
    found = [STOPPED] if progress.failed_at is not None else []
    if progress.done:
        found.append(COMPLETE)
        if progress.ignored == 0 and progress.failed_at is None:
            found.append(SUCCESS)
    return found


def fire_due(settings: Settings, now: datetime | None = None) -> CallbackReport:
    """One pass over the watched batches: fire what has happened to each, and let go of the
    batches that are done. A batch that cannot be handled now is logged and looked at again."""
    now = now or utcnow()
    entries = list(BatchModel.watched_index.query(WATCHED_BATCHES_PARTITION, limit=MAX_WATCHED_PER_TICK + 1))
    crowded = len(entries) > MAX_WATCHED_PER_TICK
    batch_ids = [entry.key.removeprefix(BATCH_KEY_PREFIX) for entry in entries[:MAX_WATCHED_PER_TICK]]
    watermark = _once(batches.counted_through)  # one read per pass, not per batch

    def fire(batch_id: str) -> CallbackReport:
        try:
            return _fire(batch_id, settings, now, rotate=crowded, watermark=watermark)
        except Exception:  # noqa: BLE001 - one batch must not stop the others or the tick
            logger.exception("could not fire the batch's callbacks; tried again next tick",
                             extra={"batch_id": batch_id})
            return CallbackReport()

    if len(batch_ids) <= 1:
        outcomes = [fire(batch_id) for batch_id in batch_ids]
    else:
        with ThreadPoolExecutor(max_workers=min(LOOK_THREADS, len(batch_ids))) as pool:
            outcomes = list(pool.map(fire, batch_ids))
    return CallbackReport(watched=len(batch_ids), put=tuple(item for outcome in outcomes for item in outcome.put),
                          published=sum(outcome.published for outcome in outcomes),
                          settling=any(outcome.settling for outcome in outcomes))


def _once(read: Callable[[], datetime | None]) -> Callable[[], datetime | None]:
    """``read``, called at most once however many threads ask (they share its answer)."""
    lock = threading.Lock()
    answer: list[datetime | None] = []

    def once() -> datetime | None:
        with lock:
            if not answer:
                answer.append(read())
            return answer[0]

    return once


def _fire(batch_id: str, settings: Settings, now: datetime, rotate: bool,
          watermark: Callable[[], datetime | None] | None = None) -> CallbackReport:
    head, progress = batches.read_batch(batch_id, watermark)
    if head.status_shard != WATCHED_BATCHES_PARTITION:
        return CallbackReport()  # let go meanwhile
    named: Mapping[str, Any] = head.callbacks or {}
    fired = set(head.fired or ())
    put: list[tuple[str, str]] = []
    published = 0
    for event in happened(progress):
        if event in fired:
            continue
        if event in (COMPLETE, SUCCESS) and progress.completed_at is None:
            completed_at = batches.close(head, batch_id, now)
            if completed_at is None:
                # A put request opened (or a redrive came) since the batch was read done: its
                # counts are not final; looked at again next tick.
                return CallbackReport(watched=1, put=tuple(put), published=published)
            progress = dataclasses.replace(progress, completed_at=completed_at)
        if event in named:
            task = _callback_task(batch_id, event, named[event], progress, settings, now)
            if writes.put_if_new(task, f"callback task {task.key!r}"):
                put.append((task.key, task.task_type))
                logger.info("batch callback put", extra={"batch_id": batch_id, "event": event, "task_key": task.key})
        publisher = events.publisher(settings)
        if event in _EVENT_TYPES and publisher.enabled:
            publisher.publish([_batch_event(event, progress, head, settings)])
            published += 1
        writes.update(head, [BatchModel.fired.add({event})], None, f"record batch {batch_id!r}'s {event}",
                      refresh=False)
        fired.add(event)
    if progress.done:
        _let_go(head, batch_id)
    elif rotate:  # more batches are watched than a tick looks at: this one goes to the back
        writes.update(head, [BatchModel.due_at.set(now)], BatchModel.status_shard == WATCHED_BATCHES_PARTITION,
                      f"move watched batch {batch_id!r} back", refresh=False)
    return CallbackReport(watched=1, put=tuple(put), published=published,
                          settling=progress.open <= 0 and not progress.settled)


def _let_go(head: BatchModel, batch_id: str) -> None:
    """Take a done batch's head out of the watched partition, on the condition that nothing
    that could make it run again (a put request, a redrive, a stop) came since it was read."""
    unchanged = batches.unchanged_since(head) & (BatchModel.status_shard == WATCHED_BATCHES_PARTITION)
    if writes.update(head, [BatchModel.status_shard.remove(), BatchModel.due_at.remove()], unchanged,
                     f"let go of batch {batch_id!r}", refresh=False):
        logger.info("batch no longer watched", extra={"batch_id": batch_id})


def _callback_task(batch_id: str, event: str, named: Mapping[str, Any], progress: BatchProgress,
                   settings: Settings, now: datetime) -> TaskModel:
    template = NewTask.model_validate(named)
    payload = {"event": event, "batch": progress.to_dict(), "payload": template.payload}
    # The key is set after the checks: it is of the form reserved for callbacks (tasks.derived_key_problem).
    spec = dataclasses.replace(NewTask.model_validate({**named, "payload": None}).to_spec(),
                               key=callback_key(batch_id, event), payload=payload)
    # The payload stays on the record (the named part is at most MAX_CALLBACKS_BYTES): the
    # coordinator never needs the object store.
    return lifecycle.new_task(spec, settings, now)


def _batch_event(event: str, progress: BatchProgress, head: BatchModel, settings: Settings) -> events.Event:
    counts = progress.to_dict()
    moment = progress.failed_at if event == STOPPED else progress.settled_at or progress.updated_at
    return events.Event(_EVENT_TYPES[event], {
        "event_id": f"batch-{event}:{progress.batch_id}:{iso_utc(moment)}",
        "table": settings.table_name,
        **{name: counts[name] for name in ("batch_id", "state", "total", "finished", "ignored", "open",
                                           "failure_reason", "created_at", "failed_at")},
        "succeeded": progress.done and progress.ignored == 0 and progress.failed_at is None,
        "callbacks": sorted((head.callbacks or {}).keys()),
        "at": iso_utc(utcnow()),
    })


def callbacks_size(callbacks: Mapping[str, NewTask]) -> int:
    """The stored size of ``callbacks`` (compact JSON), to hold to MAX_CALLBACKS_BYTES."""
    return offload.stored_size({event: task.model_dump(mode="json", exclude_none=True)
                                for event, task in callbacks.items()})


def read_results(keys: Sequence[str], settings: Settings | None = None) -> dict[str, Any]:
    """The results of the tasks ``keys`` that are finished, by key (a result kept in the object
    store is loaded); keys of tasks not finished, or not found, are left out. For a callback's
    handler reading its batch's results (``from coworker import read_results``): BatchGetItem,
    KEYS_PER_READ keys a call. ``settings`` default to the process's environment."""
    settings = settings or Settings.from_env()
    unique = list(dict.fromkeys(keys))
    results: dict[str, Any] = {}
    refs: dict[str, dict[str, Any]] = {}
    try:
        for start in range(0, len(unique), KEYS_PER_READ):
            for task in TaskModel.batch_get(unique[start:start + KEYS_PER_READ],
                                            attributes_to_get=["key", "status", "result", "result_ref"]):
                if task.status != TaskStatus.FINISHED.value:
                    continue
                if task.result_ref is None:
                    results[task.key] = task.result
                else:
                    refs[task.key] = task.result_ref
    except PynamoDBException as exc:
        raise StorageError(f"could not read results: {exc}") from exc
    if refs:
        store = offload.store_for(settings)
        with ThreadPoolExecutor(max_workers=min(8, len(refs))) as pool:
            results.update(zip(refs, pool.map(lambda ref: offload.load(ref, store), refs.values()), strict=True))
    return results
