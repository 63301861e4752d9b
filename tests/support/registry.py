"""Task types registered for the tests of one module only.

A type registered at import (``@task_handler`` on a module's function) stays registered in every
test of the process, since pytest imports every module before it runs a test. A container type
changes what every worker and coordinator does (their reads leave its tasks out), so the modules
that need one register it for their own tests only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from coworker.engine import handlers


@contextlib.contextmanager
def registered(*types: tuple[str, Any, dict[str, Any]]) -> Iterator[None]:
    """Register each ``(task type, handler, task_handler options)`` for the block, then remove it."""
    for task_type, function, options in types:
        handlers.task_handler(task_type, **options)(function)
    try:
        yield
    finally:
        for task_type, _, _ in types:
            handlers._registry.pop(task_type, None)  # noqa: SLF001 - the registry has no other way out
