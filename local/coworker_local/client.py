"""Coworker's Python client: put many tasks, follow their batch, read their results.

The ``coworker`` command, the local demo and your own code share it::

    from coworker_local.client import Coworker

    tasks = Coworker("https://abc.execute-api.eu-west-1.amazonaws.com/v1", api_key="...")  # or iam=True
    submitted = tasks.submit({"key": f"page-{n}", "type": "crawl", "payload": {"url": url}}
                             for n, url in enumerate(urls))           # any iterable, sent in chunks
    batch = tasks.wait(submitted.batch_id, on_progress=print)        # until every task has ended
    for key, result in tasks.results(submitted.keys):                # the finished ones' results
        ...

Every call follows the API's advice (re-sent on 503 and 429 with backoff, see
:mod:`coworker_local.api_client`) and raises :class:`ApiError` with the API's own message when it
refuses, or :class:`Unreachable`. Puts are idempotent by key: a task without one gets a random key
before it is sent, so a re-sent chunk stores each task once, and re-running ``submit`` with the
same keys and ``batch_id`` stores only what is missing.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from coworker_local.api_client import ApiClient, ApiError, Unreachable

__all__ = ["ApiError", "BatchProgress", "Coworker", "SubmitStopped", "Submitted", "Task", "Unreachable"]

DEFAULT_URL = "http://127.0.0.1:8000"
# One POST /tasks carries at most this many tasks and about this many bytes (the API's limits are
# 1,000 tasks and API Gateway's 10 MB).
CHUNK_TASKS = 1000
CHUNK_BYTES = 5 * 1024 * 1024
# Requests the CLI sends at once when it submits a file (the local API answers 4 side by side;
# API Gateway and Lambda more), and the most it allows.
SUBMIT_PARALLEL = 4
MAX_SUBMIT_PARALLEL = 32
# Entries asked for per page of a listing: the API's largest pages (coworker.api.models).
SCHEDULE_PAGE = 100
TYPE_PAGE = 100
RATE_PAGE = 100


@dataclasses.dataclass(frozen=True)
class Submitted:
    """What :meth:`Coworker.submit` stored: ``created`` new tasks and ``existing`` keys that were
    there already (a re-run), all in batch ``batch_id``."""

    batch_id: str
    submitted: int
    created: int
    existing: int
    keys: tuple[str, ...]


class SubmitStopped(ApiError):
    """The API refused a request of :meth:`Coworker.submit` (after its re-sends): the submit stopped.
    Its status, message and errors are the refusal's; ``submitted`` is what is stored in the batch
    (every request answered, requests sent alongside included, and the keys a refused request
    reported stored); ``first`` is the index in the input of the refused request's first task and
    ``count`` its number of tasks (the errors' ``entry`` counts from ``first``)."""

    def __init__(self, cause: ApiError, submitted: Submitted, first: int, count: int) -> None:
        super().__init__(cause.status, cause.message, cause.errors, cause.stored, cause.retry_after)
        self.submitted = submitted
        self.first = first
        self.count = count


@dataclasses.dataclass(frozen=True)
class BatchProgress:
    """A batch's counts (``GET /batches/{id}``): ``done`` once no task is open and every write
    is counted; ``state`` is ``running``, ``done`` or ``failed`` (stopped at its threshold)."""

    batch_id: str
    total: int
    finished: int
    ignored: int
    open: int
    done: bool
    state: str
    failure_reason: str | None = None

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> BatchProgress:
        return cls(batch_id=str(answer["batch_id"]), total=int(answer["total"]), finished=int(answer["finished"]),
                   ignored=int(answer["ignored"]), open=int(answer["open"]), done=bool(answer["done"]),
                   state=str(answer["state"]), failure_reason=answer.get("failure_reason"))

    def __str__(self) -> str:
        return (f"batch {self.batch_id}: {self.finished + self.ignored}/{self.total} ended "
                f"(finished {self.finished}, ignored {self.ignored}, open {self.open}) - {self.state}")


@dataclasses.dataclass(frozen=True)
class Task:
    """One task as ``GET /tasks/{key}`` answers it; ``raw`` has every field."""

    key: str
    type: str | None
    status: str
    attempts: int
    max_attempts: int | None
    errors: list[dict[str, Any]]
    raw: dict[str, Any]

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> Task:
        return cls(key=answer["key"], type=answer.get("type"), status=answer["status"],
                   attempts=int(answer.get("attempts") or 0), max_attempts=answer.get("max_attempts"),
                   errors=list(answer.get("errors") or []), raw=dict(answer))

    @property
    def last_error(self) -> dict[str, Any] | None:
        return self.errors[-1] if self.errors else None


class Coworker:
    """A client of one deployment's task API (or of the local runtime's)."""

    def __init__(self, url: str | None = None, *, api_key: str | None = None, iam: bool = False,
                 region: str | None = None, api: ApiClient | None = None) -> None:
        """``url`` defaults to ``COWORKER_API_URL`` (else the local runtime's), ``api_key`` to
        ``COWORKER_API_KEY``; ``iam`` signs requests with your AWS credentials (SigV4)."""
        self.api = api or ApiClient(url or os.environ.get("COWORKER_API_URL") or DEFAULT_URL,
                                    api_key=api_key if api_key is not None else os.environ.get("COWORKER_API_KEY"),
                                    iam=iam, region=region)

    # -- putting tasks ---------------------------------------------------------------------

    def put(self, task: Mapping[str, Any]) -> str:
        """Put one task; ``"created"``, or ``"exists"`` when its key was there already."""
        return str(self.api.request("POST", "/tasks", body=dict(task))["outcome"])

    def submit(self, tasks: Iterable[Mapping[str, Any]], *, batch_id: str | None = None,
               chunk_size: int = CHUNK_TASKS, on_progress: Callable[[Submitted], None] | None = None,
               callbacks: Mapping[str, Mapping[str, Any]] | None = None, parallel: int = 1) -> Submitted:
        """Put every task of ``tasks`` (any iterable, read once) in one batch, ``chunk_size`` per
        request and ``parallel`` requests at a time; ``on_progress`` is told after each request, in
        the order of the tasks. A task without a key is given one. ``callbacks`` (``complete``,
        ``success``, ``stopped`` -> a task without key) go with every request: each fires once,
        when the batch gets there (docs/batches.md). A request the API refuses (after its re-sends)
        stops the submit: nothing more is sent, the requests in flight are answered, and
        :class:`SubmitStopped` says what is stored and which tasks were refused."""
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        batch_id = batch_id or uuid.uuid4().hex
        keys: list[str] = []
        created = existing = 0
        refused: _Refused | None = None  # the first request refused, in the order of the tasks

        def put(chunk: list[dict[str, Any]]) -> tuple[int, int]:
            body: dict[str, Any] = {"batch_id": batch_id, "tasks": chunk}
            if callbacks:
                body["callbacks"] = dict(callbacks)
            chunk_keys = {task["key"] for task in chunk}
            try:
                # Every task has a key and the batch its id: a request cut off (504) is safe to send again.
                answer = self.api.request("POST", "/tasks", body=body, idempotent=True, resend=_without_stored)
            except ApiError as exc:
                raise _Refused(exc, self.api.stored_before_resend & chunk_keys) from exc
            # Tasks stored by an attempt the API asked to re-send are left out of the next one, or
            # answer "exists" in it (after a 504, which names none, they are counted as existing).
            stored = self.api.stored_before_resend & chunk_keys
            again = sum(1 for result in answer["results"] if result["outcome"] == "exists" and result["key"] in stored)
            return answer["created"] + len(stored), answer["existing"] - again

        def record(first: int, chunk: list[dict[str, Any]], sent: Callable[[], tuple[int, int]]) -> None:
            nonlocal created, existing, refused
            try:
                counts = sent()
            except _Refused as exc:
                # What the refused request stored is stored; the first refused is the one reported.
                created += len(exc.stored)
                keys.extend(task["key"] for task in chunk if task["key"] in exc.stored)
                if refused is None:
                    refused = exc.at(first, len(chunk))
                return
            created += counts[0]
            existing += counts[1]
            keys.extend(task["key"] for task in chunk)
            if on_progress is not None:
                on_progress(Submitted(batch_id, len(keys), created, existing, ()))

        numbered = _numbered(chunked(tasks, chunk_size))
        if parallel == 1:
            for first, chunk in numbered:
                record(first, chunk, functools.partial(put, chunk))
                if refused is not None:
                    break
        else:
            with ThreadPoolExecutor(max_workers=parallel) as pool:
                sent: collections.deque[_Sent] = collections.deque()
                for first, chunk in numbered:
                    sent.append((first, chunk, pool.submit(put, chunk)))
                    if len(sent) >= 2 * parallel:  # read the tasks only as fast as they are put
                        record(*_answered(sent.popleft()))
                    if refused is not None:  # send nothing more; count what those in flight store
                        break
                while sent:
                    record(*_answered(sent.popleft()))
        submitted = Submitted(batch_id, len(keys), created, existing, tuple(keys))
        if refused is not None:
            raise SubmitStopped(refused.cause, submitted, refused.first, refused.count) from refused.cause
        return submitted

    # -- following them --------------------------------------------------------------------

    def batch(self, batch_id: str) -> BatchProgress:
        return BatchProgress.of(self.api.request("GET", f"/batches/{_path(batch_id)}"))

    def wait(self, batch_id: str, *, poll_seconds: float = 2.0, timeout: float | None = None,
             on_progress: Callable[[BatchProgress], None] | None = None,
             sleep: Callable[[float], None] = time.sleep) -> BatchProgress:
        """Poll the batch until it is done or failed (stopped at its threshold); ``TimeoutError``
        after ``timeout`` seconds, if given."""
        started = time.monotonic()
        while True:
            progress = self.batch(batch_id)
            if on_progress is not None:
                on_progress(progress)
            if progress.done or progress.state == "failed":
                return progress
            if timeout is not None and time.monotonic() - started >= timeout:
                raise TimeoutError(f"{progress} after {timeout:g} s")
            sleep(poll_seconds)

    def task(self, key: str) -> Task:
        return Task.of(self.api.request("GET", f"/tasks/{_path(key)}"))

    def result(self, key: str) -> Any:
        """A finished task's result (:class:`ApiError` 409 before it finishes); one too large for
        an answer of the API is fetched from the presigned link it redirects to (303), without the
        API's credentials."""
        return self.api.request("GET", f"/tasks/{_path(key)}/result")

    def results(self, keys: Iterable[str]) -> Iterator[tuple[str, Any]]:
        """``(key, result)`` of each finished task of ``keys``, in order; tasks that are not
        finished (ignored, or still open) are passed over: :meth:`task` says why."""
        for key in keys:
            try:
                yield key, self.result(key)
            except ApiError as exc:
                if exc.status != 409:
                    raise

    def retry(self, key: str) -> Task:
        return Task.of(self.api.request("POST", f"/tasks/{_path(key)}/retry"))

    # -- listings (each follows its cursor to the end) -------------------------------------

    def schedules(self) -> Iterator[dict[str, Any]]:
        """Every schedule, as ``GET /schedules`` answers each (active ones by next occurrence,
        then paused ones), a page at a time. A schedule that fires or is paused or resumed
        meanwhile may come twice or not at all."""
        return self.api.pages("/schedules", "schedules", {"limit": SCHEDULE_PAGE})

    def types(self) -> Iterator[dict[str, Any]]:
        """Every task type registered, paused, held or limited, by name, a page at a time."""
        return self.api.pages("/types", "types", {"limit": TYPE_PAGE})

    def rate_limits(self) -> Iterator[dict[str, Any]]:
        """Every rate limit set through the API or CLI, by group, with its recent starts, a page at
        a time (a group whose tasks carry their own limit: ``GET /rate-limits/key:<key>``)."""
        return self.api.pages("/rate-limits", "limits", {"limit": RATE_PAGE})

    def cancel(self, key: str) -> Task:
        return Task.of(self.api.request("POST", f"/tasks/{_path(key)}/cancel"))


_Sent = tuple[int, list[dict[str, Any]], Future[tuple[int, int]]]


class _Refused(Exception):
    """A request of a submit refused (``cause``), with the keys of it stored before, and where
    its tasks start in the input once known."""

    def __init__(self, cause: ApiError, stored: set[str]) -> None:
        super().__init__(cause.message)
        self.cause = cause
        self.stored = stored
        self.first = self.count = 0

    def at(self, first: int, count: int) -> _Refused:
        self.first, self.count = first, count
        return self


def _numbered(chunks: Iterable[list[dict[str, Any]]]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Each chunk with the index in the input of its first task."""
    first = 0
    for chunk in chunks:
        yield first, chunk
        first += len(chunk)


def _without_stored(body: dict[str, Any], stored: set[str]) -> dict[str, Any]:
    """A batch put to send again: without the tasks an earlier send stored (at least one task
    stays, to be answered as existing). When writes are slow each send puts a part of its tasks
    before its window closes; sending them all again would spend the window on those stored."""
    rest = [task for task in body["tasks"] if task["key"] not in stored]
    return {**body, "tasks": rest or body["tasks"][:1]}


def _answered(sent: _Sent) -> tuple[int, list[dict[str, Any]], Callable[[], tuple[int, int]]]:
    """A chunk sent (where it starts, its tasks) and what gives its counts (created, existing)
    once its request is answered."""
    first, chunk, answer = sent
    return first, chunk, answer.result


def chunked(tasks: Iterable[Mapping[str, Any]], size: int = CHUNK_TASKS) -> Iterator[list[dict[str, Any]]]:
    """``tasks`` in lists of at most ``size`` tasks and about CHUNK_BYTES, each with a key."""
    chunk: list[dict[str, Any]] = []
    used = 0
    for given in tasks:
        task = dict(given)
        if task.get("key") is None:  # a key of its own: a re-sent chunk stores each task once
            task["key"] = str(uuid.uuid4())
        task_bytes = len(json.dumps(task).encode("utf-8")) + 2
        if chunk and (len(chunk) >= size or used + task_bytes > CHUNK_BYTES):
            yield chunk
            chunk, used = [], 0
        chunk.append(task)
        used += task_bytes
    if chunk:
        yield chunk


def _path(key: str) -> str:
    return quote(key, safe="")
