"""The gateway's HTTP/1.1 client for its upstreams (the engines' OpenAI-compatible servers).

What a proxy's upstream hop needs and nothing more: POST a body, get the response head with
the first piece of its body, then the rest as it arrives, undecoded; pooled keep-alive
connections per origin (at most ``max_connections`` each, further requests wait for one); a
connect timeout; a read timeout for the answer (its head and first piece) and for each next
piece of the body; back-pressure (reading pauses while a slow
client leaves a quarter megabyte unread); ``close()`` before the end drops the connection, so
the engine sees its client go and aborts the request; a pooled connection the engine had closed
is retried once on a new one. HTTP is parsed by httptools (llhttp, the parser uvicorn serves
with) on asyncio's transports.

Why not aiohttp, which this hop used until 2026-12-04: one request at a time against the same
upstream in one run (2026-12-04, benchmarks/upstream_client.py, since removed), aiohttp's client spent 152 us of CPU on
a non-streaming request and 219 us on a streamed one; this one 58 and 113 us. The gateway's
whole budget is 0.25 ms added (issue 22), and the general-purpose client's machinery (cookies,
redirects, tracing, a payload registry, a task per request) was most of it
(docs/benchmarks.md, "Why the gateway is built as it is").
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import httptools

from app.deadline import Deadline

Check = Callable[[], Awaitable[None]]
PAUSE_AT = 256 * 1024  # bytes of body read from the upstream and not yet taken by the relay


class UpstreamError(Exception):
    """The upstream failed below HTTP: see the subclasses."""


class UpstreamConnectError(UpstreamError):
    """Refused, unreachable, or no connection within the connect timeout."""


class UpstreamTimeout(UpstreamError):
    """No answer (or no next chunk) within the read timeout."""


class UpstreamBroken(UpstreamError):
    """The connection dropped before the end of the response, or the HTTP was malformed."""


class UpstreamResponse:
    """An upstream response whose head has arrived; the body is read with ``read()`` or
    ``next_chunk()``. ``close()`` before the end drops the connection (the request is aborted
    upstream); reading to the end returns it to the pool. The request counts in flight
    (``UpstreamClient.send``) until the first ``close()``."""

    __slots__ = ("connection", "status", "headers", "body", "buffered", "complete", "error",
                 "waiter", "inflight", "key", "released")

    def __init__(self, connection: _Connection, inflight: dict[str, int], key: str) -> None:
        self.connection = connection
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.buffered = 0
        self.complete = False
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.inflight: dict[str, int] | None = inflight
        self.key = key
        self.released = False

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    # --- fed by the connection

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self.body.append(data)
        self.buffered += len(data)
        if self.buffered > PAUSE_AT:
            self.connection.pause()
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if not self.complete and self.error is None:
            self.error = error
            waiter = self.waiter
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)

    async def _wait(self, timeout: float) -> None:
        """Until the connection feeds some body, the end, or an error, or ``timeout``. The head
        alone wakes nobody: who reads a response wants its body (a wake-up for the head would
        cost a turn of the task for nothing)."""
        connection = self.connection
        self.waiter = waiter = connection.loop.create_future()
        connection.read_deadline.set(timeout)
        try:
            await waiter
        finally:
            self.waiter = None  # the deadline may pass now: with no waiter, nothing times out

    # --- read by the gateway

    async def next_chunk(self) -> bytes | None:
        """What arrived of the body since the last call (all of it, in one piece, so that a
        proxy passes on several upstream chunks in one write when it falls behind); None at the
        end."""
        while not self.body:
            if self.error is not None:
                raise self.error
            if self.complete:
                self._release()  # the whole body was read: the connection goes back to the pool
                return None
            await self._wait(self.connection.client.read_timeout)
        body, self.body = self.body, []
        if self.buffered > PAUSE_AT:
            self.connection.resume()
        self.buffered = 0
        return body[0] if len(body) == 1 else b"".join(body)

    def at_end(self) -> bool:
        """Whether the whole body has arrived and been read (the next chunk is the end)."""
        return self.complete and not self.body

    async def read(self) -> bytes:
        parts = []
        while (chunk := await self.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)

    def _release(self) -> None:
        if not self.released:
            self.released = True
            self.connection.done(self)

    def close(self) -> None:
        """Drops the connection if the body was not read to the end; ends the count in flight."""
        if not self.released:
            self.released = True
            if self.complete and self.error is None:
                self.connection.done(self)
            else:
                self.connection.abort()
        if self.inflight is not None:
            self.inflight[self.key] -= 1
            self.inflight = None


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an origin, one response at a time (no pipelining)."""

    def __init__(self, client: UpstreamClient, origin: tuple[str, str, int]) -> None:
        self.client, self.origin = client, origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.headers: dict[str, str] = {}
        self.reusable = False  # the last response completed and allows keep-alive
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        # Of the response's current wait: one timer per connection, not one per wait.
        self.read_deadline = Deadline(self.loop, self.read_timed_out)

    # --- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # nothing was asked: not HTTP we can follow
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.response._fail(UpstreamBroken(f"malformed HTTP from the upstream: {exc}"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.read_deadline.cancel()
        self.client.forget(self)
        response = self.response
        if response is None or response.complete:
            return
        if response.status and "content-length" not in response.headers and \
                "chunked" not in response.headers.get("transfer-encoding", ""):
            response.complete = True  # a body that ends with the connection
            response._wake()
        else:
            response._fail(UpstreamBroken("the upstream closed the connection"))

    # --- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        response.status, response.headers, self.headers = self.parser.get_status_code(), \
            self.headers, {}

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        response = self.response
        assert response is not None
        self.reusable = self.parser.should_keep_alive()
        response.complete = True
        response._wake()

    # --- used by the client and the response

    def request(self, head: bytes, body: bytes, response: UpstreamResponse) -> None:
        self.response, self.reusable = response, False
        assert self.transport is not None
        self.transport.writelines((head, body))

    def read_timed_out(self) -> None:
        waiter = self.response.waiter if self.response is not None else None
        if waiter is not None and not waiter.done():
            waiter.set_exception(UpstreamTimeout("the upstream did not answer in time"))

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def done(self, response: UpstreamResponse) -> None:
        """``response`` was read to its end."""
        if self.response is response:
            self.response = None
            self.resume()
            if self.reusable and not self.closed:
                self.client.release(self)
            else:
                self.abort()

    def abort(self) -> None:
        self.response = None
        if self.transport is not None:
            self.transport.abort()  # connection_lost follows
        self.closed = True


class _Origin:
    """An origin's idle connections (newest last), how many are open, and who waits for one."""

    __slots__ = ("idle", "open", "waiters")

    def __init__(self) -> None:
        self.idle: list[_Connection] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()


class UpstreamClient:
    """Pooled keep-alive connections to every upstream, in the event loop that uses it."""

    def __init__(self, connect_timeout: float, read_timeout: float, max_connections: int,
                 keepalive: float = 4.0) -> None:
        # keepalive: below uvicorn's (vLLM's) 5 s, so an idle connection is dropped here first.
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self.max_connections, self.keepalive = max_connections, keepalive
        self.origins: dict[tuple[str, str, int], _Origin] = {}
        # url -> its origin, a request's head but its Content-Length, and the headers in it
        self.targets: dict[str, tuple[tuple[str, str, int], bytes, dict[str, str]]] = {}

    def target(self, url: str, headers: dict[str, str]) -> tuple[tuple[str, str, int], bytes]:
        """The origin of ``url`` and a request's head to it up to its Content-Length (cached
        per URL while its headers stay the same)."""
        known = self.targets.get(url)
        if known is None or (known[2] is not headers and known[2] != headers):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise UpstreamConnectError(f"not an http(s) URL: {url!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            head = "".join((f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\n",
                            *(f"{name}: {value}\r\n" for name, value in headers.items())))
            known = ((parts.scheme, parts.hostname, port), head.encode("latin-1"), headers)
            if len(self.targets) > 10_000:
                self.targets.clear()
            self.targets[url] = known
        return known[0], known[1]

    async def send(self, url: str, headers: dict[str, str], body: bytes,
                   inflight: dict[str, int], key: str,
                   check: Check | None = None) -> UpstreamResponse:
        """POST ``body``; return once the response's head and the first piece of its body (or
        its end) have arrived, within the read timeout. ``inflight[key]`` counts
        the request from now until the response is closed. ``check`` is awaited once the
        request has been written and before its answer is: if it raises, the request is
        aborted (the upstream sees its client go) and the exception goes to the caller."""
        origin, start = self.target(url, headers)
        head = start + b"Content-Length: %d\r\n\r\n" % len(body)
        inflight[key] = inflight.get(key, 0) + 1
        try:
            for attempt in (0, 1):
                connection, reused = await self.acquire(origin)
                response = UpstreamResponse(connection, inflight, key)
                connection.request(head, body, response)
                try:
                    if check is not None:
                        await check()
                        check = None
                    while not (response.body or response.complete):
                        if response.error is not None:
                            raise response.error
                        await response._wait(self.read_timeout)
                except UpstreamBroken:
                    response.released = True
                    connection.abort()
                    if reused and attempt == 0 and not response.status:
                        continue  # a pooled connection the upstream had closed: once more
                    raise
                except BaseException:
                    response.released = True
                    connection.abort()  # the request is abandoned: so is the connection
                    raise
                return response
            raise AssertionError("unreachable")
        except BaseException:
            inflight[key] -= 1
            raise

    async def acquire(self, key: tuple[str, str, int]) -> tuple[_Connection, bool]:
        """An idle connection to the origin (and True), or a new one (and False)."""
        origin = self.origins.get(key)
        if origin is None:
            origin = self.origins[key] = _Origin()
        while True:
            now = asyncio.get_running_loop().time()
            while origin.idle:
                connection = origin.idle.pop()
                if not connection.closed and now - connection.idle_since < self.keepalive:
                    return connection, True
                connection.abort()
            if origin.open < self.max_connections:
                break
            waiter = asyncio.get_running_loop().create_future()
            origin.waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake(origin)  # woken, then cancelled: pass the turn on
                raise
        origin.open += 1
        try:
            return await self.connect(key), False
        except BaseException:
            origin.open -= 1
            self._wake(origin)
            raise

    async def connect(self, key: tuple[str, str, int]) -> _Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, key), host, port, ssl=scheme == "https")
        except TimeoutError:
            raise UpstreamConnectError("no connection within the connect timeout") from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: {exc}") from None
        return connection

    def release(self, connection: _Connection) -> None:
        """``connection`` is idle again: kept for the next request to its origin."""
        origin = self.origins.get(connection.origin)
        if origin is None:
            connection.abort()
            return
        connection.idle_since = connection.loop.time()
        origin.idle.append(connection)
        self._wake(origin)

    def forget(self, connection: _Connection) -> None:
        """``connection`` was closed (by either side)."""
        origin = self.origins.get(connection.origin)
        if origin is None:
            return
        if connection in origin.idle:
            origin.idle.remove(connection)
        origin.open -= 1
        self._wake(origin)

    @staticmethod
    def _wake(origin: _Origin) -> None:
        while origin.waiters:
            waiter = origin.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        origins, self.origins = self.origins, {}
        for origin in origins.values():
            for connection in origin.idle:
                connection.abort()
            for waiter in origin.waiters:
                if not waiter.done():
                    waiter.cancel()
