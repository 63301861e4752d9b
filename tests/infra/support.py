"""Helpers shared by the infrastructure tests."""

from __future__ import annotations

from pathlib import Path

from coworker_cdk import constants as c

FUNCTION_DIRS = (c.COORDINATOR_DIR_NAME, c.WORKER_DIR_NAME, c.API_DIR_NAME)


def missing_function_code(functions_dir: Path = c.FUNCTIONS_DIR) -> list[str]:
    """Function directories of the stack that have no handler.py yet."""
    return [name for name in FUNCTION_DIRS if not (functions_dir / name / "handler.py").is_file()]
