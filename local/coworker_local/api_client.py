"""The HTTP client of the task API that the ``coworker`` command uses (see :mod:`coworker_local.cli`).

Standard library only; ``--iam`` signs requests with SigV4 through botocore.

It follows the API's own advice: a 503 (DynamoDB or the object store refused; a batch stored part
way lists the keys it stored) is re-sent (a batch without the tasks already stored, see
``Coworker.submit``), and a 429 (throttled) is re-sent after backing off, both with exponential
delays (a ``Retry-After`` header of a positive number of seconds is honoured; zero, negative or
not a number is not, the client backs off as without it), at most :data:`RESEND_ATTEMPTS` times in a
row without progress (a batch's answer that stored tasks of the request that were not stored before
starts the count again: when writes are slow, each send stores a part; keys it names that the
request did not carry are no progress) and :data:`MAX_SENDS` times in all; then the
last answer is reported, saying how long it tried. Puts are
idempotent by key, so a re-sent batch stores only what is missing (the CLI gives every task a key
before it sends it). A 504 (API Gateway cut the request off at 29 s: what it did is unknown) is
re-sent the same way only where sending again is safe: reads, and calls that say so (a batch put
whose tasks all have keys).
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode, urljoin
from urllib.request import HTTPRedirectHandler, Request, build_opener, urlopen

TIMEOUT_SECONDS = 60
# Answers the API says to re-send, and how: at most RESEND_ATTEMPTS re-sends in a row, the delay
# doubling from FIRST_DELAY_SECONDS to at most MAX_DELAY_SECONDS, each drawn from the upper half
# of its ceiling (jitter): 1, 2, 4, 8, 16, 20 s ceilings, so 25.5 to 51 s in all before giving up.
RESENT_STATUSES = frozenset({429, 503})
# API Gateway's "Endpoint request timed out": re-sent only where sending again is safe.
TIMED_OUT = 504
RESEND_ATTEMPTS = 6
# Sends of one request in all, however many of them stored something new.
MAX_SENDS = 100
FIRST_DELAY_SECONDS = 1.0
MAX_DELAY_SECONDS = 20.0
# A redirect the client follows itself (GET /tasks/{key}/result answers 303 to a presigned link
# for a large result): without the API's credentials, which the link's host must not get (and
# S3 refuses a presigned request that also carries an Authorization header).
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class _Unfollowed(HTTPRedirectHandler):
    """Redirects are answers, not followed by urllib (which would send every header on)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = build_opener(_Unfollowed)


def resend_delay(attempt: int, retry_after: str | None = None) -> float:
    """Seconds to wait before re-send number ``attempt`` (1-based): the server's ``Retry-After``
    if it is a positive number of seconds (at most MAX_DELAY_SECONDS), else exponential with
    jitter. A ``Retry-After`` of 0, negative, ``nan`` or not a number would re-send at once, and
    so soon exhaust the re-sends on a server that needs time."""
    if retry_after is not None:
        try:
            seconds = float(retry_after)
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds) and seconds > 0:
            return min(MAX_DELAY_SECONDS, seconds)
    ceiling = min(MAX_DELAY_SECONDS, FIRST_DELAY_SECONDS * 2 ** (attempt - 1))
    return random.uniform(ceiling / 2, ceiling)


class ApiError(Exception):
    """The API answered with an error (4xx/5xx); ``message`` is the API's own wording."""

    def __init__(self, status: int, message: str, errors: list[dict] | None = None,
                 stored: list[str] | None = None, retry_after: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or []
        self.stored = stored or []  # a batch stored part way: the keys that went in
        self.retry_after = retry_after


class Unreachable(Exception):
    """No answer from the API (connection refused, DNS, timeout)."""


class ApiClient:
    """A small JSON client of the task API (standard library only; botocore for ``--iam``)."""

    def __init__(self, url: str, api_key: str | None = None, iam: bool = False,
                 region: str | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.iam = iam
        self.region = (region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                       or "us-east-1")
        self._sleep = sleep
        # Keys a batch put stored before an answer said to re-send it (see ``request``), per
        # calling thread: a client may send several requests at once.
        self._calls = threading.local()

    def request(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None,
                *, idempotent: bool | None = None,
                resend: Callable[[Any, set[str]], Any] | None = None) -> Any:
        """One call, re-sent on 429 and 503 as the API advises (see the module's docstring), and
        on 504 when ``idempotent`` (default: for GET only): sending it again changes nothing that
        the first attempt did. ``resend`` gives the body to send again, from the body last sent
        and the keys stored so far (default: the same body)."""
        started = time.monotonic()
        self._calls.stored = set()
        if idempotent is None:
            idempotent = method == "GET"
        resent = RESENT_STATUSES | {TIMED_OUT} if idempotent else RESENT_STATUSES
        attempt = stalled = 0  # sends, and re-sends in a row that stored nothing new
        while True:
            attempt += 1
            try:
                return self._send(method, path, query, body)
            except ApiError as exc:
                if exc.status not in resent:
                    raise
                # Only keys this send carried count: a key the request never held is no progress.
                stored = set(exc.stored) & _keys_of(body)
                progressed = not stored <= self._calls.stored  # bounded: each key once
                self._calls.stored.update(stored)
                stalled = 0 if progressed else stalled + 1
                if stalled > RESEND_ATTEMPTS or attempt >= MAX_SENDS:
                    exc.message += (f" (sent {attempt} times over {time.monotonic() - started:.0f} s; "
                                    "try again later)")
                    exc.args = (exc.message,)
                    raise
                self._sleep(resend_delay(max(1, stalled), exc.retry_after))
                if resend is not None:
                    body = resend(body, self._calls.stored)

    def pages(self, path: str, field: str, query: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every entry of a listing route's ``field`` (``GET /schedules``: ``schedules``), one
        page after another as its ``cursor`` leads (each cursor reads on strictly after the last
        entry it gave, so the pages end)."""
        query = dict(query or {})
        while True:
            page = self.request("GET", path, query=query)
            yield from page[field]
            if not page.get("cursor"):
                return
            query["cursor"] = page["cursor"]

    @property
    def stored_before_resend(self) -> set[str]:
        """Keys this thread's last ``request`` stored before an answer said to re-send it."""
        stored: set[str] = getattr(self._calls, "stored", set())
        return stored

    def _send(self, method: str, path: str, query: dict[str, Any] | None, body: Any) -> Any:
        query = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.url + path + ("?" + urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Accept": "application/json", "User-Agent": "coworker-cli"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["x-api-key"] = self.api_key
        if self.iam:
            headers = self._signed(method, url, data, headers)
        try:
            request = Request(url, data=data, headers=headers, method=method)
            with _opener.open(request, timeout=TIMEOUT_SECONDS) as reply:
                return _parse(reply.read())
        except HTTPError as exc:
            location = exc.headers.get("Location") if exc.headers else None
            if exc.code in REDIRECTS and method == "GET" and location:
                exc.close()
                return self._follow(urljoin(url, location))
            answer = _parse(exc.read())
            retry_after = exc.headers.get("Retry-After") if exc.headers else None
            if isinstance(answer, dict) and "message" in answer:
                raise ApiError(exc.code, str(answer["message"]), answer.get("errors"), answer.get("stored"),
                               retry_after) from None
            raise ApiError(exc.code, f"HTTP {exc.code} {exc.reason}", retry_after=retry_after) from None
        except URLError as exc:
            raise Unreachable(f"cannot reach the API at {self.url}: {exc.reason}") from None
        except TimeoutError:
            raise Unreachable(f"the API at {self.url} did not answer within {TIMEOUT_SECONDS} s") from None

    def _follow(self, location: str) -> Any:
        """The JSON at a link the API redirected a GET to (a presigned result), fetched without the
        API's credentials; its errors are reported as the API's would be."""
        request = Request(location, headers={"Accept": "application/json", "User-Agent": "coworker-cli"})
        try:
            with urlopen(request, timeout=TIMEOUT_SECONDS) as reply:
                return _parse(reply.read())
        except HTTPError as exc:
            shown = location.split("?")[0][:200]
            raise ApiError(exc.code, f"HTTP {exc.code} {exc.reason} from {shown}, where the API's redirect "
                                     "led (a presigned link holds for an hour: ask the API again)") from None
        except URLError as exc:
            raise Unreachable(f"cannot reach {location.split('?')[0][:200]}, where the API's redirect led: "
                              f"{exc.reason}") from None
        except TimeoutError:
            raise Unreachable(f"{location.split('?')[0][:200]} did not answer within {TIMEOUT_SECONDS} s") from None

    def _signed(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> dict[str, str]:
        import botocore.session
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        credentials = botocore.session.Session().get_credentials()
        if credentials is None:
            raise Unreachable("--iam needs AWS credentials (environment, profile or instance role)")
        request = AWSRequest(method=method, url=url, data=data, headers=headers)
        SigV4Auth(credentials.get_frozen_credentials(), "execute-api", self.region).add_auth(request)
        return dict(request.headers.items())


def _keys_of(body: Any) -> set[str]:
    """The task keys a request body carries (a batch's tasks, or one task)."""
    if not isinstance(body, dict):
        return set()
    tasks = body["tasks"] if isinstance(body.get("tasks"), list) else [body]
    return {task["key"] for task in tasks if isinstance(task, dict) and isinstance(task.get("key"), str)}


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
