"""The gateway's upstream client (app.services.upstream, on aiohttp) against real sockets: a
scripted HTTP server on 127.0.0.1 (asyncio's), so every answer, pause and close is the test's to
choose. The gateway's own tests (tests/integration/test_gateway*.py) drive it through uvicorn
upstreams: timeouts, a stream dying mid-way, a client disconnect aborting the upstream, refused
replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from app.services.upstream import (
    UpstreamBroken,
    UpstreamClient,
    UpstreamConnectError,
    UpstreamTimeout,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer k"}


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (Content-Length bodies only: what the client sends)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head, await reader.readexactly(length)


def ok(body: bytes, *extra: bytes) -> bytes:
    return b"\r\n".join([b"HTTP/1.1 200 OK", b"Content-Length: %d" % len(body), *extra,
                         b"", body])


class Server:
    """Serves ``handler`` for each connection; counts the connections and what they sent."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.connections, self.requests = handler, 0, []
        self.closed: asyncio.Event | None = None

    async def __aenter__(self) -> Server:
        self.closed = asyncio.Event()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()
                assert self.closed is not None
                self.closed.set()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/chat"
        return self

    async def __aexit__(self, *_: object) -> None:
        self.server.close()


def client(**overrides: float) -> UpstreamClient:
    settings = {"connect_timeout": 2.0, "read_timeout": 5.0, "max_connections": 8}
    return UpstreamClient(**{**settings, **overrides})  # type: ignore[arg-type]


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_requests_in_a_row_share_one_connection_and_send_the_body_as_given() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                head, body = await read_request(reader)
                server.requests.append((head, body))
                writer.write(ok(b'{"n":%d}' % len(server.requests)))

        async with Server(handler) as server:
            upstream, inflight = client(), {}
            for n in (1, 2, 3):
                response = await upstream.send(server.url, HEADERS, b'{"a":1}', inflight, "r")
                assert response.status == 200 and inflight == {"r": 1}
                assert await response.read() == b'{"n":%d}' % n
                response.close()
                assert inflight == {"r": 0}
            await upstream.aclose()
        assert server.connections == 1
        head, body = server.requests[0]
        assert head.startswith(b"POST /v1/chat HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"\r\nAuthorization: Bearer k\r\n" in head and b"\r\nContent-Length: 7\r\n" in head
        assert body == b'{"a":1}'

    run(scenario)


def test_a_chunked_body_arrives_decoded_piece_by_piece() -> None:
    async def scenario() -> None:
        go_on = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                         b"Retry-After: 3\r\n\r\n6\r\ndata: \r\n")
            await go_on.wait()
            writer.write(b"3\r\nabc\r\n0\r\n\r\n")

        async with Server(handler) as server:
            upstream = client()
            response = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            assert response.header("retry-after") == "3" and response.header("RETRY-AFTER") == "3"
            assert await response.next_chunk() == b"data: "
            assert not response.at_end()
            go_on.set()
            assert await response.next_chunk() == b"abc"
            assert response.at_end()
            assert await response.next_chunk() is None
            response.close()
            await upstream.aclose()

    run(scenario)


def test_malformed_http_is_broken_and_the_connection_dropped() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n")
            await reader.read()  # until the client drops the connection

        async with Server(handler) as server:
            upstream = client()
            with pytest.raises(UpstreamBroken, match="malformed"):
                await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            assert server.closed is not None
            await server.closed.wait()
            await upstream.aclose()

    run(scenario)


def test_closing_before_the_end_aborts_the_upstream_request() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf")
            assert await reader.read() == b""  # the client went away without reading on

        async with Server(handler) as server:
            upstream, inflight = client(), {}
            response = await upstream.send(server.url, HEADERS, b"{}", inflight, "r")
            assert await response.next_chunk() == b"half"
            response.close()
            assert inflight == {"r": 0}
            assert server.closed is not None
            await server.closed.wait()
            await upstream.aclose()

    run(scenario)


def test_a_body_that_ends_with_the_connection() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")

        async with Server(handler) as server:
            upstream = client()
            response = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            assert await response.read() == b"all of it"
            response.close()
            await upstream.aclose()

    run(scenario)


def test_a_connection_closed_mid_body_is_broken() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf")

        async with Server(handler) as server:
            upstream = client()
            response = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            with pytest.raises(UpstreamBroken, match="closed the connection"):
                await response.read()
            response.close()
            await upstream.aclose()

    run(scenario)


def test_a_pooled_connection_the_upstream_closed_is_retried_once_on_a_new_one() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            # The first connection answers once and then closes at the next request, as a
            # keep-alive timeout races a request; the second one answers.
            writer.write(ok(b"first" if server.connections == 1 else b"again"))
            if server.connections == 1:
                await read_request(reader)
                return
            while True:
                await read_request(reader)
                writer.write(ok(b"again"))

        async with Server(handler) as server:
            upstream = client()
            first = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            assert await first.read() == b"first"
            first.close()
            second = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            assert await second.read() == b"again"
            second.close()
            await upstream.aclose()
        assert server.connections == 2

    run(scenario)


def test_an_idle_connection_past_the_keepalive_is_not_reused() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await read_request(reader)
                writer.write(ok(b"x"))

        async with Server(handler) as server:
            upstream = client()
            upstream.keepalive = 0.05
            for _ in range(2):
                response = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
                await response.read()
                response.close()
                await asyncio.sleep(0.1)
            await upstream.aclose()
        assert server.connections == 2

    run(scenario)


def test_requests_past_max_connections_wait_for_one() -> None:
    async def scenario() -> None:
        release = asyncio.Event()

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                await read_request(reader)
                server.requests.append(None)
                await release.wait()
                writer.write(ok(b"x"))

        async with Server(handler) as server:
            upstream = client(max_connections=1)

            async def one() -> bytes:
                response = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
                try:
                    return await response.read()
                finally:
                    response.close()

            tasks = [asyncio.ensure_future(one()) for _ in range(3)]
            while not server.requests:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
            assert len(server.requests) == 1  # the others wait for the one connection
            release.set()
            assert await asyncio.gather(*tasks) == [b"x"] * 3
            await upstream.aclose()
        assert server.connections == 1

    run(scenario)


def test_reading_pauses_while_the_reader_falls_behind() -> None:
    total = 64 << 20
    written = [0]

    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
            for _ in range(total // 65536):
                writer.write(b"x" * 65536)
                await writer.drain()  # stalls while the client does not read
                written[0] += 65536

        async with Server(handler) as server:
            upstream = client()
            response = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            await asyncio.sleep(0.5)  # unpaused, all 64 MiB would arrive meanwhile
            assert written[0] < total // 4  # the sockets' buffers and the client's, no more
            received = 0
            while (chunk := await response.next_chunk()) is not None:
                received += len(chunk)
            assert received == total == written[0]
            response.close()
            await upstream.aclose()

    run(scenario)


def test_timeouts_and_refusals() -> None:
    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            await reader.read()  # never answers

        async with Server(handler) as server:
            upstream = client(read_timeout=0.2)
            with pytest.raises(UpstreamTimeout):
                await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            assert server.closed is not None
            await server.closed.wait()  # the abandoned request's connection is dropped
            await upstream.aclose()
        refused = server.url  # the server is gone: nobody listens there now
        upstream, inflight = client(), {}
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await upstream.send(refused, HEADERS, b"{}", inflight, "r")
        assert inflight == {"r": 0}
        await upstream.aclose()

    run(scenario)


def run_on(loop: str, scenario: Callable[[], Awaitable[None]]) -> None:
    """``scenario`` on asyncio's own loop or on uvloop (`specdeck api`'s), whose timers differ."""
    main = asyncio.wait_for(scenario(), 30)
    if loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_read_timeout_is_each_waits_own(loop: str) -> None:
    """One timer per connection serves every wait (``_Connection.read_deadline``): answers and pieces
    that each come within the read timeout never time out, however long the requests in a row
    or the stream take in all; a piece that does not come times out after the read timeout
    from when it was waited for, not from an earlier wait's start."""
    timeout, pace = 1.0, 0.1  # 10x: a loop held up for a while under load times nothing out

    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for _ in range(4):  # four answers in a row, each after `pace`
                await read_request(reader)
                await asyncio.sleep(pace)
                writer.write(ok(b"{}"))
            await read_request(reader)  # then a stream: 12 pieces `pace` apart, then silence
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in range(12):
                await asyncio.sleep(pace)
                writer.write(b"1\r\nx\r\n")
            await reader.read()

        async with Server(handler) as server:
            upstream = client(read_timeout=timeout)
            started = asyncio.get_running_loop().time()
            for _ in range(4):
                response = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
                assert await response.read() == b"{}"
                response.close()
            response = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            received = b""
            while len(received) < 12:
                received += await response.next_chunk() or b""
            assert asyncio.get_running_loop().time() - started > timeout  # past the first deadline
            waited = asyncio.get_running_loop().time()
            with pytest.raises(UpstreamTimeout):
                await response.next_chunk()
            assert timeout - 0.05 < asyncio.get_running_loop().time() - waited < timeout + 5.0
            response.close()
            await upstream.aclose()
        assert server.connections == 1

    run_on(loop, scenario)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_stalled_answer_after_a_quick_one_times_out_from_its_own_start(loop: str) -> None:
    """The connection's timer, armed by the quick answer's wait, fires while the next one waits
    and before its time: it is moved on to that wait's deadline, and the wait times out then."""
    timeout, pace = 1.0, 0.3

    async def scenario() -> None:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            await asyncio.sleep(pace)
            writer.write(ok(b"{}"))
            await read_request(reader)
            await reader.read()  # never answers

        async with Server(handler) as server:
            upstream = client(read_timeout=timeout)
            response = await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            assert await response.read() == b"{}"
            response.close()
            waited = asyncio.get_running_loop().time()
            with pytest.raises(UpstreamTimeout):
                await upstream.send(server.url, HEADERS, b"{}", {}, "r")
            assert timeout - 0.05 < asyncio.get_running_loop().time() - waited < timeout + 5.0
            await upstream.aclose()

    run_on(loop, scenario)
