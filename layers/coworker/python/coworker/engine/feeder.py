"""Self-feeding: the keys a worker invocation's threads run, its hints first, then due work it
finds on the status index itself."""

from __future__ import annotations

import collections
import heapq
import math
import random
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from coworker.config import Settings
from coworker.data import index
from coworker.data.layout import shard_of, stripe_shards
from coworker.data.models import TaskStatus, status_shards, utcnow
from coworker.engine import control
from coworker.engine.control import DueAction
from coworker.engine.outcomes import TaskSource
from coworker.observability import logger

# Work is looked for in this order: lost by dead workers, due retries, then new.
FEED_ORDER = (TaskStatus.PROCESSING, TaskStatus.FAILED, TaskStatus.TODO)
# Index entries one self-feeding query reads at most (one page).
MAX_FEED_PAGE = 200
# A worker helps with another stripe's keys only once they have been due this long: the stripe's
# own worker, if one runs, takes them first (it looks again within ``FEED_POLL_SECONDS`` of their
# arrival), so helpers do not race it for fresh work, and a stripe without a live worker still
# gets its work done a moment later.
HELP_AFTER_SECONDS = 2.0
# Seeds the hash that names a key's helper (:func:`helper_of`), apart from the stripe's hash.
HELPER_HASH_SEED = 0x5EED
# After a look that found less than its threads' worth of work, a worker waits this long before it
# looks again: while tasks trickle in, each look finds several instead of every idle worker
# querying the index without pause (about one query per task), at the cost of that much delay
# for a task put while every slot is busy (a free slot gets it at once: dispatch on submit).
# Each further short look in a row doubles the pause, up to FEED_POLL_MAX_SECONDS: the looks settle
# where each finds about a window's worth.
FEED_POLL_SECONDS = 0.25
FEED_POLL_MAX_SECONDS = 1.0
# A shard of a status whose look found nothing (no lost work, no due retry) is not looked at again
# by this process for this long, or a tick if longer: the coordinator looks every tick and hands
# such work to free slots, so busy workers need not query its shards on every look.
QUIET_STATUS_SECONDS = 5.0


# Entries of another runner's types a look reads past at most, per index shard: a backlog of the
# container runner's work at the head of the queue does not hide the Lambda workers' work behind it
# (a look then reads up to this many more entries, about 1 read unit per 20).
EXCLUDED_READ_PAST = 1000
# A worker whose feeding has ended still waits this long for a deferred key's booked start (a
# rate-limited task it turned away); one booked later is left to the coordinator and the feeders.
HOLD_DEFERRED_SECONDS = 5.0
# A booked start is tried this long after it, so that its claim finds it due.
DEFERRED_SLACK_SECONDS = 0.005

# Index shards of a status whose last feed query found nothing, with when to look again
# (process-wide: warm invocations share it). The coordinator re-checks them every tick anyway.
_quiet_until: dict[tuple[TaskStatus, int], float] = {}
_quiet_lock = threading.Lock()


class Feeder:
    """Hands out the keys an invocation's threads run: its hints first, then due work it finds.

    Self-feeding reads the index shards that hold its own *stripe*'s keys (oldest first): the keys
    whose :func:`~coworker.data.layout.shard_of` among the worker slots is its slot number (see
    :func:`~coworker.data.layout.stripe_shards`). It takes a window of them, and only when those
    run short, a few of the other stripes' newest keys.
    Workers that look at the same moment so take different tasks instead of racing for the head
    item, and no stripe starves when its slot is idle. Only tasks whose type ``fits`` the time left
    are taken (see :mod:`coworker.engine.budget`). It stops when a page has nothing new it may
    take, when the feed cut-off passes, or when the invocation lost its slot.
    """

    def __init__(self, settings: Settings, hints: Sequence[str], self_feed: bool, feed_until: float,
                 slot_number: int | None = None, stop: threading.Event | None = None,
                 window: int | None = None, fits: Callable[[str], bool] | None = None,
                 exclude_types: Sequence[str] = ()) -> None:
        self._settings = settings
        # Types the index reads leave out (the container runner's, for a Lambda worker), reading
        # past at most EXCLUDED_READ_PAST of their entries a shard and look.
        self._exclude_types = list(exclude_types)
        # Whether a task of a type may still be taken (its time fits what the invocation has left).
        self._fits = fits or (lambda _task_type: True)
        self._queue: collections.deque[tuple[str, TaskSource]] = collections.deque(
            (key, TaskSource.HINT) for key in hints)
        # Deferred keys (turned away by their rate group) by their booked start, a monotonic time.
        self._deferred: list[tuple[float, str]] = []
        self._seen: set[str] = set(hints)
        self._exhausted = not self_feed
        self._feed_until = feed_until
        self._window = max(4 * (window or settings.batch_size), 4)
        self._stripes = settings.worker_slots
        self._stripe = (slot_number if slot_number is not None else random.randrange(self._stripes)) % self._stripes
        self._stop = stop or threading.Event()
        self._cond = threading.Condition()
        self._fetching = False
        self._low_water = max(1, window or settings.batch_size)
        # Index shard each status is read from first (among its own, or among the others when
        # helping): where the last look found work.
        self._first_shard = dict.fromkeys(FEED_ORDER, 0)
        # Where helping goes on: other shards are helped in turn, one with work a look.
        self._help_from = dict.fromkeys(FEED_ORDER, 0)
        # Earliest time of the next look (after short ones: how many in a row), and whether the last
        # look saw due work of other stripes too fresh to help with (then an empty window is not
        # the end).
        self._next_look = 0.0
        self._short_looks = 0
        self._fresh_elsewhere = False
        self.pages = 0

    def next(self) -> tuple[str, TaskSource] | None:
        """The next key to run, or ``None`` when there is no more work for this invocation.

        When fewer keys than threads are queued, the thread that notices fetches the next window
        while the others keep working (only a thread finding the queue empty waits for it).
        """
        with self._cond:
            self._take_deferred()
            while not self._queue:
                if self._take_deferred():
                    break
                if self._exhausted:
                    if not self._wait_deferred():
                        return None
                    continue
                if not self._fetching:
                    if not self._may_feed():
                        self._exhausted = True
                        return None
                    self._fetching = True
                    break
                self._cond.wait()
            item = self._queue.popleft() if self._queue else None
            # With keys in hand, look early only when the last look was not short; a thread with
            # nothing to run looks (waiting out the pause if it must)
            fetch = item is None or (not self._fetching and len(self._queue) < self._low_water
                                     and not self._exhausted and self._may_feed()
                                     and time.monotonic() >= self._next_look)
            if fetch and item is not None:
                self._fetching = True
        if fetch:
            self._refill()
        return item if item is not None else self.next()

    def hand(self, key: str) -> None:
        """Run ``key`` next (a blocked task this invocation's release just woke)."""
        with self._cond:
            self._queue.appendleft((key, TaskSource.HINT))
            self._seen.add(key)
            self._cond.notify_all()

    def hand_at(self, key: str, start: datetime) -> None:
        """Run ``key`` at its booked ``start`` (a task its rate group turned away), if this
        invocation still runs then; a later page may hand it out too (its claim decides)."""
        when = time.monotonic() + (start - utcnow()).total_seconds() + DEFERRED_SLACK_SECONDS
        with self._cond:
            self._seen.discard(key)
            heapq.heappush(self._deferred, (when, key))
            self._cond.notify_all()

    def _take_deferred(self) -> bool:
        """Queue the deferred keys whose start has come, while this invocation may still take
        work (call with the lock held): past its feed cut-off they are left to the others."""
        now, taken = time.monotonic(), False
        while self._deferred and self._deferred[0][0] <= now and self._may_feed():
            _, key = heapq.heappop(self._deferred)
            self._queue.appendleft((key, TaskSource.HINT))  # its start was booked: before new work
            self._seen.add(key)
            taken = True
        return taken

    def _wait_deferred(self) -> bool:
        """With feeding ended, wait for the next deferred key's start if it is near and the
        invocation may still take work (call with the lock held); ``False``: nothing to wait for."""
        if not self._deferred or not self._may_feed():
            return False
        pause = self._deferred[0][0] - time.monotonic()
        if pause > HOLD_DEFERRED_SECONDS:
            return False
        self._cond.wait(max(0.0, min(pause, self._feed_until - time.monotonic())))
        return True

    def forget(self, key: str) -> None:
        """Let a later page hand out ``key`` again (it was blocked, and will be due once woken)."""
        with self._cond:
            self._seen.discard(key)

    def _may_feed(self) -> bool:
        return time.monotonic() < self._feed_until and not self._stop.is_set()

    def _refill(self) -> None:
        found: list[str] = []
        wait_for_help = False
        try:
            pause = self._next_look - time.monotonic()
            if pause > 0:
                self._stop.wait(pause)
            if self._may_feed():
                found = self._fetch()
                wait_for_help = self._fresh_elsewhere
        except Exception:  # noqa: BLE001 - no more feeding; the supervisor hands the work out
            logger.exception("could not look for more work; this invocation takes no more")
        finally:
            with self._cond:
                self._fetching = False
                self._queue.extend((key, TaskSource.FEED) for key in found)
                if len(found) < self._low_water:
                    self._short_looks += 1
                    pause = min(FEED_POLL_MAX_SECONDS, FEED_POLL_SECONDS * 2 ** (self._short_looks - 1))
                    self._next_look = time.monotonic() + pause
                else:
                    self._short_looks = 0
                # Nothing due at all ends the feeding; due work that only its own stripe's worker
                # may take yet is looked at again after the pause.
                if not found and not wait_for_help:
                    self._exhausted = True
                self._cond.notify_all()

    def _fetch(self) -> list[str]:
        """One window of due keys not seen before by this invocation."""
        settings = self._settings
        now, clock = utcnow(), time.monotonic()
        shards = status_shards()
        # About two windows of this stripe's keys (a stripe is 1/stripes of the keys), one page a
        # shard; exactly one window when this worker is the only stripe.
        limit = min(MAX_FEED_PAGE, self._window * (2 * self._stripes - 1))
        own_shards = stripe_shards(self._stripe, self._stripes, shards)
        # This stripe's share of the entries in one of its shards: a page that size holds about a
        # window of its keys (exactly one window where a shard holds one stripe's keys).
        share = shards / (self._stripes * len(own_shards))
        own_page = self._window if share >= 1 else min(limit, math.ceil(self._window / share))
        view = control.cached(settings.control_cache_seconds)
        help_before = now - timedelta(seconds=HELP_AFTER_SECONDS)
        page: list[tuple[str, bool]] = []  # (key, whether others may help with it yet)
        own = 0  # keys of this stripe in ``page``
        met = 0  # index entries read: at most ``limit`` a look

        def read(status: TaskStatus, shard: int, page_size: int) -> int:
            """Take due keys of ``status`` from one index shard; how many entries were met."""
            nonlocal own, met
            found = 0
            entries = (index.due_in_shard(status, now, limit - met, shard, page_size, exclude_types=self._exclude_types,
                                          read_past=EXCLUDED_READ_PAST) if self._exclude_types
                       else index.due_in_shard(status, now, limit - met, shard, page_size))
            for task in entries:
                found += 1
                met += 1
                if shard in own_shards:
                    self._first_shard[status] = shard  # the next look starts where this one found work
                if task.key in self._seen:
                    continue
                action = control.due_action(view, task, status)
                if action is DueAction.REAP:
                    self._seen.add(task.key)
                if action is not DueAction.RUN:
                    continue  # paused, stopped or lost at its ceiling: the coordinator sees to it
                if not self._fits(task.task_type):
                    continue  # longer than this invocation has left: a fresh one takes it
                page.append((task.key, task.due_at is None or task.due_at <= help_before))
                own += shard_of(task.key, self._stripes) == self._stripe
                if own >= self._window:
                    break  # before the iterator reads another page
            return found

        # Its own shards first (pages of about a window of its keys), then, only when its own work
        # does not keep every thread busy, the others, to help: the first with work of each status,
        # in one page of what is left.
        for helping in (False, True):
            if own >= (self._low_water if helping else self._window):
                break
            for status in FEED_ORDER:
                candidates = [shard for shard in range(shards) if (shard in own_shards) != helping]
                first = self._help_from[status] if helping else self._first_shard[status]
                for shard in _starting_at(candidates, first):
                    if met >= limit or own >= self._window:
                        break
                    if status is not TaskStatus.TODO:
                        with _quiet_lock:
                            if _quiet_until.get((status, shard), 0.0) > clock:
                                continue
                    taken = len(page)
                    found = read(status, shard, limit - met if helping else own_page)
                    if not found and status is not TaskStatus.TODO:
                        with _quiet_lock:
                            _quiet_until[(status, shard)] = clock + max(settings.tick_seconds, QUIET_STATUS_SECONDS)
                    if helping and len(page) > taken:
                        self._help_from[status] = shard + 1  # the next look helps in the next one
                        break  # one shard with work to take a look (entries it cannot run do not count)
        self.pages += 1
        mine = [key for key, _ in page if shard_of(key, self._stripes) == self._stripe]
        others = [(key, ripe) for key, ripe in page if shard_of(key, self._stripes) != self._stripe]
        # Other stripes' keys only when its own do not keep every thread busy, only those due for
        # a while (HELP_AFTER_SECONDS), and from the newest end: their own workers take them oldest
        # first, so helper and owner meet in the middle instead of racing for the same keys. Each
        # key has one helper among the other stripes, so helpers do not race each other either;
        # a worker with nothing else to do helps with any, in an order of its own (idle workers
        # that read the same page then take different keys).
        window = mine[:self._window]
        self._fresh_elsewhere = False
        if len(mine) < self._low_water:
            ripe = [key for key, is_ripe in others[::-1] if is_ripe]
            helped = [key for key in ripe if helper_of(key, self._stripes) == self._stripe]
            if not window and not helped:
                helped = sorted(ripe, key=lambda key: zlib.crc32(f"{self._stripe}:{key}".encode()))
            window += helped[:self._low_water]
            self._fresh_elsewhere = any(not is_ripe for _, is_ripe in others)
        self._seen.update(window)
        return window


def helper_of(key: str, stripes: int) -> int:
    """The stripe that helps first with ``key`` when its own stripe's worker falls behind: one of
    the other stripes, by a hash independent of the stripe's own."""
    owner = shard_of(key, stripes)
    if stripes == 1:
        return owner
    share = zlib.crc32(key.encode(), HELPER_HASH_SEED) % (stripes - 1)
    return share if share < owner else share + 1


def _starting_at(shards: list[int], first: int) -> list[int]:
    """``shards`` in turn from ``first`` on (or from the next one above it)."""
    cut = next((position for position, shard in enumerate(shards) if shard >= first), 0)
    return shards[cut:] + shards[:cut]


