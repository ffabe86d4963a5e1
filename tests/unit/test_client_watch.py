"""The gateway's watch on its client (``ClientWatch`` in app/services/gateway.py): served by
`specdeck api`'s protocol (app/server.py), the server tells it that the client went away, with no
task of its own; served by anything else, a task waiting on ``receive()`` does. Either way the
request's task is cancelled where it waits, and only while the watch is armed."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from app.server import CLIENT_GONE, CONNECTION, HttpProtocol
from app.services.gateway import ClientWatch

REQUEST = b"POST /wait HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\n\r\n{}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def serve(app: Any) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=HttpProtocol,
                                           lifespan="off", log_level="warning"))
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, port


def test_the_server_tells_the_watch_that_the_client_went_away() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        watch = ClientWatch(scope, receive)
        seen["watch"], seen["registry"] = watch, scope["extensions"][CLIENT_GONE]
        seen["state"] = scope["extensions"][CONNECTION]
        seen["state"]["key_hash"] = ("sk-the-clients-key", "its hash")  # as the gateway keeps
        seen["waiting"].set()
        try:
            await asyncio.sleep(60)  # an engine that takes its time
        except asyncio.CancelledError:
            seen["swallowed"] = watch.swallow()
        finally:
            watch.stop()
            seen["done"].set()

    async def main() -> None:
        seen["waiting"], seen["done"] = asyncio.Event(), asyncio.Event()
        server, serving, port = await serve(app)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            await asyncio.wait_for(seen["waiting"].wait(), 10)
            watch = seen["watch"]
            assert watch.watcher is None  # no task: the protocol calls it
            assert len(seen["registry"]) == 1
            writer.close()
            await asyncio.wait_for(seen["done"].wait(), 10)
            assert watch.gone and seen["swallowed"]
            assert not seen["registry"]
            assert seen["state"] == {}  # the key it was sent is not kept past the connection
        finally:
            server.should_exit = True
            await serving

    asyncio.run(main())


def test_a_stopped_watch_is_not_told_and_the_connection_serves_on() -> None:
    """Keep-alive: a request that ended leaves nothing behind for the next one to trip on."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        watch = ClientWatch(scope, receive)
        watch.stop()
        assert not scope["extensions"][CLIENT_GONE]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def main() -> None:
        server, serving, port = await serve(app)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(3):
                writer.write(REQUEST)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200")
                assert await reader.readexactly(2) == b"ok"
            writer.close()
        finally:
            server.should_exit = True
            await serving

    asyncio.run(main())


def test_without_the_extension_a_task_waits_on_receive() -> None:
    async def main() -> None:
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def request() -> bool:
            watch = ClientWatch({"type": "http"}, receive)
            assert watch.watcher is not None
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                return watch.swallow()
            finally:
                watch.stop()
            return False

        task = asyncio.get_running_loop().create_task(request())
        gone.set()
        assert await asyncio.wait_for(task, 10) is True

        # Stopped before the client goes: nothing is cancelled.
        gone.clear()

        async def finished() -> str:
            watch = ClientWatch({"type": "http"}, receive)
            watch.stop()
            gone.set()
            await asyncio.sleep(0.05)
            return "finished"

        assert await asyncio.wait_for(finished(), 10) == "finished"

    asyncio.run(main())
