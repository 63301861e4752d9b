"""DynamoDB's billing rules, checked against figures computed by hand from the documentation."""

from __future__ import annotations

import pytest
from coworker.data import layout
from coworker_local import capacity
from coworker_local.capacity import (
    get_item_read_units,
    index_write_units,
    item_size,
    read_units,
    status_index,
    write_units,
)

INDEX = status_index()


def task(status: str | None = "todo", due_at: str | None = "2026-01-01T00:00:00Z", **extra) -> dict:
    """A task item as the table stores it (low-level attribute values)."""
    item = {"key": {"S": "k1"}, "type": {"S": "quick"}, "attempts": {"N": "0"},
            "max_attempts": {"N": "3"}, "payload": {"S": '{"n": 1}'}}
    if status is not None:
        item["status"] = {"S": status}
        item["status_shard"] = {"S": f"{status}#0"}
    if due_at is not None:
        item["due_at"] = {"S": due_at}
    item.update(extra)
    return item


# --- item size -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"k": {"S": "x" * 999}}, 1000),  # name 1 + value 999
        ({"é": {"S": "日本"}}, 2 + 6),  # UTF-8 bytes of name and value, not characters
        ({"n": {"N": "123"}}, 1 + 2 + 1),  # 3 significant digits -> 2 bytes, + 1
        ({"n": {"N": "100"}}, 1 + 1 + 1),  # trailing zeros trimmed: 1 digit
        ({"n": {"N": "-0.0125"}}, 1 + 2 + 1),  # sign, point and leading zeros do not count
        ({"b": {"B": b"\x00\x01\x02"}}, 1 + 3),  # raw bytes
        ({"b": {"B": "AAEC"}}, 1 + 3),  # base64 on the wire: still the 3 raw bytes
        ({"t": {"BOOL": True}, "z": {"NULL": True}}, 2 + 2),
        ({"s": {"SS": ["a", "bc"]}}, 1 + 3),
        ({"s": {"NS": ["1", "22"]}}, 1 + 2 + 2),
        ({"l": {"L": [{"S": "ab"}, {"BOOL": False}]}}, 1 + 3 + (1 + 2) + (1 + 1)),
        ({"m": {"M": {"a": {"S": "xy"}, "b": {"N": "1"}}}}, 1 + 3 + (1 + 1 + 2) + (1 + 1 + 2)),
        ({"m": {"M": {}}}, 1 + 3),  # empty map: the overhead only
        ({"l": {"L": [{"L": []}]}}, 1 + 3 + (1 + 3)),  # nested overhead counts again
    ],
)
def test_item_size_follows_the_documented_rules(item, expected):
    assert item_size(item) == expected


def test_unknown_attribute_type_is_rejected():
    with pytest.raises(ValueError, match="XX"):
        item_size({"a": {"XX": 1}})


# --- table writes ----------------------------------------------------------------------------

def test_write_units_round_up_per_kilobyte():
    small, just_over = {"k": {"S": "x" * 999}}, {"k": {"S": "x" * 1024}}
    assert (item_size(small), item_size(just_over)) == (1000, 1025)
    assert write_units(None, small) == 1
    assert write_units(None, just_over) == 2
    assert write_units(None, {"k": {"S": "x" * 1023}}) == 1  # exactly 1,024 bytes


def test_update_is_billed_at_the_larger_of_before_and_after():
    big, small = {"k": {"S": "x" * 2500}}, {"k": {"S": "x"}}
    assert write_units(big, small) == 3  # shrinking a 2.5 KB item still costs 3
    assert write_units(small, big) == 3
    assert write_units(big, None) == 3  # a delete: the deleted item's size


def test_failed_conditional_write_is_billed_at_the_existing_items_size():
    existing = {"k": {"S": "x" * 1500}}
    assert write_units(existing, {"k": {"S": "y"}}, succeeded=False) == 2  # not the 1 of the new item
    assert write_units(None, {"k": {"S": "x" * 5000}}, succeeded=False) == 1  # nothing there: minimum


# --- index writes ----------------------------------------------------------------------------

def test_index_description_is_the_schemas():
    request = layout.create_table_request("t")
    (gsi,) = request["GlobalSecondaryIndexes"]
    assert INDEX.name == gsi["IndexName"]
    assert list(INDEX.key) == [k["AttributeName"] for k in gsi["KeySchema"]]
    assert list(INDEX.projected) == gsi["Projection"]["NonKeyAttributes"]
    assert list(INDEX.table_key) == [k["AttributeName"] for k in request["KeySchema"]]


def test_index_entry_keeps_keys_and_projected_attributes_only():
    entry = INDEX.entry(task())
    assert "payload" not in entry and "max_attempts" in entry
    assert set(entry) == {"key", "status_shard", "status", "due_at", "type", "attempts", "max_attempts"}


def test_new_indexed_item_costs_one_index_write():
    assert index_write_units(None, task(), INDEX) == 1


def test_key_change_costs_a_delete_and_a_put():
    claimed = task("processing", "2026-01-01T00:05:30Z", attempts={"N": "1"})
    assert index_write_units(task(), claimed, INDEX) == 2
    # the sort key alone moving is a key change too
    assert index_write_units(task(), task(due_at="2026-02-01T00:00:00Z"), INDEX) == 2


def test_leaving_a_sparse_index_costs_one_write():
    finished = task("finished", None)
    assert not INDEX.contains(finished)
    assert index_write_units(task("processing"), finished, INDEX) == 1


def test_item_outside_the_index_before_and_after_costs_nothing():
    finished = task("finished", None)
    assert index_write_units(finished, task("finished", None, result={"S": "ok"}), INDEX) == 0
    assert index_write_units(None, task(status=None), INDEX) == 0  # a key attribute missing


def test_projected_attribute_change_costs_one_write_other_changes_none():
    assert index_write_units(task(), task(attempts={"N": "2"}), INDEX) == 1
    assert index_write_units(task(), task(payload={"S": "another payload"}), INDEX) == 0


def test_index_writes_are_sized_by_the_index_entry():
    fat = task(type={"S": "t" * 1100})  # projected: the entry exceeds 1 KB
    assert index_write_units(None, fat, INDEX) == 2
    assert index_write_units(fat, task("processing", type={"S": "t" * 1100}), INDEX) == 4
    heavy_payload = task(payload={"S": "p" * 5000})  # not projected: the entry stays small
    assert index_write_units(None, heavy_payload, INDEX) == 1
    assert write_units(None, heavy_payload) == 5


def test_full_projection_copies_the_whole_item():
    full = capacity.IndexDescription("all", ("key",), ("status", "due_at"), None)
    assert index_write_units(task(), task(payload={"S": "changed"}), full) == 1


# --- reads -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("total", "consistent", "expected"),
    [
        (0, False, 0.5),  # an empty query still costs the minimum
        (4096, False, 0.5),
        (4097, False, 1.0),
        (4097, True, 2.0),
        (10 * 410, False, 1.0),  # ten 410-byte items: summed, then rounded (4,100 bytes)
        (10 * 200, False, 0.5),
    ],
)
def test_query_read_units_sum_then_round_to_4kb(total, consistent, expected):
    assert read_units(total, consistent) == expected


def test_get_item_rounds_per_item():
    assert get_item_read_units({"k": {"S": "x" * 4095}}, consistent=True) == 1.0  # 4,096 bytes
    assert get_item_read_units({"k": {"S": "x" * 4096}}, consistent=True) == 2.0
    assert get_item_read_units(None) == 0.5  # a miss is still a read
