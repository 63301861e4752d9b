"""Paging through the status index: signed cursors, and the bounded reads they resume.

A listing (``GET /tasks``, ``POST /bulk``, ``POST /batches/{id}/retry``) reads its status's index
shards merged by ``due_at`` (:func:`read_index`), at most :data:`MAX_SCANNED_PER_REQUEST` entries
per request, and answers where each shard stopped as an opaque cursor (:class:`CursorCodec`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import zlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from coworker.api.errors import BadRequestError
from coworker.api.models import MAX_CURSOR_CHARS
from coworker.config import Settings
from coworker.data import index, layout, writes
from coworker.data.models import CursorStateModel, SecretModel, TaskModel, status_shards, utcnow
from coworker.engine.tasks import MAX_KEY_CHARS
from coworker.errors import StorageError

# Index entries one listing or redrive request may read, whatever filters drop: bounds the
# cost and the latency of a request (API Gateway gives up after 29 s).
MAX_SCANNED_PER_REQUEST = 1000

# Cursors name the index layout they read: a cursor of another layout is refused, not misread.
CURSOR_VERSION = "sharded-1"
# A cursor that names a listing state kept in the table starts with this (never base64's alphabet).
STORED_MARK = "~"
KEPT_STATE_SECONDS = 24 * 3600
_BAD_CURSOR = ("the cursor is not valid (altered, from another listing, or from an earlier release): "
               "pass back the cursor of a previous answer unchanged, or start again without a cursor")


class CursorCodec:
    """Opaque, tamper-evident cursors: URL-safe base64 of the (deflated) read state -- where each
    index shard stopped -- and of the listing it belongs to, plus an HMAC-SHA256 of both under
    ``secret``. A cursor that was edited, comes from another deployment or release, or belongs to
    another listing (status, filters, order, shard count) is refused with 400 before it reaches
    DynamoDB."""

    def __init__(self, secret: str | Callable[[], str], max_chars: int = MAX_CURSOR_CHARS) -> None:
        """``secret``, or what gives it when a cursor is first made or read (not at start-up);
        cursors are at most ``max_chars`` long."""
        self._secret = secret
        self._key: bytes | None = None
        self.max_chars = max_chars

    def _sign(self, data: bytes) -> str:
        if self._key is None:
            secret = self._secret if isinstance(self._secret, str) else self._secret()
            self._key = hashlib.sha256(b"coworker-cursor|" + secret.encode()).digest()
        return _b64(hmac.new(self._key, data, hashlib.sha256).digest()[:16])

    def encode(self, state: Any, listing: Sequence[Any]) -> str | None:
        """The cursor of ``state``; a state whose cursor would be longer than a request may carry
        (long keys over many shards) is kept in the table and the cursor names it instead."""
        if state is None:
            return None
        data = zlib.compress(json.dumps({"k": state, "q": [CURSOR_VERSION, *listing]}, separators=(",", ":"),
                                        sort_keys=True, ensure_ascii=False).encode(), 9)
        cursor = f"{_b64(data)}.{self._sign(data)}"
        if len(cursor) <= self.max_chars:
            return cursor
        reference = (STORED_MARK + hashlib.sha256(data).hexdigest()[:40]).encode()
        keep_state(reference.decode(), data)
        return f"{reference.decode()}.{self._sign(reference)}"

    def decode(self, cursor: str | None, listing: Sequence[Any]) -> Any:
        """The read state a cursor stands for; :class:`BadRequestError` if it is not one of
        ours, or not for this listing."""
        if not cursor:
            return None
        encoded, _, signature = cursor.partition(".")
        if encoded.startswith(STORED_MARK):  # a state kept in the table
            if not signature or not hmac.compare_digest(signature, self._sign(encoded.encode())):
                raise BadRequestError(_BAD_CURSOR)
            data = kept_state(encoded)
        else:
            try:
                data = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            except (binascii.Error, ValueError):
                raise BadRequestError(_BAD_CURSOR) from None
            if not signature or not hmac.compare_digest(signature, self._sign(data)):
                raise BadRequestError(_BAD_CURSOR)
        try:
            value = json.loads(zlib.decompress(data))
        except (zlib.error, ValueError):  # signed by a release whose cursors were not deflated
            raise BadRequestError("the cursor comes from an earlier release: start again without "
                                  "a cursor") from None
        listing = [CURSOR_VERSION, *listing]
        if not isinstance(value, dict) or "k" not in value:
            raise BadRequestError(_BAD_CURSOR)  # signed, but not one this code made
        if value.get("q") != list(listing):
            raise BadRequestError("the cursor belongs to another listing (status, filters or order): "
                                  "start again without a cursor")
        return value["k"]


def bad_cursor() -> BadRequestError:
    """The refusal of a cursor that is signed but names no position of the listing it is for."""
    return BadRequestError(_BAD_CURSOR)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def cursor_secret(settings: Settings) -> str | Callable[[], str]:
    """The cursor signing secret: the setting when given (the local runtime makes one per run),
    else the deployment's own, kept in its table and read when first needed (:func:`stored_secret`)."""
    return settings.cursor_secret or stored_secret


def keep_state(name: str, data: bytes) -> None:
    """Keep a listing state a cursor names (named by its content: making it again only renews it)."""
    expires = utcnow() + timedelta(seconds=KEPT_STATE_SECONDS)
    CursorStateModel(layout.CURSOR_STATE_PREFIX + name, state=data, delete_after_epoch=expires).save()


def kept_state(name: str) -> bytes:
    try:
        return bytes(CursorStateModel.get(layout.CURSOR_STATE_PREFIX + name, consistent_read=True).state)
    except CursorStateModel.DoesNotExist:
        raise BadRequestError("the cursor has expired (a day after it was made): start again without "
                              "a cursor") from None


def stored_secret() -> str:
    """The table's ``control#cursor-secret``, made at random by the first process that needs it.

    Only those who may read the table's items can read it (and they can read the tasks anyway).
    Deleting the item rotates it: processes started after that sign with a new one, and cursors
    signed with the old one are refused (400) from then on.
    """
    for _ in range(3):
        try:
            return SecretModel.get(layout.CURSOR_SECRET_KEY, consistent_read=True).value
        except SecretModel.DoesNotExist:
            made = SecretModel(layout.CURSOR_SECRET_KEY, value=secrets.token_hex(32), created_at=utcnow())
            if writes.put_if_new(made, "store the cursor secret"):
                return made.value
    raise StorageError("the cursor secret could not be read or made")  # deleted and remade meanwhile


# -- index reads (bounded) ---------------------------------------------------------------------

def read_index(status: str, *, want: int, start: list[Any] | None = None, forward: bool = True,
               batch_id: str | None = None, task_type: str | None = None,
               budget: int = MAX_SCANNED_PER_REQUEST) -> tuple[list[TaskModel], list[Any] | None, int]:
    """Up to ``want`` index entries of ``status`` matching the filters, its shards merged by
    ``due_at``, reading at most about ``budget`` entries.

    Returns ``(tasks, state, scanned)``; ``state`` (where each shard stopped, packed for a cursor)
    is ``None`` when every shard is exhausted. Filters on projected attributes (``type``,
    ``batch_id``) are applied by DynamoDB after reading, so they cut the answer, not the read:
    hence the budget.
    """
    condition = None
    if task_type is not None:
        condition = TaskModel.task_type == task_type
    if batch_id is not None:
        by_batch = TaskModel.batch_id == batch_id
        condition = by_batch if condition is None else condition & by_batch
    read = index.MergedRead(status, want=want, filter_condition=condition, forward=forward,
                              starts=_unpack_positions(status, start), budget=budget)
    found: list[TaskModel] = []
    for task in read:
        found.append(task)
        if len(found) >= want:
            break
    state = None if read.complete else _pack_positions(read.positions())
    return found, state, read.scanned


def start_state() -> list[Any]:
    """The read state of a listing's first page, for a cursor that reads it again."""
    return _pack_positions([None] * status_shards())


def _is_position(value: Any) -> bool:
    """One shard's position as :func:`_pack_positions` writes it."""
    return (value is None or (value == 0 and not isinstance(value, bool))
            or (isinstance(value, list) and len(value) == 2 and all(isinstance(part, str) and part for part in value)
                and len(value[0]) <= MAX_KEY_CHARS and len(value[1]) <= 64))


def _pack_positions(positions: list[Any]) -> list[Any]:
    """Shard positions as a cursor keeps them: ``[key, due_at]``, ``None`` (from the start) or
    ``0`` (nothing left); the shard's partition key value is implied by its place."""
    return [0 if p is False else None if p is None
            else [p[layout.PARTITION_KEY]["S"], p[layout.STATUS_INDEX_SORT_KEY]["S"]] for p in positions]


def _unpack_positions(status: str, packed: list[Any] | None) -> list[Any] | None:
    if packed is None:
        return None
    if not isinstance(packed, list) or not all(_is_position(p) for p in packed):
        raise BadRequestError(_BAD_CURSOR)
    if len(packed) != status_shards():
        raise BadRequestError("the cursor was made with another number of index shards: start again "
                              "without a cursor")
    return [False if p == 0 else None if p is None else {
        layout.PARTITION_KEY: {"S": p[0]},
        layout.STATUS_INDEX_PARTITION_KEY: {"S": layout.shard_value(status, shard)},
        layout.STATUS_INDEX_SORT_KEY: {"S": p[1]},
    } for shard, p in enumerate(packed)]
