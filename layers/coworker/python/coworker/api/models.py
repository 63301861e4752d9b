"""Request and response models of the task API, and its documented limits.

The OpenAPI document (``GET /openapi.json``) is generated from these models by Powertools, so
the limits below are what the document states and what the API enforces.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    Tag,
    field_validator,
    model_validator,
)

from coworker.api.bulk import BulkAction, check_action
from coworker.engine.callbacks import CALLBACK_EVENTS, MAX_CALLBACKS_BYTES, callbacks_size
from coworker.engine.tasks import (
    BATCH_ID_PATTERN,
    MAX_CONCURRENCY_LIMIT,
    MAX_RATE_INTERVAL_SECONDS,
    MAX_RATE_LIMIT,
    MAX_TYPE_CHARS,
    MIN_RATE_INTERVAL_SECONDS,
    NewTask,
    as_utc,
    no_control_characters,
    time_as_text,
)

MAX_BATCH_TASKS = 1000
# A batch's failure threshold: a count a batch can reach, a share DynamoDB can store as given.
MAX_TOLERATED_FAILURES = 1_000_000_000
MIN_TOLERATED_PERCENT = 1e-6
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_REDRIVE_PER_REQUEST = 200
# A cursor holds a key per index shard (deflated): 4 shards of keys up to 512 characters fit.
# API Gateway takes about 10 KB of request line and headers in all.
MAX_CURSOR_CHARS = 4096

# Lambda refuses a function's answer above 6 MB (6,291,456 bytes), and the answer carries the
# body as a JSON string, escaped once more: every quote and backslash of the body doubles. The
# body is ASCII (the serializer escapes the rest), so the answer is at most twice the body.
LAMBDA_RESPONSE_BYTES = 6 * 1024 * 1024
# GET /schedules pages. A schedule's task is at most MAX_TEMPLATE_BYTES (16,384) of JSON as
# stored, written again as the same bytes; its other fields (name 80, expression 200, time zone
# 64 characters of ASCII, a task key of 101, six times, counters and field names) are under
# 1,024 bytes. So a schedule is at most 17,408 bytes of body, 34,816 of answer, and a page of
# MAX_SCHEDULE_PAGE (100) at most 3,481,600 bytes: 55% of the 6 MB (the default page, 28%).
# tests/api/test_listing_pages.py builds that page and measures it.
DEFAULT_SCHEDULE_PAGE = 50
MAX_SCHEDULE_PAGE = 100
MAX_SCHEDULE_FIELD_BYTES = 1024
# GET /types pages. A type's answer is its name (at most MAX_TYPE_CHARS (128) characters: 14
# bytes of answer each at worst, an escaped pair of UTF-16 surrogates) and about 500 bytes of
# fields: under 2.5 KB, so the bound on a page is its cost -- a paused or limited type reads up
# to 1,000 index entries to count its held or blocked tasks -- not its size.
DEFAULT_TYPE_PAGE = 50
MAX_TYPE_PAGE = 100
# GET /rate-limits pages, by group. At most MAX_RATE_LIMITS (100) are set, each answered in under
# 8 KB (a group name of 260 characters, 14 bytes of answer each at worst, and its state), so the
# bound is each page's read: one BatchGetItem of its groups' start logs (100 keys at most), and
# of the chunks their heads name (about N / 50 for a group limited above 100 starts per interval).
DEFAULT_RATE_PAGE = 50
MAX_RATE_PAGE = 100


class IndexedStatus(enum.StrEnum):
    """Statuses a listing can ask for; ``finished`` is accepted only to explain why it cannot be listed."""

    TODO = "todo"
    PROCESSING = "processing"
    FAILED = "failed"
    IGNORED = "ignored"
    FINISHED = "finished"


class RedriveStatus(enum.StrEnum):
    FAILED = "failed"
    IGNORED = "ignored"


class BulkStatus(enum.StrEnum):
    """Statuses a bulk action can start from (see :data:`coworker.api.bulk.ACTION_STATUSES`)."""

    TODO = "todo"
    PROCESSING = "processing"
    FAILED = "failed"
    IGNORED = "ignored"


class Order(enum.StrEnum):
    OLDEST = "oldest"
    NEWEST = "newest"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskIn(NewTask):
    """One task to create (its fields and their rules are the engine's: ``engine.tasks.NewTask``)."""


class _TaskTemplateIn(NewTask):
    """A task Coworker puts later (the fields of a task, without key and run_at: the occasion sets
    them); ``_WHY`` says how."""

    _WHY: ClassVar[str]

    @model_validator(mode="after")
    def _no_key_or_time(self) -> _TaskTemplateIn:
        if self.key is not None or self.run_at is not None:
            raise ValueError(self._WHY)
        return self


class CallbackTaskIn(_TaskTemplateIn):
    """A task a batch puts when it gets somewhere (the fields of a task, without key and run_at)."""

    _WHY = ("a callback task has no key or run_at: it gets the key <batch id>~<event> and runs when the event "
            "happens")


class BatchCallbacksIn(_Strict):
    """Tasks a batch puts once each, with its counts (see docs/batches.md)."""

    complete: CallbackTaskIn | None = Field(None, description="Put once every task of the batch is finished or "
                                                              "ignored (and counted).")
    success: CallbackTaskIn | None = Field(None, description="Put once every task is finished, none ignored, and "
                                                             "the batch did not stop (also after a redrive ends so).")
    stopped: CallbackTaskIn | None = Field(None, description="Put once the batch stops at its failure threshold.")

    @model_validator(mode="after")
    def _some_and_small(self) -> BatchCallbacksIn:
        named = self.named()
        if not named:
            raise ValueError("name at least one of complete, success and stopped")
        size = callbacks_size(named)
        if size > MAX_CALLBACKS_BYTES:
            raise ValueError(f"the callbacks, payloads included, are {size} bytes as stored; at most "
                             f"{MAX_CALLBACKS_BYTES // 1024} KB (they are kept on the batch's record)")
        return self

    def named(self) -> dict[str, NewTask]:
        """The callback task of each event named."""
        return {event: task for event in CALLBACK_EVENTS if (task := getattr(self, event)) is not None}


class BatchIn(_Strict):
    """Several tasks at once, under one batch id."""

    tasks: list[TaskIn] = Field(min_length=1, max_length=MAX_BATCH_TASKS,
                                description=f"1 to {MAX_BATCH_TASKS} tasks.")
    batch_id: str | None = Field(
        None, pattern=BATCH_ID_PATTERN,
        description="Batch id; pass the same id to re-submit a batch idempotently. Generated when absent.",
    )
    tolerated_failure_percent: float | None = Field(
        None, ge=0, le=100, allow_inf_nan=False,
        description="The batch stops once more than this share of its tasks end ignored: its open tasks "
                    "are cancelled (running ones finish) and it shows state failed, until it is redriven. "
                    "Kept from the batch's first submission.")
    tolerated_failure_count: StrictInt | None = Field(
        None, ge=0, le=MAX_TOLERATED_FAILURES,
        description="The same, as a number of ignored tasks; the batch stops at whichever passes first.")
    callbacks: BatchCallbacksIn | None = Field(
        None, description="Tasks put once each when the batch completes, succeeds or stops, under the key "
                          "<batch id>~<event>, with the payload {event, batch: its counts, payload}. The latest "
                          "submission that names callbacks sets them.")

    @field_validator("tolerated_failure_percent")
    @classmethod
    def _a_usable_share(cls, value: float | None) -> float | None:
        if value is not None and 0 < value < MIN_TOLERATED_PERCENT:
            raise ValueError(f"tolerated_failure_percent is 0, or at least {MIN_TOLERATED_PERCENT:g}")
        return value

    @model_validator(mode="after")
    def _keys_unique(self) -> BatchIn:
        seen: dict[str, int] = {}
        clashes = []
        for index, task in enumerate(self.tasks):
            if task.key is None:
                continue
            if task.key in seen:
                clashes.append(f"tasks[{index}] repeats the key {task.key!r} of tasks[{seen[task.key]}]")
            else:
                seen[task.key] = index
        if clashes:
            raise ValueError("keys must be unique within a batch: " + "; ".join(clashes[:10]))
        return self


def _submission_kind(value: Any) -> str:
    return "batch" if isinstance(value, dict) and "tasks" in value else "task"


Submission = Annotated[
    Annotated[TaskIn, Tag("task")] | Annotated[BatchIn, Tag("batch")],
    Discriminator(_submission_kind),
]


class PutResult(BaseModel):
    key: str
    outcome: Literal["created", "exists"]


class SubmitTaskOut(PutResult):
    """Answer to a single task: 201 when created, 200 when the key existed (left untouched)."""


class SubmitBatchOut(BaseModel):
    """Answer to a batch: 201 when at least one task was created, else 200."""

    batch_id: str
    created: int
    existing: int
    results: list[PutResult]


class ErrorDetail(BaseModel):
    location: str = Field(description="Where the problem is, e.g. body.tasks[3].key or query.limit.")
    message: str
    type: str
    entry: int | None = Field(None, description="Index of the batch entry concerned, if any.")


class ErrorOut(BaseModel):
    """Every error answer has this shape."""

    statusCode: int  # noqa: N815 - the Powertools convention for error bodies
    error: str = Field(description="Short machine-readable error name.")
    message: str = Field(description="What went wrong, for a person.")
    errors: list[ErrorDetail] | None = None
    stored: list[str] | None = Field(
        None, description="Only when storage failed part-way through a batch: the keys that were stored. "
                          "Re-send the same request (puts are idempotent by key) to store the rest.")


class ResultLinkOut(BaseModel):
    """The body of a 303 from GET /tasks/{key}/result: where to fetch a result too large to answer."""

    location: str = Field(description="The presigned link (also the Location header), valid for an hour.")
    bytes: int = Field(description="The result's size, as JSON.")


class ResultRefOut(BaseModel):
    """Where a large result is kept."""

    uri: str = Field(description="s3://bucket/key on AWS, file:// in local runs.")
    bytes: int = Field(description="Size of the result (compact JSON).")
    sha256: str
    url: str | None = Field(None, description="Presigned GET link, valid for an hour (S3 only).")


class TaskOut(BaseModel):
    """The whole record of a task."""

    model_config = ConfigDict(extra="allow")

    key: str
    type: str
    status: str
    payload: Any = None
    attempts: int
    max_attempts: int
    created_at: str | None
    updated_at: str | None
    due_at: str | None
    started_at: str | None = Field(None, description="When the task was last claimed: the start of its latest "
                                                     "attempt (null until its first claim). A claim given back "
                                                     "unstarted (blocked, no rate token, too little time left) "
                                                     "leaves it, so a finished task's is its finishing attempt's.")
    finished_at: str | None
    lock_owner: str | None
    lock_expires_at: str | None
    batch_id: str | None
    parent: str | None = Field(None, description="Key of the task whose handler spawned this one.")
    priority: int | None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    rate_key: str | None = None
    rate_limit: int | None = None
    rate_interval_seconds: float | None = None
    timeout_seconds: float | None = Field(None, description="The task's own time limit, if it was put with one "
                                                            "(else its type's declared limit applies).")
    blocked: bool = Field(False, description="Waiting for a place in its concurrency group (its key's or its "
                                             "type's limit is reached): out of the queue until one frees.")
    result: Any = None
    result_ref: ResultRefOut | None = Field(
        None, description="Set when the result was too large for the record: read it with "
                          "GET /tasks/{key}/result (or its presigned url).")
    errors: list[dict[str, Any]]


class TaskSummary(BaseModel):
    """A task as the status index holds it (listing entries)."""

    key: str
    type: str | None
    status: str
    due_at: str | None
    attempts: int | None
    max_attempts: int | None
    updated_at: str | None
    batch_id: str | None
    lock_owner: str | None


class TaskPage(BaseModel):
    items: list[TaskSummary]
    count: int
    cursor: str | None = Field(description="Pass as ?cursor= for the next page; null when there is no more.")
    scanned: int = Field(description="Index entries read to answer (filters drop some of them).")


class BatchOut(BaseModel):
    batch_id: str
    total: int
    finished: int
    ignored: int
    open: int = Field(description="total - finished - ignored: tasks still todo, processing or failed.")
    done: bool = Field(description="open is 0 and every write to the batch has been counted (the counts "
                                   "follow the tasks by up to a coordinator tick).")
    state: Literal["running", "done", "failed"] = Field(
        description="failed: stopped at its failure threshold (see failure_reason); redrive it to go on.")
    failure_reason: str | None
    failed_at: str | None
    tolerated_failure_percent: float | None
    tolerated_failure_count: int | None
    created_at: str | None
    updated_at: str | None
    counted_through: str | None = Field(description="Every write made before this time is in the counts "
                                                    "(null for a batch counted before the table's stream).")
    callbacks: list[str] = Field([], description="The events the batch has callback tasks for.")
    fired: list[str] = Field([], description="The events that have happened and were handled (callback put, "
                                             "event published), each once.")
    completed_at: str | None = Field(None, description="When its completion fired (complete callback, Batch "
                                                       "Completed event): from then on it takes no new tasks.")


MAX_BULK_PER_REQUEST = 200  # tasks changed by one bulk request (each is a read and a write)
MAX_BULK_DRY_RUN_PER_REQUEST = 1000  # tasks counted by one dry-run request


class BulkIn(_Strict):
    """A bulk action: retry or cancel every task matching a filter, a page per request."""

    action: BulkAction = Field(description="retry (failed or ignored tasks) or cancel (todo, failed or "
                                           "processing tasks).")
    status: BulkStatus = Field(description="The status of the tasks to act on.")
    type: str | None = Field(None, min_length=1, max_length=MAX_TYPE_CHARS, description="Only tasks of this type.")
    batch_id: str | None = Field(None, pattern=BATCH_ID_PATTERN, description="Only tasks of this batch.")
    created_after: datetime | None = Field(None, description="Only tasks created at or after this ISO-8601 "
                                                             "time (no zone means UTC).")
    created_before: datetime | None = Field(None, description="Only tasks created before this time.")
    dry_run: StrictBool = Field(False, description="Count the matching tasks of this page; change nothing.")
    limit: StrictInt = Field(100, ge=1, le=MAX_BULK_DRY_RUN_PER_REQUEST,
                             description=f"Tasks acted on per request: at most {MAX_BULK_PER_REQUEST}, "
                                         f"{MAX_BULK_DRY_RUN_PER_REQUEST} in a dry run.")
    cursor: str | None = Field(None, max_length=MAX_CURSOR_CHARS,
                               description="From the previous answer, to go on where it stopped.")

    @field_validator("type")
    @classmethod
    def _type_is_usable(cls, value: str | None) -> str | None:
        return None if value is None else no_control_characters(value, "type")

    @field_validator("created_after", "created_before", mode="before")
    @classmethod
    def _time_is_text(cls, value: Any) -> Any:
        return time_as_text(value, "the time")

    @field_validator("created_after", "created_before")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return as_utc(value)

    @model_validator(mode="after")
    def _consistent(self) -> BulkIn:
        check_action(self.action, self.status.value)
        if self.created_after and self.created_before and self.created_after >= self.created_before:
            raise ValueError("created_after must be earlier than created_before")
        if not self.dry_run and self.limit > MAX_BULK_PER_REQUEST:
            raise ValueError(f"limit is at most {MAX_BULK_PER_REQUEST} when acting "
                             f"({MAX_BULK_DRY_RUN_PER_REQUEST} in a dry run)")
        return self


class BulkOut(BaseModel):
    action: BulkAction
    status: BulkStatus
    dry_run: bool
    matched: int = Field(description="Tasks of this page that match the filter: in a dry run, what would "
                                     "change.")
    changed: int = Field(description="Tasks this request changed (0 in a dry run).")
    skipped: int = Field(description="Matching tasks that changed state before the action reached them.")
    unreached: int = Field(0, description="Matching tasks not acted on because writes were slow (the request "
                                          "answers before API Gateway's time limit): the cursor reads this page "
                                          "again.")
    scanned: int = Field(description="Index entries read.")
    cursor: str | None = Field(description="More may remain: call again with the same filter and this cursor. "
                                           "null when the whole status has been read.")


class TypeOut(BaseModel):
    type: str
    registered: bool = Field(description="A handler is registered for it in this deployment.")
    paused: bool = Field(description="Its tasks are neither dispatched nor claimed; running ones finish.")
    held: int = Field(description="Its tasks parked out of the queue while paused (counted up to 1,000), "
                                  "put back once it is resumed.")
    limit: int | None = Field(None, description="At most this many of its tasks run at once (null: no limit).")
    running: int | None = Field(None, description="With a limit: places taken now (live leases).")
    blocked: int | None = Field(None, description="With a limit: its tasks waiting for a place (counted up to "
                                                  "1,000), woken oldest first as places free.")
    changed: bool | None = Field(None, description="For pause and resume: false when it was so already.")
    timeout_seconds: float | None = Field(None, description="The time limit its handler declares (null: none; a "
                                                            "task may carry its own).")
    runner: Literal["lambda", "container"] = Field("lambda", description="Where its tasks run: the Lambda worker, "
                                                   "or the container runner (ECS Fargate; its limit is longer than "
                                                   "a Lambda worker gives, or it asks for one).")
    observed_p95_seconds: float | None = Field(None, description="Without a declared limit: the p95 of its "
                                                                 "observed run times, which plans its tasks (null "
                                                                 "until 10 runs are kept).")


class LimitIn(_Strict):
    """A task type's concurrency limit."""

    limit: StrictInt | None = Field(
        description=f"At most this many tasks of the type run at once, fleet-wide (1-{MAX_CONCURRENCY_LIMIT}); "
                    "null lifts the limit. Claimers see a change within COWORKER_CONTROL_CACHE_SECONDS.",
        ge=1, le=MAX_CONCURRENCY_LIMIT)


class RateLimitIn(_Strict):
    """A rate group's limit: at most ``limit`` starts per ``interval_seconds``."""

    limit: StrictInt | None = Field(
        description=f"At most this many tasks of the group start per interval, fleet-wide (1-{MAX_RATE_LIMIT}); "
                    "null lifts the limit set here (a key's tasks may still carry their own). Claimers see "
                    "a change within COWORKER_CONTROL_CACHE_SECONDS.",
        ge=1, le=MAX_RATE_LIMIT)
    interval_seconds: float = Field(
        1.0, ge=MIN_RATE_INTERVAL_SECONDS, le=MAX_RATE_INTERVAL_SECONDS, strict=True, allow_inf_nan=False,
        description=f"The interval, in seconds ({MIN_RATE_INTERVAL_SECONDS:g}-{MAX_RATE_INTERVAL_SECONDS:g}; "
                    "default 1).")


class RateLimitOut(BaseModel):
    group: str = Field(description="key:<rate key> or type:<task type>")
    limit: int | None = Field(None, description="Starts allowed per interval (null: not limited).")
    interval_seconds: float | None = None
    source: str = Field(description="set: set through the API or CLI; last start: none is set, this is the "
                                    "limit the group's last start ran under (carried by its task); none: no "
                                    "limit known")
    started_in_interval: int = Field(description="Starts in the last interval.")
    next_free_at: str | None = Field(None, description="When the next start is allowed, if not now.")
    booked_until: str | None = Field(None, description="Waiters are booked up to here (ISO-8601 UTC): their "
                                                       "tasks are due one after another as tokens free.")
    changed: bool | None = Field(None, description="For PUT: false when the limit was so already.")


class RateLimitsOut(BaseModel):
    limits: list[RateLimitOut] = Field(description="The groups with a limit set, by name.")
    note: str
    cursor: str | None = Field(None, description="Pass as ?cursor= for the next page of groups; null when there "
                                                 "is no more.")


class TypesOut(BaseModel):
    types: list[TypeOut]
    note: str
    cursor: str | None = Field(None, description="Pass as ?cursor= for the next page of types; null when there "
                                                 "is no more.")


class RedriveOut(BaseModel):
    batch_id: str
    status: RedriveStatus
    redriven: int
    skipped: int = Field(description="Matching tasks that changed state before they could be redriven.")
    unreached: int = Field(0, description="Tasks not redriven because writes were slow (the request answers "
                                          "before API Gateway's time limit): the cursor reads this page again.")
    scanned: int
    cursor: str | None = Field(description="More may remain: call again with this cursor.")


class StatusCount(BaseModel):
    count: int | None = Field(description="Index entries of the status, at most the cap (null: not counted).")
    capped: bool = Field(description="True when there are more than the cap: count is a lower bound (the real "
                                     "number is at least count). False: count is exact, as the index holds it.")


class StatsOut(BaseModel):
    counts: dict[str, StatusCount]
    cap: int = Field(description="The cap counted up to, per status (at most 1,000, whatever was asked).")
    note: str


class ScheduleTaskIn(_TaskTemplateIn):
    """The task a schedule puts (the fields of a task, without key and run_at: the occurrence sets them)."""

    _WHY = ("a schedule's task has no key or run_at: each occurrence gets the key <name>@<occurrence time> and runs "
            "at that time")


class ScheduleIn(_Strict):
    """A recurring schedule: when it fires, and the task each occurrence puts."""

    expression: str = Field(
        min_length=1, max_length=200,
        description="rate(N minutes|hours|days), counted from when the schedule is put, or "
                    "cron(minute hour day-of-month month day-of-week), five crontab fields read in `timezone`.",
        examples=["cron(0 3 * * *)", "rate(15 minutes)"])
    timezone: str = Field("UTC", min_length=1, max_length=64,
                          description="IANA time zone a cron expression is read in (e.g. Europe/Berlin).")
    missed: Literal["once", "skip"] = Field(
        "once", description="Occurrences missed while nothing ran (coordinator down, schedule paused): 'once' "
                            "runs the latest of them once, 'skip' runs none of them (an occurrence more than "
                            "5 minutes late counts as missed). Never more than one at a time.")
    paused: StrictBool = Field(False, description="Put the schedule paused: it fires once resumed.")
    task: ScheduleTaskIn = Field(description="The task each occurrence puts; its key is <name>@<occurrence "
                                             "time, UTC>, so every occurrence is put exactly once.")


class ScheduleOut(BaseModel):
    name: str
    expression: str
    timezone: str
    missed: str
    paused: bool
    task: dict[str, Any] = Field(description="The task each occurrence puts.")
    next_run_at: datetime | None = Field(description="The next occurrence (null while paused).")
    last_run_at: datetime | None = Field(description="The last occurrence that put a task.")
    last_task_key: str | None = Field(description="The key of the task it put.")
    skipped: int = Field(description="Occurrences missed and skipped (missed='skip').")
    created_at: datetime
    updated_at: datetime
    created: bool | None = Field(None, description="For PUT: true when the schedule is new.")
    changed: bool | None = Field(None, description="For pause and resume: false when it was so already.")


class SchedulesOut(BaseModel):
    schedules: list[ScheduleOut] = Field(description="Active schedules by next occurrence, then paused ones by "
                                                     "when they were paused.")
    cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; null when there is no more.")
    truncated: bool = Field(description="More schedules follow (cursor is not null); kept for clients written "
                                        "before the listing paged.")
