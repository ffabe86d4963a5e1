"""/v1: the OpenAI-compatible gateway in front of the project's deployments.

``GET /v1/models`` lists the ready deployments of the caller's project; ``POST
/v1/chat/completions`` (streaming or not) goes to the deployment named by ``model``, over the
app's pooled HTTP client, with the engine's internal key (never shown to the caller).

A deployment with replicas is served by those that are ready (``Balancer``): each request goes
to the one with the fewest requests in flight from this API process (ties in turn). One that
refuses the connection or breaks before answering is ejected for
SPECDECK_GATEWAY_REPLICA_EJECT_SECONDS (unless every replica is) and the request goes once more,
to another replica: the errors below come when the route has no other, or it fails too. Neither
a timeout (the engine may still be working on the request) nor an engine's HTTP answer is
retried. Usage and capture name the deployment, whichever replica served.

Status codes follow what openai-python retries (408, 409, 429 and 5xx): a request that must not
be retried never gets one of those.

==========================================  ======  ====================================
a missing or invalid key                     401     ``missing_api_key``, ``invalid_api_key``
over the key's rate limit                    429     ``rate_limit_exceeded`` + Retry-After
body over SPECDECK_MAX_BODY_BYTES            413     ``request_too_large``
bad JSON, ``n`` != 1, ``max_tokens`` over    400     ``invalid_json``, ``invalid_value``
the cap, a missing ``model``                         (``param`` names the field)
no such model in the project (or another     404     ``model_not_found``
project's, or stopping/stopped/failed)
the deployment is pending or starting        503     ``model_not_ready`` + Retry-After
no ready replica with a usable address, or   503     ``upstream_unavailable`` + Retry-After
the upstream refuses connections, or does
not accept one within the connect timeout
no answer within the upstream timeout        504     ``upstream_timeout``
the upstream failed (5xx, bad answer)        502     ``upstream_error``
the upstream refused the gateway's key       502     ``upstream_auth_failed``
the upstream answered 4xx                    same    its message, in this shape
the database is down and nothing is cached   503     ``service_unavailable`` + Retry-After
==========================================  ======  ====================================

Streaming: the first upstream chunk is read before the response starts, so a failure up to then
is one of the HTTP errors above (or a retry on another replica). Chunks are then passed through
as they come; the stream always ends with ``data: [DONE]``, or, when the upstream dies
mid-stream, with a final ``data: {"error": {...}}`` event (``upstream_error``;
``upstream_timeout`` when it sends nothing for SPECDECK_GATEWAY_UPSTREAM_TIMEOUT_SECONDS). When
the client disconnects, the upstream request is closed at once (the upstream sees its client go
away). Usage comes from the upstream's ``usage`` (the gateway asks for
``stream_options.include_usage`` and drops that chunk again when the client did not ask for it)
and is recorded per key in batches.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response, Security
from starlette import routing
from starlette.types import Receive, Scope, Send

from app.api.deps import bearer
from app.errors import (
    OPENAI_TYPES,
    APIError,
    ErrorResponse,
    echo,
    error_body,
    error_responses,
)
from app.middleware import too_large
from app.schemas.common import inline_schema
from app.schemas.openai import ChatCompletionRequest, Model, ModelList
from app.services.capture import EVENT_SPLIT, Sampled, event_json
from app.services.limits import EARLY_REFUSED, Verdict
from app.services.gateway import (
    Caller,
    ClientWatch,
    Gateway,
    ProjectRoutes,
    Route,
    gateway_lifespan,
    get_gateway,
)
from app.services.upstream import (
    Check,
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeout,
)
from app.services.state import DeploymentStatus

router = APIRouter(prefix="/v1", tags=["openai"], lifespan=gateway_lifespan,
                   dependencies=[Security(bearer)], responses=error_responses(401, 429, 503))

_WWW_AUTH = {"WWW-Authenticate": "Bearer"}
_NOT_READY = frozenset({DeploymentStatus.PENDING.value, DeploymentStatus.STARTING.value})
_ROUTABLE = _NOT_READY | {DeploymentStatus.READY.value}
_JSON = "application/json"


# --- auth, limits, routing ---------------------------------------------------------------------

async def authenticate(gateway: Gateway, header: str | None) -> Caller:
    """The caller of an Authorization header (401 if none)."""
    if not header:
        raise APIError(401, "Missing API key: send 'Authorization: Bearer <key>'",
                       code="missing_api_key", headers=_WWW_AUTH)
    scheme, _, token = header.partition(" ")
    token = token.strip()
    try:
        caller = (await gateway.caller(token) if token and scheme.lower() == "bearer"
                  else None)
    except Exception:  # the database is unreachable and the key is not cached: logged by the cache
        raise unavailable(gateway) from None
    if caller is None:
        raise APIError(401, "Invalid API key", code="invalid_api_key", headers=_WWW_AUTH)
    return caller


async def authenticate_limited(gateway: Gateway, header: str | None) -> Caller:
    """The caller, within their key's rate limit (429 past it)."""
    caller = await authenticate(gateway, header)
    if gateway.limiter.enabled:
        await enforce(gateway, gateway.limiter.ask(caller.key_id))
    return caller


async def enforce(gateway: Gateway, verdict: Verdict | None) -> None:
    """429 if the rate limit refused the request (awaiting its answer); once per request."""
    if verdict is None or verdict.checked:
        return
    verdict.checked = True
    if (wait := verdict.result if verdict.answered else await verdict.wait()) is not None:
        if verdict.early:
            EARLY_REFUSED.inc()
        raise APIError(429, "Rate limit exceeded for this API key; retry after the number of "
                       "seconds in Retry-After", code="rate_limit_exceeded",
                       headers={"Retry-After": gateway.retry_after(wait)})


def unavailable(gateway: Gateway) -> APIError:
    return APIError(503, "The gateway cannot reach its database; retry shortly",
                    code="service_unavailable",
                    headers={"Retry-After": gateway.unavailable_retry_after})


async def routes_of(gateway: Gateway, caller: Caller) -> ProjectRoutes:
    try:
        return await gateway.project_routes(caller.project_id)
    except Exception:  # the database is unreachable and the project is not cached
        raise unavailable(gateway) from None


async def resolve(gateway: Gateway, caller: Caller, model: str) -> Route:
    route = (await routes_of(gateway, caller)).by_name.get(model)
    if route is None or route.status not in _ROUTABLE:
        raise APIError(404, f"The model '{echo(model)}' does not exist or is not deployed",
                       code="model_not_found", param="model")
    if route.status in _NOT_READY:
        raise APIError(503, f"The model '{echo(model)}' is starting; retry shortly",
                       code="model_not_ready",
                       headers={"Retry-After": gateway.starting_retry_after})
    if not route.replicas:
        raise APIError(503, f"The model '{echo(model)}' is not reachable right now",
                       code="upstream_unavailable",
                       headers={"Retry-After": gateway.unavailable_retry_after})
    return route


def invalid(message: str, param: str | None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, code=code, param=param, type="invalid_request_error")


# orjson parses 1,024 levels deep. Python's json, which the engines parse a request with (vLLM,
# SGLang), fails at fewer: its recursion limit, 1,000 frames less its own stack. A body with this
# many brackets is parsed by json.loads too, so that what an engine could not parse is refused
# here, never sent (rarely: a chat request nests a dozen levels and has a few dozen brackets).
_BRACKETS_CHECKED = 500


def parse_body(raw: bytes) -> Any:
    """The request's JSON, by orjson (a quarter of json.loads' time: docs/benchmarks.md); 400
    if it is not valid or nests too deep for Python's json."""
    try:
        body = orjson.loads(raw)  # orjson.JSONDecodeError is a ValueError
        if raw.count(b"[") + raw.count(b"{") > _BRACKETS_CHECKED:
            json.loads(raw)
    except (ValueError, RecursionError):
        raise invalid("The request body is not valid JSON", None, "invalid_json") from None
    return body


def check_request(body: Any, cap: int) -> tuple[str, bool]:
    """The model and whether to stream; raises 400 for what the gateway refuses."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object", None, "invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required: the name of a deployment", "model",
                      "missing_field" if model is None else "invalid_value")
    stream = body.get("stream")
    if stream is None:
        stream = False
    elif not isinstance(stream, bool):
        raise invalid("'stream' must be true or false", "stream")
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):
        raise invalid("Only n=1 is supported", "n")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if type(value) is not int or value < 1:
            raise invalid(f"'{name}' must be a positive integer", name)
        if value > cap:
            raise invalid(f"'{name}' is {value}, over this gateway's limit of {cap}", name)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options")
    return model, stream


def upstream_body(raw: bytes, body: dict[str, Any], stream: bool) -> tuple[bytes, bool]:
    """The body to forward: the client's bytes, with ``stream_options.include_usage`` added when
    streaming (to record usage). Also: did the client ask for usage itself?

    An omitted ``max_tokens`` is left to the engine: a default of the gateway's cap would be
    refused by a model whose context has less room than that (vLLM answers 400
    when prompt + max_tokens is over the context length)."""
    if not stream:
        return raw, False
    options = body.get("stream_options")
    if options is None and "stream_options" not in body:
        stripped = raw.rstrip()  # a JSON object with at least "model": ends with "}"
        return stripped[:-1] + b',"stream_options":{"include_usage":true}}', False
    client_usage = bool(options and options.get("include_usage"))
    if client_usage:
        return raw, True
    body = {**body, "stream_options": {**(options or {}), "include_usage": True}}
    return json.dumps(body, separators=(",", ":")).encode(), False


# --- upstream errors ---------------------------------------------------------------------------

# The code of an engine's client error that names none of its own.
UPSTREAM_CODES = {400: "invalid_request", 404: "not_found", 422: "invalid_value",
                  429: "rate_limit_exceeded"}
UPSTREAM_MESSAGE_MAX = 2_000  # an engine's message may quote the request


def upstream_error(status: int, content: bytes, retry_after: str | None = None) -> APIError:
    """An upstream's non-200 answer as the gateway's error (never leaking the upstream's key)."""
    if status in (401, 403):
        return APIError(502, "The model server refused the gateway's credentials",
                        code="upstream_auth_failed", type="server_error")
    if status == 503:
        return APIError(503, "The model server is unavailable; retry shortly",
                        code="upstream_unavailable", headers={"Retry-After": "1"})
    if status >= 500 or status < 400:
        return APIError(502, f"The model server failed (HTTP {status})", code="upstream_error",
                        type="server_error")
    message, type_, param, code = f"The model server answered HTTP {status}", None, None, None
    try:
        payload = json.loads(content)
        error = payload.get("error", payload) if isinstance(payload, dict) else {}
        if isinstance(error, str):
            error = {"message": error}
        if isinstance(error, dict):
            message = error.get("message") if isinstance(error.get("message"), str) else message
            # vLLM's type is an exception name ("BadRequestError") and its code the status as a
            # number: OpenAI clients get OpenAI's type for the status, and a code that says what.
            type_ = error.get("type") if error.get("type") in OPENAI_TYPES else None
            param = error.get("param") if isinstance(error.get("param"), str) else None
            code = error.get("code") if isinstance(error.get("code"), str) else None
    except ValueError:
        pass
    if code is None:
        code = ("context_length_exceeded" if "maximum context length" in message
                else UPSTREAM_CODES.get(status, "upstream_error"))
    extra = None
    if status == 429:
        extra = {"Retry-After": retry_after or "1"}
    return APIError(status, echo(message, UPSTREAM_MESSAGE_MAX), code=code, param=param,
                    type=type_, headers=extra)


def transport_error(gateway: Gateway, exc: UpstreamError) -> APIError:
    if isinstance(exc, UpstreamConnectError):
        return APIError(503, "The model server is not reachable; retry shortly",
                        code="upstream_unavailable",
                        headers={"Retry-After": gateway.unavailable_retry_after})
    if isinstance(exc, UpstreamTimeout):
        return APIError(504, "The model server did not answer in time", code="upstream_timeout",
                        type="server_error")
    return APIError(502, f"The model server failed: {type(exc).__name__}", code="upstream_error",
                    type="server_error")


def acceptance_length(metrics: Any) -> float | None:
    """The request's mean acceptance length, from the ``metrics.speculative_decoding`` that
    vLLM adds with ``--per-request-spec-decode-metrics`` (both runtimes); None when
    absent or when no step was drafted."""
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if not isinstance(spec, dict) or spec.get("num_spec_steps") == 0:
        return None
    value = spec.get("mean_acceptance_length")
    if type(value) not in (int, float) or not math.isfinite(value) or value < 1:
        return None
    return float(value)


def record_usage(gateway: Gateway, caller: Caller, route: Route, usage: Any,
                 metrics: Any = None) -> None:
    if isinstance(usage, dict):
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        gateway.usage.add_usage(caller, route, prompt if type(prompt) is int else 0,
                                completion if type(completion) is int else 0,
                                acceptance_length(metrics) if metrics is not None else None)


# --- streaming ---------------------------------------------------------------------------------

_DONE = b"data: [DONE]\n\n"
_USAGE = re.compile(rb'"usage": ?\{')
_SEPARATORS = (b"\r\n\r\n", b"\n\n", b"\r\r")


def event_end(data: bytes) -> int:
    """The index just past the last complete SSE event in ``data`` (0: none)."""
    end = data.rfind(b"\n\n")
    end = end + 2 if end >= 0 else 0
    crlf = data.rfind(b"\r\n\r\n")
    return max(end, crlf + 4) if crlf >= 0 else end


def sse_error(message: str, code: str) -> bytes:
    body = error_body(502, message, code=code, type="server_error")
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class SSEProxy(Response):
    """Relays an upstream SSE stream whose first chunk has been read already."""

    def __init__(self, gateway: Gateway, caller: Caller, route: Route,
                 upstream: UpstreamResponse, watch: ClientWatch, first: bytes,
                 client_usage: bool, messages: Any) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        self.gateway, self.caller, self.route = gateway, caller, route
        self.upstream, self.watch, self.first = upstream, watch, first
        self.client_usage = client_usage
        # Captured (sampled): the chunks as forwarded, assembled into the reply off the path.
        self.messages, self.captured = messages, ([] if route.sample() else None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            last = await self.relay(send)
            await send({"type": "http.response.body", "body": last, "more_body": False})
            if self.captured is not None:
                self.captured.append(last)
                self.gateway.capture.add_sampled(Sampled(
                    self.route.capture_dataset_id, time.time(),  # type: ignore[arg-type]
                    self.messages, self.captured, True))
        except asyncio.CancelledError:
            if not self.watch.swallow():
                raise  # not the client going away: the server is stopping
        finally:
            self.watch.stop()
            self.upstream.close()  # before the end (a disconnect): aborts the upstream request

    async def relay(self, send: Send) -> bytes:
        """Send the events as they come; return what ends the stream."""
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        pending, chunk, done, held = b"", self.first, False, b""
        next_chunk, at_end, captured = (self.upstream.next_chunk, self.upstream.at_end,
                                        self.captured)
        while True:
            data = pending + chunk if pending else chunk
            end = event_end(data)
            if end:
                out, pending = (data[:end], data[end:]) if end < len(data) else (data, b"")
                if b'"usage":{' in out or b'"usage": {' in out:
                    out = self.take_usage(out)
                if not done and b"data: [DONE]" in out:
                    done = True
                if out and done and at_end():
                    held = out  # nothing more is coming: sent with the stream's end, one write
                elif out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    if captured is not None:
                        captured.append(out)
            else:
                pending = data
            try:
                chunk = await next_chunk()
            except UpstreamTimeout:
                self.captured = None  # a broken reply is not captured
                return sse_error("The model server stopped sending mid-stream", "upstream_timeout")
            except UpstreamError as exc:
                self.captured = None
                return sse_error(f"The model server failed mid-stream ({type(exc).__name__})",
                                 "upstream_error")
            if chunk is None:
                break
        tail = pending + b"\n\n" if pending.strip() else b""
        if tail and b'"usage":' in tail:
            tail = self.take_usage(tail)
        return held + tail if done else tail + _DONE

    def take_usage(self, out: bytes) -> bytes:
        """Record the usage in these events; drop the usage chunk if the client did not ask.
        Only the events that carry a usage object are looked at (one per stream, the last):
        the others pass through as they are."""
        pieces: list[bytes] = []
        done = 0
        for match in _USAGE.finditer(out):
            if match.start() < done:
                continue  # inside an event already handled
            start = max([done] + [at + len(sep) for sep in _SEPARATORS
                                  if (at := out.rfind(sep, done, match.start())) >= 0])
            boundary = EVENT_SPLIT.search(out, match.end())
            end = boundary.end() if boundary else len(out)
            pieces += (out[done:start], self.usage_event(out[start:end]))
            done = end
        if not done:
            return out
        pieces.append(out[done:])
        return b"".join(pieces)

    def usage_event(self, event: bytes) -> bytes:
        """One event with a usage object: recorded; what of it goes on to the client."""
        try:
            payload = event_json(event)
        except ValueError:
            return event
        if not isinstance(payload, dict) or not isinstance(payload.get("usage"), dict):
            return event
        record_usage(self.gateway, self.caller, self.route, payload["usage"],
                     payload.get("metrics"))
        if self.client_usage:
            return event
        if not payload.get("choices"):
            return b""  # the usage-only chunk the gateway asked for
        payload.pop("usage")
        separator = EVENT_SPLIT.search(event)
        return (b"data: " + json.dumps(payload, separators=(",", ":")).encode()
                + (separator.group() if separator else b""))


# --- routes ---------------------------------------------------------------------------------

@router.get("/models", response_model=ModelList)
async def list_models(request: Request) -> ModelList:
    gateway = get_gateway(request.app)
    caller = await authenticate_limited(gateway, request.headers.get("authorization"))
    routes = await routes_of(gateway, caller)
    return ModelList(data=[Model(id=r.name, created=r.created, owned_by="specdeck")
                           for r in routes.ready])


@router.get("/models/{model:path}", response_model=Model,
            responses=error_responses(404, 422))
async def retrieve_model(model: str, request: Request) -> Model:
    gateway = get_gateway(request.app)
    caller = await authenticate_limited(gateway, request.headers.get("authorization"))
    route = (await routes_of(gateway, caller)).by_name.get(model)
    if route is None or route.status != DeploymentStatus.READY.value:
        raise APIError(404, f"The model '{echo(model)}' does not exist or is not deployed",
                       code="model_not_found", param="model")
    return Model(id=route.name, created=route.created, owned_by="specdeck")


CHAT_COMPLETIONS = "/v1/chat/completions"


class Served(Response):
    """A response that serves the request itself: a plain ASGI function run as a Response."""

    def __init__(self, serve: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.serve, self.background = serve, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.serve(scope, receive, send)


_CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The completion; with \"stream\": true, server-sent events ending with "
          "data: [DONE]", "content": {_JSON: {"schema": {"type": "object"}},
                                      "text/event-stream": {"schema": {"type": "string"}}}},
    **error_responses(400, 404, 413, 502, 504),
    "4XX": {"model": ErrorResponse,
            "description": "The model server's own 4xx answer, relayed in the one error shape"},
}
_CHAT_BODY = {"requestBody": {"required": True, "content": {
    _JSON: {"schema": inline_schema(ChatCompletionRequest)}}}}


@router.post("/chat/completions", responses=_CHAT_RESPONSES, openapi_extra=_CHAT_BODY)
async def chat_completions() -> Response:
    """A chat completion from the deployment named by ``model``, as OpenAI's API answers it
    (server-sent events with ``"stream": true``)."""
    # Declared here for the OpenAPI document; CHAT_ROUTE, ahead of it, serves the path.
    return Served(serve_chat_completion)


class ChatCompletions:
    """``POST /v1/chat/completions`` as a plain ASGI app (``serve_chat_completion``), routed by
    Starlette ahead of every API route, inside the app's middleware and error handlers: FastAPI's
    request handling (its request object, dependencies, response wrapping) was 787 - 545 us of
    the gateway's CPU a request, and does nothing here, where the route reads its own body as it
    comes and watches its client (docs/benchmarks.md, "Gateway overhead")."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serve_chat_completion(scope, receive, send)


CHAT_ROUTE = routing.Route(CHAT_COMPLETIONS, ChatCompletions(), methods=["POST"],
                           include_in_schema=False)


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body; None if the client went away. 413 once it grows past ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # http.disconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def serve_chat_completion(scope: Scope, receive: Receive, send: Send) -> None:
    """``POST /v1/chat/completions`` as a plain ASGI app; what it raises goes to the app's error
    handlers, as on every route. Nothing is sent when the client went away."""
    response = await chat_completion(get_gateway(scope["app"]), scope, receive)
    if response is not None:
        await response(scope, receive, send)


async def chat_completion(gateway: Gateway, scope: Scope, receive: Receive) -> Response | None:
    authorization = length = None
    for name, value in scope["headers"]:
        if name == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
        elif name == b"content-length" and length is None:
            length = value
    limit = gateway.max_body_bytes
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large(limit)  # before anything else, as for every route
    caller = await authenticate(gateway, authorization)
    # The rate limit's answer is asked for now; unless it may come while the request is on its
    # way upstream (``Verdict.early``), it is awaited here, before anything else.
    verdict = gateway.limiter.ask(caller.key_id) if gateway.limiter.enabled else None
    if verdict is not None and not verdict.early:
        await enforce(gateway, verdict)
        verdict = None
    try:
        raw = await read_body(receive, limit)
        if raw is None:
            return None
        body = parse_body(raw)
        model, stream = check_request(body, gateway.max_tokens)
        route = await resolve(gateway, caller, model)
        content, client_usage = upstream_body(raw, body, stream)
        messages = body.get("messages")
        limit_check = None if verdict is None else functools.partial(enforce, gateway, verdict)
        if not stream:
            return await complete(gateway, caller, route, content, receive, messages,
                                  limit_check)
        return await open_stream(gateway, caller, route, content, receive, client_usage,
                                 messages, limit_check)
    except Exception:
        await enforce(gateway, verdict)  # a refused request is told so first, whatever else
        raise


async def upstream_answer(gateway: Gateway, route: Route, content: bytes, stream: bool,
                          limit_check: Check | None) -> tuple[UpstreamResponse, bytes]:
    """The response of a replica of ``route`` (the balancer's pick) and its body, or when
    streaming with a 200 its first chunk (the rest is left to read). A replica that cannot be
    reached or breaks before that is ejected, and the request goes once more, to another one if
    the route has another: nothing has gone to the client yet. The caller closes the response.
    ``limit_check``: the rate limit's answer, awaited once the request is on its way and before
    its answer (``UpstreamClient.send``)."""
    balancer = gateway.balancer
    replica = balancer.pick(route.replicas)
    retry = len(route.replicas) > 1
    while True:
        upstream: UpstreamResponse | None = None
        try:
            upstream = await gateway.client.send(replica.url, replica.headers, content,
                                                 balancer.inflight, replica.deployment_id,
                                                 limit_check)
            if not stream or upstream.status != 200:
                return upstream, await upstream.read()
            first: bytes | None = None
            while not first:  # the first non-empty chunk
                first = await upstream.next_chunk()
                if first is None:
                    raise UpstreamBroken("the upstream closed the stream without answering")
            return upstream, first
        except BaseException as exc:
            if upstream is not None:
                upstream.close()  # aborts the upstream request if it was still going
            if not isinstance(exc, (UpstreamConnectError, UpstreamBroken)):
                raise
            balancer.eject(replica, exc)
            if not retry:
                raise
            replica, retry = balancer.pick(route.replicas, avoid=replica), False


async def complete(gateway: Gateway, caller: Caller, route: Route, content: bytes,
                   receive: Receive, messages: Any,
                   limit_check: Check | None) -> Response | None:
    watch = ClientWatch(receive)
    try:
        upstream, body = await upstream_answer(gateway, route, content, False, limit_check)
    except asyncio.CancelledError:
        if watch.swallow():
            return None  # the client went away: nobody is left to read it
        raise
    except UpstreamError as exc:
        raise transport_error(gateway, exc) from None
    finally:
        watch.stop()
    upstream.close()  # read to the end: this only ends its count in flight
    if upstream.status != 200:
        raise upstream_error(upstream.status, body, upstream.header("Retry-After"))
    # Before the answer goes, not after: on a small VM the client, woken by the answer, waits for
    # what this process still does (docs/benchmarks.md, "Why the gateway is built as it is").
    try:
        answer = orjson.loads(body)
    except ValueError:
        answer = None
    if isinstance(answer, dict):
        record_usage(gateway, caller, route, answer.get("usage"), answer.get("metrics"))
    if route.sample():
        gateway.capture.add_sampled(Sampled(route.capture_dataset_id, time.time(),  # type: ignore[arg-type]
                                            messages, body, False))
    return Response(body, media_type=_JSON)


async def open_stream(gateway: Gateway, caller: Caller, route: Route, content: bytes,
                      receive: Receive, client_usage: bool, messages: Any,
                      limit_check: Check | None) -> Response | None:
    upstream: UpstreamResponse | None = None
    watch = ClientWatch(receive)
    try:
        upstream, first = await upstream_answer(gateway, route, content, True, limit_check)
        if upstream.status != 200:
            raise upstream_error(upstream.status, first, upstream.header("Retry-After"))
        if first.startswith(b'data: {"error"'):  # failed before generating: an HTTP error
            try:
                error = event_json(first[:event_end(first)] or first)["error"]
                status = error.get("code") if isinstance(error, dict) else None
            except (ValueError, TypeError, KeyError):
                error, status = None, None
            status = status if type(status) is int and 400 <= status < 600 else 502
            raise upstream_error(status, json.dumps({"error": error}).encode())
    except BaseException as exc:
        watch.stop()
        if upstream is not None:
            upstream.close()
        if isinstance(exc, asyncio.CancelledError) and watch.swallow():
            return None  # the client went away
        if isinstance(exc, UpstreamError):
            raise transport_error(gateway, exc) from None
        raise
    # From here the response owns the watch and the upstream response (and closes both).
    return SSEProxy(gateway, caller, route, upstream, watch, first, client_usage, messages)
