"""The gateway's hop to its upstreams (the engines' OpenAI-compatible servers), on aiohttp's
client through its public API.

What the gateway needs of it, in its terms: POST a body and get the response once its head has
arrived; its body whole (``read``) or in the pieces that arrive (``next_chunk``); pooled
keep-alive connections per upstream (at most ``max_connections`` each; the rest wait), kept
below uvicorn's (vLLM's) 5 s keep-alive; a connect timeout and a read timeout for each wait;
``close()`` before the end drops the connection, so the engine sees its client go and aborts the
request; failures below HTTP as ``UpstreamError``s, which say whether another replica may be
tried (``UpstreamConnectError``, ``UpstreamBroken``) or not (``UpstreamTimeout``: the engine may
still be working on it). A pooled connection that the upstream had closed is tried once more on
a new one. Bodies pass through undecoded; ``inflight`` counts each request until it is closed
(the balancer picks the replica with the fewest).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp

Check = Callable[[], Awaitable[None]]


class UpstreamError(Exception):
    """The upstream failed below HTTP: see the subclasses."""


class UpstreamConnectError(UpstreamError):
    """Refused, unreachable, or no connection within the connect timeout."""


class UpstreamTimeout(UpstreamError):
    """No answer (or no next chunk) within the read timeout."""


class UpstreamBroken(UpstreamError):
    """The connection dropped before the end of the response, or the HTTP was malformed."""


def as_upstream_error(exc: BaseException) -> UpstreamError:
    """aiohttp's exception (or a timeout) as the gateway's, saying what happened."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError,
                        aiohttp.InvalidURL)):
        return UpstreamConnectError(f"cannot connect to the upstream: {exc}")
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return UpstreamTimeout(f"no answer within the read timeout: {exc}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return UpstreamBroken(f"the upstream closed the connection before the end of its "
                              f"answer: {exc}")
    if isinstance(exc, aiohttp.ClientResponseError):  # what aiohttp could not parse
        return UpstreamBroken(f"malformed HTTP from the upstream: {exc.message}")
    return UpstreamBroken(f"the upstream's connection broke: {type(exc).__name__}: {exc}")


FAILURES = (aiohttp.ClientError, asyncio.TimeoutError)


class UpstreamResponse:
    """An upstream response whose head has arrived. ``close()`` before the end of the body drops
    the connection (the request is aborted upstream); after it, the connection goes back to the
    pool. The request counts in flight until the first ``close()``."""

    __slots__ = ("response", "status", "inflight", "key")

    def __init__(self, response: aiohttp.ClientResponse, inflight: dict[str, int],
                 key: str) -> None:
        self.response, self.status = response, response.status
        self.inflight: dict[str, int] | None = inflight
        self.key = key

    def header(self, name: str) -> str | None:
        return self.response.headers.get(name)

    async def next_chunk(self) -> bytes | None:
        """What has arrived of the body since the last call, in one piece; None at the end."""
        try:
            chunk = await self.response.content.readany()
        except FAILURES as exc:
            raise as_upstream_error(exc) from exc
        return chunk or None

    def at_end(self) -> bool:
        """Whether the whole body has arrived and been read (the next chunk is the end)."""
        return self.response.content.at_eof()

    async def read(self) -> bytes:
        try:
            return await self.response.read()
        except FAILURES as exc:
            raise as_upstream_error(exc) from exc

    def close(self) -> None:
        """Drops the connection if the body was not read to the end; ends the count in flight."""
        if self.response.content.at_eof():
            self.response.release()
        else:
            self.response.close()
        if self.inflight is not None:
            self.inflight[self.key] -= 1
            self.inflight = None


class UpstreamClient:
    """One aiohttp session for every upstream, in the event loop that uses it (made there on
    first use)."""

    def __init__(self, connect_timeout: float, read_timeout: float, max_connections: int,
                 keepalive: float = 4.0) -> None:
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout,
                                             sock_read=read_timeout)
        self.max_connections, self.keepalive = max_connections, keepalive
        self.session: aiohttp.ClientSession | None = None

    def open(self) -> aiohttp.ClientSession:
        if self.session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=self.max_connections,
                                             keepalive_timeout=self.keepalive)
            self.session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"))
        return self.session

    async def send(self, url: str, headers: dict[str, str], body: bytes,
                   inflight: dict[str, int], key: str,
                   check: Check | None = None) -> UpstreamResponse:
        """POST ``body``; return once the response's head has arrived, within the read timeout.
        ``inflight[key]`` counts the request from now until the response is closed. ``check``
        is awaited while the request is on its way: if it raises, the request is abandoned (the
        upstream sees its client go) and the exception goes to the caller."""
        session = self.open()
        inflight[key] = inflight.get(key, 0) + 1
        try:
            if check is None:
                response = await self.post(session, url, headers, body)
            else:
                posting = asyncio.ensure_future(self.post(session, url, headers, body))
                try:
                    await check()
                except BaseException:
                    posting.cancel()
                    raise
                response = await posting
            return UpstreamResponse(response, inflight, key)
        except BaseException:
            inflight[key] -= 1
            raise

    async def post(self, session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                   body: bytes) -> aiohttp.ClientResponse:
        for attempt in (0, 1):
            try:
                return await session.post(url, data=body, headers=headers,
                                          allow_redirects=False)
            except aiohttp.ServerDisconnectedError as exc:
                if attempt == 0:
                    continue  # a pooled connection the upstream had closed: once more
                raise as_upstream_error(exc) from exc
            except FAILURES as exc:
                raise as_upstream_error(exc) from exc
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None
