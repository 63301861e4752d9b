"""Rate limits: at most N starts of one *rate group* in any window of I milliseconds, fleet-wide.

A task belongs to up to two rate groups:

* its **rate key**, ``key:<rate_key>``, with the limit set for the key in the control record
  (:func:`coworker.engine.control.set_rate`), or else the one the task carries (``rate_limit``
  per ``rate_interval_seconds``); a key with neither is not limited;
* its **type**, ``type:<type>``, when a rate is set for the type in the control record.

Each group has a *start log*, headed by one item ``gate#rate:<group>`` in the task table: its last
N start times (epoch ms, non-decreasing) and a version, and the limit of its last start when that
start's task carried it (a limit set through the API lives in the control record only: kept in
the log, it would outlive its lifting and be shown as still in force).

**A long log is packed** (:func:`_laid_out`). Up to HEAD_STARTS (100) starts per interval the
head holds the last N, as releases before this layout wrote it (about 30 + 9 N bytes and the
group's name: 942 bytes at N = 100 for ``key:api.example``). Above, it holds only its newest
starts: once it holds more than SEAL_AT (50), the write that adds a start first seals all but its
newest into a *chunk*, an item ``gate#rate-log:<group>#<version>`` named by the head version that
write makes, and the head names the chunks that may hold one of the last N (about N / 50). A
chunk never changes (every writer that tries that version read the same head, and a head's
starts but its newest are final: only the newest is ever given back), so it is written before
the head's conditional write, by any writer that tries, and a process keeps the chunks it has
read. A start then writes a head of at most about 700 bytes at any N (and a chunk every 50 starts
or so), while the N-th last start it checks against is read from the head or a chunk. TTL deletes
a chunk two days after its last start (past the longest interval, a day: a deleted chunk held no
start a window can still count), as well as one whose head write was refused, which no head names.
While a fleet runs the release before this layout beside this one, a group above 100 keeps to its
limit only among this release's processes (the older one counts the head's starts alone); at 100
and below nothing changed.

**Taking a token** (after the claim and the concurrency places, just before the handler starts;
:func:`admit`): the start is stamped ``t = max(now + lead, last start)`` and written, on the
condition that the log's version is the one read, only if the log holds fewer than N starts or
its N-th last is at least I + margin before ``t``. Every start so admitted saw fewer than N
starts in the window before it and every later one is stamped at or after it, so no window of I
holds more than N stamps, however many workers race (a refused condition re-reads the log). A
process keeps the log it last saw, so a key run by one worker pays no read, and its threads take
turns on a group (no failed writes among them): the thread whose turn it is answers every thread
queued behind it in the same write, each stamped in turn, so a slow write holds the queue up for
itself and one more write, not one write per thread.

**Starting on the stamp** (:func:`start_on`): the stamp is ``lead`` ahead (three times this
process's recent token-write time), and the worker sleeps until it before calling the handler;
a token whose write came back more than the margin (I / 20, at most MAX_MARGIN_MS) after its
stamp is given back and taken again. So the handlers' own start times keep to the limit too: a
start is within the margin of its stamp, and stamps are spaced I + margin per N.

**Waiting** (:func:`book`): a task whose token is further away than the worker cares to wait
gives its claim back (the attempt does not count) and is due again at a start it books from the
group's ``booked_until``: the later of the next free token and that mark, which then moves on by
(I + margin) / N. So the waiters of a busy key come due about as fast as tokens free, one after
another, instead of all racing for each token; a new task does not pass them (it books after
them); the worker that turned it away keeps its key and tries it then if it is still feeding
(:meth:`coworker.engine.feeder.Feeder.hand_at`). No worker thread waits for long.

**A change of limit** (:func:`rebook`, when the API sets, raises or lifts one) re-books the
group's waiters under the new limit, in their order, each only ever sooner, and moves
``booked_until`` to behind the last of them: otherwise they would keep their starts at the old
spacing, and new tasks book behind them. A task notes the group that booked it
(``rate_booked_by``), so a task in two groups moves with that one only.

A task in several groups takes its token in each, in order; one refused gives back the tokens it
took, each only if no start was stamped after it (a token given back late is simply unused: the
log is never wrong in the direction of too many starts).

**Cost** in write units (1 unit per KB written; a head is within 1 KB at any N for a group name of
up to about 90 characters, and of any length above 100 starts per interval): an admitted start
pays 1 per group, and above 100 starts per interval a chunk write about every 50 starts (1.02 a
start at N = 1,000, measured; it was about 8 with the last N in one item); a racing writer of
another process 1 failed write and a consistent read (and a BatchGetItem of the chunks sealed
meanwhile; the first read of a long log in a process reads its N / 50 chunks, about 1 read unit
each); a task turned away its claim and give-back (6 with the index moves) and 1 for its booking
(docs/operations.md has the measured figures; ``benchmarks/rates.py --only log`` the log's own).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from pynamodb.exceptions import DoesNotExist
from pynamodb.expressions.condition import Condition
from pynamodb.expressions.update import Action

from coworker.data import index, layout, writes
from coworker.data.layout import RATE_GATE_PREFIX, rate_chunk_key
from coworker.data.models import RateChunkModel, RateGateModel, TaskModel, TaskStatus, utcnow
from coworker.engine import control
from coworker.engine.control import Rate
from coworker.observability import logger

KEY_GROUP = "key:"
TYPE_GROUP = "type:"
DEFAULT_INTERVAL_SECONDS = 1.0
# Conditional writes one token tries while other writers change the log under it.
RACE_RETRIES = 8
# The most a start may begin after its token's stamp (see :func:`margin_ms`).
MAX_MARGIN_MS = 25
# How far ahead a start is stamped, at least and at most (see :func:`lead_ms`).
LEAD_MS = (10, 5000)
# Groups whose log (and turn lock) a process keeps, at most: the least recently used go first.
KNOWN_GROUPS = 4096
# And chunks of long logs (see HEAD_STARTS), at most: about 50 starts each, 8,192 of them some
# 16 MB (as many as 400 logs at 1,000 starts per interval hold).
KNOWN_CHUNKS = 8192
# A task claimed at most this long (or its group's interval, if longer) after the start it
# booked is a returning waiter: it may take a token while others are booked (see :func:`returning`).
RETURN_WINDOW_SECONDS = 60.0
# A start log keeps its last N starts in its head item up to this N (about 9 bytes a start: 1 KB,
# one write unit, for a group name of up to about 90 characters), exactly as releases before
# chunks did; above it the head keeps only its newest starts, and the older ones are sealed
# into chunk items (see :func:`_laid_out`).
HEAD_STARTS = 100
# A head above HEAD_STARTS that holds more than this many starts seals all but its newest into a
# chunk: it holds at most this many and the starts one write adds, and names about N / SEAL_AT
# chunks (the head of a limit of 1,000 stays within about 700 bytes).
SEAL_AT = 50
# How long a sealed chunk is kept (by TTL) after its last start: the longest interval
# (engine.tasks.MAX_RATE_INTERVAL_SECONDS, a day) and a day more, so a chunk deleted leaves out
# only starts that no window of the interval can hold any more.
CHUNK_KEPT_SECONDS = 2 * 86_400


@dataclasses.dataclass(frozen=True)
class RateGroup:
    """A set of tasks of which at most ``rate.limit`` start per ``rate.interval_ms``."""

    name: str  # "key:<rate key>" or "type:<type>"
    rate: Rate
    carried: bool = False  # the rate is the one the task carries for its key (none is set for the group)

    @property
    def gate_key(self) -> str:
        return RATE_GATE_PREFIX + self.name


@dataclasses.dataclass(frozen=True)
class Token:
    """A start taken in one group: the log's version it wrote, and the start's stamp."""

    group: RateGroup
    version: int
    stamp: int


def groups_of(task: TaskModel, rate_limits: Mapping[str, Rate]) -> tuple[RateGroup, ...]:
    """The rate groups ``task`` belongs to: its type's (if set), then its rate key's."""
    groups = []
    type_rate = rate_limits.get(TYPE_GROUP + task.task_type)
    if type_rate is not None:
        groups.append(RateGroup(TYPE_GROUP + task.task_type, type_rate))
    if task.rate_key:
        rate = rate_limits.get(KEY_GROUP + task.rate_key)
        if rate is not None:
            groups.append(RateGroup(KEY_GROUP + task.rate_key, rate))
        elif (carried := task_rate(task)) is not None:
            groups.append(RateGroup(KEY_GROUP + task.rate_key, carried, carried=True))
    return tuple(groups)


def task_rate(task: TaskModel) -> Rate | None:
    """The rate a task carries for its key, if any."""
    if not task.rate_limit:
        return None
    seconds = float(task.rate_interval_seconds or DEFAULT_INTERVAL_SECONDS)
    return Rate(int(task.rate_limit), interval_ms(seconds))


def interval_ms(seconds: float) -> int:
    """An interval in whole milliseconds (at least 1)."""
    return max(1, round(seconds * 1000))


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def from_epoch_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclasses.dataclass(frozen=True)
class _Chunk:
    """Older starts of a log, sealed by the head's write of ``version`` (its name); never changed.
    Empty when TTL deleted it: its starts were older than any interval."""

    version: int
    starts: tuple[int, ...]


@dataclasses.dataclass
class _Log:
    version: int
    starts: list[int]  # the head's own starts (the newest)
    booked_until: int | None = None
    chunks: tuple[_Chunk, ...] = ()  # the older starts the head names, oldest first

    def all_starts(self) -> list[int]:
        """The log's starts, oldest first: its chunks' and the head's."""
        return [start for chunk in self.chunks for start in chunk.starts] + self.starts


# The log each group had when this process last read or wrote it: a process that runs a key's
# tasks alone writes without reading first.
_known: collections.OrderedDict[str, _Log] = collections.OrderedDict()
_known_lock = threading.Lock()


def _known_as(key: str) -> str:
    return f"{RateGateModel.Meta.table_name}\0{key}"


# One writer per group at a time in this process: its threads take turns instead of racing each
# other's conditional writes (a failed one is billed like any write); processes still race.
_group_locks: collections.OrderedDict[str, threading.Lock] = collections.OrderedDict()


def _turn(key: str) -> threading.Lock:
    with _known_lock:
        lock = _group_locks.setdefault(_known_as(key), threading.Lock())
        _group_locks.move_to_end(_known_as(key))
        while len(_group_locks) > KNOWN_GROUPS:  # a lock dropped in use only lets two threads race
            _group_locks.popitem(last=False)
        return lock


# Chunks of the logs kept, in all: a process keeps at most KNOWN_CHUNKS of them.
_known_chunks = 0


def _remember(key: str, log: _Log | None) -> None:
    global _known_chunks
    with _known_lock:
        dropped = _known.pop(_known_as(key), None)
        _known_chunks -= len(dropped.chunks) if dropped is not None else 0
        if log is None:
            return
        _known[_known_as(key)] = log
        _known_chunks += len(log.chunks)
        while len(_known) > KNOWN_GROUPS or (_known_chunks > KNOWN_CHUNKS and len(_known) > 1):
            _, dropped = _known.popitem(last=False)
            _known_chunks -= len(dropped.chunks)


def _remember_booking(key: str, booked_until: int) -> None:
    """Note a booking mark this process wrote in the log it keeps (its starts and version stay as
    the token writes left them)."""
    with _known_lock:
        log = _known.get(_known_as(key))
        if log is not None:
            log.booked_until = booked_until


def _recall(key: str) -> _Log | None:
    with _known_lock:
        log = _known.get(_known_as(key))
        return dataclasses.replace(log, starts=list(log.starts)) if log is not None else None  # (chunks: a tuple)


def read_log(group_name: str) -> RateGateModel | None:
    """A group's start log as stored (one consistent read), or ``None``."""
    try:
        return RateGateModel.get(RATE_GATE_PREFIX + group_name, consistent_read=True)
    except DoesNotExist:
        return None


def _read(group: RateGroup) -> _Log:
    """The group's log as stored: its head (one consistent read) and the chunks it names that this
    process has not seen yet (sealed chunks never change: one consistent BatchGetItem, if any)."""
    item = read_log(group.name)
    log = _Log(0, [])
    if item is not None:
        known = _recall(group.gate_key)
        log = _Log(int(item.version or 0), [int(s) for s in item.starts or ()],
                   int(item.booked_until) if item.booked_until is not None else None,
                   _chunks_of(group.name, [int(v) for v in item.chunks or ()], known.chunks if known else ()))
    _remember(group.gate_key, log)
    return log


def _chunks_of(group_name: str, versions: Sequence[int], known: Sequence[_Chunk] = ()) -> tuple[_Chunk, ...]:
    """The chunks of ``group_name``'s log sealed by ``versions``: those in ``known`` as they are,
    the others read (one consistent BatchGetItem per 100); one deleted by TTL is empty."""
    have = {chunk.version: chunk for chunk in known}
    read = _read_chunks([rate_chunk_key(group_name, version) for version in versions if version not in have])
    return tuple(have.get(version) or _Chunk(version, read.get(rate_chunk_key(group_name, version), ()))
                 for version in versions)


def _read_chunks(keys: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The starts of the chunks ``keys`` (one consistent BatchGetItem per 100), by key; those
    deleted by TTL are left out."""
    if not keys:
        return {}
    return {item.key: tuple(int(s) for s in item.starts or ())
            for item in RateChunkModel.batch_get(list(keys), consistent_read=True)}


def logged_starts(*items: RateGateModel | None) -> list[list[int]]:
    """Every start each group's stored log holds, oldest first (its chunks', then its head's): the
    chunks of them all in one consistent BatchGetItem per 100."""
    def named(item: RateGateModel | None) -> list[str]:
        if item is None:
            return []
        return [rate_chunk_key(item.key[len(RATE_GATE_PREFIX):], int(v)) for v in item.chunks or ()]

    read = _read_chunks([key for item in items for key in named(item)])
    return [[start for key in named(item) for start in read.get(key, ())]
            + ([int(s) for s in item.starts or ()] if item is not None else []) for item in items]


def margin_ms(rate: Rate) -> int:
    """How late after its stamp a start may begin: a twentieth of the interval, at most
    MAX_MARGIN_MS. Tokens are spaced that much wider than the interval, so that starts, not
    only stamps, keep to the limit."""
    return min(MAX_MARGIN_MS, rate.interval_ms // 20)


def free_at(starts: Sequence[int], rate: Rate) -> int:
    """When (epoch ms) the next start is allowed after ``starts``: at once (0) while fewer than
    ``rate.limit`` are logged, else an interval (and the margin) after the limit-th last."""
    return starts[-rate.limit] + rate.interval_ms + margin_ms(rate) if len(starts) >= rate.limit else 0


def _version_is(version: int) -> Condition:
    return (RateGateModel.version == version) if version else RateGateModel.version.does_not_exist()


def _limit_shown(group: RateGroup) -> list[Action]:
    """What a start writes of its limit in the log: the limit its task carried, or none (a limit
    set through the API is read from the control record, and may be lifted there)."""
    if group.carried:
        return [RateGateModel.limit.set(group.rate.limit), RateGateModel.interval_ms.set(group.rate.interval_ms)]
    return [RateGateModel.limit.remove(), RateGateModel.interval_ms.remove()]


@dataclasses.dataclass
class _Ask:
    """One thread's request for a token in a group (see :func:`_take`): its floor, how much later it
    would take one, whether it is a returning waiter; then what it got (a token, or when the next
    one frees), or the error the shared write raised."""

    floor_ms: int
    wait_ms: int
    waiter: bool
    answer: Token | int | None = None
    error: BaseException | None = None


# Requests waiting for their group's turn in this process, by group: the thread that gets the turn
# answers every one of them with one write.
_asks: dict[str, list[_Ask]] = {}


def _take(group: RateGroup, floor_ms: int, wait_ms: int, waiter: bool) -> Token | int:
    """Take a start token in ``group`` stamped at or after ``floor_ms`` (or up to ``wait_ms``
    later, when the next token frees by then): the token, or when (epoch ms) the next one frees.

    A task that is not a ``waiter`` (back at the start it booked) does not pass the waiters:
    while starts are booked ahead of it, it is refused, and books after them.

    This process's threads take turns on a group, and the thread whose turn it is takes the tokens
    of every thread queued behind it in the same write (one conditional write of the log, however
    many): when writes are slow, a queued thread waits for at most the write under way and its own,
    not for one write per thread ahead of it (each holding its claim meanwhile)."""
    ask = _Ask(floor_ms, wait_ms, waiter)
    key = _known_as(group.gate_key)
    with _known_lock:
        _asks.setdefault(key, []).append(ask)
    with _turn(group.gate_key):
        if ask.answer is None and ask.error is None:  # (else the thread before answered it)
            with _known_lock:
                asks = _asks.pop(key, [])
            try:
                answers = _take_all(group, asks)
            except BaseException as exc:
                for each in asks:
                    each.error = exc
            else:
                for each, answer in zip(asks, answers, strict=True):
                    each.answer = answer
    if ask.error is not None:
        raise ask.error
    assert ask.answer is not None
    return ask.answer


def _stamps(log: _Log, rate: Rate, asks: Sequence[_Ask], now_floor: int) -> list[int]:
    """What ``asks`` get, in turn, after ``log``, none stamped before ``now_floor``: per ask its
    stamp, or if refused, minus when its next token frees."""
    starts = log.all_starts()[-rate.limit:]
    stamps: list[int] = []
    for ask in asks:
        floor = max(ask.floor_ms, now_floor)
        stamp = max(floor, starts[-1] if starts else 0)
        free = free_at(starts, rate)
        if not ask.waiter and log.booked_until is not None and log.booked_until > floor + ask.wait_ms:
            free = max(free, log.booked_until)  # waiters are booked until then: after them
        if stamp < free <= floor + ask.wait_ms:
            stamp = free  # a token that frees this soon is worth the wait
        if free > stamp:
            stamps.append(-free)  # refused: when the next one frees (negated)
            continue
        starts = [*starts, stamp][-rate.limit:]
        stamps.append(stamp)
    return stamps


def _laid_out(log: _Log, rate: Rate, new: Sequence[int], version: int) -> tuple[list[int], tuple[_Chunk, ...],
                                                                                _Chunk | None]:
    """How ``log`` is written with the ``new`` starts as ``version``: ``(the head's starts, the
    chunks it names, the chunk this write seals or None)``.

    Up to HEAD_STARTS starts per interval, the head holds the last N (and names no chunk), as
    releases before chunks wrote it. Above, a head holding more than SEAL_AT starts seals all but
    its newest into a chunk named by ``version``, and names only the chunks that may hold one of
    the last N starts. A write reads the N-th last start wherever it is, but writes a bounded head
    (and a chunk every SEAL_AT starts or so), so a start costs about 1 write unit at any N.

    Why a chunk can be written before the head's conditional write, by every writer that tries
    ``version``, and never changes: every such writer read the same head (``version - 1``: its
    writes are conditional on it) and seals the same starts of it; and a head's starts but its
    newest are final (a start is given back only while it is the newest one). A writer whose head
    write is refused leaves a chunk that no head names; TTL deletes it."""
    if rate.limit <= HEAD_STARTS:
        return [*log.all_starts(), *new][-rate.limit:], (), None
    head, chunks, sealed = list(log.starts), list(log.chunks), None
    if len(head) > SEAL_AT:
        sealed = _Chunk(version, tuple(head[:-1]))
        head, chunks = head[-1:], [*chunks, sealed]
    head = [*head, *new][-rate.limit:]
    kept: list[_Chunk] = []
    held = len(head)
    for chunk in reversed(chunks):  # the newest chunks that, with the head, hold the last N
        if held >= rate.limit:
            break
        kept.insert(0, chunk)
        held += len(chunk.starts)
    return head, tuple(kept), sealed if sealed in kept else None


def _seal(group: RateGroup, chunk: _Chunk) -> None:
    """Write ``chunk`` of ``group``'s log before the head that names it (if another writer of the
    same version wrote it first, it holds the same starts)."""
    expires = datetime.fromtimestamp(chunk.starts[-1] / 1000 + CHUNK_KEPT_SECONDS, tz=UTC).replace(microsecond=0)
    writes.put_if_new(RateChunkModel(rate_chunk_key(group.name, chunk.version), starts=list(chunk.starts),
                                     delete_after_epoch=expires), f"seal starts of {group.name!r}")


def _take_all(group: RateGroup, asks: Sequence[_Ask]) -> list[Token | int]:
    """Answer ``asks`` (in order) with one conditional write of the group's log: each a token, or
    when (epoch ms) the next one frees for it."""
    rate = group.rate
    log = _recall(group.gate_key) or _read(group)
    fresh = False
    for _ in range(RACE_RETRIES):
        # Stamped from now on: a request made before a long wait for the turn is not stamped in
        # the past (a start whose stamp passed before its write came back would be given back).
        stamps = _stamps(log, rate, asks, epoch_ms(utcnow()) + lead_ms())
        if any(stamp < 0 for stamp in stamps) and not fresh:
            log, fresh = _read(group), True  # what this process saw may be old: look again
            continue
        if all(stamp < 0 for stamp in stamps):
            return [-stamp for stamp in stamps]
        version = log.version + 1
        head, chunks, sealed = _laid_out(log, rate, [stamp for stamp in stamps if stamp >= 0], version)
        actions = [RateGateModel.starts.set(head), RateGateModel.version.set(version), *_limit_shown(group)]
        if chunks:
            actions.append(RateGateModel.chunks.set([chunk.version for chunk in chunks]))
        elif log.chunks:
            actions.append(RateGateModel.chunks.remove())
        sent = time.monotonic()
        if sealed is not None:
            _seal(group, sealed)
        if writes.update(RateGateModel(group.gate_key), actions, _version_is(log.version),
                         f"take a start of {group.name!r}", refresh=False):
            _write_took((time.monotonic() - sent) * 1000)
            _remember(group.gate_key, _Log(version, head, log.booked_until, chunks))
            return [Token(group, version, stamp) if stamp >= 0 else -stamp for stamp in stamps]
        log, fresh = _read(group), True
    # The log kept changing: try again after about one start's share of the interval.
    return [max(ask.floor_ms, 0) + math.ceil(rate.interval_ms / rate.limit) for ask in asks]


# How long this process's token writes take (an average that follows the latest): a start is
# stamped that far ahead (three times it, within LEAD_MS), so that its write is back before the stamp
# (and, when writes slow down, the lead grows with them instead of every start coming back late)
# and the handler starts on it.
_write_ms = 10.0
_write_ms_lock = threading.Lock()


def _write_took(ms: float) -> None:
    global _write_ms
    with _write_ms_lock:
        _write_ms += 0.2 * (ms - _write_ms)


def lead_ms() -> int:
    """How far ahead of now a start is stamped."""
    with _write_ms_lock:
        return int(min(LEAD_MS[1], max(LEAD_MS[0], 3 * _write_ms + 5)))


def worth_waiting_seconds(lock_seconds: float) -> float:
    """How long a token is worth waiting for with the claim held, by what turning the task away
    would cost: its booking, its give-back and its claim again, three writes at this process's
    recent write time (so, when writes are slow, a task waits for a near token rather than pay
    three slow writes and come back late to it); within a quarter of the lock, which the
    heartbeat keeps meanwhile, and LEAD_MS's most."""
    with _write_ms_lock:
        ms = 3 * _write_ms
    return min(ms, LEAD_MS[1], lock_seconds * 1000 / 4) / 1000


def give_back(tokens: Sequence[Token]) -> None:
    """Undo ``tokens`` (latest first) where no start was stamped after them; never raises."""
    for token in reversed(tokens):
        try:
            with _turn(token.group.gate_key):
                _give_back(token)
        except Exception:  # noqa: BLE001 - an unused token only slows its group down
            logger.exception("could not give back a rate token", extra={"rate_group": token.group.name})


def _give_back(token: Token) -> None:
    """Undo ``token`` if no start was stamped after it (else it stays, unused)."""
    key = token.group.gate_key
    log = _recall(key)
    if log is None or log.version != token.version or not log.starts or log.starts[-1] != token.stamp:
        return
    starts = log.starts[:-1]
    actions = [RateGateModel.starts.set(starts), RateGateModel.version.set(token.version + 1)]
    if writes.update(RateGateModel(key), actions, _version_is(token.version),
                     f"give back a start of {token.group.name!r}", refresh=False):
        _remember(key, _Log(token.version + 1, starts, log.booked_until, log.chunks))
    else:
        _remember(key, None)


def admit(groups: Sequence[RateGroup], now: datetime | None = None, wait_seconds: float = 0.0,
          waiter: Callable[[RateGroup], bool] | None = None) -> tuple[list[Token], RateGroup | None, int]:
    """Take a start token in each of ``groups``, all or nothing, stamped a moment ahead, or up to
    ``wait_seconds`` later for a token that frees by then (the handler starts on the stamp:
    :func:`start_on`). ``waiter`` tells, per group, whether the task is back at the start it
    booked there (else it does not pass that group's waiters).

    Returns ``(tokens, None, 0)`` when every group let the task start, or ``([], group,
    free_ms)`` with the group that refused it and when (epoch ms) its next token frees.
    """
    floor = epoch_ms(now or utcnow()) + lead_ms()
    for _ in range(2):
        tokens: list[Token] = []
        for group in groups:
            taken = _take(group, floor, int(wait_seconds * 1000), waiter is not None and waiter(group))
            if not isinstance(taken, Token):
                give_back(tokens)
                return [], group, taken
            tokens.append(taken)
            floor = max(floor, taken.stamp)
        # One start for every group: each stamp within its margin of the latest.
        if all(floor - token.stamp <= margin_ms(token.group.rate) for token in tokens):
            return tokens, None, 0
        give_back(tokens)
    return [], groups[-1], floor


def start_on(tokens: Sequence[Token]) -> bool:
    """Wait for the tokens' stamp, so that the handler starts on it; ``False`` when it has
    passed by more than the margin (the write was slow: give the tokens back and take new ones)."""
    stamp = max(token.stamp for token in tokens)
    wait = stamp / 1000 - time.time()
    if wait > 0:
        time.sleep(wait)
    now_ms = int(time.time() * 1000)
    return all(now_ms - token.stamp <= margin_ms(token.group.rate) for token in tokens)


def returning(task: TaskModel, group: RateGroup, now: datetime | None = None) -> bool:
    """Whether ``task`` comes back from a start it booked lately (within the longer of the
    group's interval and RETURN_WINDOW_SECONDS): it may take a token though others are booked."""
    if task.rate_booked_at is None:
        return False
    now_ms = epoch_ms(now or utcnow())
    return now_ms - max(group.rate.interval_ms, RETURN_WINDOW_SECONDS * 1000) <= int(task.rate_booked_at) <= now_ms


def book(group: RateGroup, free_ms: int, now: datetime | None = None) -> datetime:
    """A start time for a task ``group`` turned away: the later of its next free token
    (``free_ms``) and the group's booking mark, which moves on by one start's share of the
    interval (and margin), so that its waiters come due one after another as tokens free."""
    spacing = math.ceil((group.rate.interval_ms + margin_ms(group.rate)) / group.rate.limit)
    free_ms = max(free_ms, epoch_ms(now or utcnow()))
    # (Bookings take turns apart from the tokens: they write another attribute, under its own
    # condition, and a slow one holds up no start.)
    with _turn(group.gate_key + "\0book"):
        return _book(group, free_ms, spacing)


def _book(group: RateGroup, free_ms: int, spacing: int) -> datetime:
    log = _recall(group.gate_key) or _read(group)
    for _ in range(RACE_RETRIES):
        booked = log.booked_until
        slot = max(free_ms, booked or 0)
        seen = (RateGateModel.booked_until == booked) if booked is not None \
            else RateGateModel.booked_until.does_not_exist()
        if writes.update(RateGateModel(group.gate_key), [RateGateModel.booked_until.set(slot + spacing)], seen,
                         f"book a start of {group.name!r}", refresh=False):
            _remember_booking(group.gate_key, slot + spacing)
            return from_epoch_ms(slot)
        log = _read(group)
    return from_epoch_ms(free_ms)


# Index entries one change of a limit reads, at most, looking for its group's booked waiters
# (:func:`rebook`; a rate key is not in the index, so a key's are among every task due meanwhile).
REBOOK_READS = 2000


@dataclasses.dataclass(frozen=True)
class Rebooked:
    """What :func:`rebook` did: how many waiters it brought forward, and whether it looked at every
    task booked (else those past its read budget keep their start, and so does the booking mark)."""

    moved: int
    complete: bool


def rebook(group_name: str, rate: Rate | None, settle_seconds: float, now: datetime | None = None) -> Rebooked:
    """Re-book ``group_name``'s waiters under ``rate``, the limit now in force (``None``: none is
    set), after it was set, raised or lifted: each, in the order booked, is due at the later of
    the next free token and ``settle_seconds`` from now (when every claimer sees the new limit,
    which it would otherwise turn the waiter away under again), spaced by the new limit's share
    of the interval, if that is sooner than its booking; the booking mark moves to behind the last
    of them, so a new task books there, not behind the old bookings. A lowered limit moves
    nobody later: the tokens keep to it, and a waiter turned away books again.

    Each waiter moves only if it is still where it was booked (not claimed meanwhile); the mark only
    if no task was booked meanwhile (else it is looked at again, and moves too). Costs about one
    read unit per 20 index entries between now and the mark (REBOOK_READS at most), a
    consistent BatchGetItem of those entries for a key's group, and one write per waiter moved."""
    group_key = RATE_GATE_PREFIX + group_name
    is_key = group_name.startswith(KEY_GROUP)
    moved = 0
    for _ in range(RACE_RETRIES):
        now_ms = epoch_ms(now or utcnow())
        item = read_log(group_name)
        if item is None or item.booked_until is None or int(item.booked_until) <= now_ms:
            return Rebooked(moved, True)
        horizon = int(item.booked_until)
        base, spacing = now_ms + math.ceil(settle_seconds * 1000), 0
        if rate is not None:
            base = max(base, free_at(logged_starts(item)[0], rate))
            spacing = math.ceil((rate.interval_ms + margin_ms(rate)) / rate.limit)
        found, complete = index.due_between((TaskStatus.TODO, TaskStatus.FAILED), from_epoch_ms(now_ms),
                                            from_epoch_ms(horizon), REBOOK_READS,
                                            None if is_key else group_name[len(TYPE_GROUP):])
        waiters = _waiters(found, group_name, group_name[len(KEY_GROUP):] if is_key else None)
        for number, task in enumerate(waiters):
            slot = base + number * spacing
            if slot < int(task.rate_booked_at) and _move(task, slot):
                moved += 1
        if not complete:
            return Rebooked(moved, False)  # the mark stays behind the waiters not looked at
        if writes.update(RateGateModel(group_key), [RateGateModel.booked_until.set(base + len(waiters) * spacing)],
                         RateGateModel.booked_until == horizon, f"re-book the waiters of {group_name!r}",
                         refresh=False):
            _remember(group_key, None)  # (a process's workers see the new mark when theirs is refused)
            return Rebooked(moved, True)
    return Rebooked(moved, False)


def _waiters(found: Sequence[TaskModel], group_name: str, rate_key: str | None) -> list[TaskModel]:
    """Of index entries ``found`` (by due time), the tasks that wait at the start ``group_name``
    booked for them (of ``rate_key``, if given): one consistent BatchGetItem per 100. (A task
    booked by another of its groups stays: brought forward, that group would turn it away again,
    to behind its waiters; one booked before bookings were signed is taken as this group's.)"""
    names = [TaskModel.rate_key.attr_name, TaskModel.rate_booked_at.attr_name, TaskModel.rate_booked_by.attr_name]
    if not found:
        return []
    got = {task.key: task for task in TaskModel.batch_get([task.key for task in found], consistent_read=True,
                                                          attributes_to_get=[layout.PARTITION_KEY, *names])}
    waiters = []
    for entry in found:
        task = got.get(entry.key)
        if task is None or task.rate_booked_at is None or (rate_key is not None and task.rate_key != rate_key):
            continue
        if task.rate_booked_by not in (None, group_name):
            continue
        if from_epoch_ms(int(task.rate_booked_at)) != entry.due_at:
            continue  # due at another time than it booked: not waiting at its booking
        entry.rate_booked_at = task.rate_booked_at
        waiters.append(entry)
    return waiters


def _move(task: TaskModel, slot: int) -> bool:
    """Bring a booked waiter forward to ``slot`` (epoch ms), if it is still where it was booked."""
    where = ((TaskModel.status_shard == task.status_shard) & (TaskModel.due_at == task.due_at)
             & (TaskModel.rate_booked_at == task.rate_booked_at))
    return writes.update(TaskModel(task.key), [TaskModel.due_at.set(from_epoch_ms(slot)),
                                               TaskModel.rate_booked_at.set(slot)], where,
                         f"re-book task {task.key!r}", refresh=False)


@dataclasses.dataclass(frozen=True)
class RateState:
    """What one group's log says at a moment: the limit in force, the starts in the last
    interval, when the next start is allowed, and until when waiters are booked."""

    rate: Rate | None  # the limit set for the group, else the one its last start's task carried
    started_in_interval: int
    next_free_at: datetime | None
    booked_until: datetime | None
    carried: bool = False  # ``rate`` is the one the last start's task carried (none is set)
    logged: bool = False  # the group has a start log: some start of it ran under a limit


def states(groups: Mapping[str, Rate | None], now: datetime | None = None) -> dict[str, RateState]:
    """The state of each group's log (one BatchGetItem per 100 groups, consistent, and one per
    100 chunks their heads name: about N / SEAL_AT for a group above HEAD_STARTS), by group
    name, under the limit set for it (``None``: none is set; then the one its last start's task
    carried, if it did)."""
    now_ms = epoch_ms(now or utcnow())
    keys = [RATE_GATE_PREFIX + name for name in groups]
    items = {item.key: item for item in RateGateModel.batch_get(keys, consistent_read=True)} if keys else {}
    found = [items.get(key) for key in keys]
    return {name: _state_of(item, starts, rate, now_ms)
            for (name, rate), item, starts in zip(groups.items(), found, logged_starts(*found), strict=True)}


def state(group_name: str, now: datetime | None = None) -> RateState:
    """The state of ``group_name``'s log under the limit in force (the control record's, else the
    one its last start's task carried): two consistent reads (and one BatchGetItem of its log's
    chunks, above HEAD_STARTS)."""
    item = read_log(group_name)
    return _state_of(item, logged_starts(item)[0], control.read(consistent=True).rate_limits.get(group_name),
                     epoch_ms(now or utcnow()))


def _state_of(item: RateGateModel | None, starts: Sequence[int], rate: Rate | None, now_ms: int) -> RateState:
    if item is None:
        return RateState(rate, 0, None, None)
    booked = int(item.booked_until) if item.booked_until is not None else None
    booked_until = from_epoch_ms(booked) if booked is not None and booked > now_ms else None
    # A start under a limit set through the API leaves none in the log: a limit found there was
    # carried by the last start's task (and a log without one, nothing set, means it was lifted).
    carried = rate is None and item.limit is not None and item.interval_ms is not None
    if carried:
        rate = Rate(int(item.limit), int(item.interval_ms))
    if rate is None:
        return RateState(None, 0, None, booked_until, logged=True)
    recent = sum(1 for s in starts if s > now_ms - rate.interval_ms)
    free = free_at(starts, rate)
    return RateState(rate, recent, from_epoch_ms(free) if free > now_ms else None, booked_until,
                     carried=carried, logged=True)
