"""The error history a write keeps: the last ``error_history`` entries, every message, and only the
newest traceback (each later write of a failing task is billed by the record's size)."""

from datetime import UTC, datetime

from coworker.config import Settings
from coworker.data.models import ErrorKind
from coworker.engine.lifecycle import error_record, kept_history

AT = datetime(2026, 11, 27, tzinfo=UTC)


def test_only_the_newest_traceback_is_kept_even_when_the_newest_entry_has_none() -> None:
    # Given two system errors with tracebacks, then a cancellation (no traceback)
    entries = [error_record(1, ErrorKind.SYSTEM, "first", AT, "Traceback one"),
               error_record(2, ErrorKind.SYSTEM, "second", AT, "Traceback two"),
               error_record(2, ErrorKind.CANCELLED, "cancelled", AT)]
    kept = kept_history(entries, Settings())
    # Then every message stays, and the traceback kept is the newest one there is
    assert [e.message for e in kept] == ["first", "second", "cancelled"]
    assert [e.traceback for e in kept] == [None, "Traceback two", None]
    assert [(int(e.attempt), e.kind, e.at) for e in kept] == [(int(e.attempt), e.kind, e.at) for e in entries]
    # And the entries given are left as they were (a worker's claim still holds them)
    assert [e.traceback for e in entries] == ["Traceback one", "Traceback two", None]


def test_the_history_is_cut_to_its_length_before_choosing_the_traceback() -> None:
    entries = [error_record(n, ErrorKind.SYSTEM, f"m{n}", AT, f"Traceback {n}") for n in range(1, 8)]
    kept = kept_history(entries, Settings(error_history=3))
    assert [(e.message, e.traceback) for e in kept] == [("m5", None), ("m6", None), ("m7", "Traceback 7")]
    assert kept_history([], Settings()) == []
