"""A process's threads take turns on a rate group's start log, and the thread whose turn it is
takes the tokens of every thread queued behind it in one write (issue 52, item 1): when a token
write is slow, the queued threads wait for that write and one more, not one write each, and
their stamps are taken when their write is sent, not before the wait."""

from __future__ import annotations

import threading

from coworker.data import writes
from coworker.data.models import RateGateModel, utcnow
from coworker.engine import rates
from coworker.engine.control import Rate

from tests.support.waits import wait_until

RATE = Rate(10, 1000)


def test_threads_queued_behind_a_slow_token_write_get_their_tokens_in_one_write(settings, monkeypatch):
    group = rates.RateGroup("key:turns", RATE)
    update, held, sent = writes.update, threading.Event(), []

    def counted(item, *args, **kwargs):
        if isinstance(item, RateGateModel):
            sent.append(True)
            if len(sent) == 1:
                held.wait(60)  # the first token write is slow
        return update(item, *args, **kwargs)

    monkeypatch.setattr(writes, "update", counted)
    answers: dict[int, tuple] = {}

    def admit(number: int) -> None:
        answers[number] = rates.admit([group], now=utcnow())

    # Given a thread whose token write is slow, and three more threads of the process queued
    # behind it for the group's turn
    first = threading.Thread(target=admit, args=(0,))
    first.start()
    wait_until(lambda: len(sent) == 1, what="the first token write to be sent")
    others = [threading.Thread(target=admit, args=(number,)) for number in (1, 2, 3)]
    for thread in others:
        thread.start()
    wait_until(lambda: len(rates._asks.get(rates._known_as(group.gate_key), [])) == 3,
               what="three threads to queue for the turn")

    # When the slow write comes back
    released = rates.epoch_ms(utcnow())
    held.set()
    for thread in [first, *others]:
        thread.join(60)

    # Then the three queued threads got their tokens in one more write, stamped no earlier than
    # the slow write came back (not as of their wait's start), and the log holds the four starts
    assert len(sent) == 2, sent
    stamps = sorted(answers[number][0][0].stamp for number in (1, 2, 3))
    assert all(answers[number][1] is None for number in range(4))
    assert stamps[0] >= released
    log = rates.read_log(group.name)
    assert log is not None and int(log.version) == 2 and len(log.starts) == 4


def test_one_write_for_many_queued_threads_keeps_to_the_limit(settings, monkeypatch):
    group = rates.RateGroup("key:turns-limit", Rate(2, 60_000))
    update, held, sent = writes.update, threading.Event(), []

    def counted(item, *args, **kwargs):
        if isinstance(item, RateGateModel):
            sent.append(True)
            if len(sent) == 1:
                held.wait(60)
        return update(item, *args, **kwargs)

    monkeypatch.setattr(writes, "update", counted)
    answers: dict[int, tuple] = {}

    def admit(number: int) -> None:
        answers[number] = rates.admit([group], now=utcnow())

    # Given a limit of 2 a minute, a slow first token write, and four threads queued behind it
    threads = [threading.Thread(target=admit, args=(number,)) for number in range(5)]
    threads[0].start()
    wait_until(lambda: len(sent) == 1, what="the first token write to be sent")
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: len(rates._asks.get(rates._known_as(group.gate_key), [])) == 4,
               what="four threads to queue for the turn")

    # When the write comes back and the queued threads are answered together
    held.set()
    for thread in threads:
        thread.join(60)

    # Then exactly two of the five start; the other three are told when the next token frees
    admitted = [number for number, (tokens, refused_by, _) in answers.items() if refused_by is None]
    assert len(admitted) == 2, answers
    assert all(answers[number][2] > rates.epoch_ms(utcnow()) for number in answers if number not in admitted)
    log = rates.read_log(group.name)
    assert log is not None and len(log.starts) == 2


def test_a_token_is_worth_waiting_for_as_long_as_three_recent_writes_within_a_quarter_of_the_lock(monkeypatch):
    """What turning a task away costs (its booking, its give-back and its claim again: three
    writes at this process's recent write time) is how long a near token is waited for, with the
    claim held; never past a quarter of the lock, which the heartbeat keeps meanwhile, nor LEAD_MS's
    most."""
    monkeypatch.setattr(rates, "_write_ms", 20.0)
    assert rates.worth_waiting_seconds(60) == 0.06
    monkeypatch.setattr(rates, "_write_ms", 900.0)
    assert rates.worth_waiting_seconds(60) == 2.7  # slow writes: a near token is waited for
    assert rates.worth_waiting_seconds(8) == 2.0  # a quarter of an 8-s lock
    monkeypatch.setattr(rates, "_write_ms", 4000.0)
    assert rates.worth_waiting_seconds(600) == rates.LEAD_MS[1] / 1000
