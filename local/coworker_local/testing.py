"""Run your handlers end to end in a test: put, dispatch, claim, run and record, against the
embedded database, through the same code as the deployed workers.

::

    from coworker_local.testing import LocalTaskSystem

    def test_a_zero_amount_is_ignored_at_once():
        with LocalTaskSystem(handler_modules=["handlers"]) as system:
            task = system.run("charge-order", {"order": "o-1", "amount_cents": 0})
        assert task["status"] == "ignored" and task["attempts"] == 1

Each system gets a table of its own on an embedded database that is started once per test
process (DynamoDB Local, or moto without Java; ``COWORKER_LOCAL_DB`` or ``database=`` chooses)
and stopped when the process ends. Retries are due at once (no backoff) so that a test does not
wait; everything else is the library's defaults unless given as keyword arguments.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from coworker.bootstrap import configure
from coworker.config import Settings
from coworker.data import index
from coworker.data.models import TaskStatus, utcnow
from coworker.engine import dispatch, lifecycle, offload, progress, slots, submit
from coworker.engine.outcomes import TaskReport
from coworker.engine.runner import InProcessLauncher
from coworker.engine.tasks import NewTask, TaskSpec

from coworker_local.database import (
    FAKE_CREDENTIALS,
    EmbeddedDatabase,
    admin_client,
    create_table,
    start_database,
)

_databases: dict[str, EmbeddedDatabase] = {}
_databases_lock = threading.Lock()
# Statuses a task can still leave by itself (finished and ignored are terminal).
OPEN_STATUSES = (TaskStatus.TODO, TaskStatus.FAILED, TaskStatus.PROCESSING)


def shared_database(requested: str | None = None) -> EmbeddedDatabase:
    """The embedded database of this process for ``requested`` (see ``coworker_local.database``),
    started on first use and stopped when the process exits."""
    key = (requested or os.environ.get("COWORKER_LOCAL_DB") or "auto").lower()
    with _databases_lock:
        if key not in _databases:
            for name, value in FAKE_CREDENTIALS.items():
                os.environ.setdefault(name, value)
            database = start_database(requested)
            atexit.register(database.stop)
            _databases[key] = database
        return _databases[key]


class LocalTaskSystem:
    """The engine on its own table, with workers run in this process (threads per invocation)."""

    def __init__(
        self,
        *,
        handler_modules: Sequence[str] = (),
        database: str | None = None,
        **settings: Any,
    ) -> None:
        self._handler_modules = list(handler_modules)
        self._database = database
        self._overrides = settings
        self.settings: Settings | None = None
        self.reports: list[TaskReport] = []
        self._result_dir: str | None = None  # a temporary result store, deleted by stop()

    def start(self) -> LocalTaskSystem:
        """Create this system's table (on ``dynamodb_endpoint`` if given, else the shared database)."""
        endpoint = self._overrides.get("dynamodb_endpoint") or shared_database(self._database).endpoint
        values: dict[str, Any] = {
            "table_name": f"coworker-test-{uuid.uuid4().hex[:12]}",
            "dynamodb_endpoint": endpoint,
            "backoff_base_seconds": 0,
            "backoff_max_seconds": 0,
            "max_concurrency": 10,
            "batch_size": 5,
            "worker_timeout_seconds": 30,
            "dispatch_on_submit": False,  # tasks start when the test drains them
            **self._overrides,
        }
        if not values.get("result_bucket") and not values.get("result_dir"):
            self._result_dir = tempfile.mkdtemp(prefix="coworker-test-results-")
            values["result_dir"] = self._result_dir
        listed = ",".join([values.pop("handler_modules", ""), *self._handler_modules])
        values["handler_modules"] = ",".join(filter(None, listed.split(",")))
        self.settings = Settings(**values)
        create_table(self.settings)
        configure(self.settings)
        slots.ensure_slots(self.settings.worker_slots)
        slots.ensure_slots(self.settings.max_runners, pool=slots.RUNNERS)
        return self

    def stop(self) -> None:
        """Delete this system's table."""
        if self.settings is not None:
            admin_client(self.settings).delete_table(TableName=self.settings.table_name)
            self.settings = None
        if self._result_dir is not None:
            shutil.rmtree(self._result_dir, ignore_errors=True)
            self._result_dir = None

    def __enter__(self) -> LocalTaskSystem:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def _settings(self) -> Settings:
        if self.settings is None:
            raise RuntimeError("the LocalTaskSystem is not started (use it in a with block)")
        return self.settings

    def put(self, task_type: str, payload: Any = None, *, key: str | None = None,
            max_attempts: int | None = None, run_at: datetime | None = None,
            batch_id: str | None = None, callbacks: dict[str, dict[str, Any]] | None = None) -> str:
        """Put one task, as the API does; returns its key (a new one unless given). ``callbacks``
        (``{"complete": {"type": ...}}``, with a ``batch_id``) are its batch's (docs/batches.md)."""
        key = key or f"{task_type}-{uuid.uuid4().hex[:12]}"
        spec = TaskSpec(key=key, type=task_type, payload=payload, max_attempts=max_attempts,
                                  run_at=run_at, batch_id=batch_id)
        if callbacks:
            if batch_id is None:
                raise ValueError("callbacks are a batch's: give a batch_id")
            named = {event: NewTask.model_validate(task) for event, task in callbacks.items()}
            submit.put_batch([spec], batch_id, self._settings, callbacks=named)
        else:
            submit.put_task(spec, self._settings)
        return key

    def get(self, key: str) -> dict[str, Any]:
        """The task's record as ``GET /tasks/{key}`` shows it."""
        return lifecycle.get_task(key).to_dict()

    def result(self, key: str) -> Any:
        """The task's whole result, from its record or the result store."""
        record = lifecycle.get_task(key)
        if record.result_ref is None:
            return record.result
        return offload.load(record.result_ref, offload.store_for(self._settings))

    def drain(self, timeout_seconds: float = 900.0) -> list[TaskReport]:
        """Run coordinator ticks and the workers they start until no task is due, then count batch
        progress from the stream; returns what the workers reported. Raises TimeoutError if work
        is still due after ``timeout_seconds`` (a guard against work that never ends, not a
        budget: a loaded machine takes minutes for what a quiet one does in seconds)."""
        settings = self._settings
        invoker = dispatch.InProcessInvoker(settings, owner_prefix="test-worker")
        launcher = InProcessLauncher(settings, owner_prefix="test-runner")  # the container runner's types
        give_up = time.monotonic() + timeout_seconds
        reports: list[TaskReport] = []
        try:
            while True:
                report = dispatch.tick(settings, invoker, launcher=launcher)
                reports.extend(invoker.wait())
                reports.extend(launcher.wait())
                if report.dispatched == report.runners_started == report.reaped == 0 and not self._any_due():
                    break
                if time.monotonic() > give_up:
                    raise TimeoutError(f"tasks still due after {timeout_seconds:g} s")
        finally:
            invoker.shutdown()
            launcher.shutdown()
        progress.catch_up(settings)  # batch counts, as the coordinator's next tick would count them
        self.reports.extend(reports)
        return reports

    def run(self, task_type: str, payload: Any = None, **put: Any) -> dict[str, Any]:
        """Put one task, drain, and return its record (``status``, ``attempts``, ``result``,
        ``errors``...)."""
        key = self.put(task_type, payload, **put)
        self.drain()
        return self.get(key)

    def open_tasks(self) -> int:
        """Tasks not yet finished or ignored (todo, failed or processing), counted on the index."""
        return sum(self._count(status) for status in OPEN_STATUSES)

    def _any_due(self) -> bool:
        now = utcnow()
        return any(next(iter(index.due(status, now, 1)), None) is not None for status in OPEN_STATUSES)

    @staticmethod
    def _count(status: TaskStatus) -> int:
        return index.count(status)
