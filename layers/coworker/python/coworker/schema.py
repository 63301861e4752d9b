"""The table layout, in one place: imported by the pynamodb model, the CDK construct,
the local runtime and the tests, so the definitions cannot drift apart.

Layout (one item per task)::

    key (S, partition key)                       the task's unique key
    status (S)       todo | processing | failed | finished | ignored
    due_at (S)       ISO-8601 UTC; when the coordinator should next look at the task:
                     todo -> run-at time, failed -> retry time, processing -> lock expiry,
                     ignored -> when it was ignored; absent once finished.

    GSI ``status-due`` : partition ``status``, sort ``due_at``, INCLUDE projection.

The index is sparse: a finished task drops ``due_at`` and leaves the index (one index write
instead of the two a key change costs), so the index holds only live and ignored tasks and
the coordinator's queries never wade through finished work.
"""

from __future__ import annotations

from typing import Final

DEFAULT_TABLE_NAME: Final = "coworker-tasks"

PARTITION_KEY: Final = "key"
STATUS_INDEX_NAME: Final = "status-due"
STATUS_INDEX_PARTITION_KEY: Final = "status"
STATUS_INDEX_SORT_KEY: Final = "due_at"
# Non-key attributes copied into the index: enough for listings and for the coordinator
# to reap lost tasks at their attempt ceiling without reading the table.
STATUS_INDEX_PROJECTED: Final = (
    "type", "attempts", "max_attempts", "updated_at", "batch_id", "lock_owner",
)
TTL_ATTRIBUTE: Final = "delete_after_epoch"


def key_schema() -> dict[str, str]:
    """Attribute name -> DynamoDB type for every key attribute of the table and its index."""
    return {PARTITION_KEY: "S", STATUS_INDEX_PARTITION_KEY: "S", STATUS_INDEX_SORT_KEY: "S"}


def create_table_request(table_name: str = DEFAULT_TABLE_NAME) -> dict:
    """A CreateTable request for this layout (on-demand), as boto3 takes it.

    Used by the local runtime and the tests; the CDK construct builds the same table from the
    same constants.
    """
    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": name, "AttributeType": kind} for name, kind in key_schema().items()
        ],
        "KeySchema": [{"AttributeName": PARTITION_KEY, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": STATUS_INDEX_NAME,
                "KeySchema": [
                    {"AttributeName": STATUS_INDEX_PARTITION_KEY, "KeyType": "HASH"},
                    {"AttributeName": STATUS_INDEX_SORT_KEY, "KeyType": "RANGE"},
                ],
                "Projection": {
                    "ProjectionType": "INCLUDE",
                    "NonKeyAttributes": list(STATUS_INDEX_PROJECTED),
                },
            }
        ],
    }
