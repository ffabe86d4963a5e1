"""The least a proxy on the gateway's stack can add: an ASGI app on uvicorn (httptools, uvloop)
that sends each request's body to one upstream with the gateway's upstream client
(app/services/upstream.py, on aiohttp) and answers with the upstream's body. No key, no rate limit, no JSON,
no routing, no usage, no metrics: benchmarks/gateway.py runs it as the target "bare-proxy", so
that the gateway's added latency can be read against the floor of any proxy built this way on
the same machine.

    BARE_PROXY_UPSTREAM=http://127.0.0.1:PORT/v1/chat/completions BARE_PROXY_KEY=KEY \\
        .venv/bin/python -m uvicorn benchmarks.bare_proxy:app --loop uvloop --http httptools
"""

from __future__ import annotations

import os
from typing import Any

from app.services.upstream import UpstreamClient

URL = os.environ.get("BARE_PROXY_UPSTREAM", "")
HEADERS = {"Content-Type": "application/json",
           "Authorization": f"Bearer {os.environ.get('BARE_PROXY_KEY', '')}"}
_client: list[UpstreamClient] = []  # made in the server's event loop


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        if _client:
            await _client[0].aclose()
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    status, content_type, answer = await forward(await read_body(receive))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()),
                            (b"content-length", b"%d" % len(answer))]})
    await send({"type": "http.response.body", "body": answer})


async def read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def forward(body: bytes) -> tuple[int, str, bytes]:
    """The upstream's status, content type and body."""
    if not _client:
        _client.append(UpstreamClient(connect_timeout=5, read_timeout=60, max_connections=100))
    response = await _client[0].send(URL, HEADERS, body, {}, "bare")
    try:
        answer = await response.read()
    finally:
        response.close()
    return response.status, response.header("content-type") or "", answer

