"""An embedded DynamoDB for local runs and tests: moto's server, reached over real HTTP.

Nothing here is used on AWS; moto is imported only when a server is started.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
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


class _OneRequestAtATime:
    """WSGI middleware that serialises requests.

    moto's DynamoDB backend does not lock an item between evaluating a condition and writing
    it, so two concurrent conditional writes could both succeed: a race real DynamoDB does not
    have. Serialising requests restores per-item atomicity; moto is bound by the GIL anyway,
    so throughput barely changes.
    """

    def __init__(self, app: Callable) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        with self._lock:
            return list(self._app(environ, start_response))


class EmbeddedDynamoDB:
    """A moto DynamoDB server on 127.0.0.1, running in a thread of this process."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        for name, value in FAKE_CREDENTIALS.items():
            os.environ.setdefault(name, value)
        self.host = host
        self.port = port or free_port(host)
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> EmbeddedDynamoDB:
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        app = _OneRequestAtATime(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self.host, self.port, app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="embedded-dynamodb",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

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
