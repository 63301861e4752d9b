"""Results and payloads of any size: small ones stay on the task's record, larger ones go to an
object store (an S3 bucket on AWS, ``COWORKER_RESULT_BUCKET``; a folder in local runs,
``COWORKER_RESULT_DIR``). Every write to a task item costs a write unit per KB of the whole item,
and a task is written four times or more (put, claim, heartbeats, finish), so keeping records
small is what keeps DynamoDB cheap; an S3 PUT and GET cost about as much as 4 write units.

**Results.**
A handler's return value is serialised as JSON. Up to ``inline_result_bytes`` it is kept on the
record (``result``); above, it is written to the result store (an S3 bucket on AWS,
``COWORKER_RESULT_BUCKET``; a folder in local runs, ``COWORKER_RESULT_DIR``) and the record gets
``result_ref``: where it is, its size and its SHA-256. ``GET /tasks/{key}/result`` returns it
either way. Without a store, or above ``max_result_bytes``, the record keeps a note that says so
and a preview; the result is never dropped without a word.

Objects are named ``results/<sha256 of the key>/<attempt>-<owner>.json``: every attempt writes its
own object, so a stale attempt can never overwrite the result of a newer one, and only the attempt
that records ``finished`` (fenced) points the record at its object. Where finished tasks expire
(``retention_days``), results go under ``results/kept-<days>d/`` instead (:func:`result_prefix`),
which the results bucket expires some days after the records that point to them.

**Payloads.** A payload larger than ``inline_payload_bytes`` (counted as DynamoDB stores it) is
written to ``payloads/<sha256 of the key>/<sha256 of the payload>.json`` before the task is put,
and the record gets ``payload_ref``; the worker reads it before it calls the handler. A re-submit
of an existing key with another payload writes another object and leaves the task as it was.
Above ``max_payload_bytes``, or above ``MAX_RECORD_PAYLOAD_BYTES`` where there is no store, the
put is refused with :class:`PayloadTooLargeError` before anything is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from coworker.config import Settings
from coworker.errors import PayloadTooLargeError, StorageError

RESULT_PREFIX = "results/"
PAYLOAD_PREFIX = "payloads/"
# Without an object store, payloads stay on the record up to this size (as stored): a DynamoDB
# item holds 400 KB, and the record needs room for its error history and result.
MAX_RECORD_PAYLOAD_BYTES = 256 * 1024
PREVIEW_CHARS = 200
PRESIGNED_URL_SECONDS = 3600


@dataclasses.dataclass(frozen=True)
class StoredObject:
    """What a record holds about an object in the store (its ``result_ref`` or ``payload_ref``)."""

    uri: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> StoredObject:
        return cls(uri=str(value["uri"]), bytes=int(value["bytes"]), sha256=str(value["sha256"]))


class ObjectStore(Protocol):
    """Where results larger than the record's budget go."""

    def put(self, name: str, body: bytes) -> str:
        """Store ``body`` under ``name``; return its URI."""

    def get(self, uri: str) -> bytes: ...

    def link(self, uri: str) -> str | None:
        """A URL a client may fetch the object from directly (presigned), or None."""


class S3ObjectStore:
    """Results in an S3 bucket (the stack's results bucket), through boto3."""

    def __init__(self, bucket: str, region: str, client: Any = None) -> None:
        import boto3

        self.bucket = bucket
        self._client = client or boto3.client("s3", region_name=region)

    def put(self, name: str, body: bytes) -> str:
        try:
            self._client.put_object(Bucket=self.bucket, Key=name, Body=body, ContentType="application/json")
        except Exception as exc:  # noqa: BLE001 - botocore raises many kinds; all mean "not stored"
            raise StorageError(f"could not store {name!r} in bucket {self.bucket!r}: {exc}") from exc
        return f"s3://{self.bucket}/{name}"

    def get(self, uri: str) -> bytes:
        bucket, key = self._split(uri)
        try:
            return self._client.get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"could not read {uri!r}: {exc}") from exc

    def link(self, uri: str) -> str | None:
        bucket, key = self._split(uri)
        return self._client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=PRESIGNED_URL_SECONDS)

    @staticmethod
    def _split(uri: str) -> tuple[str, str]:
        parsed = urlparse(uri)
        if parsed.scheme != "s3":
            raise StorageError(f"not an S3 object: {uri!r}")
        return parsed.netloc, parsed.path.lstrip("/")


class FolderObjectStore:
    """Results in a folder: the local runtime's stand-in for the bucket."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).resolve()

    def put(self, name: str, body: bytes) -> str:
        path = (self.folder / name).resolve()
        if self.folder not in path.parents:
            raise StorageError(f"{name!r} would be stored outside the object store's folder")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            partial.write_bytes(body)
            partial.replace(path)  # readers never see half a result
        except OSError as exc:
            raise StorageError(f"could not store {name!r} in {self.folder}: {exc}") from exc
        return path.as_uri()

    def get(self, uri: str) -> bytes:
        parsed = urlparse(uri)
        if parsed.scheme != "file":
            raise StorageError(f"not a file of the object store: {uri!r}")
        # The URI's path is percent-encoded (a folder with a space), and resolved before the
        # containment check, so that ``..`` or a link cannot lead outside the folder.
        path = Path(unquote(parsed.path)).resolve()
        if self.folder not in path.parents:
            raise StorageError(f"{uri!r} is outside the object store's folder")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise StorageError(f"could not read {uri!r}: {exc}") from exc

    def link(self, uri: str) -> str | None:
        return None


def store_from_settings(settings: Settings) -> ObjectStore | None:
    """A new result store for ``settings``: the bucket, else the folder, else none."""
    if settings.result_bucket:
        return S3ObjectStore(settings.result_bucket, settings.region)
    if settings.result_dir:
        return FolderObjectStore(settings.result_dir)
    return None


_stores: dict[tuple[str | None, str | None, str], ObjectStore | None] = {}
_stores_lock = threading.Lock()


def store_for(settings: Settings) -> ObjectStore | None:
    """The result store of ``settings``, built once per process and shared by its threads
    (``bootstrap.configure`` builds it before any worker thread starts)."""
    cache_key = (settings.result_bucket, settings.result_dir, settings.region)
    with _stores_lock:
        if cache_key not in _stores:
            _stores[cache_key] = store_from_settings(settings)
        return _stores[cache_key]


def result_prefix(retention_days: float) -> str:
    """Where the results of tasks kept ``retention_days`` after they finish go: ``results/`` when
    they are kept for ever (0), else ``results/kept-<days>d/`` (whole days, rounded up).

    The results bucket expires objects under the second prefix only, a few days after their
    records' TTL. A prefix per retention keeps that rule off every object whose record was
    written under another one: results of a deployment that kept its tasks for ever (the
    default before retention was), or longer, are never removed while their records remain.
    """
    if not retention_days:
        return RESULT_PREFIX
    return f"{RESULT_PREFIX}kept-{math.ceil(retention_days)}d/"


def object_name(key: str, attempt: int, owner: str, retention_days: float = 0) -> str:
    """Where one attempt's result goes (task keys may hold any character: hash them)."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    safe_owner = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in owner)[:64]
    return f"{result_prefix(retention_days)}{digest}/{attempt}-{safe_owner}.json"


@dataclasses.dataclass(frozen=True)
class PreparedResult:
    """What the record gets for a handler's return value: ``inline`` or ``stored`` (or a note)."""

    inline: Any = None
    stored: StoredObject | None = None


def prepare_result(result: Any, settings: Settings, store: ObjectStore | None, *, key: str, attempt: int,
            owner: str) -> PreparedResult:
    """Decide where ``result`` goes, writing it to the store if it is too large for the record.

    Raises :class:`StorageError` when the store refuses it (the attempt is then retried).
    """
    if result is None:
        return PreparedResult()
    try:
        body = json.dumps(result, default=str, ensure_ascii=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        return PreparedResult(inline={"note": f"result of type {type(result).__name__} is not JSON: {exc}"})
    value = json.loads(body)
    if stored_size(value) <= settings.inline_result_bytes:  # counted as the record would store it
        return PreparedResult(inline=value)
    preview = body[:PREVIEW_CHARS].decode(errors="ignore")
    if store is None:
        return PreparedResult(inline={
            "note": f"result of {len(body)} bytes not kept: over the record's {settings.inline_result_bytes}-byte "
                    "budget and no result store is configured (COWORKER_RESULT_BUCKET or COWORKER_RESULT_DIR)",
            "preview": preview})
    if len(body) > settings.max_result_bytes:
        return PreparedResult(inline={
            "note": f"result of {len(body)} bytes not kept: over COWORKER_MAX_RESULT_BYTES "
                    f"({settings.max_result_bytes})", "preview": preview})
    uri = store.put(object_name(key, attempt, owner, settings.retention_days), body)
    return PreparedResult(stored=StoredObject(uri=uri, bytes=len(body), sha256=hashlib.sha256(body).hexdigest()))


def stored_size(value: Any) -> int:
    """Bytes ``value`` takes on the record: pynamodb stores JSON with ASCII escapes and spaces."""
    return len(json.dumps(value).encode())


def check_payload(payload: Any, settings: Settings, has_store: bool) -> int:
    """The payload's size as stored on the record; raises :class:`PayloadTooLargeError` when no
    put could take it (checked for a whole batch before anything is written)."""
    if payload is None:
        return 0
    size = stored_size(payload)
    if size <= settings.inline_payload_bytes:
        return size
    if not has_store:
        if size <= MAX_RECORD_PAYLOAD_BYTES:
            return size
        raise PayloadTooLargeError(
            f"payload is {size} bytes as stored; without an object store (COWORKER_RESULT_BUCKET or "
            f"COWORKER_RESULT_DIR) the limit is {MAX_RECORD_PAYLOAD_BYTES} bytes")
    compact = len(_compact(payload))
    if compact > settings.max_payload_bytes:
        raise PayloadTooLargeError(
            f"payload is {compact} bytes of JSON; the limit is {settings.max_payload_bytes} bytes "
            "(COWORKER_MAX_PAYLOAD_BYTES): put the data somewhere else and pass its address")
    return size


def stage_payload(payload: Any, settings: Settings, store: ObjectStore | None, *, key: str
                  ) -> tuple[Any, StoredObject | None]:
    """``(payload for the record, reference)``: a payload over ``inline_payload_bytes`` is written to
    the store (when there is one) and replaced by its reference. Call :func:`check_payload` first."""
    if payload is None or store is None or stored_size(payload) <= settings.inline_payload_bytes:
        return payload, None
    body = _compact(payload)
    digest = hashlib.sha256(body).hexdigest()
    name = f"{PAYLOAD_PREFIX}{hashlib.sha256(key.encode()).hexdigest()}/{digest}.json"
    return None, StoredObject(uri=store.put(name, body), bytes=len(body), sha256=digest)


def _compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def load(ref: dict[str, Any], store: ObjectStore | None) -> Any:
    """The full result a record's ``result_ref`` points to, checked against its SHA-256."""
    return json.loads(read(ref, store))


def read(ref: dict[str, Any], store: ObjectStore | None) -> bytes:
    """The stored JSON of a record's ``result_ref``, as written, checked against its SHA-256."""
    stored = StoredObject.from_dict(ref)
    if store is None:
        raise StorageError(f"{stored.uri!r} is in an object store, and none is configured here")
    body = store.get(stored.uri)
    if hashlib.sha256(body).hexdigest() != stored.sha256:
        raise StorageError(f"result {stored.uri!r} does not match its recorded checksum")
    return body
