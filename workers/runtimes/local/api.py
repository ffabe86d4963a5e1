"""The local engine's HTTP server: vLLM's OpenAI-compatible routes around a
:class:`~workers.runtimes.local.speculation.LocalEngine`.

- ``POST /v1/chat/completions``: messages rendered by the verifier's chat template (``tools``
  and ``chat_template_kwargs`` passed to it), streamed or not; with ``"return_token_ids": true``
  (vLLM's extension, what ``speculators regenerate-responses`` reads) the response carries
  ``prompt_token_ids`` (top level) and ``choices[0].token_ids`` (the generated ids, a generated
  stop token included).
- ``POST /v1/completions``: ``prompt`` as text or as token ids, not streamed; with
  ``return_token_ids``, ``choices[0].prompt_token_ids`` and ``choices[0].token_ids``.
- ``GET /v1/models``, ``/health``, and ``/metrics`` with vLLM's counters
  (``vllm:spec_decode_num_drafts``, ``_num_draft_tokens``, ``_num_accepted_tokens``,
  ``_num_accepted_tokens_per_pos{position}``, prompt/generation tokens, request successes, and
  the gauges ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``: what a promotion
  waits for before it stops an old engine).
- With ``per_request_metrics`` "summary" or "detailed" (vLLM's
  ``--per-request-spec-decode-metrics``) and speculation on, each response carries the request's
  own acceptance as vLLM 0.33 writes it: ``metrics.speculative_decoding`` at the top level of a
  completion, and of a stream's final usage chunk (sent when ``stream_options.include_usage``).

Greedy only (temperature 0 or absent), n = 1. Requests are served one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from workers.runtimes.local.server import (
    ComputeThread,
    RequestError,
    error_response,
    install_error_handlers,
    model_list,
)
from workers.runtimes.local.speculation import DecodeStep, Generation, LocalEngine

__all__ = ["PER_REQUEST_LEVELS", "IncrementalDetokenizer", "RequestAcceptance",
           "SpecDecodeMetrics", "build_app"]

logger = logging.getLogger("specdeck.local.engine")

# A non-streamed request runs its steps on the compute thread for up to this long before coming
# back to the event loop to see whether the client is still there: one thread hop per slice,
# not per step.
STEP_SLICE_S = 0.05
DEFAULT_COMPLETION_MAX_TOKENS = 16  # vLLM's (and OpenAI's) default for /v1/completions
PER_REQUEST_LEVELS = ("none", "summary", "detailed")  # --per-request-spec-decode-metrics


class IncrementalDetokenizer:
    """Text deltas for streamed token ids, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def add(self, token_ids: list[int], *, final: bool = False) -> str:
        self.token_ids.extend(token_ids)
        prefix = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        text = self._decode(self.token_ids[self._prefix_offset :])
        if len(text) > len(prefix) and (final or not text.endswith("\ufffd")):
            self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
            return text[len(prefix) :]
        return ""


class SpecDecodeMetrics:
    """vLLM's speculative-decoding and token counters in a private registry."""

    def __init__(self, model_name: str, num_speculative_tokens: int) -> None:
        disable_created_metrics()  # process-wide; vLLM does the same: no *_created series
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}
        names = list(labels)

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, [*names, *extra], registry=self.registry)

        self.num_drafts = counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."
        ).labels(**labels)
        self.num_draft_tokens = counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
        ).labels(**labels)
        self.num_accepted_tokens = counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
        ).labels(**labels)
        per_pos = counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            ["position"],
        )
        self.accepted_per_pos = [
            per_pos.labels(**labels, position=str(i)) for i in range(num_speculative_tokens)
        ]
        self.prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        ).labels(**labels)
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(**labels)
        request_success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ["finished_reason"]
        )
        self.request_success = {
            reason: request_success.labels(**labels, finished_reason=reason)
            for reason in ("stop", "length")
        }
        # vLLM's scheduler gauges: the request being generated, and those waiting their turn.
        self.requests_running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.",
            names, registry=self.registry,
        ).labels(**labels)
        self.requests_waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
            names, registry=self.registry,
        ).labels(**labels)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        self.requests_waiting.inc()
        try:
            yield
        finally:
            self.requests_waiting.dec()

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.requests_running.inc()
        try:
            yield
        finally:
            self.requests_running.dec()

    def observe(self, step: DecodeStep) -> None:
        self.generation_tokens.inc(len(step.token_ids))
        if step.num_draft_tokens == 0:
            return
        self.num_drafts.inc()
        self.num_draft_tokens.inc(step.num_draft_tokens)
        self.num_accepted_tokens.inc(step.num_accepted_tokens)
        for position in range(step.num_accepted_tokens):
            self.accepted_per_pos[position].inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestAcceptance:
    """One request's acceptance: vLLM's ``metrics.speculative_decoding`` (its docs' "Per-Request
    Acceptance Metrics"). A step that drafted nothing is not a verification step."""

    def __init__(self, num_spec_tokens: int, *, detailed: bool) -> None:
        self.num_spec_tokens = num_spec_tokens
        self.detailed = detailed
        self.histogram = [0] * (num_spec_tokens + 1)  # steps that accepted exactly j drafts
        self.by_draft_length: dict[int, list[int]] = {}
        self.accepted_per_step: list[int] = []
        self.drafted_per_step: list[int] = []

    def observe(self, step: DecodeStep) -> None:
        if step.num_draft_tokens == 0:
            return
        self.histogram[step.num_accepted_tokens] += 1
        row = self.by_draft_length.setdefault(step.num_draft_tokens,
                                              [0] * (step.num_draft_tokens + 1))
        row[step.num_accepted_tokens] += 1
        self.accepted_per_step.append(step.num_accepted_tokens)
        self.drafted_per_step.append(step.num_draft_tokens)

    def as_json(self) -> dict[str, Any]:
        steps = len(self.accepted_per_step)
        accepted, drafted = sum(self.accepted_per_step), sum(self.drafted_per_step)
        out: dict[str, Any] = {
            "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
            "acceptance_histogram": list(self.histogram),
            "acceptance_histogram_by_draft_length": {
                str(k): list(v) for k, v in sorted(self.by_draft_length.items())},
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": drafted,
            "num_spec_tokens": self.num_spec_tokens,
        }
        if self.detailed:
            out["per_step_accepted"] = list(self.accepted_per_step)
            out["per_step_drafted"] = list(self.drafted_per_step)
        return out


# Requests ------------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    # OpenAI clients send many optional fields: accept them, check those that matter.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    n: int | None = None
    stream: bool = False
    ignore_eos: bool = False  # vLLM extension, used by benchmarks for fixed lengths
    return_token_ids: bool = False  # vLLM extension: prompt and completion token ids


class ChatCompletionRequest(_Sampling):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    stream_options: StreamOptions | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]


class _AuthAndLog:
    """Pure ASGI middleware: the bearer-key check on ``/v1/*`` and one log line per request.

    Not ``@app.middleware("http")``: Starlette's BaseHTTPMiddleware relays streamed bodies
    through a channel that, once the client is gone, leaves the producer blocked (and the
    engine lock held); plain ASGI lets StreamingResponse see the disconnect itself.
    """

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        method, path = scope["method"], scope["path"]
        if self.expected is not None and path.startswith("/v1/"):
            supplied = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(supplied, self.expected):
                logger.info("%s %s 401 (bad or missing API key)", method, path)
                await error_response(401, "Invalid or missing API key.")(scope, receive, send)
                return
        status = 0

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            elapsed_ms = (time.perf_counter() - start) * 1000
            logger.info("%s %s %d %.1fms", method, path, status, elapsed_ms)


@dataclass(frozen=True)
class _Job:
    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    acceptance: RequestAcceptance | None  # when per-request metrics are on

    def metrics(self) -> dict[str, Any]:
        """vLLM's per-request ``metrics`` object ({} when off)."""
        if self.acceptance is None:
            return {}
        return {"metrics": {"speculative_decoding": self.acceptance.as_json()}}


def _observe(job: _Job, metrics: SpecDecodeMetrics, step: DecodeStep) -> None:
    metrics.observe(step)
    if job.acceptance is not None:
        job.acceptance.observe(step)


def _run_slice(job: _Job, generation: Generation, metrics: SpecDecodeMetrics,
               seconds: float) -> None:
    """Steps until the generation ends or ``seconds`` have passed (at least one step)."""
    deadline = time.perf_counter() + seconds
    while True:
        _observe(job, metrics, generation.step())
        if generation.finished or time.perf_counter() >= deadline:
            return


def build_app(
    engine: LocalEngine, served_model_name: str, *, api_key: str | None = None,
    compute: ComputeThread | None = None, per_request_metrics: str = "none",
) -> FastAPI:
    """The HTTP API around ``engine``. With ``api_key``, ``/v1/*`` needs that bearer token.
    ``compute`` is the thread that loaded the engine (a new one if not given).
    ``per_request_metrics``: vLLM's ``--per-request-spec-decode-metrics`` level."""
    if per_request_metrics not in PER_REQUEST_LEVELS:
        raise ValueError(f"per_request_metrics must be one of {PER_REQUEST_LEVELS}")
    per_request = per_request_metrics != "none" and engine.num_speculative_tokens > 0
    app = FastAPI(title="SpecDeck local engine")
    created = int(time.time())
    metrics = SpecDecodeMetrics(served_model_name, engine.num_speculative_tokens)
    app.state.metrics = metrics
    busy = asyncio.Lock()  # one request at a time: it is a CPU engine

    @contextlib.asynccontextmanager
    async def turn() -> AsyncIterator[None]:
        """The engine to this request alone, counted as waiting, then running."""
        with metrics.waiting():
            await busy.acquire()
        try:
            with metrics.running():
                yield
        finally:
            busy.release()
    compute = compute or ComputeThread()  # every prefill and step, on one thread

    app.add_middleware(_AuthAndLog, api_key=api_key)

    install_error_handlers(app)

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        return model_list(served_model_name, created, engine.verifier_path, engine.max_model_len)

    def check_sampling(body: _Sampling) -> None:
        if body.model is not None and body.model != served_model_name:
            raise RequestError(
                f"The model `{body.model}` does not exist.", param="model", status=404
            )
        if body.temperature not in (None, 0):
            raise RequestError(
                "only greedy decoding is served (temperature 0 or absent): speculative "
                "decoding here is lossless for greedy only",
                param="temperature",
            )
        if body.n not in (None, 1):
            raise RequestError("only n=1 is supported", param="n")

    def job(prefix: str, prompt_ids: list[int], requested: int | None, ignore_eos: bool) -> _Job:
        room = engine.max_model_len - len(prompt_ids)
        max_tokens = room if requested is None else requested
        if max_tokens < 1:
            raise RequestError(
                f"max_tokens must be at least 1, got {max_tokens}"
                + (f" (the prompt has {len(prompt_ids)} tokens)" if requested is None else ""),
                param="max_tokens",
            )
        if max_tokens > room:
            raise RequestError(
                f"this model's maximum context length is {engine.max_model_len} tokens; the "
                f"prompt has {len(prompt_ids)} and {max_tokens} were requested",
                param="max_tokens",
            )
        acceptance = (RequestAcceptance(engine.num_speculative_tokens,
                                        detailed=per_request_metrics == "detailed")
                      if per_request else None)
        return _Job(f"{prefix}-{uuid.uuid4().hex}", prompt_ids, max_tokens, ignore_eos,
                    acceptance)

    def prepare_chat(body: ChatCompletionRequest) -> _Job:
        check_sampling(body)
        if not body.messages:
            raise RequestError("messages must not be empty", param="messages")
        try:
            prompt_ids = engine.render(body.messages, body.chat_template_kwargs, tools=body.tools)
        except (jinja2.TemplateError, ValueError, TypeError, KeyError) as e:
            raise RequestError(f"chat template failed: {e}", param="messages") from e
        requested = body.max_completion_tokens
        if requested is None:
            requested = body.max_tokens
        return job("chatcmpl", prompt_ids, requested, body.ignore_eos)

    def prepare_completion(body: CompletionRequest) -> _Job:
        check_sampling(body)
        if body.stream:
            raise RequestError("stream is not supported on /v1/completions", param="stream")
        prompt: Any = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise RequestError("only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = list(engine.tokenizer.encode(prompt))
        else:
            vocab = engine.runner.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise RequestError(
                    f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="prompt"
                )
            prompt_ids = list(prompt)
        if not prompt_ids:
            raise RequestError("the prompt is empty", param="prompt")
        requested = body.max_tokens if "max_tokens" in body.model_fields_set else None
        if requested is None:
            requested = min(DEFAULT_COMPLETION_MAX_TOKENS, engine.max_model_len - len(prompt_ids))
        return job("cmpl", prompt_ids, requested, body.ignore_eos)

    def usage(job: _Job, generation: Generation) -> dict[str, int]:
        completion = len(generation.output_ids)
        return {
            "prompt_tokens": len(job.prompt_ids),
            "completion_tokens": completion,
            "total_tokens": len(job.prompt_ids) + completion,
        }

    def finish(job: _Job, generation: Generation, elapsed_s: float) -> None:
        assert generation.finish_reason is not None
        metrics.request_success[generation.finish_reason].inc()
        logger.info(
            "%s: prompt %d tokens, completion %d tokens (%s) in %.2fs, %.1f tokens/s",
            job.request_id,
            len(job.prompt_ids),
            len(generation.output_ids),
            generation.finish_reason,
            elapsed_s,
            len(generation.output_ids) / elapsed_s,
        )

    def abandoned(job: _Job, generation: Generation) -> None:
        logger.info(
            "%s: client disconnected, generation stopped after %d of %d tokens",
            job.request_id,
            len(generation.output_ids),
            job.max_tokens,
        )

    def start(job: _Job) -> Generation:
        """The prefill (on the compute thread)."""
        return engine.start(job.prompt_ids, job.max_tokens, ignore_eos=job.ignore_eos)

    async def run_to_end(job: _Job, request: Request) -> Generation | None:
        """The whole generation (None when the client left first)."""
        async with turn():
            started = time.perf_counter()
            metrics.prompt_tokens.inc(len(job.prompt_ids))
            generation = await compute.run(start, job)
            while not generation.finished:
                if await request.is_disconnected():
                    abandoned(job, generation)
                    return None
                await compute.run(_run_slice, job, generation, metrics, STEP_SLICE_S)
            finish(job, generation, time.perf_counter() - started)
        return generation

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest, request: Request
    ) -> dict[str, Any] | Response:
        job = prepare_chat(body)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(
                stream(job, include_usage, body.return_token_ids, request),
                media_type="text/event-stream",
            )
        generation = await run_to_end(job, request)
        if generation is None:
            return Response(status_code=499)
        text = engine.tokenizer.decode(generation.output_ids, skip_special_tokens=True)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": generation.finish_reason,
        }
        response: dict[str, Any] = {
            "id": job.request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served_model_name,
            "choices": [choice],
            "usage": usage(job, generation),
            **job.metrics(),
        }
        if body.return_token_ids:
            response["prompt_token_ids"] = job.prompt_ids
            choice["token_ids"] = list(generation.output_ids)
        return response

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> dict[str, Any] | Response:
        job = prepare_completion(body)
        generation = await run_to_end(job, request)
        if generation is None:
            return Response(status_code=499)
        choice: dict[str, Any] = {
            "index": 0,
            "text": engine.tokenizer.decode(generation.output_ids, skip_special_tokens=True),
            "logprobs": None,
            "finish_reason": generation.finish_reason,
            "stop_reason": None,
        }
        if body.return_token_ids:
            choice["prompt_token_ids"] = job.prompt_ids
            choice["token_ids"] = list(generation.output_ids)
        return {
            "id": job.request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": served_model_name,
            "choices": [choice],
            "usage": usage(job, generation),
            **job.metrics(),
        }

    async def stream(
        job: _Job, include_usage: bool, return_token_ids: bool, request: Request
    ) -> AsyncIterator[str]:
        created_at = int(time.time())

        def chunk(
            delta: dict[str, Any],
            finish_reason: str | None = None,
            token_ids: list[int] | None = None,
            first: bool = False,
        ) -> str:
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            payload: dict[str, Any] = {
                "id": job.request_id,
                "object": "chat.completion.chunk",
                "created": created_at,
                "model": served_model_name,
                "choices": [choice],
            }
            if return_token_ids:
                choice["token_ids"] = token_ids or []
                if first:
                    payload["prompt_token_ids"] = job.prompt_ids
            if include_usage:
                payload["usage"] = None
            return f"data: {_json(payload)}\n\n"

        async with turn():
            started = time.perf_counter()
            metrics.prompt_tokens.inc(len(job.prompt_ids))
            generation = await compute.run(start, job)
            detokenizer = IncrementalDetokenizer(engine.tokenizer)
            pending: list[int] = []  # ids whose text is held back (incomplete UTF-8)
            try:
                yield chunk({"role": "assistant", "content": ""}, first=True)
                while not generation.finished:
                    # Starlette also cancels this generator when the client leaves; the
                    # check covers servers that only report it through receive().
                    if await request.is_disconnected():
                        return
                    step = await compute.run(generation.step)
                    _observe(job, metrics, step)
                    pending.extend(step.token_ids)
                    text = detokenizer.add(step.token_ids, final=generation.finished)
                    if text or (return_token_ids and generation.finished):
                        yield chunk({"content": text}, token_ids=pending)
                        pending = []
            finally:
                if not generation.finished:
                    abandoned(job, generation)
            finish(job, generation, time.perf_counter() - started)
            yield chunk({}, generation.finish_reason, token_ids=pending)
            if include_usage:
                final = {
                    "id": job.request_id,
                    "object": "chat.completion.chunk",
                    "created": created_at,
                    "model": served_model_name,
                    "choices": [],
                    "usage": usage(job, generation),
                    **job.metrics(),
                }
                yield f"data: {_json(final)}\n\n"
            yield "data: [DONE]\n\n"

    return app


def _json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
