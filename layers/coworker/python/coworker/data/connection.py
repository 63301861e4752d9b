"""Where the models send their requests: one table, region and endpoint per process, and one
botocore client shared by every model and by the transactions.

Call :func:`bind` once per process (``coworker.bootstrap.configure`` does), then
:func:`build_clients` before any worker thread starts.
"""

from __future__ import annotations

from typing import Any, Protocol

from pynamodb.connection import Connection

from coworker.data.models import ALL_MODELS, TaskModel, set_status_shards


class Target(Protocol):
    """Where the table is: what :func:`bind` reads of ``coworker.config.Settings``."""

    @property
    def table_name(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def dynamodb_endpoint(self) -> str | None: ...
    @property
    def status_shards(self) -> int: ...


# (table, region, endpoint) the models are bound to: see bind.
_bound_to: tuple[str, str, str | None] | None = None
# Transactions are not a model's: they go through a plain connection of their own.
_transaction_connections: dict[tuple[str, str | None], Connection] = {}
# The shared client of each (region, endpoint): binding to another table keeps it.
_clients: dict[tuple[str, str | None], Any] = {}


def bind(settings: Target) -> None:
    """Point every model at the configured table, region and endpoint (once per process).

    Binding again to the same table, region and endpoint keeps the connections already built.
    """
    global _bound_to
    set_status_shards(settings.status_shards)
    target = (settings.table_name, settings.region, settings.dynamodb_endpoint)
    if target == _bound_to:
        return
    for model_class in ALL_MODELS:
        meta: Any = model_class.Meta
        meta.table_name, meta.region, meta.host = target
        # Tasks carry their own conflict handling (conditions); plain retries are for throttling.
        meta.max_retry_attempts = 5
        meta.max_pool_connections = 64  # workers run a batch's tasks in parallel threads
        model_class._connection = None  # drop a connection made for another table or endpoint
    _bound_to = target


def build_clients() -> None:
    """Create one botocore client now, in the calling thread, and share it between the models
    and the transactions.

    pynamodb gives every model a connection of its own and creates its client lazily and without
    a lock, so the threads of a worker batch that all start on a cold process would each build
    one (about 0.15 s of CPU apiece), and each model would hold its own copy of botocore's
    service model (about 30,000 objects that every full garbage collection walks). Built once
    here, before any thread starts, one client serves every model (they share table, region,
    endpoint and settings; botocore clients are thread-safe). No request is sent.

    A client carries no table, so binding to another table on the same region and endpoint (the
    tests, a local runtime's next table) keeps the one built before.
    """
    meta: Any = TaskModel.Meta
    endpoint = (meta.region, getattr(meta, "host", None))
    client = _clients.get(endpoint)
    if client is None:
        client = _clients[endpoint] = ALL_MODELS[0]._get_connection().connection.client
    for model_class in ALL_MODELS:
        share_client(model_class._get_connection().connection, client)
    share_client(transaction_connection(), client)


def shared_client() -> Any:
    """The botocore client the models share (built by :func:`build_clients` if need be)."""
    return TaskModel._get_connection().connection.client


def share_client(connection: Connection, client: Any | None = None) -> None:
    """Make pynamodb ``connection`` send its requests through the models' shared client.

    pynamodb has no public way to hand a connection a client: it keeps the one it builds in
    ``_client`` and builds one only while that is empty.
    """
    connection._client = client or shared_client()


def transaction_connection() -> Connection:
    """A pynamodb connection for transactions, on the endpoint the models are bound to."""
    meta: Any = TaskModel.Meta
    cache_key = (meta.region, getattr(meta, "host", None))
    if cache_key not in _transaction_connections:
        _transaction_connections[cache_key] = Connection(
            region=meta.region, host=getattr(meta, "host", None),
            max_retry_attempts=getattr(meta, "max_retry_attempts", None),
            max_pool_connections=getattr(meta, "max_pool_connections", None))
    return _transaction_connections[cache_key]
