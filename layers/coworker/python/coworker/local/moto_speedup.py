"""Make moto's ``TransactWriteItems`` cost what one item costs, not what the whole table costs.

moto (5.x) backs up a transaction by deep-copying **every table it touches, once per item of the
transaction**, so that it can roll back. With batch counters every terminal transition of a task
is a transaction, and a put of 250 tasks is three transactions of up to 100 items: on a table of a
few thousand tasks that deep copy dominates everything (measured: a demo of 2,000 tasks ran at
about 4 tasks/s, with quick tasks taking seconds to record).

This patch keeps moto's code and semantics and only changes what is backed up: before the
transaction, a deep copy of each item it names (or "absent"); moto's own table backup becomes the
table itself; on any error the named items are put back as they were. Nothing else can change in
between: the embedded server runs one request at a time (see :mod:`coworker.embedded`).

Nothing here is used on AWS. Applied by the local runtime before its embedded server starts.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

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


def apply() -> None:
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
        try:
            return original(self, transact_items)
        except BaseException:
            _restore(saved)
            raise

    models.copy = _CopyWithoutTables(Table)  # type: ignore[assignment]
    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]
    _APPLIED = True
