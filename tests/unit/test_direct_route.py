"""`specdeck api`'s protocol answers the app's ``direct_route`` (the gateway's chat completions)
past ASGI's per-request machinery (app/server.py). Each test sends the same raw bytes to two real
uvicorn servers on ``HttpProtocol``: one whose app names the route, and one whose app does not
(uvicorn's ASGI way), and compares what comes back, byte for byte but for the Date header: the
direct way must write what uvicorn writes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import uvicorn
from starlette.responses import JSONResponse, Response, StreamingResponse

from app.server import CLIENT_GONE, DirectRoute, HttpProtocol, JSONBody
from tests.support.upstream import free_port

PATH = "/v1/chat/completions"


def request(body: bytes, *, path: str = PATH, version: str = "1.1", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/{version}\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: {len(body)}\r\n\r\n").encode() + body


class App:
    """Answers by what the body asks: ``whole`` (JSON, with a header), ``stream`` (chunks),
    ``boom`` (raises), ``gone`` (waits for the client to go, then None), ``bad-header``,
    ``held`` (whole, once ``release`` is set; ``holding`` is set while it waits). ``called``:
    set when a request reaches it; ``given``: whether the direct way handed it each body."""

    def __init__(self, direct: bool) -> None:
        self.ways: list[str] = []
        self.bodies: list[bytes] = []
        self.given: list[bool] = []
        self.called, self.holding, self.release = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.gone = asyncio.Event()
        if direct:
            self.direct_route = DirectRoute(PATH, self.answer)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:  # the ASGI way
        self.ways.append("asgi")
        self.called.set()
        response = await self.reply(scope, receive, None)
        if response is not None:
            await response(scope, receive, send)

    async def answer(self, scope: Any, receive: Any, body: bytes | None) -> Any:
        self.ways.append("direct")
        self.given.append(body is not None)
        self.called.set()
        return await self.reply(scope, receive, body)

    async def reply(self, scope: Any, receive: Any, body: bytes | None) -> Any:
        if body is None:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
        self.bodies.append(body)
        ask = json.loads(body)["ask"]
        if ask == "held":
            self.holding.set()
            await self.release.wait()
            ask = "whole"
        if ask == "whole":
            return JSONResponse({"echo": len(body), "path": scope["path"],
                                 "query": scope["query_string"].decode()},
                                headers={"x-request": "1"})
        if ask == "stream":
            async def chunks() -> AsyncIterator[bytes]:
                for i in range(3):
                    yield b"data: %d\n\n" % i
            return StreamingResponse(chunks(), media_type="text/event-stream")
        if ask == "boom":
            raise RuntimeError("the app failed")
        if ask == "gone":
            scope["extensions"][CLIENT_GONE].add(self.gone.set)
            self.holding.set()
            await self.gone.wait()
            return None
        if ask == "json":
            return JSONBody(body)
        if ask == "bad-header":
            return Response(b"{}", headers={"x-bad": "a\nb"})
        raise AssertionError(ask)


async def serve(app: App, **config: Any) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    port = free_port()
    # As `specdeck api` runs it (app/cli.py): no proxy headers middleware around the app, which
    # would hide its direct route (the app applies them itself, past the route).
    config = {"lifespan": "off", "log_level": "warning", "proxy_headers": False, **config}
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=HttpProtocol,
                                           **config))
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, port


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """One response: its head and its body (Content-Length or chunked)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = re.search(rb"\r\ncontent-length: (\d+)\r\n", head)
    if length:
        return head + await asyncio.wait_for(reader.readexactly(int(length[1])), 10)
    assert b"\r\ntransfer-encoding: chunked\r\n" in head
    return head + await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)


def without_date(raw: bytes) -> bytes:
    return re.sub(rb"date: [^\r]*\r\n", b"", raw)


Exchange = Callable[[int, App, uvicorn.Server], Awaitable[Any]]


def both_ways(exchange: Exchange, **config: Any) -> tuple[Any, Any, App, App]:
    """Run ``exchange(port, app, server)`` against the direct server, then the ASGI one."""
    async def main() -> tuple[Any, Any, App, App]:
        results, apps = [], []
        for direct in (True, False):
            app = App(direct)
            server, serving, port = await serve(app, **config)
            try:
                results.append(await exchange(port, app, server))
            finally:
                server.should_exit = True
                await asyncio.wait_for(serving, 30)
            apps.append(app)
        return results[0], results[1], apps[0], apps[1]

    return asyncio.run(main())


def test_whole_answers_on_a_keep_alive_connection_are_written_as_uvicorn_writes_them() -> None:
    async def exchange(port: int, app: App, server: uvicorn.Server) -> list[bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        for size in (2, 300, 70_000):  # the last one's body comes in several reads
            writer.write(request(json.dumps({"ask": "whole", "pad": "x" * size}).encode()))
            answers.append(without_date(await read_answer(reader)))
        writer.close()
        return answers

    direct, asgi, direct_app, asgi_app = both_ways(exchange)
    assert direct == asgi
    assert direct[0].startswith(b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\nx-request: 1\r\n"
                                b"content-length: 52\r\ncontent-type: application/json\r\n\r\n")
    assert b"connection" not in direct[0]
    assert json.loads(direct[2].split(b"\r\n\r\n", 1)[1])["echo"] == len(direct_app.bodies[2])
    assert direct_app.ways == ["direct"] * 3 and asgi_app.ways == ["asgi"] * 3
    assert direct_app.given[:2] == [True, True]  # each body came with its head: handed in
    assert direct_app.bodies == asgi_app.bodies


def test_a_json_body_is_written_as_starlettes_response_of_it() -> None:
    body = b'{"ask": "json", "text": "caf\xc3\xa9"}'
    lean, starlette = JSONBody(body), Response(body, media_type="application/json")
    assert (lean.status_code, lean.raw_headers, lean.body, lean.background) == (
        starlette.status_code, starlette.raw_headers, starlette.body, starlette.background)

    async def exchange(port: int, app: App, server: uvicorn.Server) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(body))
        answer = without_date(await read_answer(reader))
        writer.close()
        return answer

    direct, asgi, direct_app, _ = both_ways(exchange)
    assert direct == asgi == (b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-length: %d\r\n"
                              b"content-type: application/json\r\n\r\n%s" % (len(body), body))
    assert direct_app.ways == ["direct"]


@pytest.mark.parametrize("version, extra", [("1.0", ""), ("1.1", "Connection: close\r\n")])
def test_a_connection_that_closes_is_told_so_and_closed(version: str, extra: str) -> None:
    async def exchange(port: int, app: App, server: uvicorn.Server) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(b'{"ask": "whole"}', version=version, extra=extra))
        raw = await asyncio.wait_for(reader.read(), 10)  # to the end: the server closes
        writer.close()
        return without_date(raw)

    direct, asgi, direct_app, _ = both_ways(exchange)
    assert direct == asgi
    assert b"\r\nconnection: close\r\n" in direct and direct.endswith(b'"query":""}')
    assert direct_app.ways == ["direct"]


def test_a_stream_an_error_and_a_bad_header() -> None:
    async def exchange(port: int, app: App, server: uvicorn.Server) -> list[bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(b'{"ask": "stream"}'))
        stream = without_date(await read_answer(reader))
        writer.write(request(b'{"ask": "boom"}'))
        boom = without_date(await asyncio.wait_for(reader.read(), 10))
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(b'{"ask": "bad-header"}'))
        bad = without_date(await asyncio.wait_for(reader.read(), 10))
        writer.close()
        return [stream, boom, bad]

    direct, asgi, direct_app, _ = both_ways(exchange)
    assert direct[0] == asgi[0]  # the stream: uvicorn's own send, chunked
    assert direct[0].endswith(b"data: 2\n\n\r\n0\r\n\r\n")
    assert direct[1] == asgi[1]  # uvicorn's 500, and the connection closed
    assert direct[1].startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    # A header value with a line break: uvicorn has started the response when it checks it, and
    # drops the connection; the direct way checks before, and answers uvicorn's 500.
    assert asgi[2] == b""
    assert direct[2].startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"x-bad" not in direct[2]
    assert direct_app.ways == ["direct"] * 3


def test_pipelined_requests_are_answered_in_order() -> None:
    bodies = [json.dumps({"ask": "whole", "n": n}).encode() for n in (1, 22)]

    async def exchange(port: int, app: App, server: uvicorn.Server) -> list[bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(bodies[0]) + request(bodies[1]))
        answers = [without_date(await read_answer(reader)) for _ in range(2)]
        writer.close()
        return answers

    direct, asgi, direct_app, _ = both_ways(exchange)
    assert direct == asgi
    assert [json.loads(a.split(b"\r\n\r\n", 1)[1])["echo"] for a in direct] == [
        len(b) for b in bodies]
    # The second arrived while the first was answered: it waited, and went the ASGI way.
    assert direct_app.ways == ["direct", "asgi"]


@pytest.mark.parametrize("pad, pieces, given", [
    (0, 2, True),  # collected, then handed in whole
    # Past uvicorn's high-water mark before it is whole: read with receive(), with uvicorn's
    # flow control, not handed in.
    (300_000, 1, False)])
def test_a_body_that_comes_after_its_head(pad: int, pieces: int, given: bool) -> None:
    body = json.dumps({"ask": "whole", "late": True, "pad": "x" * pad}).encode()

    async def exchange(port: int, app: App, server: uvicorn.Server) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = request(body)
        writer.write(raw[:-len(body)])
        await writer.drain()
        cut = len(body) // pieces
        for piece in (body[:cut], body[cut:]):  # in reads of their own, most likely
            writer.write(piece)
            await writer.drain()
        answer = without_date(await read_answer(reader))
        writer.close()
        return answer

    direct, asgi, direct_app, _ = both_ways(exchange)
    assert direct == asgi
    assert direct_app.ways == ["direct"] and direct_app.bodies == [body]
    assert direct_app.given == [given]


@pytest.mark.parametrize("path, extra", [(PATH + "?x=1", ""),
                                         (PATH, "Expect: 100-continue\r\n")])
def test_a_query_string_or_an_expectation_goes_the_asgi_way(path: str, extra: str) -> None:
    async def exchange(port: int, app: App, server: uvicorn.Server) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(b'{"ask": "whole"}', path=path, extra=extra))
        answer = await asyncio.wait_for(reader.readuntil(b"}"), 10)
        writer.close()
        return without_date(answer)

    direct, asgi, direct_app, _ = both_ways(exchange)
    assert direct == asgi
    assert direct_app.ways == ["asgi"]


def test_a_client_that_goes_away_gets_nothing_and_the_server_serves_on() -> None:
    async def exchange(port: int, app: App, server: uvicorn.Server) -> bytes:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(b'{"ask": "gone"}'))
        await asyncio.wait_for(app.holding.wait(), 10)  # the app waits for the client to go
        writer.close()
        await asyncio.wait_for(app.gone.wait(), 10)  # the server told it
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(b'{"ask": "whole"}'))
        answer = await read_answer(reader)
        writer.close()
        return without_date(answer)

    direct, asgi, direct_app, asgi_app = both_ways(exchange)
    assert direct == asgi and direct.startswith(b"HTTP/1.1 200 OK\r\n")
    assert direct_app.ways == ["direct", "direct"] and asgi_app.ways == ["asgi", "asgi"]


@contextlib.contextmanager
def access_lines() -> Iterator[list[str]]:
    """The lines uvicorn's access log writes meanwhile, the client's port as PORT."""
    access = logging.getLogger("uvicorn.access")
    handler = logging.Handler()
    lines: list[str] = []
    handler.emit = lambda record: lines.append(  # type: ignore[method-assign]
        re.sub(r":\d+ - ", ":PORT - ", record.getMessage()))
    access.addHandler(handler)
    try:
        yield lines
    finally:
        access.removeHandler(handler)


def test_the_access_log_reads_the_same() -> None:
    async def exchange(port: int, app: App, server: uvicorn.Server) -> list[str]:
        with access_lines() as lines:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request(b'{"ask": "whole"}'))
            await read_answer(reader)
            writer.close()
        return lines

    direct, asgi, _, _ = both_ways(exchange, access_log=True, log_level="info")
    assert direct == asgi == ['127.0.0.1:PORT - "POST /v1/chat/completions HTTP/1.1" 200']


def test_a_route_can_be_left_out_of_the_access_log() -> None:
    async def main() -> list[str]:
        app = App(direct=True)
        app.direct_route = app.direct_route._replace(access_log=False)
        server, serving, port = await serve(app, access_log=True, log_level="info")
        try:
            with access_lines() as lines:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                for ask in ("whole", "stream"):  # answered directly: not logged
                    writer.write(request(json.dumps({"ask": ask}).encode()))
                    await read_answer(reader)
                writer.write(request(b'{"ask": "whole"}', path=PATH + "?x=1"))  # the ASGI way
                await read_answer(reader)
                writer.close()
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)
        assert app.ways == ["direct", "direct", "asgi"]
        return lines

    assert asyncio.run(main()) == [
        '127.0.0.1:PORT - "POST /v1/chat/completions?x=1 HTTP/1.1" 200']


@pytest.mark.parametrize("setting, logged", [(None, False), ("true", True)])
def test_the_gateways_completions_are_logged_only_when_asked(
        monkeypatch: pytest.MonkeyPatch, setting: str | None, logged: bool) -> None:
    from app.main import create_server
    from app.settings import get_settings

    if setting is None:
        monkeypatch.delenv("SPECDECK_GATEWAY_ACCESS_LOG", raising=False)
    else:
        monkeypatch.setenv("SPECDECK_GATEWAY_ACCESS_LOG", setting)
    get_settings.cache_clear()
    try:
        route = create_server().direct_route
    finally:
        get_settings.cache_clear()
        gc.unfreeze()  # create_server froze this test process's heap: see below
    assert route.path == PATH and route.access_log is logged


def test_the_server_freezes_what_startup_made_so_full_collections_skip_it() -> None:
    from app.main import create_server

    gc.unfreeze()
    try:
        server = create_server()
        frozen = gc.get_freeze_count()
        # What startup made is out of the collector's reach (a full collection of it took about
        # 70 ms in `specdeck api`): the app itself, its routes, and what they hold.
        assert frozen > 100_000
        assert not any(obj is server or obj is server.app for obj in gc.get_objects())
    finally:
        gc.unfreeze()


def test_a_graceful_shutdown_lets_the_answer_go_then_closes_the_connection() -> None:
    async def exchange(port: int, app: App, server: uvicorn.Server) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request(b'{"ask": "held"}'))
        await asyncio.wait_for(app.holding.wait(), 10)
        server.should_exit = True  # as SIGTERM does: the request in flight is answered
        for _ in range(1000):  # until the server has told the connection to close after it
            if all(not c.cycle.keep_alive for c in server.server_state.connections):
                break
            await asyncio.sleep(0.01)
        app.release.set()
        raw = await asyncio.wait_for(reader.read(), 10)  # to the end: the server closes
        writer.close()
        return without_date(raw)

    direct, asgi, direct_app, _ = both_ways(exchange)
    assert direct == asgi
    assert direct.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\nconnection: close\r\n" in direct
    assert direct_app.ways == ["direct"]


KeepAliveExchange = Callable[[App, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[float]]


def closed_after_keep_alive(keep_alive: float, exchange: KeepAliveExchange) -> tuple[App, int]:
    """Run ``exchange(app, reader, writer)`` on a connection to a direct server whose
    keep-alive timeout is ``keep_alive``; it returns the loop's time of its last answer, after
    which the server must close the connection that long later. Returns the app and the
    server's count of requests."""
    async def main() -> tuple[App, int]:
        app = App(direct=True)
        server, serving, port = await serve(app, timeout_keep_alive=keep_alive)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            answered = await exchange(app, reader, writer)
            assert await asyncio.wait_for(reader.read(), keep_alive + 10) == b""  # closed
            waited = asyncio.get_running_loop().time() - answered
            assert keep_alive - 0.05 < waited < keep_alive + 5
            writer.close()
            return app, server.server_state.total_requests
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)

    return asyncio.run(main())


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout_and_a_busy_one_is_not() -> None:
    """One keep-alive timer per connection (``app.deadline.Deadline``), as uvicorn's
    timeout reads: requests that come within it keep the connection, however long they go on
    in all; once they stop, the server closes it that long after the last answer."""
    keep_alive, pace = 2.0, 0.2  # 10x: a loop held up for a while under load closes nothing

    async def exchange(app: App, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < 1.5 * keep_alive:  # past the first timer's time
            writer.write(request(b'{"ask": "json"}'))
            assert (await read_answer(reader)).startswith(b"HTTP/1.1 200 OK\r\n")
            answered = loop.time()
            await asyncio.sleep(pace)
        return answered

    app, requests = closed_after_keep_alive(keep_alive, exchange)
    assert requests == len(app.ways) > 10


def test_a_request_answered_after_the_keep_alive_timeout_keeps_its_connection_that_long() -> None:
    """The connection's timer fires while a request is under way, which keeps the connection;
    the answer arms it again, and the connection is closed the timeout after the answer."""
    keep_alive = 1.0

    async def exchange(app: App, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> float:
        writer.write(request(b'{"ask": "json"}'))  # arms the timer
        await read_answer(reader)
        writer.write(request(b'{"ask": "held"}'))
        await asyncio.wait_for(app.holding.wait(), 10)
        await asyncio.sleep(1.5 * keep_alive)  # the timer fires meanwhile
        app.release.set()
        assert (await read_answer(reader)).startswith(b"HTTP/1.1 200 OK\r\n")
        return asyncio.get_running_loop().time()

    app, requests = closed_after_keep_alive(keep_alive, exchange)
    assert app.ways == ["direct", "direct"] and requests == 2
