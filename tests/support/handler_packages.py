"""Builds handlers packages in a temporary folder, as a team would write one."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path


def write_handler_package(root: Path, name: str | None = None, *, task_type: str | None = None,
                          requirements: str = "") -> tuple[Path, str, str]:
    """A package ``root/<name>`` with one module registering ``task_type`` (which doubles its
    payload's ``n``), ``<task_type>-big`` (a result of about ``bytes`` bytes) and ``<task_type>-env``
    (the value of the environment variable ``name``), a nested module,
    a test module that must never be imported, and ``requirements.txt``. Returns
    ``(package folder, name, task type)``; names are unique."""
    suffix = uuid.uuid4().hex[:8]
    name = name or f"team_tasks_{suffix}"
    task_type = task_type or f"double-{suffix}"
    package = root / name
    (package / "reports").mkdir(parents=True)
    (package / "__init__.py").write_text('"""A team\'s task handlers."""\n')
    (package / "math_tasks.py").write_text(textwrap.dedent(f'''
        from coworker import TaskContext, task_handler

        @task_handler({task_type!r})
        def double(payload: dict, context: TaskContext) -> dict:
            return {{"doubled": payload["n"] * 2, "attempt": context.attempt}}

        @task_handler({task_type + "-big"!r})
        def big(payload: dict, context: TaskContext) -> dict:
            return {{"text": "é" * (payload["bytes"] // 2), "attempt": context.attempt}}

        @task_handler({task_type + "-env"!r})
        def env(payload: dict, context: TaskContext) -> dict:
            import os

            return {{"value": os.environ.get(payload["name"])}}
    '''))
    (package / "reports" / "__init__.py").write_text("")
    (package / "reports" / "summary.py").write_text(textwrap.dedent(f'''
        from coworker import task_handler

        @task_handler({task_type + "-summary"!r})
        def summary(payload, context):
            return {{"lines": len(payload or [])}}
    '''))
    (package / "test_math_tasks.py").write_text("raise RuntimeError('a test module was imported')\n")
    (package / "requirements.txt").write_text(requirements)
    return package, name, task_type
