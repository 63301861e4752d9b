"""What a task is made of before it is stored: one shape, :class:`TaskSpec`, and its limits.

The API's request body (``coworker.api.models.TaskIn``), a handler's follow-up
(``TaskContext.spawn``) and a direct put (:func:`coworker.engine.submit.put_task`) all build
a :class:`NewTask`, so every way in refuses the same things with the same words.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator, model_validator

from coworker.data.layout import BATCH_KEY_PREFIX, reserved_prefix

MAX_KEY_CHARS = 512  # DynamoDB allows 2048 bytes; 512 characters of UTF-8 always fit
MAX_TYPE_CHARS = 128
MAX_ATTEMPTS_CEILING = 100
MAX_PRIORITY = 2**31 - 1
MAX_CONCURRENCY_KEY_CHARS = 256
MAX_CONCURRENCY_LIMIT = 1000  # a gate item holds ~30 bytes per place: 1,000 places stay under 32 KB
MAX_RATE_LIMIT = 1000  # a rate gate keeps the last N starts (~8 bytes each): 1,000 stay under 10 KB
MAX_RATE_INTERVAL_SECONDS = 86_400.0
MIN_RATE_INTERVAL_SECONDS = 0.001  # the start log counts milliseconds
# A task's time limit (its own, or its type's): the bounds of the value; what a deployment's runners
# can give is checked where the task is put (coworker.engine.timing).
MIN_TIMEOUT_SECONDS = 1.0
MAX_TIMEOUT_SECONDS = 7 * 86_400.0
BATCH_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
# Keys Coworker derives for the tasks it puts itself, each put only if its key is new: a task put
# first under one would take that task's place. coworker.engine.schedules.occurrence_key
# (<schedule name>@<occurrence, UTC, to the second>) and coworker.engine.callbacks.callback_key
# (<batch id>~<event>) build them; tests hold the two sides together.
OCCURRENCE_KEY_PATTERN = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,79}@[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
CALLBACK_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}~(complete|success|stopped)")
# Containers (objects, arrays) nested in a payload at most: below every later stage's limit (the
# storage library's JSON encoding, the response models), so a payload taken is a payload read.
MAX_PAYLOAD_DEPTH = 64


def no_control_characters(value: str, what: str) -> str:
    """``value``, or ValueError if it holds control characters (tabs, newlines, NUL...) or is not
    valid Unicode text (a lone surrogate, such as ``\ud800``)."""
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise ValueError(f"{what} must not contain control characters (tabs, newlines, NUL...)")
    if not is_text(value):
        raise ValueError(f"{what} is not valid Unicode text (it holds a lone surrogate, such as \\ud800)")
    return value


def is_text(value: str) -> bool:
    """Whether ``value`` can be stored as UTF-8 (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def payload_problem(payload: Any) -> str | None:
    """Why a payload cannot be stored and read back as it was, or ``None``: nested deeper than
    :data:`MAX_PAYLOAD_DEPTH`, or a string (or object key) that is not valid Unicode text."""
    stack: list[tuple[Any, int]] = [(payload, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not is_text(value):
                return "the payload holds a string that is not valid Unicode text (a lone surrogate, such as \\ud800)"
        elif isinstance(value, dict | list):
            if depth >= MAX_PAYLOAD_DEPTH:
                return f"the payload nests objects and arrays deeper than {MAX_PAYLOAD_DEPTH} levels"
            items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
            for name, item in items:
                if isinstance(name, str) and not is_text(name):
                    return "the payload holds an object key that is not valid Unicode text (a lone surrogate)"
                stack.append((item, depth + 1))
    return None


def key_problem(key: str) -> str | None:
    """Why no task can have ``key``, or ``None``."""
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        return f"task keys are 1 to {MAX_KEY_CHARS} characters"
    prefix = reserved_prefix(key)
    if prefix is not None:
        if prefix == BATCH_KEY_PREFIX:
            return f"keys starting with '{BATCH_KEY_PREFIX}' are reserved for batches"
        return f"keys starting with '{prefix}' are reserved for Coworker's own items"
    try:
        no_control_characters(key, "key")
    except ValueError as exc:
        return str(exc)
    return None


def derived_key_problem(key: str) -> str | None:
    """Why a task put by anyone but Coworker may not have ``key`` (the key of a schedule's
    occurrence or of a batch's callback), or ``None``. Such keys are still read like any other."""
    if OCCURRENCE_KEY_PATTERN.fullmatch(key):
        return ("keys of the form <schedule name>@<YYYY-MM-DDTHH:MM:SSZ> are reserved for the tasks schedules "
                "put (one per occurrence); choose another key")
    if CALLBACK_KEY_PATTERN.fullmatch(key):
        return ("keys of the form <batch id>~complete, ~success or ~stopped are reserved for batch callbacks; "
                "choose another key")
    return None


def time_as_text(value: Any, name: str) -> Any:
    """Refuse a time given as anything but a string (a number would be read as epoch seconds)."""
    if value is not None and not isinstance(value, str | datetime):
        raise ValueError(f"{name} must be an ISO-8601 time as a string, e.g. \"2026-12-01T09:00:00Z\"")
    return value


def as_utc(value: datetime | None) -> datetime | None:
    """An aware UTC time (a naive one is taken as UTC)."""
    if value is None:
        return None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time is out of range once converted to UTC (years 1 to 9999)") from None


class NewTask(BaseModel):
    """A task as anyone asks for it: the fields a client (or a handler's follow-up) sets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str | None = Field(
        None, min_length=1, max_length=MAX_KEY_CHARS,
        description="Unique task key; makes the put idempotent. A UUID is generated when absent. "
                    f"1-{MAX_KEY_CHARS} characters, no control characters, not starting with "
                    f"'{BATCH_KEY_PREFIX}', not of the forms Coworker gives the tasks it puts "
                    "(<schedule>@<YYYY-MM-DDTHH:MM:SSZ>, <batch id>~complete|success|stopped). "
                    "Percent-encode it in URLs (including '/').",
    )
    type: str = Field(min_length=1, max_length=MAX_TYPE_CHARS,
                      description="Task type: selects the registered handler.")
    payload: Any = Field(None, description="Any JSON value. Up to COWORKER_INLINE_PAYLOAD_BYTES (16 KB as "
                                           "stored) it stays on the record; larger ones are kept in the object "
                                           "store, up to COWORKER_MAX_PAYLOAD_BYTES (5 MB of JSON); above: 413.")
    max_attempts: StrictInt | None = Field(None, ge=1, le=MAX_ATTEMPTS_CEILING,
                                           description="Attempt ceiling; default COWORKER_MAX_ATTEMPTS.")
    run_at: datetime | None = Field(None, description="ISO-8601 time before which the task is not run "
                                                      "(no zone means UTC).")
    priority: StrictInt | None = Field(None, ge=-MAX_PRIORITY - 1, le=MAX_PRIORITY,
                                       description="Seconds of head start in the oldest-first queue "
                                                   "(negative: held back that long); ignored when run_at is set.")
    concurrency_key: str | None = Field(
        None, min_length=1, max_length=MAX_CONCURRENCY_KEY_CHARS,
        description="Tasks with the same concurrency key run at most concurrency_limit at once, fleet-wide "
                    "(a crawled domain, a tenant id). Tasks without one are not limited.")
    concurrency_limit: StrictInt | None = Field(
        None, ge=1, le=MAX_CONCURRENCY_LIMIT,
        description=f"How many tasks of this concurrency key may run at once (1-{MAX_CONCURRENCY_LIMIT}; "
                    "default 1). Only with concurrency_key.")

    rate_key: str | None = Field(
        None, min_length=1, max_length=MAX_CONCURRENCY_KEY_CHARS,
        description="Tasks with the same rate key start at most rate_limit times per rate_interval_seconds, "
                    "fleet-wide (a crawled domain, a tenant's API key); a task over the rate waits in the "
                    "queue, not in a worker. A limit set for the key (PUT /rate-limits/key:<key>) wins.")
    rate_limit: StrictInt | None = Field(
        None, ge=1, le=MAX_RATE_LIMIT,
        description=f"How many tasks of this rate key may start per interval (1-{MAX_RATE_LIMIT}). Only with "
                    "rate_key; without it, the key is limited only by a limit set for it.")
    rate_interval_seconds: float | None = Field(
        None, ge=MIN_RATE_INTERVAL_SECONDS, le=MAX_RATE_INTERVAL_SECONDS, strict=True, allow_inf_nan=False,
        description=f"The interval of rate_limit, in seconds ({MIN_RATE_INTERVAL_SECONDS:g}-"
                    f"{MAX_RATE_INTERVAL_SECONDS:g}; default 1). Only with rate_limit.")

    timeout_seconds: float | None = Field(
        None, ge=MIN_TIMEOUT_SECONDS, le=MAX_TIMEOUT_SECONDS, strict=True, allow_inf_nan=False,
        description="How long one attempt may take, in seconds (default: the limit its type declares). A worker "
                    "starts it only with that much time left; an attempt still running after it is recorded as "
                    "timed out and retried. A limit longer than this deployment's worker can give is refused.")

    @model_validator(mode="after")
    def _limit_needs_a_key(self) -> NewTask:
        if self.concurrency_limit is not None and self.concurrency_key is None:
            raise ValueError("concurrency_limit needs a concurrency_key: the limit applies to the tasks "
                             "that share the key")
        if self.rate_limit is not None and self.rate_key is None:
            raise ValueError("rate_limit needs a rate_key: the limit applies to the tasks that share the key")
        if self.rate_interval_seconds is not None and self.rate_limit is None:
            raise ValueError("rate_interval_seconds needs a rate_limit: it is the interval of that limit")
        return self

    @field_validator("concurrency_key", "rate_key")
    @classmethod
    def _group_key_is_usable(cls, value: str | None, info: ValidationInfo) -> str | None:
        return value if value is None else no_control_characters(value, str(info.field_name))

    @field_validator("key")
    @classmethod
    def _key_is_usable(cls, value: str | None) -> str | None:
        if value is None:
            return value
        problem = key_problem(value) or derived_key_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("payload")
    @classmethod
    def _payload_is_storable(cls, value: Any) -> Any:
        problem = payload_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("type")
    @classmethod
    def _type_is_usable(cls, value: str) -> str:
        return no_control_characters(value, "type")

    @field_validator("run_at", mode="before")
    @classmethod
    def _run_at_is_text(cls, value: Any) -> Any:
        return time_as_text(value, "run_at")

    @field_validator("run_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        return as_utc(value)

    def to_spec(self, *, batch_id: str | None = None, parent: str | None = None) -> TaskSpec:
        """This task as the engine puts it (a key generated when it has none), in ``batch_id``."""
        return TaskSpec(key=self.key or str(uuid.uuid4()), type=self.type, payload=self.payload,
                        max_attempts=self.max_attempts, run_at=self.run_at, priority=self.priority,
                        concurrency_key=self.concurrency_key, concurrency_limit=self.concurrency_limit,
                        rate_key=self.rate_key, rate_limit=self.rate_limit,
                        rate_interval_seconds=self.rate_interval_seconds, timeout_seconds=self.timeout_seconds,
                        batch_id=batch_id, parent=parent)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What the engine puts: a new task with its key, and where it belongs.

    Built by :meth:`NewTask.to_spec` from checked input (the API, follow-ups); code that builds
    one directly (tests, tools) is trusted with the same limits.
    """

    key: str
    type: str
    payload: Any = None
    max_attempts: int | None = None
    run_at: datetime | None = None
    batch_id: str | None = None
    priority: int | None = None
    parent: str | None = None  # the task that spawned this one (a follow-up)
    concurrency_key: str | None = None  # at most concurrency_limit tasks of one key run at once
    concurrency_limit: int | None = None
    rate_key: str | None = None  # at most rate_limit starts of one key per rate_interval_seconds
    rate_limit: int | None = None
    rate_interval_seconds: float | None = None
    payload_ref: dict[str, Any] | None = None  # set when staged: the payload is in the object store
    timeout_seconds: float | None = None  # its own time limit (else its type's)
