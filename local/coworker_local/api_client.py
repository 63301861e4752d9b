"""The HTTP client of the task API that the ``coworker`` command uses (see :mod:`coworker_local.cli`).

Standard library only; ``--iam`` signs requests with SigV4 through botocore.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode
from urllib.request import Request, urlopen

TIMEOUT_SECONDS = 60


class ApiError(Exception):
    """The API answered with an error (4xx/5xx); ``message`` is the API's own wording."""

    def __init__(self, status: int, message: str, errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors or []


class Unreachable(Exception):
    """No answer from the API (connection refused, DNS, timeout)."""


class ApiClient:
    """A small JSON client of the task API (standard library only; botocore for ``--iam``)."""

    def __init__(self, url: str, api_key: str | None = None, iam: bool = False,
                 region: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.iam = iam
        self.region = (region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
                       or "us-east-1")

    def request(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None) -> Any:
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
            with urlopen(request, timeout=TIMEOUT_SECONDS) as reply:
                return _parse(reply.read())
        except HTTPError as exc:
            answer = _parse(exc.read())
            if isinstance(answer, dict) and "message" in answer:
                raise ApiError(exc.code, str(answer["message"]), answer.get("errors")) from None
            raise ApiError(exc.code, f"HTTP {exc.code} {exc.reason}") from None
        except URLError as exc:
            raise Unreachable(f"cannot reach the API at {self.url}: {exc.reason}") from None
        except TimeoutError:
            raise Unreachable(f"the API at {self.url} did not answer within {TIMEOUT_SECONDS} s") from None

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


def _parse(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")
