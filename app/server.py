"""The HTTP protocol `specdeck api` serves with: uvicorn's own (httptools), which also tells the
app at once when a client goes away, without a task per request waiting on ``receive()``, and
answers one route directly, past the per-request machinery of ASGI.

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

**A route answered directly** (``DirectRoute``: the gateway's chat completions). An app may
name one POST route in its ``direct_route`` attribute. A request to it, its URL exactly the
route's path, is collected by the protocol (``DirectCycle``, in the place of uvicorn's cycle)
and, once its body is whole, answered by ``DirectRoute.answer`` in a task of its own, without
uvicorn's cycle, its ASGI wrapper, the parsing of its URL, and the two ASGI messages of a
response (each checked and written on its own): a Starlette ``Response`` whose body is whole
(its class keeps ``Response.__call__``) goes out in one write, status line, headers and body.
Any other answer (a stream), an exception, or a body that grows past uvicorn's high-water mark
before it is whole gets uvicorn's own cycle then, with its ``receive`` and ``send``, flow control
and error handling. Everything else about the connection stays uvicorn's: keep-alive,
pipelining (a request that arrives while another is answered waits, on the ASGI way), a client
that goes away, a graceful shutdown, the access log. A request with ``Expect: 100-continue``, a
query string, or a concurrency limit set goes the ASGI way, to the same app. That way cost about
28 us of CPU a request more, pinned to one CPU, on an Intel VM, and uvicorn's cycle 13 us more
than a ``DirectCycle`` on an AMD one (docs/benchmarks.md, "The ASGI layer", "A lighter
cycle").

**One keep-alive timer per connection** (``app.deadline.Deadline``), where uvicorn makes and
cancels one per request (docs/benchmarks.md, "Timers").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from app.deadline import Deadline

CLIENT_GONE = "specdeck.client_gone"
# A dict that lives as long as the client's connection, for what the app may reuse from one
# request to the next on it (the gateway: the hash of the last API key it was sent).
CONNECTION = "specdeck.connection"

Answer = Callable[[Scope, Receive, bytes | None], Awaitable[Response | ASGIApp | None]]


class DirectRoute(NamedTuple):
    """A POST route that ``HttpProtocol`` answers directly: ``answer(scope, receive, body)``
    (``body``: the request's, whole, or None when it was too large to hold and is read with
    ``receive``) returns the response (a whole Starlette ``Response`` or an ASGI
    app), or None when the client went away and nothing is to be sent. ``access_log``: False
    leaves its requests out of uvicorn's access log."""

    path: str
    answer: Answer
    access_log: bool = True


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the ``CLIENT_GONE`` and ``CONNECTION`` extensions in
    each scope, and the app's ``direct_route`` answered directly."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.keep_alive = Deadline(self.loop, self.timeout_keep_alive_handler)
        self.client_gone: set[Callable[[], None]] = set()
        self.connection_state: dict[str, Any] = {}
        self.direct_route: DirectRoute | None = getattr(self.app, "direct_route", None)
        self.direct_path = b"" if self.direct_route is None else self.direct_route.path.encode()
        super().connection_made(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.keep_alive.clear()
        extensions = {CLIENT_GONE: self.client_gone, CONNECTION: self.connection_state}
        self.scope["extensions"] = extensions  # type: ignore[typeddict-unknown-key]

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.keep_alive.cancel()
        self.connection_state.clear()  # the last key sent on it goes with the connection
        gone, self.client_gone = self.client_gone, set()
        for callback in gone:
            callback()

    def on_response_complete(self) -> None:
        """uvicorn's, but for the keep-alive timeout: a ``Deadline`` of the connection's, where
        uvicorn makes a timer for each answer and cancels it when the next request comes.
        uvicorn's own timer is never armed; its handler closes the connection."""
        if self.pipeline or self.transport.is_closing():
            super().on_response_complete()  # starts the next pipelined request; or nothing
            return
        self.server_state.total_requests += 1
        self.flow.resume_reading()
        self.keep_alive.set(self.timeout_keep_alive)

    def on_headers_complete(self) -> None:
        route = self.direct_route
        if (route is None or self.url != self.direct_path or self.parser.get_method() != b"POST"
                or self.expect_100_continue or self.limit_concurrency is not None
                or (self.cycle is not None and not self.cycle.response_complete)
                or self.parser.should_upgrade()):
            super().on_headers_complete()  # the ASGI way
            return
        http_version = self.parser.get_http_version()
        scope = self.scope
        scope["method"] = "POST"
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = self.root_path + route.path
        scope["raw_path"] = self.root_path.encode("ascii") + self.direct_path
        scope["query_string"] = b""
        self.cycle = DirectCycle(
            scope, self, self.access_log and route.access_log,
            keep_alive=http_version != "1.0" and self.parser.should_keep_alive())

    def on_body(self, body: bytes) -> None:
        request = self.cycle
        if type(request) is not DirectCycle:
            super().on_body(body)
            return
        request.body += body
        if len(request.body) > HIGH_WATER_LIMIT:  # a large body: read as it comes, with
            cycle = self.uvicorn_cycle(request)   # uvicorn's flow control
            cycle.body, cycle.more_body = bytearray(request.body), True
            cycle.message_event.set()
            self.flow.pause_reading()
            self.start(self.answer_directly(cycle, self.direct_route.answer))  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        request = self.cycle
        if type(request) is not DirectCycle:
            super().on_message_complete()
            return
        self.start(self.answer_whole(request, self.direct_route.answer))  # type: ignore[union-attr]

    def start(self, answering: Awaitable[None]) -> None:
        task = self.loop.create_task(answering)  # type: ignore[arg-type]
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def answer_whole(self, request: DirectCycle, answer: Answer) -> None:
        """Answer a request whose body came whole. A whole answer is written here; anything
        else (a stream, an exception, no answer) is left to uvicorn's cycle, made now, which
        sends it, or logs the error and answers 500, as for any request."""
        try:
            response = await answer(request.scope, request.receive, bytes(request.body))
            if is_whole(response):
                write_whole(request, response)
                return
        except BaseException as exc:
            response = raising(exc)
        await self.uvicorn_cycle(request).run_asgi(response or answered_nothing)

    async def answer_directly(self, cycle: RequestResponseCycle, answer: Answer) -> None:
        """Answer a request whose body is read as it comes (with ``receive``)."""
        async def respond(scope: Scope, receive: Receive, send: Any) -> None:
            response = await answer(scope, receive, None)
            if is_whole(response):
                write_whole(cycle, response)
            elif response is not None:
                await response(scope, receive, send)

        await cycle.run_asgi(respond)  # its handling of errors and of an answer never sent

    def uvicorn_cycle(self, request: DirectCycle) -> RequestResponseCycle:
        """uvicorn's own cycle for ``request``, in its place: the body is taken."""
        cycle = RequestResponseCycle(
            scope=request.scope, transport=self.transport, flow=self.flow, logger=self.logger,
            access_logger=self.access_logger, access_log=request.access_log,
            default_headers=self.server_state.default_headers, message_event=asyncio.Event(),
            expect_100_continue=False, keep_alive=request.keep_alive,
            on_response=self.on_response_complete)
        cycle.more_body, cycle.disconnected = False, request.disconnected
        if self.cycle is request:
            self.cycle = cycle
        return cycle


class DirectCycle:
    """A request to the direct route while its body comes and its whole answer is made, in the
    protocol's ``cycle`` in place of uvicorn's: what uvicorn's protocol reads and sets of a cycle
    (``response_complete`` for pipelining, ``disconnected`` and ``message_event`` when the
    connection is lost, ``keep_alive`` at a graceful shutdown) and what ``write_whole`` needs, in
    slots, without uvicorn's per-request machinery (its cycle, an ``asyncio.Event``, the ASGI
    wrapper): 13-14 us of a request's way, pinned (docs/benchmarks.md, "A lighter cycle")."""

    __slots__ = ("scope", "transport", "access_log", "access_logger", "default_headers",
                 "on_response", "keep_alive", "body", "disconnected", "response_started",
                 "response_complete", "message_event")

    def __init__(self, scope: Scope, protocol: HttpProtocol, access_log: bool,
                 keep_alive: bool) -> None:
        self.scope, self.transport = scope, protocol.transport
        self.access_log, self.access_logger = access_log, protocol.access_logger
        self.default_headers = protocol.server_state.default_headers
        self.on_response, self.keep_alive = protocol.on_response_complete, keep_alive
        self.body = b""
        self.disconnected = self.response_started = self.response_complete = False
        self.message_event: Any = UNWATCHED

    async def receive(self) -> dict[str, Any]:
        """ASGI's ``receive`` once the body is taken: the client's going away."""
        if not self.disconnected and not self.response_complete:
            self.message_event = asyncio.Event()  # set by uvicorn when the connection is lost
            await self.message_event.wait()
        return {"type": "http.disconnect"}


class _Unwatched:
    """A direct request's ``message_event`` until ``receive`` waits on one."""

    def set(self) -> None:
        pass


UNWATCHED = _Unwatched()


def raising(exc: BaseException) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Any) -> None:
        raise exc

    return app


async def answered_nothing(scope: Scope, receive: Receive, send: Any) -> None:
    """An answer of None: the client went away (or the app failed to answer: uvicorn's 500)."""


class JSONBody(Response):
    """A whole JSON answer, its bytes as they are: ``Response(body,
    media_type="application/json")``, made without Starlette's general ``__init__``, its two
    headers known to ``write_whole`` (nothing in them to check): 6-7 us off each of the gateway's
    completions, pinned (docs/benchmarks.md, "A lighter cycle")."""

    media_type = "application/json"

    def __init__(self, body: bytes) -> None:
        self.status_code, self.background, self.body = 200, None, body
        self.raw_headers = [(b"content-length", b"%d" % len(body)),
                            (b"content-type", b"application/json")]


def is_whole(response: Any) -> bool:
    """A Starlette ``Response`` that sends its body in one message, with a body to send and
    nothing to run after it."""
    return (isinstance(response, Response) and type(response).__call__ is Response.__call__
            and 200 <= response.status_code and response.status_code not in (204, 304)
            and response.background is None)


def write_whole(cycle: RequestResponseCycle | DirectCycle, response: Response) -> None:
    """What uvicorn's ``cycle.send`` does with a response's start and its one body message, in
    one write."""
    if cycle.disconnected:
        return
    status, body = response.status_code, response.body
    if cycle.access_log:
        cycle.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(cycle.scope),
                                 cycle.scope["method"], get_path_with_query_string(cycle.scope),
                                 cycle.scope["http_version"], status)
    content = [STATUS_LINE[status]]
    for name, value in cycle.default_headers:  # uvicorn's own (server, date)
        content += (name, b": ", value, b"\r\n")
    length = close = False
    check = type(response) is not JSONBody  # its headers are made above
    for name, value in response.raw_headers:
        if check and (HEADER_RE.search(name) or HEADER_VALUE_RE.search(value)):
            raise RuntimeError("Invalid HTTP header.")
        if name == b"content-length":
            if check and int(value) != len(body):
                raise RuntimeError("Response content length differs from Content-Length")
            length = True
        elif name == b"connection" and b"close" in value.lower():
            close = True
        content += (name, b": ", value, b"\r\n")
    if not length:
        content.append(b"content-length: %d\r\n" % len(body))
    if close:
        cycle.keep_alive = False
    elif not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    content += (b"\r\n", body)
    cycle.response_started = True
    cycle.transport.write(b"".join(content))
    cycle.response_complete = True
    cycle.message_event.set()
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()
