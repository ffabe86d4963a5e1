"""The HTTP client: one ``Api`` per command, with retries and the API's errors turned into exit
codes.

Network errors and 502/503/504 are retried with exponential backoff (a ``Retry-After`` from the
server is honoured). A request that is not safe to repeat (a POST without an Idempotency-Key)
is retried only when it surely did nothing: the connection was never made, or the API answered
503 (it rolls back before answering that).
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from app.client import exits
from app.client.exits import CLIError

RETRY_STATUSES = frozenset({502, 503, 504})
# Whatever the server asks for, one wait between two attempts is at most this long.
MAX_DELAY = 30.0
FilesFactory = Callable[[contextlib.ExitStack], dict[str, Any]]


def describe_error(response: httpx.Response) -> str:
    """The API's error, ``{"error": {"message", "type", "param", "code"}}``, as one readable line."""
    try:
        error = response.json()["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError):
        text = response.text.strip().splitlines()
        return f"HTTP {response.status_code}: {text[0][:300] if text else response.reason_phrase}"
    details = [f"HTTP {response.status_code}"]
    details += [f"{name} {error[name]}" for name in ("code", "param") if error.get(name)]
    return f"{message} ({', '.join(details)})"


def backoff(attempt: int, base: float, retry_after: str | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): base * 2^attempt with jitter,
    at least what ``Retry-After`` asks (in seconds), never more than MAX_DELAY."""
    delay = base * 2 ** attempt * random.uniform(0.8, 1.2)
    if retry_after is not None:
        with contextlib.suppress(ValueError):
            delay = max(delay, float(retry_after))
    return min(delay, MAX_DELAY)


class Api:
    """The REST API at ``url`` with ``key``; ``retries`` extra attempts per request."""

    def __init__(self, url: str, key: str | None, *, retries: int, backoff: float,
                 timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, repeatable: bool | None = None,
                files: FilesFactory | None = None, **kwargs: Any) -> httpx.Response:
        """The answer to a request, a 2xx one; anything else raises CLIError with its exit code.
        ``repeatable``: the request may be sent again after a failure that may have reached the
        server (default: every method but POST). ``files``: the multipart files, opened anew
        for each attempt."""
        if repeatable is None:
            repeatable = method != "POST"
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                with contextlib.ExitStack() as stack:
                    if files is not None:
                        kwargs["files"] = files(stack)
                    response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                unsent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if last or not (repeatable or unsent):
                    raise CLIError(exits.UNREACHABLE, f"cannot reach {self.url}: "
                                   f"{type(exc).__name__}: {exc}") from exc
                self._pause(attempt, f"{type(exc).__name__}: {exc}", None)
                continue
            if response.is_success:
                return response
            retryable = response.status_code == 503 or (
                repeatable and response.status_code in RETRY_STATUSES)
            if last or not retryable:
                raise CLIError(exits.exit_code_for_status(response.status_code),
                               describe_error(response))
            self._pause(attempt, describe_error(response), response.headers.get("retry-after"))
        raise AssertionError("unreachable")  # the loop returns or raises

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def pages(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every object of a paginated list (``after`` = the last page's ``last_id``)."""
        params = dict(params or {})
        while True:
            page = self.json("GET", path, params=params)
            yield from page["data"]
            if not page.get("has_more") or not page.get("last_id"):
                return
            params["after"] = page["last_id"]

    def _pause(self, attempt: int, reason: str, retry_after: str | None) -> None:
        delay = backoff(attempt, self.backoff, retry_after)
        print(f"retrying in {delay:.1f}s ({attempt + 1}/{self.retries}): {reason}",
              file=sys.stderr, flush=True)
        time.sleep(delay)
