"""Observed run times per task type: a p95 that plans the types that declare no time limit.

Each process counts the run times of the handlers it ran in buckets of a log scale (each
:data:`RATIO` wider than the last, from :data:`FLOOR_SECONDS`: a p95 read as its bucket's upper
end is at most 19 % high, never low). At the end of a worker invocation it merges its counts into
the type's item ``control#durations#<type>`` with one conditional write (at most once every
:data:`FLUSH_SECONDS` per type and process, the first time at once). Once an item keeps more
than :data:`DECAY_RUNS` runs its counts are halved, so the estimate follows recent runs.
Readers keep an item :data:`CACHE_SECONDS`; a p95 is given once :data:`MIN_RUNS` runs are kept.

Cost: a write per type per worker invocation at most (none for a type no handler ran), and a
read per type a minute per process that plans such a type.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

from pynamodb.exceptions import DoesNotExist
from pynamodb.expressions.condition import Condition

from coworker.data import writes
from coworker.data.layout import DURATIONS_PREFIX
from coworker.data.models import DurationsModel, utcnow
from coworker.observability import logger

FLOOR_SECONDS = 0.01
RATIO = 2 ** 0.25
BUCKETS = 96  # up to 0.01 x 2^24 s: about 46 hours
# Upper ends of the buckets; the last bucket also takes anything longer.
_UPPER = [FLOOR_SECONDS * RATIO ** (i + 1) for i in range(BUCKETS)]
MIN_RUNS = 10
DECAY_RUNS = 1000
FLUSH_SECONDS = 60.0
CACHE_SECONDS = 60.0
QUANTILE = 0.95
_WRITE_ATTEMPTS = 3


def bucket_of(seconds: float) -> int:
    """The bucket a run of ``seconds`` is counted in."""
    return min(BUCKETS - 1, bisect.bisect_left(_UPPER, seconds))


def quantile(counts: Sequence[int], share: float = QUANTILE) -> float | None:
    """The upper end of the bucket that holds the ``share`` quantile of ``counts``; ``None``
    with fewer than :data:`MIN_RUNS` runs."""
    total = sum(counts)
    if total < MIN_RUNS:
        return None
    rank = math.ceil(share * total)
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return _UPPER[index]
    return _UPPER[-1]


def _merged(stored: Sequence[int] | None, pending: Sequence[int]) -> list[int]:
    counts = [int(a) + int(b) for a, b in zip(_padded(stored), pending, strict=True)]
    if sum(counts) > DECAY_RUNS:
        counts = [count // 2 for count in counts]
    return counts


def _counts_of(item: DurationsModel | None) -> Sequence[int] | None:
    return cast("Sequence[int] | None", item.counts if item is not None else None)


def _padded(counts: Sequence[int] | None) -> list[int]:
    counts = [int(c) for c in (counts or [])][:BUCKETS]
    return counts + [0] * (BUCKETS - len(counts))


class Durations:
    """This process's view of the types' run times: what it counted and has not written yet,
    and the stored counts it read last (one instance per process: :data:`observed`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, list[int]] = {}
        self._flushed_at: dict[str, float] = {}
        self._stored: dict[str, tuple[float, list[int]]] = {}
        # p95 by type, as of the counts above (workers ask on every claim and every index entry)
        self._p95: dict[str, float | None] = {}

    def observe(self, task_type: str, seconds: float) -> None:
        """Count one run of a ``task_type`` handler that took ``seconds``."""
        with self._lock:
            counts = self._pending.setdefault(task_type, [0] * BUCKETS)
            counts[bucket_of(seconds)] += 1
            self._p95.pop(task_type, None)

    def p95(self, task_type: str) -> float | None:
        """The type's p95 run time (stored and not yet written), or ``None`` if too few runs."""
        stored = self._read(task_type)
        with self._lock:
            if task_type in self._p95:
                return self._p95[task_type]
            pending = self._pending.get(task_type)
            counts = [a + b for a, b in zip(stored, pending, strict=True)] if pending else stored
            self._p95[task_type] = value = quantile(counts)
        return value

    def known_types(self) -> list[str]:
        """Types this process holds run times of (read or counted)."""
        with self._lock:
            return sorted({*self._pending, *(t for t, (_, counts) in self._stored.items() if any(counts))})

    def runs(self, task_type: str) -> int:
        """Runs of the type kept in its item (after halvings) and counted here since."""
        stored = self._read(task_type)
        with self._lock:
            return sum(stored) + sum(self._pending.get(task_type, ()))

    def _read(self, task_type: str) -> list[int]:
        now = time.monotonic()
        with self._lock:
            cached = self._stored.get(task_type)
        if cached is not None and now - cached[0] < CACHE_SECONDS:
            return cached[1]
        try:
            counts = _padded(_counts_of(DurationsModel.get(DURATIONS_PREFIX + task_type)))
        except DoesNotExist:
            counts = [0] * BUCKETS
        except Exception:  # noqa: BLE001 - planning goes on without the stored runs
            logger.warning("could not read a task type's run times", exc_info=True, extra={"task_type": task_type})
            counts = cached[1] if cached is not None else [0] * BUCKETS
        with self._lock:
            self._stored[task_type] = (now, counts)
            self._p95.pop(task_type, None)
        return counts

    def flush(self, force: bool = False) -> int:
        """Write the counted runs of each type not written for :data:`FLUSH_SECONDS` (every type
        with ``force``); returns the writes made. Never raises: a count not written is kept."""
        now = time.monotonic()
        with self._lock:
            due = [t for t, counts in self._pending.items()
                   if any(counts) and (force or now - self._flushed_at.get(t, -math.inf) >= FLUSH_SECONDS)]
        written = 0
        for task_type in due:
            with self._lock:
                pending = self._pending.pop(task_type, None)  # (another invocation's flush may have taken it)
                self._flushed_at[task_type] = now
            if pending is None:
                continue
            try:
                stored = self._write(task_type, pending)
            except Exception:  # noqa: BLE001 - an estimate: kept for the next flush
                logger.warning("could not write a task type's run times", exc_info=True,
                               extra={"task_type": task_type})
                stored = None
            if stored is None:
                with self._lock:
                    counts = self._pending.setdefault(task_type, [0] * BUCKETS)
                    self._pending[task_type] = [a + b for a, b in zip(counts, pending, strict=True)]
                    self._p95.pop(task_type, None)
                continue
            written += 1
            with self._lock:
                self._stored[task_type] = (time.monotonic(), stored)
                self._p95.pop(task_type, None)
        return written

    @staticmethod
    def _write(task_type: str, pending: list[int]) -> list[int] | None:
        """Merge ``pending`` into the type's item, under its version; the counts written, or
        ``None`` if other writers kept winning."""
        key = DURATIONS_PREFIX + task_type
        for _ in range(_WRITE_ATTEMPTS):
            try:
                item = DurationsModel.get(key, consistent_read=True)
                version = int(item.version or 0)
                condition: Condition = DurationsModel.version == version
            except DoesNotExist:
                item, version = None, 0
                condition = DurationsModel.key.does_not_exist()
            counts = _merged(_counts_of(item), pending)
            actions = [DurationsModel.counts.set(cast(Any, counts)), DurationsModel.version.set(version + 1),
                       DurationsModel.updated_at.set(utcnow())]
            if writes.update(DurationsModel(key), actions, condition, f"record the run times of {task_type!r}",
                             refresh=False):
                return counts
        return None

    def forget(self) -> None:
        """Drop everything this process knows (tests)."""
        with self._lock:
            self._pending.clear()
            self._flushed_at.clear()
            self._stored.clear()
            self._p95.clear()


observed = Durations()
