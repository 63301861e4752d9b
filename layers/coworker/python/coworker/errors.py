"""Every exception Coworker raises derives from :class:`CoworkerError`."""

from __future__ import annotations


class CoworkerError(Exception):
    """Base class of Coworker's own errors."""


class ConfigurationError(CoworkerError):
    """Settings are missing or inconsistent."""


class StorageError(CoworkerError):
    """DynamoDB answered with an error that is not part of the lifecycle (throttling, outage)."""


class RecordTooLargeError(StorageError):
    """A write would make the task's item larger than DynamoDB's 400 KB limit."""


class TaskNotFoundError(CoworkerError):
    """No task has the given key."""


class UnknownTaskTypeError(CoworkerError):
    """No handler is registered for a task's type."""


class TaskFailedError(CoworkerError):
    """Raised by a task handler for a business failure (bad input, a refused payment...).

    Recorded as kind ``business`` and retried up to the ceiling, unless ``retryable`` is false,
    in which case the task is ignored at once.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


# Short alias for handler authors: ``raise TaskFailed("card declined")``.
TaskFailed = TaskFailedError


class InvalidEventError(CoworkerError):
    """A Lambda event that does not have the shape its function expects."""
