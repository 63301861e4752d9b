"""The embedded database: choosing the backend, and starting DynamoDB Local robustly."""

from __future__ import annotations

import socket

import pytest
from coworker_local import database, dynamodb_local
from coworker_local.database import resolve_backend
from coworker_local.dynamodb_local import DatabaseStartError, DynamoDBLocal


def test_auto_prefers_dynamodb_local_and_falls_back_to_moto_with_a_notice(monkeypatch, tmp_path):
    notices: list[str] = []
    monkeypatch.delenv(database.BACKEND_VARIABLE, raising=False)
    monkeypatch.setattr(dynamodb_local, "unavailable_reason", lambda: None)
    assert resolve_backend("auto", notice=notices.append) == "dynamodb-local"
    assert resolve_backend(None, notice=notices.append) == "dynamodb-local"
    assert notices == []

    monkeypatch.setattr(dynamodb_local, "unavailable_reason", lambda: "Java was not found (install it)")
    assert resolve_backend("auto", notice=notices.append) == "moto"
    assert notices == ["notice: using moto instead of DynamoDB Local: Java was not found (install it)"]
    # An explicit choice, or a data folder (moto cannot keep one), is an error instead
    with pytest.raises(DatabaseStartError, match="Java was not found"):
        resolve_backend("dynamodb-local")
    with pytest.raises(DatabaseStartError, match="Java was not found"):
        resolve_backend("auto", data_dir=tmp_path)


def test_moto_refuses_a_data_folder_and_unknown_names_are_refused(monkeypatch, tmp_path):
    monkeypatch.setenv(database.BACKEND_VARIABLE, "moto")
    assert resolve_backend(None) == "moto"
    with pytest.raises(DatabaseStartError, match="a data folder needs DynamoDB Local"):
        resolve_backend("moto", data_dir=tmp_path)
    with pytest.raises(DatabaseStartError, match="unknown database 'postgres'"):
        resolve_backend("postgres")


@pytest.mark.dynamodb_local
def test_dynamodb_local_moves_to_another_port_when_its_port_is_taken(dynamodb_server):
    # Given a port picked for DynamoDB Local and taken by someone else before Java binds it
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        server = DynamoDBLocal()
        server.port = squatter.getsockname()[1]
        # When it starts, then it runs on another free port
        server.start()
        try:
            assert server.port != squatter.getsockname()[1]
            assert server.pid is not None
        finally:
            server.stop()
        # but a port the caller chose is not silently changed
        with pytest.raises(DatabaseStartError, match="exited"):
            DynamoDBLocal(port=squatter.getsockname()[1]).start()
