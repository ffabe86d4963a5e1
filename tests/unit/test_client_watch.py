"""The gateway's watch on its client (``ClientWatch`` in app/services/gateway.py), served by
uvicorn as `specdeck api` serves it: a task waiting on ``receive()`` learns that the client went
away, and the request's task is cancelled where it waits, only while the watch is armed."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn

from app.services.gateway import ClientWatch

REQUEST = b"POST /wait HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\n\r\n{}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def serve(app: Any) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http="httptools",
                                           lifespan="off", log_level="warning"))
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, port


def test_the_watch_learns_that_the_client_went_away() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the body
        watch = ClientWatch(receive)
        seen["watch"] = watch
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
            writer.close()
            await asyncio.wait_for(seen["done"].wait(), 10)
            assert seen["watch"].gone and seen["swallowed"]
        finally:
            server.should_exit = True
            await serving

    asyncio.run(main())


def test_a_stopped_watch_is_not_told_and_the_connection_serves_on() -> None:
    """Keep-alive: a request that ended leaves nothing behind for the next one to trip on."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        watch = ClientWatch(receive)
        watch.stop()
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


def test_the_watch_cancels_only_while_armed() -> None:
    async def main() -> None:
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def request() -> bool:
            watch = ClientWatch(receive)
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
            watch = ClientWatch(receive)
            watch.stop()
            gone.set()
            await asyncio.sleep(0.05)
            return "finished"

        assert await asyncio.wait_for(finished(), 10) == "finished"

    asyncio.run(main())
