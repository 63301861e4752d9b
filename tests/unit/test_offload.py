"""Where a handler's result goes: on the record, in the result store, or a note that says why not."""

from __future__ import annotations

import hashlib
import json

import boto3
import pytest
from coworker.config import Settings
from coworker.engine import offload
from coworker.engine.offload import FolderObjectStore, S3ObjectStore, object_name, prepare_result
from coworker.errors import PayloadTooLargeError, StorageError
from moto import mock_aws

SETTINGS = Settings(inline_result_bytes=1024, max_result_bytes=100_000)


def test_small_results_stay_on_the_record_as_json() -> None:
    assert prepare_result(None, SETTINGS, None, key="k", attempt=1, owner="w").inline is None
    kept = prepare_result({"n": 1, "when": (1, 2)}, SETTINGS, None, key="k", attempt=1, owner="w")
    assert (kept.inline, kept.stored) == ({"n": 1, "when": [1, 2]}, None)


def test_larger_results_go_to_the_store_with_size_and_checksum(tmp_path) -> None:
    store = FolderObjectStore(tmp_path)
    value = {"rows": ["é" * 50] * 100}
    prepared = prepare_result(value, SETTINGS, store, key="report/2026", attempt=2, owner="req-1")
    stored = prepared.stored
    assert prepared.inline is None and stored is not None
    body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    assert (stored.bytes, stored.sha256) == (len(body), hashlib.sha256(body).hexdigest())
    assert offload.load(stored.to_dict(), store) == value
    # One object per attempt, under a name that any key character cannot escape from.
    assert stored.uri.endswith(object_name("report/2026", 2, "req-1"))
    assert object_name("../../etc", 1, "a/b") == (
        f"results/{hashlib.sha256(b'../../etc').hexdigest()}/1-a_b.json")


def test_without_a_store_or_over_the_maximum_the_record_says_why_and_previews() -> None:
    big = "x" * 5000
    note = prepare_result(big, SETTINGS, None, key="k", attempt=1, owner="w").inline
    assert "no result store is configured" in note["note"] and note["preview"].startswith('"xxx')
    huge = prepare_result("y" * 200_000, SETTINGS, FolderObjectStore("/nonexistent-never-written"), key="k",
                   attempt=1, owner="w").inline
    assert "COWORKER_MAX_RESULT_BYTES" in huge["note"]
    odd = prepare_result({"x": {1, 2}}, SETTINGS, None, key="k", attempt=1, owner="w").inline
    assert odd == {"x": "{1, 2}"}  # what JSON cannot hold is kept as its text


def test_a_tampered_or_foreign_result_is_refused(tmp_path) -> None:
    store = FolderObjectStore(tmp_path / "results")
    stored = prepare_result("z" * 3000, SETTINGS, store, key="k", attempt=1, owner="w").stored
    path = tmp_path / "results" / object_name("k", 1, "w")
    path.write_bytes(path.read_bytes().replace(b"z", b"q", 1))
    with pytest.raises(StorageError, match="checksum"):
        offload.load(stored.to_dict(), store)
    (tmp_path / "secret.json").write_text("1")
    with pytest.raises(StorageError, match="outside the object store.s folder"):
        store.get((tmp_path / "secret.json").as_uri())
    with pytest.raises(StorageError, match="none is configured"):
        offload.load(stored.to_dict(), None)


def test_the_s3_store_writes_reads_and_links_with_boto3() -> None:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="team-results")
        store = S3ObjectStore("team-results", "us-east-1", client=client)
        stored = prepare_result(list(range(2000)), SETTINGS, store, key="k-1", attempt=1, owner="req").stored
        assert stored.uri == f"s3://team-results/{object_name('k-1', 1, 'req')}"
        assert offload.load(stored.to_dict(), store) == list(range(2000))
        link = store.link(stored.uri)
        assert link.startswith("https://team-results.s3") and "Signature" in link and "Expires=" in link
        with pytest.raises(StorageError, match="could not store"):
            S3ObjectStore("no-such-bucket", "us-east-1", client=client).put("results/x.json", b"1")


def test_payload_sizes_are_counted_as_dynamodb_stores_them() -> None:
    settings = Settings(inline_payload_bytes=1024, max_payload_bytes=10_000)
    assert offload.stored_size("é") == len('"\\u00e9"')  # 8 bytes for one character
    assert offload.check_payload({"a": 1}, settings, has_store=False) == len('{"a": 1}')
    # Without a store the record takes up to 256 KB, counted on the escaped form.
    with pytest.raises(PayloadTooLargeError, match="without an object store"):
        offload.check_payload("é" * 50_000, settings, has_store=False)
    with pytest.raises(PayloadTooLargeError, match="COWORKER_MAX_PAYLOAD_BYTES"):
        offload.check_payload("x" * 20_000, settings, has_store=True)
    assert offload.check_payload("x" * 5_000, settings, has_store=True) == 5_002


def test_a_large_payload_is_staged_under_its_key_and_content(tmp_path) -> None:
    settings = Settings(inline_payload_bytes=1024)
    store = FolderObjectStore(tmp_path)
    assert offload.stage_payload({"small": True}, settings, store, key="k") == ({"small": True}, None)
    inline, ref = offload.stage_payload("a" * 5000, settings, store, key="k")
    assert inline is None and ref.bytes == 5002 and offload.load(ref.to_dict(), store) == "a" * 5000
    _, other = offload.stage_payload("b" * 5000, settings, store, key="k")
    assert other.uri != ref.uri  # a re-submit with another payload never replaces the first one
    assert offload.stage_payload("a" * 5000, settings, None, key="k") == ("a" * 5000, None)


def test_the_folder_store_reads_only_inside_its_folder_whatever_the_path_says(tmp_path) -> None:
    # Given a store whose folder's path has a space, and a file beside (not inside) it
    store = FolderObjectStore(tmp_path / "my results")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"not yours")

    # Then it reads back what it wrote
    uri = store.put("results/k.json", b"{}")
    assert store.get(uri) == b"{}"
    # and refuses a path that climbs out, in words or percent-encoded, and a name that would
    folder = (tmp_path / "my results").as_uri()
    for escape in (f"{folder}/../outside/secret", f"{folder}/%2E%2E/outside/secret"):
        with pytest.raises(StorageError, match="outside"):
            store.get(escape)
    with pytest.raises(StorageError, match="outside"):
        store.put("../outside/planted", b"x")
    assert not (tmp_path / "outside" / "planted").exists()
