"""Coworker: a coordinator-worker task system on DynamoDB (library shared by all functions)."""

from coworker.config import Settings
from coworker.errors import CoworkerError, TaskFailed, TaskFailedError
from coworker.handlers import TaskContext, task_handler

__all__ = ["CoworkerError", "Settings", "TaskContext", "TaskFailed", "TaskFailedError", "task_handler"]
__version__ = "0.1.0"
