"""Every exception Coworker raises derives from :class:`CoworkerError`; they are all here, and the
API maps them to HTTP answers in one table (``coworker.api.errors.ERROR_STATUS``)."""

from __future__ import annotations


class CoworkerError(Exception):
    """Base class of Coworker's own errors."""


class ConfigurationError(CoworkerError):
    """Settings are missing or inconsistent."""


class StorageError(CoworkerError):
    """DynamoDB answered with an error that is not part of the lifecycle (throttling, outage)."""


class RecordTooLargeError(StorageError):
    """A write would make the task's item larger than DynamoDB's 400 KB limit."""


class PartialPutError(StorageError):
    """Storage failed part-way through putting a batch: ``stored`` are the keys that went in,
    the others did not; ``reason`` says why in words fit for a client (the message may hold
    DynamoDB's own)."""

    def __init__(self, message: str, stored: list[str], reason: str = "DynamoDB refused or failed some puts"
                 ) -> None:
        super().__init__(message)
        self.stored = stored
        self.reason = reason


class GuardFailedError(CoworkerError):
    """The guard of a guarded put no longer held: nothing of that chunk was written."""


class PayloadTooLargeError(CoworkerError):
    """A payload is larger than Coworker accepts (see ``coworker.engine.offload.check_payload``)."""


class BatchNotFoundError(CoworkerError):
    """No batch has the given id."""


class BatchFailedError(CoworkerError):
    """The batch stopped at its failure threshold: it takes no new tasks until it is redriven."""


class BatchCompletedError(CoworkerError):
    """The batch's completion fired (callback, event): it takes no new tasks; use a new batch."""


class TooManyPausedTypesError(CoworkerError):
    """The claim condition can exclude at most ``control.MAX_PAUSED_TYPES`` types."""


class TooManyRateLimitsError(CoworkerError):
    """Setting one more rate limit would pass the control record's bound."""


class TaskNotFoundError(CoworkerError):
    """No task has the given key."""


class ScheduleNotFoundError(CoworkerError):
    """No schedule has the given name."""


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
