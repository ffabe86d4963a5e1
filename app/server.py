"""The HTTP protocol `specdeck api` serves with: uvicorn's own (httptools), which also tells the
app at once when a client goes away, without a task per request waiting on ``receive()``.

ASGI's one way to learn that a client went away is a ``receive()`` that returns
``http.disconnect``: the gateway, which must abort an engine's request when its client goes,
had a task per request waiting on it, and each cost about 17 us of CPU, most of it right after
the request went upstream and after its answer went back, where, on a small VM, the process
that was just woken waits for it (docs/benchmarks.md, "Work after a write"). Here each
request's scope carries ``scope["extensions"][CLIENT_GONE]``: a set of callables of that
connection, each called once when the connection is lost; the app adds one while it waits and
discards it when done. Served by another server, the app falls back to the task
(``app.services.gateway.ClientWatch``).

Each scope also carries ``scope["extensions"][CONNECTION]``, a dict of that connection, kept as
long as it lives, where the app keeps what it may reuse from one request to the next on it (the
gateway: the hash of the last API key sent, which cost 4-5 us of each request's CPU to hash
again: docs/benchmarks.md, "Pinned to one CPU").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

CLIENT_GONE = "specdeck.client_gone"
# A dict that lives as long as the client's connection, for what the app may reuse from one
# request to the next on it (the gateway: the hash of the last API key it was sent).
CONNECTION = "specdeck.connection"


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the ``CLIENT_GONE`` and ``CONNECTION`` extensions in
    each scope."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.client_gone: set[Callable[[], None]] = set()
        self.connection_state: dict[str, Any] = {}
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        extensions = {CLIENT_GONE: self.client_gone, CONNECTION: self.connection_state}
        self.scope["extensions"] = extensions  # type: ignore[typeddict-unknown-key]

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.connection_state.clear()  # the last key sent on it goes with the connection
        gone, self.client_gone = self.client_gone, set()
        for callback in gone:
            callback()
