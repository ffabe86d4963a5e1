"""``Upstream``: a real, fast OpenAI-compatible server that the gateway tests and the gateway
benchmark route to. It stands where a deployment's ``vllm serve`` stands:
it serves chat completions under any model name, streaming fixed tokens or not, with usage.

It is a fixture we own, not a double of an external service: a raw ASGI app (no framework, so it
costs next to nothing per request) on uvicorn, on a free 127.0.0.1 port, in a thread of the test
process (``Upstream.start()``) or as its own process (``python -m tests.support.upstream``).

Endpoints (all but ``/health`` need ``Authorization: Bearer <key>``; 401 otherwise):

``GET  /health``                 200, empty body (vLLM's readiness probe)
``GET  /v1/models``              the configured model names
``POST /v1/chat/completions``    ``stream`` false: one JSON completion; true: SSE chunks (a role
                                 delta, one chunk per token, a finish chunk, the usage chunk when
                                 ``stream_options.include_usage``), then ``data: [DONE]``
``GET  /_control/requests``      what it received (``?tag=`` filters), for assertions
``POST /_control/reset``         forget the recorded requests

Usage is deterministic: ``prompt_tokens`` = the number of whitespace-separated words in the
messages' contents, ``completion_tokens`` = the number of tokens sent (``TOKENS`` cycled).

A request steers its own completion with an extra body field (the gateway forwards bodies
unchanged), e.g. ``extra_body={"upstream_control": {"fail": 500}}`` with the openai SDK:

``tag``         a string recorded with the request, to find it in ``/_control/requests``
``tokens``      completion tokens to send (default 8, or ``--tokens``)
``delay``       seconds between streamed chunks (default 0, or ``--delay``); not streaming:
                ``tokens * delay`` before the answer
``fail``        answer this HTTP status with an OpenAI-shaped error instead
``vllm_error``  with ``fail``: the error as vLLM 0.32 shapes it (``type`` an exception name such
                as ``BadRequestError``, ``code`` the status as a number) with this message
``die_after``   streaming: send this many token chunks, then drop the connection mid-body (the
                chunked encoding is never terminated, as when the server process dies)
``acceptance_length``  add vLLM's per-request ``metrics.speculative_decoding`` with this mean
                acceptance length (streaming: on the usage chunk, as vLLM sends it)

Each recorded request: ``tag``, ``model``, ``stream``, ``authorized``, ``body`` (the JSON it got),
``chunks_sent``, ``completed`` (the whole response went out), ``disconnected`` (the client went
away before the end: the gateway aborted the upstream request) and ``died`` (``die_after`` fired).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

TOKENS = ["Hello", " from", " the", " upstream", ",", " one", " token", " each", "."]
HOST = "127.0.0.1"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Died(Exception):
    """Raised inside a streaming response to make uvicorn drop the connection mid-body."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _error(status: int, message: str, type_: str, code: str | int | None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None,
                                 "code": code}}).encode()


def count_words(messages: Any) -> int:
    total = 0
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content.split())
        elif isinstance(content, list):  # content parts
            total += sum(len(p.get("text", "").split()) for p in content if isinstance(p, dict))
    return total


def spec_decode_metrics(acceptance_length: float, steps: int = 4, k: int = 3) -> dict[str, Any]:
    """vLLM's ``metrics`` with ``--per-request-spec-decode-metrics summary``, for a request
    whose mean acceptance length is ``acceptance_length`` (the other figures consistent)."""
    accepted = round((acceptance_length - 1) * steps)
    return {"speculative_decoding": {
        "mean_acceptance_length": acceptance_length,
        "draft_acceptance_rate": accepted / (steps * k), "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted, "num_draft_tokens": steps * k,
        "num_spec_tokens": k}}


class UpstreamApp:
    """The ASGI app. ``requests`` is the record of what it received (thread-safe appends)."""

    def __init__(self, key: str, models: list[str] | None = None, tokens: int = 8,
                 delay: float = 0.0) -> None:
        self.key = key
        self.tokens, self.delay = tokens, delay  # defaults for requests that set no control
        self.auth = f"Bearer {key}".encode()
        self.models = models or []
        self.requests: list[dict[str, Any]] = []
        self.created = int(time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path == "/health":
            return await self._json(send, 200, b"")
        if path.startswith("/_control/"):
            return await self._control(scope, receive, send, path)
        authorized = dict(scope["headers"]).get(b"authorization") == self.auth
        if path == "/v1/chat/completions" and method == "POST":
            body = await self._body(receive)
            return await self._chat(scope, receive, send, body, authorized)
        if not authorized:
            return await self._json(send, 401, _error(401, "Invalid upstream key",
                                                      "invalid_request_error", "invalid_api_key"))
        if path == "/v1/models" and method == "GET":
            data = [{"id": m, "object": "model", "created": self.created, "owned_by": "upstream"}
                    for m in self.models]
            listing = {"object": "list", "data": data}
            return await self._json(send, 200, json.dumps(listing).encode())
        await self._json(send, 404, _error(404, f"No route {method} {path}",
                                           "invalid_request_error", "not_found"))

    # --- helpers ---------------------------------------------------------------------------

    @staticmethod
    async def _body(receive: Receive) -> bytes:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                return b"".join(chunks)

    @staticmethod
    async def _json(send: Send, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]] | None = None) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), *(headers or [])]})
        await send({"type": "http.response.body", "body": body})

    async def _control(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        await self._body(receive)
        if path == "/_control/requests":
            tag = parse_qs(scope["query_string"].decode()).get("tag", [None])[0]
            rows = [r for r in list(self.requests) if tag is None or r["tag"] == tag]
            return await self._json(send, 200, json.dumps(rows).encode())
        if path == "/_control/reset":
            self.requests.clear()
            return await self._json(send, 200, b"{}")
        await self._json(send, 404, b"{}")

    # --- chat completions ------------------------------------------------------------------

    async def _chat(self, scope: Scope, receive: Receive, send: Send, raw: bytes,
                    authorized: bool) -> None:
        try:
            body = json.loads(raw)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            return await self._json(send, 400, _error(400, "Body is not a JSON object",
                                                      "invalid_request_error", None))
        control = body.get("upstream_control") or {}
        record: dict[str, Any] = {
            "tag": control.get("tag"), "model": body.get("model"),
            "stream": bool(body.get("stream")),
            "authorized": authorized, "body": body, "chunks_sent": 0, "completed": False,
            "disconnected": False, "died": False, "received_at": time.time()}
        self.requests.append(record)
        if len(self.requests) > 10_000:  # the benchmark sends many: keep the newest
            del self.requests[:5_000]
        if not authorized:
            return await self._json(send, 401, _error(401, "Invalid upstream key",
                                                      "invalid_request_error", "invalid_api_key"))
        if control.get("fail"):
            status = int(control["fail"])
            kind = "invalid_request_error" if status < 500 else "server_error"
            headers = [(b"retry-after", b"2")] if status == 429 else []
            if control.get("vllm_error"):  # vllm/entrypoints/serve/exception_handling
                return await self._json(send, status, _error(
                    status, control["vllm_error"], "BadRequestError" if status == 400
                    else "NotFoundError" if status == 404 else "InternalServerError", status))
            return await self._json(send, status, _error(status, f"upstream failure {status}",
                                                         kind, "upstream_test_failure"), headers)
        if not isinstance(body.get("messages"), list) or not body.get("model"):
            return await self._json(send, 400, _error(400, "'model' and 'messages' are required",
                                                      "invalid_request_error", None))
        n_tokens = int(control.get("tokens", self.tokens))
        prompt = count_words(body["messages"])
        usage = {"prompt_tokens": prompt, "completion_tokens": n_tokens,
                 "total_tokens": prompt + n_tokens}
        ident = f"chatcmpl-{time.monotonic_ns():x}"
        created = int(time.time())
        if not body.get("stream"):
            delay = float(control.get("delay", self.delay))
            if delay and await self._client_left(receive, delay * n_tokens):
                record["disconnected"] = True  # the client went away while we "generated"
                return
            text = "".join(TOKENS[i % len(TOKENS)] for i in range(n_tokens))
            out = {"id": ident, "object": "chat.completion", "created": created,
                   "model": body["model"],
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": "stop"}],
                   "usage": usage}
            if control.get("acceptance_length") is not None:
                out["metrics"] = spec_decode_metrics(float(control["acceptance_length"]))
            await self._json(send, 200, json.dumps(out).encode())
            record["completed"] = True
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        await self._stream(receive, send, record, body["model"], ident, created, n_tokens,
                           usage if include_usage else None,
                           float(control.get("delay", self.delay)),
                           control.get("die_after"), control.get("acceptance_length"))

    @staticmethod
    async def _client_left(receive: Receive, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as the client disconnects."""
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        try:
            await asyncio.wait_for(watch(), seconds)
            return True
        except TimeoutError:
            return False

    async def _stream(self, receive: Receive, send: Send, record: dict[str, Any], model: str,
                      ident: str, created: int, n_tokens: int, usage: dict[str, int] | None,
                      delay: float, die_after: int | None,
                      acceptance_length: float | None = None) -> None:
        head = (f'{{"id":"{ident}","object":"chat.completion.chunk","created":{created},'
                f'"model":{json.dumps(model)},"choices":[')
        tail = ',"usage":null}' if usage is not None else "}"

        def chunk(delta: str, finish: str | None = None) -> bytes:
            reason = f'"{finish}"' if finish else "null"
            return (f'data: {head}{{"index":0,"delta":{delta},"logprobs":null,'
                    f'"finish_reason":{reason}}}]{tail}\n\n').encode()

        disconnected = asyncio.Event()

        async def watch() -> None:  # the client going away shows up as http.disconnect
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"),
                                    (b"cache-control", b"no-cache")]})
            events = [chunk('{"role":"assistant","content":""}')]
            events += [chunk(json.dumps({"content": TOKENS[i % len(TOKENS)]}))
                       for i in range(n_tokens)]
            events.append(chunk("{}", "stop"))
            if usage is not None:  # vLLM's per-request metrics ride the usage chunk
                metrics = ("" if acceptance_length is None else ',"metrics":'
                           + json.dumps(spec_decode_metrics(float(acceptance_length))))
                events.append((f'data: {head}],"usage":{json.dumps(usage)}{metrics}}}\n\n')
                              .encode())
            events.append(b"data: [DONE]\n\n")
            for i, event in enumerate(events):
                if die_after is not None and i > int(die_after):  # the role chunk, then tokens
                    record["died"] = True
                    raise Died("upstream_control.die_after")
                if disconnected.is_set():
                    record["disconnected"] = True
                    return
                await send({"type": "http.response.body", "body": event, "more_body": True})
                record["chunks_sent"] = i + 1
                if delay and i < len(events) - 1:
                    await asyncio.sleep(delay)  # a disconnect is seen at the next chunk
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            record["completed"] = True
        finally:
            watcher.cancel()
            if disconnected.is_set() and not record["completed"]:
                record["disconnected"] = True


class _QuietDied(logging.Filter):
    """uvicorn logs the deliberate ``Died`` as an ASGI exception: keep the test output clean."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], Died))


class Upstream:
    """The server on a free 127.0.0.1 port, in a background thread of this process."""

    def __init__(self, key: str, models: list[str] | None = None, port: int | None = None,
                 tokens: int = 8, delay: float = 0.0, keep_alive: int = 5) -> None:
        self.app = UpstreamApp(key, models, tokens, delay)
        self.keep_alive = keep_alive  # seconds an idle connection stays open (uvicorn's 5)
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def key(self) -> str:
        return self.app.key

    def start(self, timeout: float = 20) -> "Upstream":
        import uvicorn

        config = uvicorn.Config(self.app, host=HOST, port=self.port, log_level="warning",
                                access_log=False, lifespan="on",
                                timeout_keep_alive=self.keep_alive)
        self._server = uvicorn.Server(config)
        logging.getLogger("uvicorn.error").addFilter(_QuietDied())
        self._thread = threading.Thread(target=self._server.run, name="upstream", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"upstream did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def requests(self, tag: str | None = None) -> list[dict[str, Any]]:
        return [r for r in list(self.app.requests) if tag is None or r["tag"] == tag]

    def __enter__(self) -> "Upstream":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.support.upstream --port N --key K [--model NAME ...] [--tokens N]
    [--delay S]``"""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--tokens", type=int, default=8, help="completion tokens by default")
    parser.add_argument("--delay", type=float, default=0.0,
                        help="seconds between streamed chunks by default (a model's pace)")
    args = parser.parse_args(argv)
    logging.getLogger("uvicorn.error").addFilter(_QuietDied())
    uvicorn.run(UpstreamApp(args.key, args.model, args.tokens, args.delay), host=args.host,
                port=args.port, log_level="warning", access_log=False, lifespan="on")


if __name__ == "__main__":
    main()
