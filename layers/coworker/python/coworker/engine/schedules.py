"""Recurring schedules: a named cron or rate expression that puts one task per occurrence.

A schedule is an item ``schedule#<name>`` in the task table. An active one sits in the status
index under the partition ``schedules`` with ``due_at`` = its next occurrence (UTC); a paused one
under ``schedules#paused``. Each coordinator tick reads the schedules that are due (one query;
:func:`create_due_occurrences`) and for each:

1. works out the one occurrence to create: the latest one at or before now (``missed="once"``,
   the default), or that one only if it is less than ``MISSED_AFTER_SECONDS`` late
   (``missed="skip"``). Never more than one per schedule and tick, so occurrences missed while
   nothing ran (the coordinator down, the schedule paused) are never burst-fired;
2. puts its task with the key ``<name>@<occurrence, UTC, to the second>``, only if that key is new;
3. moves the schedule to its first occurrence after now, on the condition that it is still
   due where it was read.

**Exactly once.** The task's key is derived from the schedule and the occurrence, and the put is
conditional on the key being new, so two coordinators, or one that died between the put and
the move and ran again, put each occurrence's task once. A replaced or paused schedule fails
the move's condition; whatever was read is then put once at most.

Expressions: ``rate(N minutes|hours|days)`` (N >= 1; occurrences every N units from when the
schedule was put), or ``cron(minute hour day-of-month month day-of-week)`` (five fields, as in
crontab, read in the schedule's ``timezone``, an IANA zone name; a bare five-field expression is
read as cron). Expressions are ASCII: other digits and spaces are refused.

**Daylight-saving changes.** A cron expression names wall-clock times, and each wall-clock time
fires once: a time the autumn change repeats fires at its first pass only (02:30 in Berlin on
31 October 2027 fires at 00:30 UTC, not again at 01:30 UTC), and a time the spring change skips
fires once at the first instant after the gap, as cron does (02:30 on 28 March 2027 fires at
03:00 CEST, 01:00 UTC; several skipped times fire as that one occurrence). A rate counts
elapsed time and is not affected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from pynamodb.exceptions import DoesNotExist, PynamoDBException

from coworker.config import Settings
from coworker.data import layout, writes
from coworker.data.models import ScheduleModel, utcnow
from coworker.engine import lifecycle
from coworker.engine.tasks import NewTask
from coworker.errors import ScheduleNotFoundError, StorageError
from coworker.observability import logger

ACTIVE = layout.SCHEDULES_PARTITION
PAUSED = layout.SCHEDULES_PAUSED_PARTITION
MISSED_POLICIES = ("once", "skip")
# An occurrence later than this counts as missed (``missed="skip"`` does not run it).
MISSED_AFTER_SECONDS = 300
# Schedules one tick looks at, and that list_all shows (the API pages: see list_page).
MAX_DUE_PER_TICK = 100
MAX_LISTED = 1000
# The task a schedule puts is kept on its item, payload included.
MAX_TEMPLATE_BYTES = 16 * 1024
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
_RATE = re.compile(r"^rate\(\s*([0-9]{1,6})\s+(minute|minutes|hour|hours|day|days)\s*\)$", re.ASCII)
_CRON = re.compile(r"^cron\((.*)\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}
# Cron times a step may pass over before one lands after the moment asked about: the times of a
# repeated hour (at most 60 minutes a day of an expression like ``* 2 * * *``) and a margin.
_MAX_CRON_STEPS = 200


class Recurrence:
    """When a schedule's occurrences fall: parsed from its expression, in its time zone.

    Raises ``ValueError`` with a message a person understands for an expression or time zone
    that cannot be used.
    """

    def __init__(self, expression: str, timezone: str, anchor: datetime) -> None:
        self.expression = expression.strip()
        if not self.expression.isascii():
            raise ValueError("the expression must be plain ASCII (digits 0-9, ordinary spaces), e.g. "
                             "cron(0 3 * * *) or rate(5 minutes)")
        self.zone = zone_of(timezone)
        self.anchor = anchor.astimezone(UTC).replace(microsecond=0)
        rate = _RATE.match(self.expression)
        self.interval: timedelta | None = None
        self.cron: str | None = None
        if rate:
            count, unit = int(rate.group(1)), rate.group(2).rstrip("s")
            if count < 1:
                raise ValueError("a rate needs at least 1 unit, e.g. rate(5 minutes)")
            self.interval = timedelta(seconds=count * _UNIT_SECONDS[unit])
            return
        cron = _CRON.match(self.expression)
        fields = (cron.group(1) if cron else self.expression).split()
        if len(fields) != 5:
            raise ValueError("the expression must be rate(N minutes|hours|days) or cron(minute hour "
                             "day-of-month month day-of-week), five cron fields, e.g. cron(0 3 * * *)")
        self.cron = " ".join(fields)
        try:
            valid = _croniter().is_valid(self.cron)
            if valid:
                self._cron_step(self.anchor, forward=True)
        except Exception:  # noqa: BLE001 - croniter's own errors vary by field
            valid = False
        if not valid:
            raise ValueError(f"cron({self.cron}) is not a valid cron expression (minute hour day-of-month "
                             "month day-of-week, e.g. cron(0 3 * * *))")

    def _cron_step(self, start: datetime, forward: bool) -> datetime:
        """The first occurrence after ``start`` (``forward``) or the last before it.

        croniter steps through wall-clock times (naive, in the zone); each is then placed in UTC
        by :meth:`_instant`, which never goes back in time as the wall clock goes on. Stepping
        from the wall-clock time of ``start`` and passing over the times that land on the wrong
        side of it finds the right one, also inside a repeated hour.
        """
        assert self.cron is not None
        moment = start.astimezone(self.zone)
        wall = moment.replace(tzinfo=None, fold=0)
        if not forward and moment.fold:  # in a repeated hour's second pass: step back from its end
            wall += _fold_shift(wall, self.zone)
        steps = _croniter()(self.cron, wall + (timedelta(0) if forward else timedelta(seconds=1)))
        for _ in range(_MAX_CRON_STEPS):
            found = self._instant(steps.get_next(datetime) if forward else steps.get_prev(datetime))
            if (found > start) if forward else (found <= start):
                return found
        raise ValueError(f"cron({self.cron}) has no occurrence near {start.isoformat()}")

    def _instant(self, wall: datetime) -> datetime:
        """The UTC instant of a wall-clock time in the zone: the first pass of a repeated time;
        for a time skipped by a change, the first instant after the gap."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if first.astimezone(self.zone).replace(tzinfo=None) == wall:
            return first.replace(microsecond=0)
        # In a gap: fold=1 reads it with the offset after the change, landing before the gap;
        # fold=0 with the offset before, landing after it. The change lies between: find it.
        low = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC).replace(microsecond=0)
        high = first.replace(microsecond=0)
        low, high = min(low, high), max(low, high)
        while high - low > timedelta(seconds=1):
            middle = low + (high - low) // 2
            if middle.astimezone(self.zone).replace(tzinfo=None) >= wall:
                high = middle
            else:
                low = middle
        return high

    def next_after(self, moment: datetime) -> datetime:
        """The first occurrence strictly after ``moment``."""
        if self.interval is not None:
            steps = (moment - self.anchor) // self.interval + 1
            return self.anchor + max(1, steps) * self.interval
        return self._cron_step(moment, forward=True)

    def latest_at_or_before(self, moment: datetime) -> datetime | None:
        """The last occurrence at or before ``moment`` (``None`` before the first)."""
        if self.interval is not None:
            steps = (moment - self.anchor) // self.interval
            return self.anchor + steps * self.interval if steps >= 1 else None
        return self._cron_step(moment, forward=False)


def _croniter() -> Any:
    """croniter, imported when a cron expression is first read: it takes about 20 ms to import,
    which every cold start of the API and the coordinator would otherwise pay."""
    from croniter import croniter

    return croniter


def _fold_shift(wall: datetime, zone: ZoneInfo) -> timedelta:
    """How much longer the first pass of an ambiguous wall-clock time is ahead of UTC than the
    second (the length of the repeated period; zero for a time that is not repeated)."""
    first = wall.replace(tzinfo=zone, fold=0).utcoffset() or timedelta(0)
    second = wall.replace(tzinfo=zone, fold=1).utcoffset() or timedelta(0)
    return max(first - second, timedelta(0))


@functools.cache
def iana_zone_names() -> frozenset[str]:
    """The IANA time zone names, as the ``tzdata`` package lists them (else the system's, less
    its ``localtime`` link): names such as ``localtime`` or ``posixrules`` are files of a zone
    directory, not zones, and mean different things on different machines."""
    try:
        return frozenset(resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8").split())
    except (ModuleNotFoundError, FileNotFoundError):
        return frozenset(available_timezones() - {"localtime", "posixrules"})


def zone_of(timezone: str) -> ZoneInfo:
    """The IANA time zone named ``timezone``; ``ValueError`` for a name that is not one."""
    try:
        if timezone not in iana_zone_names():
            raise ValueError(timezone)
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError, TypeError):
        raise ValueError(f"unknown time zone {timezone[:80]!r}: use an IANA name such as UTC, "
                         "Europe/Berlin or America/New_York") from None


def name_problem(name: str) -> str | None:
    """Why no schedule can be called ``name``, or ``None``."""
    if NAME_PATTERN.match(name):
        return None
    return ("schedule names are 1 to 80 characters: letters, digits, '.', '_' and '-', starting with "
            "a letter or digit")


def occurrence_key(name: str, occurrence: datetime) -> str:
    """The key of the task an occurrence puts: the same for every coordinator that puts it."""
    return f"{name}@{occurrence.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A schedule as people see it."""

    name: str
    expression: str
    timezone: str
    missed: str
    task: dict[str, Any]
    paused: bool
    next_run_at: datetime | None
    last_run_at: datetime | None
    last_task_key: str | None
    skipped: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, item: ScheduleModel) -> Schedule:
        paused = item.status_shard == PAUSED
        return cls(name=item.name, expression=item.expression, timezone=item.timezone, missed=item.missed,
                   task=json.loads(item.template), paused=paused, next_run_at=None if paused else item.due_at,
                   last_run_at=item.last_run_at, last_task_key=item.last_task_key, skipped=int(item.skipped or 0),
                   created_at=item.created_at, updated_at=item.updated_at)


def _item_key(name: str) -> str:
    return layout.SCHEDULE_KEY_PREFIX + name


@contextlib.contextmanager
def _storage(what: str) -> Iterator[None]:
    """DynamoDB refusing or failing a request (throttling, an outage) as :class:`StorageError`
    (the API answers 503: retry later)."""
    try:
        yield
    except PynamoDBException as exc:
        raise StorageError(f"could not {what}: {writes.error_message(exc)}") from exc


def put(name: str, expression: str, timezone: str, missed: str, task: NewTask, paused: bool = False,
        now: datetime | None = None) -> tuple[Schedule, bool]:
    """Create or replace schedule ``name``: ``(schedule, created)``. Its first occurrence is the
    first after now (a rate counts from now). ``ValueError`` for an unusable expression, time
    zone or policy; nothing is written then."""
    now = (now or utcnow()).replace(microsecond=0)
    problem = name_problem(name)
    if problem:
        raise ValueError(problem)
    if missed not in MISSED_POLICIES:
        raise ValueError(f"missed must be one of {', '.join(MISSED_POLICIES)}")
    recurrence = Recurrence(expression, timezone, now)
    template = json.dumps(task.model_dump(mode="json", exclude_none=True, exclude={"key", "run_at"}),
                          separators=(",", ":"))
    if len(template.encode()) > MAX_TEMPLATE_BYTES:
        raise ValueError(f"a schedule's task, payload included, is at most {MAX_TEMPLATE_BYTES // 1024} KB of "
                         "JSON (keep larger inputs elsewhere and pass their address)")
    previous = _read(name)
    item = ScheduleModel(
        _item_key(name), name=name, expression=recurrence.expression, timezone=timezone, missed=missed,
        template=template,
        anchor_at=now, created_at=previous.created_at if previous else now, updated_at=now,
        last_run_at=previous.last_run_at if previous else None,
        last_task_key=previous.last_task_key if previous else None, skipped=0)
    _place(item, recurrence, paused, now)
    with _storage(f"put schedule {name!r}"):
        item.save()
    logger.info("schedule put", extra={"schedule": name, "expression": item.expression,
                                       "schedule_created": previous is None})
    return Schedule.of(item), previous is None


def _place(item: ScheduleModel, recurrence: Recurrence, paused: bool, now: datetime) -> None:
    item.status_shard = PAUSED if paused else ACTIVE
    item.due_at = now if paused else recurrence.next_after(now)


def _read(name: str, consistent: bool = True) -> ScheduleModel | None:
    with _storage(f"read schedule {name!r}"):
        try:
            return ScheduleModel.get(_item_key(name), consistent_read=consistent)
        except DoesNotExist:
            return None


def get(name: str) -> Schedule:
    """Schedule ``name``; :class:`ScheduleNotFoundError` if there is none."""
    item = _read(name) if name_problem(name) is None else None
    if item is None:
        raise ScheduleNotFoundError(f"no schedule named {name[:100]!r}")
    return Schedule.of(item)


def delete(name: str) -> Schedule:
    """Delete schedule ``name`` (tasks it put stay); :class:`ScheduleNotFoundError` if none."""
    schedule = get(name)
    with _storage(f"delete schedule {name!r}"):
        ScheduleModel(_item_key(name)).delete()
    logger.info("schedule deleted", extra={"schedule": name})
    return schedule


def set_paused(name: str, paused: bool, now: datetime | None = None) -> tuple[Schedule, bool]:
    """Pause or resume schedule ``name``: ``(schedule, changed)``. A resumed schedule runs from
    its first occurrence after now (what fell due while paused is not run)."""
    now = (now or utcnow()).replace(microsecond=0)
    item = _read(name) if name_problem(name) is None else None
    if item is None:
        raise ScheduleNotFoundError(f"no schedule named {name[:100]!r}")
    if (item.status_shard == PAUSED) == paused:
        return Schedule.of(item), False
    recurrence = Recurrence(item.expression, item.timezone, item.anchor_at)
    old_shard = item.status_shard
    _place(item, recurrence, paused, now)
    condition = ScheduleModel.status_shard == old_shard
    actions = [ScheduleModel.status_shard.set(item.status_shard), ScheduleModel.due_at.set(item.due_at),
               ScheduleModel.updated_at.set(now)]
    if not writes.update(item, actions, condition, f"pause schedule {name!r}"):
        return get(name), False  # paused, resumed or deleted meanwhile: as it is now
    logger.info("schedule paused" if paused else "schedule resumed", extra={"schedule": name})
    return Schedule.of(item), True  # as written: the update returned the whole item


# The index partitions a listing walks, in this order; a position names one by its place here.
_LISTED = (ACTIVE, PAUSED)


def list_page(limit: int, after: Any = None) -> tuple[list[Schedule], list[Any] | None]:
    """Up to ``limit`` schedules in the index's order -- the active ones by next occurrence, then
    the paused ones by when they were paused -- from just after ``after``, the position a previous
    page ended at (``None``: from the start). Returns ``(schedules, position)``, ``position``
    being where the next page starts, ``None`` when no schedule is left after this page.

    One index query per partition (keys only, ``limit + 1`` entries: the one more says whether a
    next page exists) and one batch read of the page's items. ``ValueError`` for a position this
    function did not make. A schedule that fires, is paused or resumed while someone pages moves
    in the index: it may then be listed twice, or not at all.
    """
    first, start = _start_of(after)
    entries: list[tuple[int, ScheduleModel]] = []
    with _storage("list the schedules"):
        for number in range(first, len(_LISTED)):
            entries.extend((number, entry) for entry in ScheduleModel.schedule_index.query(
                _LISTED[number], limit=limit + 1 - len(entries), last_evaluated_key=start if number == first else None))
            if len(entries) > limit:
                break
        more = len(entries) > limit
        entries = entries[:limit]
        keys = [entry.key for _, entry in entries]
        found = {item.key: item for item in ScheduleModel.batch_get(keys)} if keys else {}
    page = [Schedule.of(found[key]) for key in keys if key in found]  # deleted meanwhile: left out
    if not more:
        return page, None
    number, last = entries[-1]
    name = last.key.removeprefix(layout.SCHEDULE_KEY_PREFIX)
    return page, [number, name, ScheduleModel.due_at.serialize(last.due_at)]


def _start_of(after: Any) -> tuple[int, dict[str, dict[str, str]] | None]:
    """The partition a page starts in, and the index key it starts after (``None``: its start)."""
    if after is None:
        return 0, None
    if not (isinstance(after, list) and len(after) == 3 and after[0] in range(len(_LISTED))
            and not isinstance(after[0], bool) and isinstance(after[1], str) and name_problem(after[1]) is None
            and isinstance(after[2], str) and len(after[2]) <= 64):
        raise ValueError("not a position of the schedule listing")
    number, name, due = after
    ScheduleModel.due_at.deserialize(due)  # ValueError if it is not a time as the index keeps it
    return number, {layout.PARTITION_KEY: {"S": _item_key(name)},
                    layout.STATUS_INDEX_PARTITION_KEY: {"S": _LISTED[number]},
                    layout.STATUS_INDEX_SORT_KEY: {"S": due}}


def list_all() -> tuple[list[Schedule], bool]:
    """The first ``MAX_LISTED`` schedules, by name: ``(schedules, truncated)`` (for tests and
    scripts; the API pages with :func:`list_page`)."""
    page, more = list_page(MAX_LISTED)
    return sorted(page, key=lambda s: s.name), more is not None


@dataclasses.dataclass(frozen=True)
class OccurrenceReport:
    put: tuple[tuple[str, str], ...] = ()  # (key, type) of the tasks put for occurrences this pass
    skipped: int = 0  # occurrences missed by more than MISSED_AFTER_SECONDS under missed="skip"
    due_soon: bool = False  # a schedule falls due within the horizon asked about

    @property
    def created(self) -> int:
        return len(self.put)


def create_due_occurrences(settings: Settings, now: datetime | None = None,
                           horizon: timedelta = timedelta(0)) -> OccurrenceReport:
    """One pass over the schedules due at ``now``: each puts its occurrence's task (at most
    one) and moves on to its next occurrence. ``due_soon`` tells whether one falls due before
    ``now + horizon`` (a coordinator with nothing else to do then keeps supervising)."""
    now = now or utcnow()
    put: list[tuple[str, str]] = []
    skipped = 0
    due_soon = False
    for entry in _due(now + horizon):
        if entry.due_at > now:
            due_soon = True
            continue
        item = _read(entry.key.removeprefix(layout.SCHEDULE_KEY_PREFIX))
        if item is None or item.status_shard != ACTIVE or item.due_at > now:
            continue
        try:
            made, missed = _run_occurrence(item, settings, now)
        except Exception:  # noqa: BLE001 - one broken schedule must not stop the tick
            logger.exception("schedule occurrence failed; retried next tick", extra={"schedule": item.name})
            continue
        put.extend(made)
        skipped += missed
    return OccurrenceReport(put=tuple(put), skipped=skipped, due_soon=due_soon)


def _due(until: datetime) -> Iterator[ScheduleModel]:
    return ScheduleModel.schedule_index.query(ACTIVE, ScheduleModel.due_at <= until, limit=MAX_DUE_PER_TICK)


def _run_occurrence(item: ScheduleModel, settings: Settings, now: datetime) -> tuple[list[tuple[str, str]], int]:
    """Put the task of ``item``'s occurrence (unless skipped) and move it on: ``(put, skipped)``,
    ``put`` holding the ``(key, type)`` of the task if this call created it."""
    recurrence = Recurrence(item.expression, item.timezone, item.anchor_at)
    latest = max(item.due_at, recurrence.latest_at_or_before(now) or item.due_at)
    late = now - latest
    made: list[tuple[str, str]] = []
    missed = 0
    key = None
    if item.missed == "skip" and late > timedelta(seconds=MISSED_AFTER_SECONDS):
        missed = 1
        logger.info("schedule occurrence missed; skipped",
                    extra={"schedule": item.name, "occurrence": latest.isoformat()})
    else:
        key = occurrence_key(item.name, latest)
        template = NewTask.model_validate(json.loads(item.template))
        # The payload stays on the record (at most MAX_TEMPLATE_BYTES): the coordinator never
        # needs the object store, whatever COWORKER_INLINE_PAYLOAD_BYTES says. The key is set
        # after the checks: it is of the form reserved for occurrences (tasks.derived_key_problem).
        spec = dataclasses.replace(template.to_spec(), key=key)
        if writes.put_if_new(lifecycle.new_task(spec, settings, now), f"task {key!r}"):
            made.append((key, spec.type))
        logger.info("schedule occurrence put",
                    extra={"schedule": item.name, "task_key": key, "task_created": bool(made)})
    actions: list[Any] = [ScheduleModel.due_at.set(recurrence.next_after(now)), ScheduleModel.updated_at.set(now)]
    if key is not None:
        actions += [ScheduleModel.last_run_at.set(latest), ScheduleModel.last_task_key.set(key)]
    if missed:
        actions.append(ScheduleModel.skipped.add(1))
    # Moved on only from where it was read: a replaced, paused or deleted schedule is left alone.
    condition = (ScheduleModel.due_at == item.due_at) & (ScheduleModel.status_shard == ACTIVE)
    writes.update(item, actions, condition, f"move schedule {item.name!r} on", refresh=False)
    return made, missed

