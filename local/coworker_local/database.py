"""The embedded database of local runs, benchmarks and tests, reached over DynamoDB's real HTTP API.

Two backends, one interface (``start``, ``stop``, ``endpoint``, ``describe``):

=================  ===========================================================================
``dynamodb-local``  AWS's DynamoDB Local (:mod:`coworker_local.dynamodb_local`): the default;
                    atomic under concurrency, real capacity figures, optional data folder
``moto``            moto's server (:mod:`coworker_local.moto_server`): the fast unit tier and
                    the fallback when Java is missing; in memory, one request at a time
=================  ===========================================================================

``auto`` picks DynamoDB Local and falls back to moto, with a one-line notice, when it cannot run.
Nothing here is used on AWS.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from coworker.config import Settings
from coworker.data import layout

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
}
DYNAMODB_LOCAL, MOTO, AUTO = "dynamodb-local", "moto", "auto"
BACKENDS = (DYNAMODB_LOCAL, MOTO)
# COWORKER_LOCAL_DB chooses the backend of local runs and of the test suite; default ``auto``.
BACKEND_VARIABLE = "COWORKER_LOCAL_DB"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EmbeddedDatabase(Protocol):
    """What the local runtime, the benchmarks and the tests need of an embedded database."""

    name: str

    @property
    def endpoint(self) -> str: ...

    def describe(self) -> str: ...

    def start(self) -> EmbeddedDatabase: ...

    def stop(self) -> None: ...


def resolve_backend(requested: str | None = None, *, data_dir: Path | None = None, notice=None) -> str:
    """The backend to use for ``requested`` (``auto``, ``dynamodb-local`` or ``moto``; default
    from ``COWORKER_LOCAL_DB``, else ``auto``).

    ``auto`` is DynamoDB Local when it can run, else moto with a one-line ``notice`` (printed to
    stderr by default). An explicit choice that cannot run, or a data folder on moto, is an error.
    """
    from coworker_local.dynamodb_local import DatabaseStartError, unavailable_reason

    requested = (requested or os.environ.get(BACKEND_VARIABLE) or AUTO).strip().lower()
    if requested not in (*BACKENDS, AUTO):
        raise DatabaseStartError(f"unknown database {requested!r}: choose one of {', '.join((AUTO, *BACKENDS))}")
    if requested == MOTO:
        if data_dir is not None:
            raise DatabaseStartError("a data folder needs DynamoDB Local; moto keeps its data in memory only")
        return MOTO
    reason = unavailable_reason()
    if reason is None:
        return DYNAMODB_LOCAL
    if requested == DYNAMODB_LOCAL or data_dir is not None:
        raise DatabaseStartError(reason)
    (notice or (lambda text: print(text, file=sys.stderr, flush=True)))(
        f"notice: using moto instead of DynamoDB Local: {reason}")
    return MOTO


def embedded_database(backend: str, *, host: str = "127.0.0.1", port: int | None = None,
                      data_dir: Path | None = None, log: Any = None) -> EmbeddedDatabase:
    """An embedded database of ``backend`` (not started yet)."""
    if backend == DYNAMODB_LOCAL:
        from coworker_local.dynamodb_local import DynamoDBLocal

        return DynamoDBLocal(port=port, host=host, data_dir=data_dir, log=log)
    if backend == MOTO:
        from coworker_local.moto_server import MotoServer

        return MotoServer(port=port, host=host)
    raise ValueError(f"unknown backend {backend!r}")


def start_database(requested: str | None = None, **kwargs: Any) -> EmbeddedDatabase:
    """Resolve ``requested`` (see :func:`resolve_backend`) and start that database."""
    backend = resolve_backend(requested, data_dir=kwargs.get("data_dir"))
    return embedded_database(backend, **kwargs).start()


def dynamodb_client(settings: Settings) -> Any:
    """A low-level boto3 DynamoDB client for the configured endpoint (a new one: callers may hook
    its events, as ``CapacityMeter`` does)."""
    import boto3

    return boto3.client("dynamodb", region_name=settings.region, endpoint_url=settings.dynamodb_endpoint)


@functools.cache
def _admin_client(region: str, endpoint: str | None) -> Any:
    import boto3

    return boto3.client("dynamodb", region_name=region, endpoint_url=endpoint)


def admin_client(settings: Settings) -> Any:
    """One client per region and endpoint for the table's own management (create, migrate,
    delete): a new botocore client costs about 0.07 s of CPU, more than the request it sends."""
    return _admin_client(settings.region, settings.dynamodb_endpoint)


def create_table(settings: Settings, client: Any | None = None) -> bool:
    """Create the task table as :mod:`coworker.data.layout` defines it, with TTL on; ``False`` when it
    already exists (a restarted local run on a kept data folder)."""
    client = client or admin_client(settings)
    try:
        client.create_table(**layout.create_table_request(settings.table_name))
    except client.exceptions.ResourceInUseException:
        add_status_index(settings, client)
        add_stream(settings, client)
        return False
    client.get_waiter("table_exists").wait(TableName=settings.table_name, WaiterConfig={"Delay": 1})
    client.update_time_to_live(
        TableName=settings.table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": layout.TTL_ATTRIBUTE},
    )
    return True


def add_stream(settings: Settings, client: Any | None = None) -> bool:
    """Turn on the table's stream (batch progress is counted from it) on a table made by a
    release before it; ``False`` when it has one already."""
    client = client or admin_client(settings)
    table = client.describe_table(TableName=settings.table_name)["Table"]
    if table.get("StreamSpecification", {}).get("StreamEnabled"):
        return False
    client.update_table(TableName=settings.table_name, StreamSpecification=layout.STREAM_SPECIFICATION)
    return True


def add_status_index(settings: Settings, client: Any | None = None) -> bool:
    """Add the sharded status index to a table made by a release before it (a kept local data
    folder), and wait until it is active; ``False`` when the table has it already. Its items
    still need their shard: :func:`coworker_local.migration.reshard` (the local runtime runs it)."""
    client = client or admin_client(settings)
    table = client.describe_table(TableName=settings.table_name)["Table"]
    if any(ix["IndexName"] == layout.STATUS_INDEX_NAME for ix in table.get("GlobalSecondaryIndexes", [])):
        return False
    request = layout.create_table_request(settings.table_name)
    (index,) = [ix for ix in request["GlobalSecondaryIndexes"] if ix["IndexName"] == layout.STATUS_INDEX_NAME]
    client.update_table(TableName=settings.table_name, AttributeDefinitions=request["AttributeDefinitions"],
                        GlobalSecondaryIndexUpdates=[{"Create": index}])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        table = client.describe_table(TableName=settings.table_name)["Table"]
        states = {ix["IndexName"]: ix.get("IndexStatus") for ix in table.get("GlobalSecondaryIndexes", [])}
        if states.get(layout.STATUS_INDEX_NAME) == "ACTIVE":
            return True
        time.sleep(0.5)
    raise TimeoutError(f"the index {layout.STATUS_INDEX_NAME} of {settings.table_name} did not become active")
