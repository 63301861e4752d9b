"""An embedded DynamoDB for local runs and tests: moto's server, reached over real HTTP.

Nothing here is used on AWS; moto is imported only when a server is started.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from coworker import schema
from coworker.config import Settings

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EmbeddedDynamoDB:
    """A moto DynamoDB server on 127.0.0.1, running in a thread of this process."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        from moto.server import ThreadedMotoServer

        for name, value in FAKE_CREDENTIALS.items():
            os.environ.setdefault(name, value)
        self.host = host
        self.port = port or free_port(host)
        self._server = ThreadedMotoServer(ip_address=host, port=self.port, verbose=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> EmbeddedDynamoDB:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> EmbeddedDynamoDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def dynamodb_client(settings: Settings) -> Any:
    """A low-level boto3 DynamoDB client for the configured endpoint."""
    import boto3

    return boto3.client("dynamodb", region_name=settings.region, endpoint_url=settings.dynamodb_endpoint)


def create_table(settings: Settings, client: Any | None = None) -> None:
    """Create the task table as :mod:`coworker.schema` defines it (if missing), with TTL on."""
    client = client or dynamodb_client(settings)
    try:
        client.create_table(**schema.create_table_request(settings.table_name))
    except client.exceptions.ResourceInUseException:
        return
    client.get_waiter("table_exists").wait(TableName=settings.table_name)
    client.update_time_to_live(
        TableName=settings.table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": schema.TTL_ATTRIBUTE},
    )
