"""Completion events: what other systems react to without polling (off by default).

The coordinator publishes, with source ``coworker`` (shapes in docs/events.md):

* ``Task Ignored``    -- a task reached ``ignored`` (failed at its attempt ceiling, lost at it,
  cancelled, or too large to record). The stream follower (:mod:`coworker.engine.progress`)
  sees the write, so no worker needs a permission or an extra request for it.
* ``Batch Completed`` -- every task of a batch is finished or ignored, and counted.
* ``Batch Stopped``   -- a batch stopped at its failure threshold.

Delivery is at least once, like EventBridge's own: each event carries an ``event_id`` that is
the same however often it is sent (a follower that re-reads a stream record after a restart, a
coordinator killed before it recorded a batch event as sent), so a consumer can drop repeats.

``COWORKER_EVENTS`` chooses where they go: ``eventbridge`` (PutEvents to ``COWORKER_EVENT_BUS``),
``log`` (a log line each, and a JSON line in ``COWORKER_EVENTS_FILE`` when it is set: what the
local runtime does, and its dashboard shows), or ``off``.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

from coworker.config import Settings
from coworker.errors import StorageError
from coworker.observability import MetricName, logger, metrics

SOURCE = "coworker"
TASK_IGNORED = "Task Ignored"
BATCH_COMPLETED = "Batch Completed"
BATCH_STOPPED = "Batch Stopped"
# PutEvents takes at most 10 entries per call; entries it refuses are sent again this often.
ENTRIES_PER_CALL = 10
SEND_ATTEMPTS = 3


@dataclasses.dataclass(frozen=True)
class Event:
    """One event: its detail type and its detail (a JSON object with an ``event_id``)."""

    detail_type: str
    detail: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"source": SOURCE, "detail-type": self.detail_type, "detail": self.detail}


class Publisher:
    """Sends events where the settings say; one per process and configuration."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: Any = None
        self._file_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.settings.events != "off"

    def publish(self, events: Sequence[Event]) -> None:
        """Send ``events``; :class:`StorageError` if some could not be sent (after retries)."""
        if not events or not self.enabled:
            return
        if self.settings.events == "log":
            self._log(events)
        else:
            for start in range(0, len(events), ENTRIES_PER_CALL):
                self._put(events[start:start + ENTRIES_PER_CALL])
        metrics.add_metric(name=MetricName.EVENTS_PUBLISHED, unit="Count", value=len(events))

    def _log(self, events: Sequence[Event]) -> None:
        for event in events:
            logger.info("coworker event", extra={"event": event.as_json()})
        if self.settings.events_file:
            lines = "".join(json.dumps(event.as_json(), separators=(",", ":")) + "\n" for event in events)
            with self._file_lock, open(self.settings.events_file, "a", encoding="utf-8") as out:
                out.write(lines)

    def _events_client(self) -> Any:
        if self._client is None:
            import boto3

            self._client = boto3.client("events", region_name=self.settings.region)
        return self._client

    def _put(self, events: Sequence[Event]) -> None:
        entries = [{"Source": SOURCE, "DetailType": event.detail_type, "EventBusName": self.settings.event_bus,
                    "Detail": json.dumps(event.detail, separators=(",", ":"))} for event in events]
        error = "no answer"
        for attempt in range(SEND_ATTEMPTS):
            try:
                answer = self._events_client().put_events(Entries=entries)
            except Exception as exc:  # noqa: BLE001 - botocore's errors: retried, then raised as ours
                error = str(exc)
            else:
                failed = [entry for entry, result in zip(entries, answer.get("Entries", []), strict=False)
                          if result.get("ErrorCode")]
                if not answer.get("FailedEntryCount") or not failed:
                    return
                error = next(result.get("ErrorMessage") or result.get("ErrorCode")
                             for result in answer["Entries"] if result.get("ErrorCode"))
                entries = failed
            time.sleep(0.2 * 2 ** attempt)
        raise StorageError(f"EventBridge did not take {len(entries)} event(s): {error}")


_publishers: dict[tuple[str, str, str | None], Publisher] = {}
_publishers_lock = threading.Lock()


def publisher(settings: Settings) -> Publisher:
    """This process's publisher for ``settings``."""
    with _publishers_lock:
        cache_key = (settings.events, settings.event_bus, settings.events_file)
        if cache_key not in _publishers:
            _publishers[cache_key] = Publisher(settings)
        return _publishers[cache_key]


def task_ignored(record: dict[str, Any], table: str) -> Event | None:
    """The ``Task Ignored`` event of one stream record (as GetRecords or a Lambda event gives
    it), or ``None`` when the write did not take a task to ``ignored``."""
    body = record.get("dynamodb", {})
    new, old = body.get("NewImage") or {}, body.get("OldImage") or {}
    if _text(new, "status") != "ignored" or _text(old, "status") == "ignored":
        return None
    errors = new.get("errors", {}).get("L") or []
    last = errors[-1].get("M", {}) if errors else {}
    key = _text(new, "key")
    return Event(TASK_IGNORED, {
        "event_id": f"task-ignored:{key}:{body.get('SequenceNumber')}",
        "table": table,
        "key": key,
        "type": _text(new, "type"),
        "batch_id": _text(new, "batch_id"),
        "attempts": _number(new, "attempts"),
        "max_attempts": _number(new, "max_attempts"),
        "ignored_at": _text(new, "updated_at"),
        "error": {"kind": _text(last, "kind"), "message": (_text(last, "message") or "")[:1000]} if last else None,
    })


def _text(image: dict[str, Any], name: str) -> str | None:
    value = image.get(name, {})
    return value.get("S") if isinstance(value, dict) else None


def _number(image: dict[str, Any], name: str) -> int | None:
    value = image.get(name, {})
    text = value.get("N") if isinstance(value, dict) else None
    return int(text) if text is not None else None
