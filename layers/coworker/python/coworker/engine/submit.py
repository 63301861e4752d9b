"""Putting new tasks: one, or a batch, and starting workers for the ones due now.

Every way a task is created (the API, a direct put, a tool) comes through here; follow-ups a
handler asks for are put with its completion instead (:func:`coworker.engine.lifecycle.complete`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from datetime import datetime

from coworker.config import Settings
from coworker.data import writes
from coworker.data.models import utcnow
from coworker.engine import batches, control, dispatch, lifecycle, runners
from coworker.engine.batches import Tolerance
from coworker.engine.tasks import NewTask, TaskSpec


class PutOutcome(str, enum.Enum):
    CREATED = "created"
    EXISTS = "exists"


def put_task(spec: TaskSpec, settings: Settings, now: datetime | None = None) -> PutOutcome:
    """Create a task in ``todo``; a task whose key exists is left exactly as it is.

    A task with a ``batch_id`` also creates or touches its batch (see :func:`batches.put_tasks`).
    A large payload goes to the object store first (:func:`lifecycle.stage_payloads`); one too
    large for any store raises ``PayloadTooLargeError`` and nothing is written.
    """
    now = now or utcnow()
    (spec,) = lifecycle.stage_payloads([spec], settings)
    task = lifecycle.new_task(spec, settings, now)
    if spec.batch_id:
        created = batches.put_tasks([task], spec.batch_id, now, watch=settings.events != "off")[0]
        return PutOutcome.CREATED if created else PutOutcome.EXISTS
    return PutOutcome.CREATED if writes.put_if_new(task, f"task {spec.key!r}") else PutOutcome.EXISTS


def put_batch(specs: Sequence[TaskSpec], batch_id: str, settings: Settings, tolerance: Tolerance | None = None,
              now: datetime | None = None, callbacks: Mapping[str, NewTask] | None = None) -> list[bool]:
    """Create ``specs`` as tasks of batch ``batch_id`` (each only if its key is new); per task,
    whether it was created. Every payload is checked before anything is written. ``callbacks``
    (event -> task, :mod:`coworker.engine.callbacks`) fire once each when the batch gets there."""
    now = now or utcnow()
    staged = lifecycle.stage_payloads(specs, settings)
    items = [lifecycle.new_task(spec, settings, now) for spec in staged]
    return batches.put_tasks(items, batch_id, now, tolerance, callbacks=callbacks, watch=settings.events != "off")


def start_due(specs: Sequence[TaskSpec], settings: Settings, invoker: dispatch.Invoker | None,
              now: datetime) -> int:
    """Dispatch on submit: start workers for the just-created ``specs`` that are due now and of a
    type not paused nor the container runner's (the coordinator starts runners); returns the workers
    started (best effort, see :func:`dispatch.dispatch_submitted`)."""
    paused = control.cached(settings.control_cache_seconds).paused
    skipped = {*paused, *runners.container_types(settings)}
    due = [spec.key for spec in specs if lifecycle.first_due_at(spec, now) <= now and spec.type not in skipped]
    return dispatch.dispatch_submitted(settings, invoker, due)
