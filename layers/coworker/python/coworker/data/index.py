"""Reads through the sharded status index: what the coordinator dispatches, listings, counts.

Each status lives in S index partitions, ``todo#0`` ... ``todo#S-1`` (see :mod:`coworker.data.layout`).
A read queries the S partitions of a status in parallel, a page each, and merges them by
``due_at``: the merged stream is in exactly the order one unsharded partition would give, and it
fetches a shard's next page only when the merge needs it. Reading the first N entries this way
costs about N + sqrt(N * S) entries and S queries (one for an unsharded index), however large
the backlog.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Final

from pynamodb.expressions.condition import Condition

from coworker.data import layout
from coworker.data.models import TaskModel, TaskStatus, status_shards

_INDEX_KEYS = (layout.PARTITION_KEY, layout.STATUS_INDEX_PARTITION_KEY, layout.STATUS_INDEX_SORT_KEY)
_STATUS_INDEX_NAME = TaskModel.status_index.Meta.index_name
COUNT_SELECT = "COUNT"
_pool: ThreadPoolExecutor | None = None


def _parallel(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` at once on a shared pool (in the calling thread when there is one)."""
    global _pool
    if len(calls) <= 1:
        return [call() for call in calls]
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="coworker-shard-read")
    return list(_pool.map(lambda call: call(), calls))


def index_key_of(item: dict[str, Any]) -> dict[str, Any]:
    """The index key (a LastEvaluatedKey) of a raw index entry: where a read resumes after it."""
    return {name: item[name] for name in _INDEX_KEYS}


class ShardStream:
    """One shard's entries, a page at a time, with the position a later read resumes from."""

    def __init__(self, value: str, start: dict[str, Any] | None) -> None:
        self.value = value
        self.buffer: deque[dict[str, Any]] = deque()
        self.next_key = start  # where the next page starts
        self.position = start  # where a later read resumes: after the last entry taken
        self.fetched = False
        self.scanned = 0

    @property
    def more_pages(self) -> bool:
        return not self.fetched or self.next_key is not None

    @property
    def exhausted(self) -> bool:
        return not self.buffer and not self.more_pages

    def fetch(self, page_size: int, **query: Any) -> None:
        page = next(TaskModel.status_index.query(
            self.value, page_size=page_size, last_evaluated_key=self.next_key, **query).page_iter)
        self.fetched = True
        self.scanned += int(page.get("ScannedCount", 0))
        self.next_key = page.get("LastEvaluatedKey")
        items = page.get("Items", [])
        self.buffer.extend(items)
        if not items and self.next_key is not None:
            self.position = self.next_key  # a page that the filter emptied: skip it next time

    def take(self) -> dict[str, Any]:
        item = self.buffer.popleft()
        self.position = index_key_of(item)
        return item


class MergedRead:
    """The entries of ``status`` across its shards, in ``due_at`` order (oldest first unless
    ``forward`` is false), as :class:`TaskModel` objects.

    ``starts`` resumes each shard where an earlier read's :meth:`positions` left it.
    ``budget`` bounds the index entries read (filters cut the answer, not the read): once it is
    spent the iteration stops early and :attr:`complete` stays false.
    """

    def __init__(self, status: str, *, want: int, range_key_condition: Condition | None = None,
                 filter_condition: Condition | None = None, forward: bool = True,
                 starts: Sequence[dict[str, Any] | None | bool] | None = None,
                 budget: int | None = None, shards: int | None = None) -> None:
        shards = shards or status_shards()
        values = layout.shard_values(status, shards)
        starts = list(starts) if starts is not None else [None] * shards
        if len(starts) != shards:
            raise ValueError(f"{len(starts)} shard positions for {shards} shards")
        self.streams = [ShardStream(value, start if isinstance(start, dict) else None)
                        for value, start in zip(values, starts, strict=True)]
        for stream, start in zip(self.streams, starts, strict=True):
            if start is False:  # finished in an earlier read
                stream.fetched, stream.next_key = True, None
        self.forward = forward
        self.budget = budget
        # A shard's share of ``want``, plus about one standard deviation of how the hash spreads
        # it (one shard: exactly ``want``); a shard that runs dry before the merge ends is read on.
        share = want / shards
        self.page_size = max(1, min(want, math.ceil(share + math.sqrt(share))))
        if filter_condition is not None:
            self.page_size = max(self.page_size, 25)
        self.query: dict[str, Any] = {"scan_index_forward": forward}
        if range_key_condition is not None:
            self.query["range_key_condition"] = range_key_condition
        if filter_condition is not None:
            self.query["filter_condition"] = filter_condition

    @property
    def scanned(self) -> int:
        return sum(stream.scanned for stream in self.streams)

    @property
    def complete(self) -> bool:
        """True once every shard has been read to its end."""
        return all(stream.exhausted for stream in self.streams)

    def positions(self) -> list[dict[str, Any] | None | bool]:
        """Per shard: where a later read resumes (an index key), ``None`` to start at the
        beginning, ``False`` once nothing is left."""
        return [False if stream.exhausted else stream.position for stream in self.streams]

    def _fill(self) -> bool:
        """Fetch a page for every shard whose buffer ran dry; False if the budget forbids it."""
        dry = [stream for stream in self.streams if not stream.buffer and stream.more_pages]
        while dry:
            if self.budget is not None and self.scanned >= self.budget:
                return False
            _parallel([functools.partial(stream.fetch, self.page_size, **self.query) for stream in dry])
            dry = [stream for stream in dry if not stream.buffer and stream.more_pages]
        return True

    def __iter__(self) -> Iterator[TaskModel]:
        while self._fill():
            ready = [stream for stream in self.streams if stream.buffer]
            if not ready:
                return
            pick = min if self.forward else max
            stream = pick(ready, key=lambda s: s.buffer[0][layout.STATUS_INDEX_SORT_KEY]["S"])
            yield TaskModel.from_raw_data(stream.take())


def any_due(until: datetime) -> bool:
    """Whether any task is due by ``until`` in ``todo`` or ``failed`` (one entry read per shard,
    each status only if the one before had none)."""
    return any(next(iter(due(status, until, 1)), None) is not None for status in (TaskStatus.TODO, TaskStatus.FAILED))


def due(status: TaskStatus, now: datetime, limit: int, read_past: int = 0) -> Iterator[TaskModel]:
    """Tasks in ``status`` whose ``due_at`` has passed, oldest first, at most ``limit`` (plus
    ``read_past`` more for a caller that skips some: pages stay sized for ``limit``, and further
    pages are read only as the caller goes on).

    Key-condition queries on the index's shards (eventually consistent, as every GSI read is),
    merged; they read about ``limit + sqrt(limit * S)`` entries, however large the backlog.
    """
    if limit <= 0:
        return iter(())
    read = MergedRead(status.value, want=limit, range_key_condition=TaskModel.due_at <= now)
    return _first(iter(read), limit + read_past)


# What a self-feeding worker reads of each index entry: what it filters on, nothing it would
# parse for nothing (a worker's own CPU bounds how fast its threads turn over).
FEED_ATTRIBUTES: Final = [layout.PARTITION_KEY, layout.STATUS_INDEX_SORT_KEY, "type", "batch_id", "attempts",
                         "max_attempts"]


def due_in_shard(status: TaskStatus, now: datetime, limit: int, shard: int, page_size: int,
                 exclude_types: Sequence[str] = (), read_past: int = 0) -> Iterator[TaskModel]:
    """Due tasks of ``status`` in one index ``shard``, oldest first, at most ``limit``. For
    self-feeding workers, which read the shards their own keys are in
    (:func:`~coworker.data.layout.stripe_shards`); the coordinator's :func:`due` keeps the exact
    global order. Pages of ``page_size`` entries are read as the caller iterates, so a caller that
    stops early reads no more. Each task holds only ``FEED_ATTRIBUTES``. Tasks of
    ``exclude_types`` (another runner's) are left out by the query's filter, and at most
    ``limit + read_past`` entries are read for them."""
    value, due = layout.shard_value(status.value, shard), TaskModel.due_at <= now
    page_size = max(1, min(limit, page_size))
    if not exclude_types:
        return TaskModel.status_index.query(value, due, limit=limit, page_size=page_size,
                                            attributes_to_get=FEED_ATTRIBUTES)
    pages = TaskModel.status_index.query(value, due, filter_condition=~TaskModel.task_type.is_in(*exclude_types),
                                         page_size=page_size, attributes_to_get=FEED_ATTRIBUTES).page_iter
    return _filtered(pages, limit, limit + read_past)


def _filtered(pages: Any, limit: int, read_budget: int) -> Iterator[TaskModel]:
    """The items of a filtered query's pages, at most ``limit``, reading no page once
    ``read_budget`` entries were read (an item iterator would read on through pages the filter
    empties)."""
    taken = 0
    for page in pages:
        for item in page.get("Items", ()):
            yield TaskModel.from_raw_data(item)
            taken += 1
            if taken >= limit:
                return
        if pages.total_scanned_count >= read_budget:
            return
        # A page the filter emptied (much of it another runner's): read on in pages of TYPED_PAGE.
        if len(page.get("Items", ())) < (pages.page_size or 0) // 2:
            pages.page_size = min(TYPED_PAGE, read_budget - pages.total_scanned_count)


def due_of_types(status: TaskStatus, now: datetime, types: Sequence[str], want: int,
                 read_budget: int) -> list[TaskModel]:
    """Due tasks of ``status`` whose type is one of ``types``, oldest first in each index shard,
    at most ``want``, reading at most about ``read_budget`` index entries in all (a filtered query
    per shard, pages of at most :data:`TYPED_PAGE` entries): how the container runners' work is
    found among the Lambda workers' without reading the whole backlog. Each task holds only
    ``FEED_ATTRIBUTES``."""
    if want <= 0 or not types:
        return []
    values = layout.shard_values(status.value, status_shards())
    share = max(TYPED_PAGE, read_budget // len(values))

    def shard(value: str) -> list[TaskModel]:
        found: list[TaskModel] = []
        # Page by page: an item iterator would read on through pages the filter empties.
        pages = TaskModel.status_index.query(value, TaskModel.due_at <= now,
                                             filter_condition=TaskModel.task_type.is_in(*types),
                                             page_size=min(TYPED_PAGE, share),
                                             attributes_to_get=FEED_ATTRIBUTES).page_iter
        for page in pages:
            found.extend(TaskModel.from_raw_data(item) for item in page.get("Items", ()))
            if len(found) >= want or pages.total_scanned_count >= share:
                break
        return found

    entries = [task for found in _parallel([functools.partial(shard, value) for value in values]) for task in found]
    return sorted(entries, key=lambda task: task.due_at)[:want]


# Index entries one page of a filtered query reads at most (see :func:`due_of_types`).
TYPED_PAGE: Final = 200


def due_between(statuses: Sequence[TaskStatus], after: datetime, until: datetime, read_budget: int,
                task_type: str | None = None) -> tuple[list[TaskModel], bool]:
    """Tasks of ``statuses`` due from ``after`` to ``until`` (of ``task_type`` only, if given),
    by ``due_at``, each holding only its key, ``due_at`` and ``status_shard``; reading about
    ``read_budget`` index entries at most, shared among the shards. Returns ``(tasks, complete)``:
    complete when every shard was read to ``until``; else the tasks are the first ones, due up to
    where the shard read least far stopped.

    How a rate group's booked waiters are found (:func:`coworker.engine.rates.rebook`): the index
    holds no rate key, so a key's are among every task due in that span."""
    values = [value for status in statuses for value in layout.shard_values(status.value, status_shards())]
    share = max(1, read_budget // len(values))
    wanted = TaskModel.task_type == task_type if task_type is not None else None
    names = [layout.PARTITION_KEY, layout.STATUS_INDEX_PARTITION_KEY, layout.STATUS_INDEX_SORT_KEY]

    def shard(value: str) -> tuple[list[dict[str, Any]], str | None]:
        """The shard's entries, and the due time it stopped at (``None``: read to ``until``)."""
        found: list[dict[str, Any]] = []
        pages = TaskModel.status_index.query(value, TaskModel.due_at.between(after, until), filter_condition=wanted,
                                             page_size=min(TYPED_PAGE, share), attributes_to_get=names).page_iter
        for page in pages:
            found.extend(page.get("Items", ()))
            if pages.total_scanned_count >= share and pages.last_evaluated_key is not None:
                return found, pages.last_evaluated_key[layout.STATUS_INDEX_SORT_KEY]["S"]
        return found, None

    read = _parallel([functools.partial(shard, value) for value in values])
    stops = [stop for _, stop in read if stop is not None]
    # (due_at is stored as a fixed-width ISO string: its text sorts as its time does)
    entries = [item for found, _ in read for item in found
               if not stops or item[layout.STATUS_INDEX_SORT_KEY]["S"] <= min(stops)]
    tasks = sorted((TaskModel.from_raw_data(item) for item in entries), key=lambda task: (task.due_at, task.key))
    return tasks, not stops


def running_and_lost(now: datetime) -> tuple[int, list[TaskModel]]:
    """Every ``processing`` entry, read once: how many hold a live lock, and those whose lock
    has expired (lost workers), oldest first.

    One query per shard, paging to the end: it reads every running task's index entry (as many
    as ``max_concurrency``, a couple of hundred bytes each) plus the lost ones.
    """
    def shard(value: str) -> list[TaskModel]:
        return list(TaskModel.status_index.query(value))

    entries = [task for found in _parallel([functools.partial(shard, value) for value in
                                            layout.shard_values(TaskStatus.PROCESSING.value, status_shards())])
               for task in found]
    lost = sorted((task for task in entries if task.due_at <= now), key=lambda task: task.due_at)
    return len(entries) - len(lost), lost


def _first(items: Iterator[TaskModel], limit: int) -> Iterator[TaskModel]:
    for count, item in enumerate(items, start=1):
        yield item
        if count >= limit:
            return


def count(status: TaskStatus | str, range_key_condition: Condition | None = None) -> int:
    """Exact number of index entries of ``status`` (all shards, in parallel; paginates)."""
    value = status.value if isinstance(status, TaskStatus) else status
    return sum(_parallel([
        functools.partial(TaskModel.status_index.count, shard_value, range_key_condition)
        for shard_value in layout.shard_values(value, status_shards())
    ]))


def count_capped(status: str, cap: int, range_key_condition: Condition | None = None) -> tuple[int, bool]:
    """Entries of ``status`` (those matching ``range_key_condition`` on ``due_at``), reading at
    most about ``cap`` of them: ``(count, capped)``.

    Each shard counts up to its share of ``cap``; ``capped`` means some shard had more (or the
    sum passed ``cap``), so the true count is at least ``count``, which is never above ``cap``.
    """
    return count_partitions(layout.shard_values(status, status_shards()), cap, range_key_condition)


def count_partitions(values: Sequence[str], cap: int, range_key_condition: Condition | None = None
                     ) -> tuple[int, bool]:
    """Entries of the index partitions ``values`` (in parallel), each counted up to its share of
    ``cap``: ``(count, capped)`` as :func:`count_capped`."""
    share = max(1, math.ceil(cap / len(values)))
    counted = _parallel([functools.partial(_count_shard, value, share, range_key_condition) for value in values])
    total = sum(n for n, _ in counted)
    return min(total, cap), total > cap or any(capped for _, capped in counted)


def count_exactly_up_to(partitions: dict[str, Sequence[str]], cap: int, max_rounds: int = 4
                        ) -> dict[str, tuple[int, bool]]:
    """For each name, the entries of its index partitions counted up to ``cap``: ``(count,
    capped)``, where ``capped`` means there are more than ``cap`` (and only then). Every partition
    of every name is counted at once, ``Select=COUNT``, so a request waits for its slowest read,
    not for the sum of them, and reads at most ``cap`` + 1 entries per name (and one more per
    partition).

    Each partition first counts up to its share of ``cap`` + 1; when some end below it, the
    others go on where they stopped with what is left of the budget, at most ``max_rounds`` rounds
    (a name still unfinished after them is reported capped: a lower bound). So a count below the
    cap is exact however unevenly the entries spread over the shards, where
    :func:`count_partitions` stops each shard at its share."""
    target = cap + 1  # counting one past the cap tells "exactly cap" from "more"
    counted = {name: 0 for name in partitions}
    # the partitions still open, with where each stopped (None: from the start)
    open_reads: dict[str, dict[str, dict[str, Any] | None]] = {
        name: {value: None for value in values} for name, values in partitions.items()}
    for _ in range(max_rounds):
        calls, places = [], []
        for name, reads in open_reads.items():
            budget = target - counted[name]
            if budget <= 0 or not reads:
                continue
            share = max(1, math.ceil(budget / len(reads)))
            for value, start in reads.items():
                calls.append(functools.partial(_count_page, value, share, start))
                places.append((name, value))
        if not calls:
            break
        for (name, value), (count, last_key) in zip(places, _parallel(calls), strict=True):
            counted[name] += count
            if last_key is None:
                del open_reads[name][value]
            else:
                open_reads[name][value] = last_key
    return {name: (min(counted[name], cap), counted[name] > cap or (counted[name] < target and bool(open_reads[name])))
            for name in partitions}


def _count_page(value: str, limit: int, start: dict[str, Any] | None) -> tuple[int, dict[str, Any] | None]:
    """Entries of one index partition from ``start``, at most ``limit`` (one query, ``Select=COUNT``:
    DynamoDB reads them, and bills them, but sends only their number): ``(count, where it stopped)``."""
    page = TaskModel._get_connection().query(value, index_name=_STATUS_INDEX_NAME, select=COUNT_SELECT,
                                             limit=limit, exclusive_start_key=start)
    return int(page.get("Count", 0)), page.get("LastEvaluatedKey")


def first_entries(values: Sequence[str], limit: int) -> list[TaskModel]:
    """About ``limit`` entries from the index partitions ``values`` together (a page of each, in
    parallel, oldest first within each)."""
    share = max(1, math.ceil(limit / len(values)))
    def first_page(value: str) -> list[TaskModel]:
        return list(TaskModel.status_index.query(value, limit=share, page_size=share))

    pages = _parallel([functools.partial(first_page, value) for value in values])
    return [task for page in pages for task in page]


def _count_shard(value: str, cap: int, range_key_condition: Condition | None = None) -> tuple[int, bool]:
    total = 0
    last_key = None
    while total < cap:
        page = next(TaskModel.status_index.query(
            value, range_key_condition, page_size=cap - total, last_evaluated_key=last_key,
            attributes_to_get=[layout.PARTITION_KEY]).page_iter)
        total += int(page.get("Count", 0))
        last_key = page.get("LastEvaluatedKey")
        if last_key is None:
            return total, False
    return total, True


@dataclasses.dataclass(frozen=True)
class Backlog:
    """Due work at one moment: what the coordinator publishes and the dashboards show.

    Counts stop at ``cap`` per status (``capped`` names the statuses that reached it, whose true
    count is at least the figure). ``oldest_due_age_seconds`` is how long the longest-waiting due
    task (new, retry or lost) has been due; 0 when nothing is due.
    """

    todo: int
    retry: int
    lost: int
    oldest_due_age_seconds: float
    capped: tuple[str, ...] = ()
    # Not due: waiting for a place in a concurrency group (see coworker.engine.gates).
    blocked: int = 0

    @property
    def due(self) -> int:
        return self.todo + self.retry + self.lost


def backlog(now: datetime, cap: int, lost: Sequence[TaskModel] = ()) -> Backlog:
    """Count due ``todo`` and ``failed`` tasks (at most ``cap`` index entries each, read keys-only
    by S parallel queries per status) and find the oldest due one (S one-entry queries per
    status); ``lost``
    are the expired ``processing`` entries the caller already read (see :func:`running_and_lost`).
    """
    due_now = TaskModel.due_at <= now
    todo, todo_capped = count_capped(TaskStatus.TODO.value, cap, due_now)
    retry, retry_capped = count_capped(TaskStatus.FAILED.value, cap, due_now)
    oldest = [task.due_at for status in (TaskStatus.TODO, TaskStatus.FAILED) for task in due(status, now, 1)]
    oldest += [task.due_at for task in lost[:1]]
    age = max(0.0, (now - min(oldest)).total_seconds()) if oldest else 0.0
    capped = tuple(name for name, hit in (("todo", todo_capped), ("retry", retry_capped)) if hit)
    return Backlog(todo=todo, retry=retry, lost=len(lost), oldest_due_age_seconds=age, capped=capped)
