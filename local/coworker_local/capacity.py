"""What DynamoDB bills, two ways: its own ``ConsumedCapacity`` answers, and its documented rules.

DynamoDB Local (the default embedded database) answers ``ReturnConsumedCapacity=INDEXES`` by
DynamoDB's accounting; that is the primary figure (:class:`CapacityMeter` asks for it on every
request). It is silent where AWS still bills: a write whose condition fails returns no figure,
and AWS bills it at the size of the existing item. So the documented rules below are kept, to
fill that gap and to be shown side by side with the reported figures wherever both exist, so a
difference between them is visible (moto's own figures are wrong, so on moto only the rules
count):

* Item size — "DynamoDB item sizes and formats" (developer guide, CapacityUnitCalculations):
  the sum over attributes of the UTF-8 length of the name plus the value size; strings are
  their UTF-8 bytes; numbers about 1 byte per two significant digits plus 1; binary its raw
  bytes; null and Boolean 1 byte; a list or map 3 bytes plus 1 byte per element plus the
  elements' sizes (a map element's size includes its name); sets the sum of their elements.
* Writes — "DynamoDB read and write operations": a write unit covers up to 1 KB; PutItem and
  UpdateItem are billed at the larger of the item's sizes before and after; DeleteItem at the
  size of the deleted item; a write whose condition fails still consumes units for the size of
  the existing item (at least 1); transactional writes cost twice.
* Index writes — "Using Global Secondary Indexes", *Provisioned throughput considerations*:
  no write when the item is in the index neither before nor after (an item without every index
  key attribute is not in a sparse index); one write to put a newly indexed item or to delete
  an item that leaves the index; two writes (delete + put) when an index key value changes; one
  write when only projected attributes change. Each write is sized as the index entry (table
  key, index key and projected attributes), rounded up to 1 KB.
* Reads — a read unit covers 4 KB strongly consistent, or two eventually consistent reads
  (GSI reads are always eventually consistent). Query and Scan sum the sizes of the items they
  read (``ScannedCount``; a ``Select=COUNT`` query reads the same items) and round the total up
  to 4 KB, so an empty query still costs 0.5; GetItem and each item of BatchGetItem round per item.

The pure functions take low-level attribute-value dicts (``{"S": ...}``, ``{"N": ...}``) as
boto3's client returns them. :class:`CapacityMeter` hooks the botocore client pynamodb uses and
is a measuring instrument for benchmarks and tests against the embedded server, not something
to run on AWS: it doubles the traffic with snapshot reads.

Known differences, each asserted by tests/integration/test_coordinator_cost.py and shown by the
benchmark: DynamoDB Local reports nothing for a failed conditional write (the rules bill the
existing item's size); it reports 0 for a Query that reads nothing (the rules bill the 0.5
minimum); and it doubles the *index* writes of a transaction as well as the table writes (the
rules double only the table writes: the documentation speaks of "two underlying writes of every
item", and index entries are propagated, not written in the transaction).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from coworker.data import layout

Item = Mapping[str, Mapping[str, Any]]

WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
CONDITION_FAILED = "ConditionalCheckFailedException"


# --- item size -------------------------------------------------------------------------------


def _utf8(text: str) -> int:
    return len(text.encode("utf-8"))


def _binary(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    return len(base64.b64decode(value))  # wire form: base64 text; the raw bytes are billed


def number_size(text: str) -> int:
    """Bytes of a number: one per two significant digits (leading/trailing zeros trimmed), plus 1."""
    digits = format(abs(Decimal(text)), "f").replace(".", "").strip("0")
    return math.ceil(len(digits) / 2) + 1


def value_size(value: Mapping[str, Any]) -> int:
    """Bytes of one attribute value (without its name)."""
    (kind, data), = value.items()
    if kind == "S":
        return _utf8(data)
    if kind == "N":
        return number_size(data)
    if kind == "B":
        return _binary(data)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(_utf8(s) for s in data)
    if kind == "NS":
        return sum(number_size(n) for n in data)
    if kind == "BS":
        return sum(_binary(b) for b in data)
    if kind == "L":
        return 3 + sum(1 + value_size(element) for element in data)
    if kind == "M":
        return 3 + sum(1 + _utf8(name) + value_size(element) for name, element in data.items())
    raise ValueError(f"unknown DynamoDB attribute type {kind!r}")


def item_size(item: Item | None) -> int:
    """Bytes of an item by DynamoDB's rules: names plus values of every attribute (0 for none)."""
    if not item:
        return 0
    return sum(_utf8(name) + value_size(value) for name, value in item.items())


# --- write and read units --------------------------------------------------------------------


def _write_units_for(size: int) -> int:
    return max(1, math.ceil(size / WRITE_UNIT_BYTES))


def write_units(old_item: Item | None, new_item: Item | None, succeeded: bool = True) -> int:
    """Table write units of one PutItem, UpdateItem or DeleteItem.

    ``old_item``/``new_item`` are the item before and after (``None`` when absent). A write
    whose condition failed is billed at the size of the existing item, at least 1 unit.
    """
    if not succeeded:
        return _write_units_for(item_size(old_item))
    return _write_units_for(max(item_size(old_item), item_size(new_item)))


@dataclasses.dataclass(frozen=True)
class IndexDescription:
    """What billing needs to know of a global secondary index."""

    name: str
    table_key: tuple[str, ...]
    key: tuple[str, ...]
    projected: tuple[str, ...] | None  # None: ProjectionType ALL

    def contains(self, item: Item | None) -> bool:
        """An item is in a (sparse) GSI only if it has every index key attribute."""
        return item is not None and bool(item) and all(name in item for name in self.key)

    def key_of(self, item: Item) -> tuple:
        return tuple(_freeze(item[name]) for name in self.key)

    def entry(self, item: Item) -> dict[str, Any]:
        """The index entry of a table item: table key, index key and projected attributes."""
        if self.projected is None:
            return dict(item)
        names = (*self.table_key, *self.key, *self.projected)
        return {name: item[name] for name in dict.fromkeys(names) if name in item}


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def status_index() -> IndexDescription:
    """The task table's status index, from :mod:`coworker.data.layout`."""
    return IndexDescription(
        name=layout.STATUS_INDEX_NAME,
        table_key=(layout.PARTITION_KEY,),
        key=(layout.STATUS_INDEX_PARTITION_KEY, layout.STATUS_INDEX_SORT_KEY),
        projected=tuple(layout.STATUS_INDEX_PROJECTED),
    )


def index_write_units(old_item: Item | None, new_item: Item | None, index: IndexDescription) -> int:
    """Write units one table write causes in ``index`` (0 for a failed conditional write:
    pass the same item as old and new)."""
    before, after = index.contains(old_item), index.contains(new_item)
    if not before and not after:
        return 0
    if not before:  # newly indexed: one put
        return _write_units_for(item_size(index.entry(new_item)))  # type: ignore[arg-type]
    if not after:  # left the index: one delete
        return _write_units_for(item_size(index.entry(old_item)))  # type: ignore[arg-type]
    old_entry, new_entry = index.entry(old_item), index.entry(new_item)  # type: ignore[arg-type]
    if index.key_of(old_item) != index.key_of(new_item):  # type: ignore[arg-type]
        # A key change moves the entry: delete the old one, put the new one.
        return _write_units_for(item_size(old_entry)) + _write_units_for(item_size(new_entry))
    if _freeze(old_entry) != _freeze(new_entry):  # same key, projected attributes changed
        return _write_units_for(max(item_size(old_entry), item_size(new_entry)))
    return 0


def read_units(items_bytes_total: int, consistent: bool = False) -> float:
    """Read units of one Query or Scan page: the items read, summed, rounded up to 4 KB.

    At least one 4 KB unit is billed, so an empty result costs 0.5 (eventually consistent).
    """
    units = max(1, math.ceil(items_bytes_total / READ_UNIT_BYTES))
    return units * (1.0 if consistent else 0.5)


def get_item_read_units(item: Item | None, consistent: bool = False) -> float:
    """Read units of one GetItem (or one item of BatchGetItem): rounded up to 4 KB per item."""
    units = max(1, math.ceil(item_size(item) / READ_UNIT_BYTES))
    return units * (1.0 if consistent else 0.5)


# --- the meter -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Reported:
    """What DynamoDB answered in ``ConsumedCapacity`` for one request (all of its items)."""

    table_units: float
    index_units: float

    @property
    def units(self) -> float:
        return self.table_units + self.index_units


def reported_capacity(parsed: Mapping[str, Any]) -> Reported | None:
    """The ``ConsumedCapacity`` of a response (a list for transactions and batches), summed."""
    consumed = parsed.get("ConsumedCapacity")
    if not consumed:
        return None
    entries = consumed if isinstance(consumed, list) else [consumed]
    table = index = 0.0
    for entry in entries:
        indexes = sum(float(ix.get("CapacityUnits", 0)) for ix in (entry.get("GlobalSecondaryIndexes") or {}).values())
        own = entry.get("Table", {}).get("CapacityUnits")
        table += float(own) if own is not None else float(entry.get("CapacityUnits", 0)) - indexes
        index += indexes
    return Reported(table, index)


@dataclasses.dataclass(frozen=True)
class WriteRecord:
    """One metered write: the item before and after, what the rules bill, and what DynamoDB
    reported for the request (single-item writes; a transaction's figure is per request)."""

    operation: str
    old: Item | None
    new: Item | None
    succeeded: bool
    table_units: float
    index_units: float
    reported: Reported | None = None


@dataclasses.dataclass(frozen=True)
class ReadRecord:
    """One metered read request."""

    operation: str
    index_name: str | None
    select: str | None
    key_values: tuple  # the key condition's values, e.g. ("todo", "2026-...")
    items_read: int
    bytes_read: int
    units: float
    reported_units: float | None = None


_SUMMED = ("table_write_units", "index_write_units", "read_units", "items_read",
           "reported_table_write_units", "reported_index_write_units", "reported_read_units",
           "unreported_write_units")


@dataclasses.dataclass
class MeterTotals:
    """Running totals of a :class:`CapacityMeter`: by the rules, and as DynamoDB reported them.

    ``unreported_write_units`` are the rules' units of writes that got no reported figure (a
    failed conditional write on DynamoDB Local), so ``reported_write_units +
    unreported_write_units`` is the bill to compare with ``write_units``.
    """

    requests: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    table_write_units: float = 0.0
    index_write_units: float = 0.0
    read_units: float = 0.0
    items_read: int = 0
    unmetered: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    reported_table_write_units: float = 0.0
    reported_index_write_units: float = 0.0
    reported_read_units: float = 0.0
    unreported_write_units: float = 0.0

    @property
    def write_units(self) -> float:
        return self.table_write_units + self.index_write_units

    @property
    def reported_write_units(self) -> float:
        return self.reported_table_write_units + self.reported_index_write_units

    def copy(self) -> MeterTotals:
        return dataclasses.replace(self, requests=collections.Counter(self.requests),
                                   unmetered=collections.Counter(self.unmetered))

    def __sub__(self, other: MeterTotals) -> MeterTotals:
        return self._combine(other, -1)

    def __add__(self, other: MeterTotals) -> MeterTotals:
        return self._combine(other, 1)

    def _combine(self, other: MeterTotals, sign: int) -> MeterTotals:
        requests, unmetered = collections.Counter(self.requests), collections.Counter(self.unmetered)
        for name, count in other.requests.items():
            requests[name] += sign * count
        for name, count in other.unmetered.items():
            unmetered[name] += sign * count
        return MeterTotals(
            requests=+requests,  # unary plus drops the zero counts
            unmetered=+unmetered,
            **{name: getattr(self, name) + sign * getattr(other, name) for name in _SUMMED},
        )


_WRITES = ("PutItem", "UpdateItem", "DeleteItem")
_CONTEXT_KEY = "coworker_capacity_meter"
# Operations that take ReturnConsumedCapacity.
_REPORTING = (*_WRITES, "TransactWriteItems", "BatchWriteItem", "Query", "Scan", "GetItem", "BatchGetItem",
              "TransactGetItems")


class CapacityMeter:
    """Counts the requests a botocore DynamoDB client makes, with what DynamoDB reports they
    cost (``ReturnConsumedCapacity=INDEXES`` is added to each) and what its rules bill.

    Hooks the client's ``before-parameter-build`` and ``after-call`` events. Writes are billed
    from the item before and after, read with a second, unmetered ``snapshot_client``
    (consistent GetItem) around each write; that is exact as long as no two writes to the same
    item run at once, which holds when every task is worked by one thread at a time. A
    ``Select=COUNT`` query returns no items, so it is re-run with ``ALL_PROJECTED_ATTRIBUTES`` through the
    snapshot client to learn the sizes it read. Queries with a filter or projection expression
    are billed by what they return (the engine uses neither).
    """

    def __init__(self, client: Any | Sequence[Any], snapshot_client: Any,
                 indexes: Iterable[IndexDescription] | None = None,
                 table_key: tuple[str, ...] = (layout.PARTITION_KEY,)) -> None:
        # Several clients: pynamodb connections may each have their own (each is metered once).
        given = list(client) if isinstance(client, Sequence) else [client]
        self.clients = list({id(c): c for c in given}.values())
        self.snapshot_client = snapshot_client
        self.indexes = {ix.name: ix for ix in (indexes if indexes is not None else [status_index()])}
        self.table_key = table_key
        self.totals = MeterTotals()
        self.writes: list[WriteRecord] = []
        self.reads: list[ReadRecord] = []
        self._lock = threading.Lock()

    @classmethod
    def for_model(cls, model: Any, snapshot_client: Any, *connections: Any, **kwargs: Any) -> CapacityMeter:
        """A meter on the botocore client behind a pynamodb model (bind the model first), and on
        those of any further pynamodb ``connections`` (e.g. the one transactions use)."""
        clients = [model._get_connection().connection.client, *(c.client for c in connections)]
        return cls(clients, snapshot_client, **kwargs)

    # lifecycle
    def attach(self) -> CapacityMeter:
        for client in self.clients:
            client.meta.events.register("before-parameter-build.dynamodb", self._before)
            client.meta.events.register("after-call.dynamodb", self._after)
        return self

    def detach(self) -> None:
        for client in self.clients:
            client.meta.events.unregister("before-parameter-build.dynamodb", self._before)
            client.meta.events.unregister("after-call.dynamodb", self._after)

    def __enter__(self) -> CapacityMeter:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def snapshot(self) -> MeterTotals:
        """A copy of the totals so far (subtract two snapshots for one phase)."""
        with self._lock:
            return self.totals.copy()

    # event handlers
    def _get(self, table: str, key: Mapping[str, Any]) -> dict | None:
        return self.snapshot_client.get_item(TableName=table, Key=dict(key), ConsistentRead=True).get("Item")

    def _targets(self, operation: str, params: Mapping[str, Any]) -> list[tuple[str, dict, str]]:
        """(table, key, kind) of every item a write request touches."""
        if operation in _WRITES:
            source = params["Item"] if operation == "PutItem" else params["Key"]
            return [(params["TableName"], {k: source[k] for k in self.table_key}, operation)]
        if operation == "TransactWriteItems":
            targets = []
            for entry in params["TransactItems"]:
                (kind, body), = entry.items()
                source = body["Item"] if kind == "Put" else body["Key"]
                targets.append((body["TableName"], {k: source[k] for k in self.table_key}, kind))
            return targets
        return []

    def _before(self, params: dict[str, Any], model: Any, context: dict, **_: Any) -> None:
        if model.name in _REPORTING:
            params["ReturnConsumedCapacity"] = "INDEXES"
        targets = self._targets(model.name, params)
        context[_CONTEXT_KEY] = {
            "params": params,
            "targets": [(table, key, kind, self._get(table, key)) for table, key, kind in targets],
        }

    def _after(self, http_response: Any, parsed: Mapping[str, Any], model: Any, context: dict,
               **_: Any) -> None:
        state = context.get(_CONTEXT_KEY)
        if state is None:
            return
        operation, params = model.name, state["params"]
        error = parsed.get("Error", {}).get("Code") if http_response.status_code >= 300 else None
        reported = reported_capacity(parsed) if error is None else None
        with self._lock:
            self.totals.requests[operation] += 1
            if reported is not None:
                if operation in _WRITES or operation.startswith(("TransactWrite", "BatchWrite")):
                    self.totals.reported_table_write_units += reported.table_units
                    self.totals.reported_index_write_units += reported.index_units
                else:
                    self.totals.reported_read_units += reported.units
        if operation in _WRITES or operation == "TransactWriteItems":
            self._meter_writes(operation, state["targets"], error, reported)
        elif operation == "Query" or operation == "Scan":
            if error is None:
                self._meter_query(operation, params, parsed, reported)
        elif operation == "GetItem":
            if error is None:
                item = parsed.get("Item")
                self._add_read(ReadRecord(operation, None, None, (), int(item is not None), item_size(item),
                                          get_item_read_units(item, params.get("ConsistentRead", False)),
                                          reported.units if reported else None))
        elif operation == "BatchGetItem":
            if error is None:
                for table, items in parsed.get("Responses", {}).items():
                    consistent = params["RequestItems"][table].get("ConsistentRead", False)
                    for item in items:
                        self._add_read(ReadRecord(operation, None, None, (), 1, item_size(item),
                                                  get_item_read_units(item, consistent)))
        else:
            with self._lock:
                self.totals.unmetered[operation] += 1

    def _meter_writes(self, operation: str, targets: list, error: str | None, reported: Reported | None) -> None:
        transactional = operation == "TransactWriteItems"
        for table, key, kind, old in targets:
            if error is None:
                new = self._get(table, key)
                table_units: float = write_units(old, new)
                index_units: float = sum(index_write_units(old, new, ix) for ix in self.indexes.values())
            elif error == CONDITION_FAILED and not transactional:
                new, table_units, index_units = old, write_units(old, None, succeeded=False), 0
            else:  # throttled, invalid, or a cancelled transaction: not modelled, left out
                with self._lock:
                    self.totals.unmetered[f"{operation}:{error}"] += 1
                continue
            if transactional:
                table_units *= 2
            record = WriteRecord(operation if not transactional else f"{operation}:{kind}",
                                 old, new, error is None, table_units, index_units,
                                 None if transactional else reported)
            with self._lock:
                self.writes.append(record)
                self.totals.table_write_units += table_units
                self.totals.index_write_units += index_units
                if reported is None:
                    self.totals.unreported_write_units += table_units + index_units

    def _meter_query(self, operation: str, params: Mapping[str, Any], parsed: Mapping[str, Any],
                     reported: Reported | None) -> None:
        index_name = params.get("IndexName")
        if params.get("Select") == "COUNT":
            rerun = dict(params, Select="ALL_PROJECTED_ATTRIBUTES" if index_name else "ALL_ATTRIBUTES")
            call = self.snapshot_client.query if operation == "Query" else self.snapshot_client.scan
            items = call(**rerun).get("Items", [])
        else:
            items = parsed.get("Items", [])
        index = self.indexes.get(index_name) if index_name else None
        sizes = sum(item_size(index.entry(item) if index else item) for item in items)
        values = tuple(
            next(iter(v.values())) for v in (params.get("ExpressionAttributeValues") or {}).values()
        )
        self._add_read(ReadRecord(
            operation, index_name, params.get("Select"), values,
            int(parsed.get("ScannedCount", len(items))), sizes,
            read_units(sizes, bool(params.get("ConsistentRead", False))),
            reported.units if reported else None,
        ))

    def _add_read(self, record: ReadRecord) -> None:
        with self._lock:
            self.reads.append(record)
            self.totals.read_units += record.units
            self.totals.items_read += record.items_read
