"""moto's DynamoDB server, the fast fallback database (``--db moto``) and the unit tier's.

moto is a mock, so two workarounds make it behave like DynamoDB for Coworker; both exist only
here, on the moto path, and neither is needed on DynamoDB Local:

* **Request serialisation** (:class:`_OneRequestAtATime`). moto does not lock an item between
  evaluating a condition and writing it, so two concurrent conditional writes on one key can
  both succeed (measured: 6 of 200 keys with two winners under 8 racing threads). Serving one
  request at a time restores per-item atomicity; moto is bound by the GIL anyway.
* **Transaction speed-up** (:func:`speed_up_transactions`). moto (5.x) backs up a transaction by deep-copying
  every table it touches, once per item of the transaction, so that it can roll back. With
  batch counters every terminal transition of a task in a batch is a transaction, and a put of
  250 tasks is three transactions of up to 100 items: on a table of a few thousand tasks that
  deep copy dominated everything (a 2,000-task demo ran at about 4 tasks/s). The patch keeps
  moto's code and semantics and only changes what is backed up: a deep copy of each item the
  transaction names (or "absent"); on any error those items are put back, and the records
  the undone writes added to the tables' streams are dropped. (moto applies the items after a
  failed condition before it cancels, and each applied item adds a stream record; its own
  rollback restores the copied table, stream included. Left in, the records of a cancelled
  transaction were counted by the batch follower: a completion that put a follow-up whose key
  existed counted its parent finished twice, "total 1 / finished 2 / open -1".) Nothing else can
  change in between, because requests are serialised.

Nothing here is used on AWS.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from coworker_local.database import FAKE_CREDENTIALS, free_port

_APPLIED = False


class _CopyWithoutTables:
    """Stands in for the ``copy`` module inside moto's DynamoDB backend: tables are not copied."""

    def __init__(self, table_type: type) -> None:
        self._table_type = table_type

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        if isinstance(value, self._table_type):
            return value  # restored item by item by the wrapper below
        return copy.deepcopy(value, memo)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)


def _named_items(backend: Any, transact_items: list[dict[str, Any]]) -> list[tuple[Any, Any, Any, Any]]:
    """(table, hash value, range value, deep copy of the item or None) for each item named."""
    from moto.dynamodb.models.dynamo_type import DynamoType

    saved = []
    for entry in transact_items:
        if len(entry) != 1:
            continue
        op_type, op = next(iter(entry.items()))
        table = backend.tables.get(op.get("TableName"))
        if table is None:
            continue
        key = op.get("Item") if op_type == "Put" else op.get("Key")
        if not key or table.hash_key_attr not in key:
            continue
        hash_value = DynamoType(key[table.hash_key_attr])
        range_value = (DynamoType(key[table.range_key_attr])
                       if table.range_key_attr and table.range_key_attr in key else None)
        try:
            current = table.get_item(hash_value, range_value)
        except Exception:  # noqa: BLE001 - a malformed key: moto itself will reject the request
            continue
        saved.append((table, hash_value, range_value, copy.deepcopy(current)))
    return saved


def _restore(saved: list[tuple[Any, Any, Any, Any]]) -> None:
    for table, hash_value, range_value, item in reversed(saved):
        if range_value is None:
            if item is None:
                table.items.pop(hash_value, None)
            else:
                table.items[hash_value] = item
        else:
            if item is None:
                table.items.get(hash_value, {}).pop(range_value, None)
            else:
                table.items[hash_value][range_value] = item


def _stream_ends(saved: list[tuple[Any, Any, Any, Any]]) -> list[tuple[list[Any], int]]:
    """(records, how many) of the stream shard of each table named, before the transaction."""
    shards = {id(table.stream_shard): table.stream_shard for table, *_ in saved
              if getattr(table, "stream_shard", None) is not None}
    return [(shard.items, len(shard.items)) for shard in shards.values()]


def _drop_records_after(ends: list[tuple[list[Any], int]]) -> None:
    for records, length in ends:
        del records[length:]


def speed_up_transactions() -> None:
    """Patch moto's DynamoDB backend in this process (idempotent)."""
    global _APPLIED
    if _APPLIED:
        return
    import moto.dynamodb.models as models
    from moto.dynamodb.models.table import Table

    original = models.DynamoDBBackend.transact_write_items

    @functools.wraps(original)
    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved = _named_items(self, transact_items)
        ends = _stream_ends(saved)
        try:
            return original(self, transact_items)
        except BaseException:
            _restore(saved)
            _drop_records_after(ends)  # the undone writes' stream records: DynamoDB emits none
            raise

    models.copy = _CopyWithoutTables(Table)  # type: ignore[assignment]
    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]
    _APPLIED = True


class _OneRequestAtATime:
    """WSGI middleware that serialises requests (see the module docstring for why)."""

    def __init__(self, app: Callable) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        with self._lock:
            return list(self._app(environ, start_response))


class MotoServer:
    """A moto DynamoDB server on ``host:port``, in a thread of this process; data in memory."""

    name = "moto"

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        for key, value in FAKE_CREDENTIALS.items():
            os.environ.setdefault(key, value)
        self.host = host
        self.port = port or free_port(host)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def describe(self) -> str:
        return f"moto (in memory, one request at a time) at {self.endpoint}"

    def start(self) -> MotoServer:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        speed_up_transactions()
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        app = _OneRequestAtATime(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self.host, self.port, app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto-dynamodb", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
