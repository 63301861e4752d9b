"""The benchmark's trivial task handler, importable by worker processes
(``COWORKER_HANDLER_MODULES=noop_handlers`` with ``benchmarks/`` on ``PYTHONPATH``)."""

from __future__ import annotations

from coworker.engine.handlers import TaskContext, task_handler


@task_handler("bench-noop")
def noop(payload: object, context: TaskContext) -> None:
    """Does nothing: the benchmark measures the engine, not the work."""
    return None
