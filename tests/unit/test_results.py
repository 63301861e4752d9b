"""Where a handler's result goes: on the record, in the result store, or a note that says why not."""

from __future__ import annotations

import hashlib
import json

import boto3
import pytest
from coworker import results
from coworker.config import Settings
from coworker.errors import StorageError
from coworker.results import FolderResultStore, S3ResultStore, object_name, prepare
from moto import mock_aws

SETTINGS = Settings(inline_result_bytes=1024, max_result_bytes=100_000)


def test_small_results_stay_on_the_record_as_json() -> None:
    assert prepare(None, SETTINGS, None, key="k", attempt=1, owner="w").inline is None
    kept = prepare({"n": 1, "when": (1, 2)}, SETTINGS, None, key="k", attempt=1, owner="w")
    assert (kept.inline, kept.stored) == ({"n": 1, "when": [1, 2]}, None)


def test_larger_results_go_to_the_store_with_size_and_checksum(tmp_path) -> None:
    store = FolderResultStore(tmp_path)
    value = {"rows": ["é" * 50] * 100}
    prepared = prepare(value, SETTINGS, store, key="report/2026", attempt=2, owner="req-1")
    stored = prepared.stored
    assert prepared.inline is None and stored is not None
    body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    assert (stored.bytes, stored.sha256) == (len(body), hashlib.sha256(body).hexdigest())
    assert results.load(stored.to_dict(), store) == value
    # One object per attempt, under a name that any key character cannot escape from.
    assert stored.uri.endswith(object_name("report/2026", 2, "req-1"))
    assert object_name("../../etc", 1, "a/b") == (
        f"results/{hashlib.sha256(b'../../etc').hexdigest()}/1-a_b.json")


def test_without_a_store_or_over_the_maximum_the_record_says_why_and_previews() -> None:
    big = "x" * 5000
    note = prepare(big, SETTINGS, None, key="k", attempt=1, owner="w").inline
    assert "no result store is configured" in note["note"] and note["preview"].startswith('"xxx')
    huge = prepare("y" * 200_000, SETTINGS, FolderResultStore("/nonexistent-never-written"), key="k",
                   attempt=1, owner="w").inline
    assert "COWORKER_MAX_RESULT_BYTES" in huge["note"]
    odd = prepare({"x": {1, 2}}, SETTINGS, None, key="k", attempt=1, owner="w").inline
    assert odd == {"x": "{1, 2}"}  # what JSON cannot hold is kept as its text


def test_a_tampered_or_foreign_result_is_refused(tmp_path) -> None:
    store = FolderResultStore(tmp_path / "results")
    stored = prepare("z" * 3000, SETTINGS, store, key="k", attempt=1, owner="w").stored
    path = tmp_path / "results" / object_name("k", 1, "w")
    path.write_bytes(path.read_bytes().replace(b"z", b"q", 1))
    with pytest.raises(StorageError, match="checksum"):
        results.load(stored.to_dict(), store)
    (tmp_path / "secret.json").write_text("1")
    with pytest.raises(StorageError, match="outside the result folder"):
        store.get((tmp_path / "secret.json").as_uri())
    with pytest.raises(StorageError, match="none is configured"):
        results.load(stored.to_dict(), None)


def test_the_s3_store_writes_reads_and_links_with_boto3() -> None:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="team-results")
        store = S3ResultStore("team-results", "us-east-1", client=client)
        stored = prepare(list(range(2000)), SETTINGS, store, key="k-1", attempt=1, owner="req").stored
        assert stored.uri == f"s3://team-results/{object_name('k-1', 1, 'req')}"
        assert results.load(stored.to_dict(), store) == list(range(2000))
        link = store.link(stored.uri)
        assert link.startswith("https://team-results.s3") and "Signature" in link and "Expires=" in link
        with pytest.raises(StorageError, match="could not store"):
            S3ResultStore("no-such-bucket", "us-east-1", client=client).put("results/x.json", b"1")
