"""A start log above HEAD_STARTS (100) starts per interval is packed (issue 50, last item): its head
item keeps the newest starts and names the chunks that hold the older ones, so a start writes
about 1 KB (1 write unit) at any limit, where a head of the last 1,000 starts was about 9 KB;
and the limit stays exact, across threads and processes, because every write still reads the
N-th last start (from the head, a chunk it keeps, or a chunk it reads) and is conditional on the
head's version.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from coworker.data import layout
from coworker.data.models import RateChunkModel, RateGateModel, utcnow
from coworker.engine import rates
from coworker.engine.control import Rate
from coworker.engine.tasks import MAX_RATE_INTERVAL_SECONDS
from coworker_local.capacity import CapacityMeter, WriteRecord, item_size
from coworker_local.database import dynamodb_client

from tests.support.rate_races import most_in_a_window, take_in_a_second_process

pytestmark = pytest.mark.both_backends

# Long enough that no window closes while a test runs, however busy the machine.
LONG = 600_000


def _admit_all(group: rates.RateGroup, count: int, threads: int = 8, retry: bool = False) -> list[int]:
    """Take ``count`` tokens of ``group`` from ``threads`` threads (they share writes): their stamps.
    A token refused is an error, or with ``retry`` asked for again when the next one frees."""
    stamps: list[int] = []
    errors: list[BaseException] = []
    guard = threading.Lock()
    left = iter(range(count))

    def run() -> None:
        try:
            take()
        except BaseException as exc:  # (raised again in the calling thread)
            errors.append(exc)

    def take() -> None:
        while True:
            with guard:
                if next(left, None) is None:
                    return
            tokens, refused_by, free_ms = rates.admit([group], now=utcnow())
            while retry and refused_by is not None:
                time.sleep(max(0.0, free_ms / 1000 - time.time()))
                tokens, refused_by, free_ms = rates.admit([group], now=utcnow())
            assert refused_by is None
            with guard:
                stamps.append(tokens[0].stamp)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(300)
    if errors:
        raise errors[0]
    return stamps


def test_a_chunk_outlives_every_window_its_starts_could_count_in():
    assert rates.CHUNK_KEPT_SECONDS >= 2 * MAX_RATE_INTERVAL_SECONDS


def test_a_process_keeps_a_bounded_number_of_chunks(monkeypatch):
    monkeypatch.setattr(rates, "KNOWN_CHUNKS", 10)
    monkeypatch.setattr(rates, "_known", collections.OrderedDict())
    monkeypatch.setattr(rates, "_known_chunks", 0)
    chunks = tuple(rates._Chunk(version, (version,)) for version in range(4))
    # Given logs of 4 chunks each, remembered one after the other
    for number in range(5):
        rates._remember(f"gate#rate:key:{number}", rates._Log(1, [], None, chunks))
    # Then the least recently used went first: the last two are kept (8 chunks; a third is 12)
    assert [rates._recall(f"gate#rate:key:{number}") is not None for number in range(5)] == [False] * 3 + [True] * 2
    assert rates._known_chunks == 8
    rates._remember("gate#rate:key:4", None)
    assert rates._known_chunks == 4


def _head_writes(meter: CapacityMeter) -> list[WriteRecord]:
    return [record for record in meter.writes if record.succeeded
            and (record.new or {}).get(layout.PARTITION_KEY, {}).get("S", "").startswith(layout.RATE_GATE_PREFIX)]


def _chunk_writes(meter: CapacityMeter) -> list[WriteRecord]:
    return [record for record in meter.writes
            if (record.new or record.old or {}).get(layout.PARTITION_KEY, {}).get("S", "")
            .startswith(layout.RATE_CHUNK_PREFIX)]


@pytest.mark.parametrize("limit", [10, 100, 1000])
def test_a_start_writes_about_one_write_unit_at_any_limit(settings, limit):
    # (A short interval, so that starts beyond the limit are soon let in: a log keeps its last N
    # starts, old or not.)
    group = rates.RateGroup(f"key:units-{limit}.example", Rate(limit, 10))
    # Given a group's log already holding its limit's worth of starts
    _admit_all(group, limit, retry=True)

    # When 200 more start, every write metered
    with CapacityMeter.for_model(RateGateModel, dynamodb_client(settings),
                                 RateChunkModel._get_connection().connection) as meter:
        stamps = _admit_all(group, 200, retry=True)
    assert len(stamps) == 200

    # Then no head write passes 1 write unit (the item before and after within 1 KB), as
    # DynamoDB's rules bill it and, on DynamoDB Local, as it reports; and the starts cost about 1
    # write unit each, with a chunk sealed about every SEAL_AT starts above HEAD_STARTS
    heads, chunks = _head_writes(meter), _chunk_writes(meter)
    assert heads
    largest = max(max(item_size(record.old), item_size(record.new)) for record in heads)
    assert largest <= 1024, f"a head write of {largest} bytes"
    assert all(record.table_units == 1 for record in heads)
    assert all(record.reported.table_units <= 1 for record in heads if record.reported is not None)
    units = sum(record.table_units for record in meter.writes)
    assert units <= 200 * 1.05, f"{units} write units for 200 starts"
    head = rates.read_log(group.name)
    assert head is not None
    if limit <= rates.HEAD_STARTS:  # as releases before chunks wrote it: the last N in the head
        assert chunks == [] and head.chunks is None and len(head.starts) == limit
    else:
        assert 2 <= len(chunks) <= 200 // rates.SEAL_AT + 1
        assert len(rates.logged_starts(head)[0]) >= limit
    print(f"limit {limit}: largest head {largest} bytes, {units / 200:.3f} write units per start, "
          f"{len(chunks)} chunks sealed")


def test_every_start_the_limit_allows_is_kept_and_one_more_is_refused(settings):
    group = rates.RateGroup("key:kept.example", Rate(250, LONG))
    # Given as many starts as the limit, in one window
    stamps = _admit_all(group, 250)

    # Then the log holds every one of them (the older in chunks), the state shows them all, and
    # the next start is refused until the first is an interval old
    head = rates.read_log(group.name)
    assert head is not None and head.chunks
    assert sorted(rates.logged_starts(head)[0][-250:]) == sorted(stamps)
    state = rates.states({group.name: group.rate})[group.name]
    assert state.started_in_interval == 250
    tokens, refused_by, free_ms = rates.admit([group], now=utcnow())
    assert tokens == [] and refused_by == group
    assert free_ms == min(stamps) + LONG + rates.margin_ms(group.rate)


def test_a_token_given_back_leaves_the_chunks_and_the_head_as_they_were(settings):
    big = rates.RateGroup("key:give-back.example", Rate(300, LONG))
    full = rates.RateGroup("key:full.example", Rate(1, LONG))
    _admit_all(big, 120)
    assert rates.admit([full], now=utcnow())[1] is None  # the second group is full now
    before = rates.read_log(big.name)
    assert before is not None and before.chunks

    # When a task in both groups takes a token in the first and is refused by the second
    tokens, refused_by, _ = rates.admit([big, full], now=utcnow())

    # Then the first group's token is given back: its log holds the starts it held before (the
    # token's write may have sealed some of them into a chunk meanwhile), two versions on
    assert tokens == [] and refused_by == full
    after = rates.read_log(big.name)
    assert after is not None and after.version == before.version + 2
    assert rates.logged_starts(after) == rates.logged_starts(before)


def test_a_limit_lowered_to_an_unpacked_size_keeps_the_starts_the_chunks_held(settings):
    # Given 80 starts in one window under a limit of 1,000 (the older ones in a chunk)
    stamps = _admit_all(rates.RateGroup("key:lowered.example", Rate(1000, LONG)), 80)
    head = rates.read_log("key:lowered.example")
    assert head is not None and head.chunks and len(head.starts) < 80

    # When the limit is lowered to 50, then set to 100
    lowered = rates.RateGroup("key:lowered.example", Rate(50, LONG))
    tokens, refused_by, _ = rates.admit([lowered], now=utcnow())
    assert tokens == [] and refused_by == lowered  # (80 in the window: none under 50)
    hundred = rates.RateGroup("key:lowered.example", Rate(100, LONG))
    more = _admit_all(hundred, 20, threads=1)

    # Then 100 counts the 80 the chunks and head held: it lets 20 more start, not 100, and its
    # head, written as a log of at most 100 starts is, holds all of them, naming no chunk
    assert rates.admit([hundred], now=utcnow())[1] == hundred
    head = rates.read_log(hundred.name)
    assert head is not None and head.chunks is None and head.starts == sorted(stamps) + more


def test_a_process_that_never_saw_the_log_reads_its_chunks_and_is_refused_at_the_limit(settings):
    group = rates.RateGroup("key:cold-reader.example", Rate(150, LONG))
    # Given the limit's worth of starts, most of them in chunks (the head holds at most about 50)
    _admit_all(group, 150)
    head = rates.read_log(group.name)
    assert head is not None and head.chunks and len(head.starts) < 150

    # When another process, which never read the log, asks for a token: it is refused
    assert take_in_a_second_process(settings, group) is None


@pytest.mark.parametrize("condition", ["kept", "dropped"])
def test_a_process_with_an_older_view_of_a_packed_log_cannot_start_beyond_the_limit(settings, monkeypatch, condition):
    group = rates.RateGroup(f"key:packed-cross-process-{condition}", Rate(150, LONG))
    if condition == "dropped":  # what the write would be without its version condition
        monkeypatch.setattr(rates, "_version_is", lambda version: None)

    # Given this process took all tokens but one, and keeps the log it wrote (head and chunks)
    first = _admit_all(group, 149)
    # and another process, reading the head and its chunks, took the last free one
    second = take_in_a_second_process(settings, group)
    assert second is not None, "the second process was refused a token while one was free"
    seen, stored = rates._recall(group.gate_key), rates.read_log(group.name)
    assert seen is not None and stored is not None and stored.chunks
    assert stored.version == seen.version + 1 and len(rates.logged_starts(stored)[0]) >= 150

    # When this process takes another token from its older view (149 starts: room for one)
    third = rates.admit([group], now=utcnow())[0]

    # Then, with the version condition, it is turned away: at most the limit in the window
    if condition == "kept":
        assert third == [], "a 151st start was admitted in one window of a limit of 150"
    else:  # without it, a 151st start passes: the condition is what prevents it
        assert third != []
        stamps = [*first, second, third[0].stamp]
        assert max(stamps) - min(stamps) < LONG


# A process racing this one for tokens of one group: its threads take tokens until a deadline and
# print every stamp they got.
RACING_PROCESS = """
import json, sys, threading, time
from coworker.bootstrap import configure
from coworker.config import Settings
from coworker.engine import rates
from coworker.engine.control import Rate

configure(Settings.from_env())
group = rates.RateGroup(sys.argv[1], Rate(int(sys.argv[2]), int(sys.argv[3])))
threads = int(sys.argv[4])
print("ready", flush=True)
begin = float(sys.stdin.readline())
stamps, guard = [], threading.Lock()

def run():
    while time.time() < begin + CEILING_SECONDS:
        tokens, _, free_ms = rates.admit([group])
        if tokens:
            with guard:
                stamps.append(tokens[0].stamp)
        elif free_ms / 1000 - time.time() > FULL_SECONDS:
            return  # the window is full: no token for a while
        else:
            time.sleep(min(0.05, max(0.0, free_ms / 1000 - time.time())))

time.sleep(max(0.0, begin - time.time()))
workers = [threading.Thread(target=run) for _ in range(threads)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
print(json.dumps(stamps))
"""
# A racing thread stops once the next token is this far off (the window is full), or at the ceiling.
FULL_SECONDS = 5.0
CEILING_SECONDS = 120.0


def test_starts_of_a_packed_log_keep_to_the_limit_across_threads_and_processes(settings):
    # Given two processes of 6 threads each, taking tokens of one group of 300 starts a minute as
    # fast as they can until the minute's tokens are gone (its log packed: the head and chunks)
    rate = Rate(300, 60_000)
    group = rates.RateGroup("key:racing.example", rate)
    threads = 6
    env = {**os.environ, **settings.as_environment(), "PYTHONPATH": os.pathsep.join(sys.path)}
    script = RACING_PROCESS.replace("CEILING_SECONDS", repr(CEILING_SECONDS))
    script = script.replace("FULL_SECONDS", repr(FULL_SECONDS))
    other = subprocess.Popen([sys.executable, "-c", script, group.name, str(rate.limit), str(rate.interval_ms),
                              str(threads)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert other.stdout is not None and other.stdin is not None
    assert other.stdout.readline().strip() == "ready", other.stderr.read() if other.stderr else ""
    begin = time.time() + 0.5  # both start together, whatever the other's start-up took
    other.stdin.write(f"{begin}\n")
    other.stdin.flush()
    mine: list[int] = []
    guard = threading.Lock()

    def run() -> None:
        while time.time() < begin + CEILING_SECONDS:
            tokens, _, free_ms = rates.admit([group])
            if tokens:
                with guard:
                    mine.append(tokens[0].stamp)
            elif free_ms / 1000 - time.time() > FULL_SECONDS:
                return
            else:
                time.sleep(min(0.05, max(0.0, free_ms / 1000 - time.time())))

    time.sleep(max(0.0, begin - time.time()))
    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(CEILING_SECONDS + 60)
    out, err = other.communicate(timeout=CEILING_SECONDS + 60)
    assert other.returncode == 0, err
    theirs = json.loads(out.strip().splitlines()[-1])

    # Then together they took exactly the minute's 300 tokens (every one, however slowly, and
    # not one more), both processes took some, and the log was packed into chunks
    stamps = mine + theirs
    by_process = collections.Counter({"this": len(mine), "other": len(theirs)})
    assert most_in_a_window(stamps, rate.interval_ms) <= rate.limit, by_process
    assert len(stamps) == rate.limit, by_process
    assert mine and theirs, by_process
    head = rates.read_log(group.name)
    assert head is not None and head.chunks
