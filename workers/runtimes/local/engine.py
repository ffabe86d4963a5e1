"""A CPU serving engine for a verifier with a DFlash drafter, behind an OpenAI-style API.

It stands in for ``vllm serve VERIFIER --speculative-config '{"method": "dflash",
"model": DRAFTER, "num_speculative_tokens": N}'`` on machines without a GPU::

    python -m workers.runtimes.local.engine --verifier PATH --drafter PATH_OR_DIR \\
        [--served-model-name NAME] [--num-speculative-tokens N] \\
        --host 127.0.0.1 --port P [--api-key-env VAR]

Decoding is greedy block verification, the loop of z-lab's ``dflash_generate``:

1. Prefill the verifier on the prompt; forward hooks capture the hidden states of the
   drafter's aux layer ids (id ``k`` is the residual stream after decoder layer ``k - 1``,
   id 0 the embeddings), the same states the hidden-states server gave the trainer.
2. Loop: the block is ``[last token, mask x N]`` at the next positions. The drafter
   attends to the fused context features of every earlier position (kept in its own KV
   cache) and to the block, in one pass; the argmax of the mask slots is the draft. The
   verifier checks the block in one pass; the longest prefix of the draft that equals
   the verifier's own argmax is accepted, plus the verifier's token after it. Both KV
   caches are cropped to the accepted length and the verifier's aux hidden states of
   the accepted positions become the drafter's next context.

The output is token-identical to ``verifier.generate(do_sample=False)`` (plain argmax;
up to floating-point differences between scoring a block in one pass and one token at a
time, which can only matter at an exact argmax tie), so only greedy requests are
served (temperature 0 or absent). The drafter is loaded with
speculators' ``DFlashSpeculatorConfig`` / ``DFlashDraftModel``; its forward pass is the
training one (anchored blocks over a packed batch), so the single-block inference pass
is built here from the same modules: ``fc`` and ``hidden_norm`` over the aux features,
the decoder layers, ``norm`` and ``lm_head`` (with ``d2t`` for a reduced draft vocab).

Requests are served one at a time. ``/metrics`` exposes vLLM's speculative-decoding
counters, so ``AL = 1 + accepted / drafts`` is computed the same way as on vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jinja2
import torch
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict
from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.cache_utils import Cache

from workers.runtimes.local.server import (
    RequestError,
    add_server_options,
    error_response,
    install_error_handlers,
    serve,
    set_up,
)

__all__ = [
    "DFlashEngine",
    "DecodeStep",
    "Generation",
    "IncrementalDetokenizer",
    "SpecDecodeMetrics",
    "build_app",
    "main",
    "resolve_drafter_dir",
]

logger = logging.getLogger("specdeck.local.engine")

FinishReason = Literal["stop", "length"]
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def resolve_drafter_dir(path: str | os.PathLike[str]) -> Path:
    """The directory holding the drafter's ``config.json`` and weights.

    Accepts a checkpoint directory (``OUT/<epoch>``), a trainer save path (its
    ``checkpoint_best``), or a Hugging Face Hub cache repository directory
    (``models--org--name`` with ``refs/main`` and ``snapshots/<commit>/``).
    """
    root = Path(path)
    if (root / "config.json").is_file():
        return root
    if (root / "checkpoint_best" / "config.json").is_file():
        return root / "checkpoint_best"
    snapshots = root / "snapshots"
    if snapshots.is_dir():
        ref = root / "refs" / "main"
        if ref.is_file():
            snapshot = snapshots / ref.read_text().strip()
        else:
            candidates = sorted(s for s in snapshots.iterdir() if (s / "config.json").is_file())
            if len(candidates) != 1:
                raise FileNotFoundError(
                    f"{snapshots} has {len(candidates)} snapshots with a config.json and no "
                    "refs/main to choose one"
                )
            snapshot = candidates[0]
        if (snapshot / "config.json").is_file():
            return snapshot
    if not root.exists() and HUB_ID.match(str(path)):
        # A Hub id: huggingface_hub downloads it, or finds it in its cache (HF_HUB_CACHE;
        # with HF_HUB_OFFLINE=1 only there). The token, if any, comes from HF_TOKEN.
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(path), allow_patterns=["*.json", "*.safetensors"]))
    raise FileNotFoundError(
        f"no drafter at {root}: expected a Hub id, a config.json, a checkpoint_best link or a "
        "Hub snapshot layout (refs/main, snapshots/<commit>/config.json)"
    )


@dataclass(frozen=True)
class DecodeStep:
    """What one engine step produced: the prefill or one draft-and-verify round."""

    token_ids: list[int]
    num_draft_tokens: int  # tokens the drafter proposed (0 for the prefill or a plain step)
    num_accepted_tokens: int  # proposed tokens the verifier accepted (before stop truncation)


class DFlashEngine:
    """A verifier and its DFlash drafter on the CPU, decoding greedily and losslessly."""

    def __init__(
        self,
        verifier: str | os.PathLike[str],
        drafter: str | os.PathLike[str],
        *,
        num_speculative_tokens: int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.verifier_path = str(verifier)
        self.tokenizer = AutoTokenizer.from_pretrained(self.verifier_path)
        model = AutoModelForCausalLM.from_pretrained(self.verifier_path, dtype=dtype or "auto")
        self.verifier = model.eval().requires_grad_(False)
        text_config = self.verifier.config.get_text_config()
        self.max_model_len: int = text_config.max_position_embeddings

        self.drafter_dir = resolve_drafter_dir(drafter)
        config = DFlashSpeculatorConfig.from_pretrained(self.drafter_dir)
        if config.sample_from_anchor:
            raise ValueError("drafters with sample_from_anchor=True are not supported")
        if config.mask_token_id is None:
            raise ValueError(f"{self.drafter_dir}/config.json has no mask_token_id")
        if not config.aux_hidden_state_layer_ids:
            raise ValueError(f"{self.drafter_dir}/config.json has no aux_hidden_state_layer_ids")
        # Embeddings and lm_head come from the verifier being served, wherever the
        # checkpoint was trained; flex attention has no CPU path, sdpa does.
        config.speculators_config.verifier.name_or_path = self.verifier_path
        config.transformer_layer_config._attn_implementation = "sdpa"  # noqa: SLF001
        draft = DFlashDraftModel.from_pretrained(
            self.drafter_dir, config=config, dtype=self.verifier.dtype
        )
        self.drafter: DFlashDraftModel = draft.eval().requires_grad_(False)

        # The hidden-states server stacks layers in ascending id order and the trainer
        # flattens them in that order: the drafter's fc expects that concatenation.
        self.aux_layer_ids: list[int] = sorted(config.aux_hidden_state_layer_ids)
        num_layers = text_config.num_hidden_layers
        if not all(0 <= i <= num_layers for i in self.aux_layer_ids):
            raise ValueError(
                f"aux layer ids {self.aux_layer_ids} are outside [0, {num_layers}] for the verifier"
            )
        expected_fc_in = len(self.aux_layer_ids) * text_config.hidden_size
        if self.drafter.fc.in_features != expected_fc_in:
            raise ValueError(
                f"drafter fc takes {self.drafter.fc.in_features} features, the verifier gives "
                f"{len(self.aux_layer_ids)} x {text_config.hidden_size} = {expected_fc_in}"
            )
        if self.drafter.verifier_vocab_size != text_config.vocab_size:
            raise ValueError(
                f"drafter vocab {self.drafter.verifier_vocab_size} != verifier vocab "
                f"{text_config.vocab_size}"
            )

        self.block_size: int = config.block_size
        self.mask_token_id: int = config.mask_token_id
        n = self.block_size - 1 if num_speculative_tokens is None else num_speculative_tokens
        if not 0 <= n <= self.block_size - 1:
            raise ValueError(
                f"num_speculative_tokens must be in [0, {self.block_size - 1}] for block size "
                f"{self.block_size}, got {n}"
            )
        self.num_speculative_tokens: int = n

        # Per draft layer: sliding-window size (None: full attention) and whether the
        # block is causal. This mirrors the training mask (speculators'
        # create_anchor_block_mask_mod): full-attention layers see the whole block;
        # sliding layers see it causally unless sliding_window_non_causal, and see the
        # context from anchor - window on.
        tl_config = config.transformer_layer_config
        sliding = set(self.drafter.sliding_window_indices)
        self._layer_attention: list[tuple[int | None, bool]] = [
            (
                (tl_config.sliding_window, not config.sliding_window_non_causal)
                if i in sliding
                else (None, False)
            )
            for i in range(len(self.drafter.layers))
        ]

        self.stop_token_ids: frozenset[int] = frozenset(self._stop_token_ids())
        penalty = self.verifier.generation_config.repetition_penalty
        if penalty is not None and penalty != 1.0:
            logger.warning(
                "the verifier's generation_config sets repetition_penalty=%s: this engine "
                "decodes by plain argmax and does not apply it",
                penalty,
            )

        self._captured: dict[int, torch.Tensor] = {}
        self._forward_lock = threading.Lock()
        self._register_hooks()

    def _stop_token_ids(self) -> set[int]:
        """The ids ``generate`` stops at (generation config) plus the tokenizer's EOS,
        as vLLM does."""
        ids: set[int] = set()
        for source in (self.verifier.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if source is None:
                continue
            ids.update([source] if isinstance(source, int) else source)
        return ids

    def _register_hooks(self) -> None:
        def capture(layer_id: int) -> Callable[[torch.nn.Module, Any, Any], None]:
            def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
                self._captured[layer_id] = output[0] if isinstance(output, tuple) else output

            return hook

        layers = self.verifier.get_decoder().layers
        for layer_id in self.aux_layer_ids:
            if layer_id == 0:
                self.verifier.get_input_embeddings().register_forward_hook(capture(0))
            else:
                layers[layer_id - 1].register_forward_hook(capture(layer_id))

    # Prompts -----------------------------------------------------------------------

    def render(
        self, messages: list[dict[str, Any]], chat_template_kwargs: dict[str, Any] | None = None
    ) -> list[int]:
        """Apply the verifier's chat template with the generation prompt and tokenize."""
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {})
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def start(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> Generation:
        return Generation(
            self,
            prompt_ids,
            max_tokens,
            ignore_eos=ignore_eos,
            num_speculative_tokens=num_speculative_tokens,
        )

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> tuple[Generation, list[DecodeStep]]:
        """Decode to the end; return the finished generation and its steps."""
        generation = self.start(
            prompt_ids,
            max_tokens,
            ignore_eos=ignore_eos,
            num_speculative_tokens=num_speculative_tokens,
        )
        steps = []
        while not generation.finished:
            steps.append(generation.step())
        return generation, steps

    # Model passes ------------------------------------------------------------------

    def new_verifier_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.verifier.config)
        cache.activate_past_recording()  # lets sliding-window layers be cropped back
        return cache

    def verify(
        self, token_ids: Sequence[int], cache: Cache, *, last_logits_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the verifier on ``token_ids`` after the cached ones.

        Returns the logits ``[T, V]`` (``[1, V]`` with ``last_logits_only``) and the
        concatenated aux hidden states ``[1, T, len(aux_ids) * hidden]``.
        """
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long)
        with self._forward_lock:
            self._captured.clear()
            try:
                output = self.verifier(
                    input_ids=input_ids,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1 if last_logits_only else 0,
                )
                features = torch.cat([self._captured[i] for i in self.aux_layer_ids], dim=-1)
            finally:
                self._captured.clear()
        return output.logits[0], features

    def draft(
        self, context: torch.Tensor, anchor: int, start: int, size: int, cache: Cache
    ) -> list[int]:
        """Propose ``size - 1`` tokens for positions ``start + 1 ...``.

        ``context`` holds the aux features of the positions the drafter cache does not
        have yet, which end right before ``start`` (the anchor's position); the cache
        keeps the context keys and values and is cropped back to ``start``.
        """
        d = self.drafter
        cached = cache.get_seq_length()
        if cached + context.shape[1] != start:
            raise RuntimeError(
                f"drafter cache ({cached}) + new context ({context.shape[1]}) != anchor "
                f"position {start}"
            )
        block = torch.full((1, size), self.mask_token_id, dtype=torch.long)
        block[0, 0] = anchor
        hidden = d.embed_tokens(block)
        target_hidden = d.hidden_norm(d.fc(context))
        position_ids = torch.arange(cached, start + size, dtype=torch.long).unsqueeze(0)
        position_embeddings = d.rotary_emb(hidden, position_ids)
        masks: dict[tuple[int | None, bool], torch.Tensor | None] = {}
        for layer, kind in zip(d.layers, self._layer_attention, strict=True):
            if kind not in masks:
                masks[kind] = _block_mask(start, size, window=kind[0], causal=kind[1])
            hidden = layer(
                hidden_states=hidden,
                target_hidden=target_hidden,
                attention_mask=masks[kind],
                position_ids=position_ids,
                past_key_value=cache,
                position_embeddings=position_embeddings,
            )
        _crop_to(cache, start)
        logits = d.lm_head(d.norm(hidden[:, 1:]))
        ids = logits[0].argmax(dim=-1)
        if d.use_draft_vocab:
            ids = ids + d.d2t[ids]  # d2t holds offsets: target id = draft id + d2t[draft id]
        return ids.tolist()


def _block_mask(start: int, size: int, *, window: int | None, causal: bool) -> torch.Tensor | None:
    """Boolean mask ``[1, 1, size, start + size]`` for a block anchored at ``start``.

    ``None`` when everything is visible (sdpa then runs unmasked and non-causal).
    """
    sees_all_context = window is None or window >= start
    if sees_all_context and not causal:
        return None
    kv = torch.arange(start + size)
    query = torch.arange(size)[:, None]
    in_context = kv < start
    if window is not None:
        in_context = in_context & (kv >= start - window)
    in_block = kv >= start
    if causal:
        in_block = in_block & (kv - start <= query)
    return (in_context | in_block)[None, None]


def _crop_to(cache: Cache, length: int) -> None:
    remove = cache.get_seq_length() - length
    if remove < 0:
        raise RuntimeError(f"cannot crop a cache of {cache.get_seq_length()} up to {length}")
    if remove:
        cache.crop(-remove)


class Generation:
    """One request's decoding state: call :meth:`step` until :attr:`finished`.

    ``num_speculative_tokens`` (default: the engine's) may be lowered per generation;
    0 is plain greedy decoding through the same verifier path.
    """

    def __init__(
        self,
        engine: DFlashEngine,
        prompt_ids: Sequence[int],
        max_tokens: int,
        *,
        ignore_eos: bool = False,
        num_speculative_tokens: int | None = None,
    ) -> None:
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        n = num_speculative_tokens
        if n is None:
            n = engine.num_speculative_tokens
        if not 0 <= n <= engine.block_size - 1:
            raise ValueError(
                f"num_speculative_tokens must be in [0, {engine.block_size - 1}], got {n}"
            )
        self.engine = engine
        self.num_speculative_tokens = n
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.output_ids: list[int] = []
        self.finish_reason: FinishReason | None = None
        self._verifier_cache = engine.new_verifier_cache()
        self._drafter_cache = DynamicCache()
        self._context: list[torch.Tensor] = []  # aux features not yet in the drafter cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def step(self) -> DecodeStep:
        if self.finished:
            raise RuntimeError("the generation is finished")
        with torch.inference_mode():
            return self._prefill() if not self.output_ids else self._speculate()

    def _prefill(self) -> DecodeStep:
        logits, features = self.engine.verify(
            self.prompt_ids, self._verifier_cache, last_logits_only=True
        )
        self._keep_context(features)
        emitted = self._emit([int(logits[-1].argmax())])
        return DecodeStep(emitted, 0, 0)

    def _speculate(self) -> DecodeStep:
        engine = self.engine
        anchor = self.output_ids[-1]
        start = len(self.prompt_ids) + len(self.output_ids) - 1  # the anchor's position
        size = min(self.num_speculative_tokens + 1, self.max_tokens - len(self.output_ids))
        drafted: list[int] = []
        if size > 1:
            context = torch.cat(self._context, dim=1)
            self._context.clear()
            drafted = engine.draft(context, anchor, start, size, self._drafter_cache)

        logits, features = engine.verify([anchor, *drafted], self._verifier_cache)
        target = logits.argmax(dim=-1).tolist()  # target[i]: the verifier's token after slot i
        accepted = 0
        while accepted < len(drafted) and drafted[accepted] == target[accepted]:
            accepted += 1
        emitted = self._emit([*drafted[:accepted], target[accepted]])
        # The verifier cache keeps the anchor and the accepted drafts; the last emitted
        # token is the next anchor. Their hidden states are the drafter's next context.
        _crop_to(self._verifier_cache, start + len(emitted))
        self._keep_context(features[:, : len(emitted)])
        return DecodeStep(emitted, len(drafted), accepted)

    def _keep_context(self, features: torch.Tensor) -> None:
        if self.num_speculative_tokens > 0:
            self._context.append(features)

    def _emit(self, token_ids: list[int]) -> list[int]:
        """Append tokens up to a stop token or max_tokens; return those appended."""
        emitted = []
        for token in token_ids:
            self.output_ids.append(token)
            emitted.append(token)
            if token in self.engine.stop_token_ids and not self.ignore_eos:
                self.finish_reason = "stop"
            elif len(self.output_ids) >= self.max_tokens:
                self.finish_reason = "length"
            if self.finished:
                break
        return emitted


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


# HTTP API ---------------------------------------------------------------------------





class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    # OpenAI clients send many optional fields: accept them, check those that matter.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM extension, used by benchmarks for fixed lengths
    chat_template_kwargs: dict[str, Any] | None = None


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


def build_app(
    engine: DFlashEngine, served_model_name: str, *, api_key: str | None = None
) -> FastAPI:
    """The HTTP API around ``engine``. With ``api_key``, ``/v1/*`` needs that bearer token."""
    app = FastAPI(title="SpecDeck local DFlash engine")
    created = int(time.time())
    metrics = SpecDecodeMetrics(served_model_name, engine.num_speculative_tokens)
    app.state.metrics = metrics
    busy = asyncio.Lock()  # one request at a time: it is a CPU engine

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
        return {
            "object": "list",
            "data": [
                {
                    "id": served_model_name,
                    "object": "model",
                    "created": created,
                    "owned_by": "specdeck-local",
                    "root": engine.verifier_path,
                    "parent": None,
                    "max_model_len": engine.max_model_len,
                }
            ],
        }

    def prepare(body: ChatCompletionRequest) -> _Job:
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
        if not body.messages:
            raise RequestError("messages must not be empty", param="messages")
        try:
            prompt_ids = engine.render(body.messages, body.chat_template_kwargs)
        except (jinja2.TemplateError, ValueError, TypeError, KeyError) as e:
            raise RequestError(f"chat template failed: {e}", param="messages") from e
        room = engine.max_model_len - len(prompt_ids)
        requested = body.max_completion_tokens
        if requested is None:
            requested = body.max_tokens
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
        return _Job(f"chatcmpl-{uuid.uuid4().hex}", prompt_ids, max_tokens, body.ignore_eos)

    def usage(job: _Job, generation: Generation) -> dict[str, int]:
        completion = len(generation.output_ids)
        return {
            "prompt_tokens": len(job.prompt_ids),
            "completion_tokens": completion,
            "total_tokens": len(job.prompt_ids) + completion,
        }

    async def run_step(generation: Generation) -> DecodeStep:
        step = await run_in_threadpool(generation.step)
        metrics.observe(step)
        return step

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

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest, request: Request
    ) -> dict[str, Any] | Response:
        job = prepare(body)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(
                stream(job, include_usage, request), media_type="text/event-stream"
            )
        async with busy:
            started = time.perf_counter()
            metrics.prompt_tokens.inc(len(job.prompt_ids))
            generation = engine.start(job.prompt_ids, job.max_tokens, ignore_eos=job.ignore_eos)
            while not generation.finished:
                if await request.is_disconnected():
                    abandoned(job, generation)
                    return Response(status_code=499)
                await run_step(generation)
            finish(job, generation, time.perf_counter() - started)
        text = engine.tokenizer.decode(generation.output_ids, skip_special_tokens=True)
        return {
            "id": job.request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served_model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": generation.finish_reason,
                }
            ],
            "usage": usage(job, generation),
        }

    async def stream(job: _Job, include_usage: bool, request: Request) -> AsyncIterator[str]:
        created_at = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> str:
            payload: dict[str, Any] = {
                "id": job.request_id,
                "object": "chat.completion.chunk",
                "created": created_at,
                "model": served_model_name,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
                ],
            }
            if include_usage:
                payload["usage"] = None
            return f"data: {_json(payload)}\n\n"

        async with busy:
            started = time.perf_counter()
            metrics.prompt_tokens.inc(len(job.prompt_ids))
            generation = engine.start(job.prompt_ids, job.max_tokens, ignore_eos=job.ignore_eos)
            detokenizer = IncrementalDetokenizer(engine.tokenizer)
            try:
                yield chunk({"role": "assistant", "content": ""})
                while not generation.finished:
                    # Starlette also cancels this generator when the client leaves; the
                    # check covers servers that only report it through receive().
                    if await request.is_disconnected():
                        return
                    step = await run_step(generation)
                    text = detokenizer.add(step.token_ids, final=generation.finished)
                    if text:
                        yield chunk({"content": text})
            finally:
                if not generation.finished:
                    abandoned(job, generation)
            finish(job, generation, time.perf_counter() - started)
            yield chunk({}, generation.finish_reason)
            if include_usage:
                final = {
                    "id": job.request_id,
                    "object": "chat.completion.chunk",
                    "created": created_at,
                    "model": served_model_name,
                    "choices": [],
                    "usage": usage(job, generation),
                }
                yield f"data: {_json(final)}\n\n"
            yield "data: [DONE]\n\n"

    return app


def _json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


# CLI --------------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workers.runtimes.local.engine",
        allow_abbrev=False,  # "--api-key" must not pass for "--api-key-env"
        description="CPU OpenAI-compatible server: a verifier with a DFlash drafter, greedy "
        "and lossless.",
    )
    parser.add_argument("--verifier", required=True, help="verifier directory (transformers)")
    parser.add_argument(
        "--drafter",
        required=True,
        help="speculators DFlash checkpoint: an epoch directory, a trainer save path "
        "(checkpoint_best) or a Hub cache repository directory (refs/, snapshots/)",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="id in /v1/models (default: --verifier)"
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="draft tokens per block (default: block_size - 1; 0 disables speculation)",
    )
    parser.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="name of an environment variable holding the API key; when it is set, "
        "/v1/* requires 'Authorization: Bearer <key>'",
    )
    add_server_options(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    dtype = set_up(args)
    api_key: str | None = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env) or None
        if api_key is None:
            logger.warning("%s is not set: the API is open to every client", args.api_key_env)
    engine = DFlashEngine(
        args.verifier,
        args.drafter,
        num_speculative_tokens=args.num_speculative_tokens,
        dtype=dtype,
    )
    served_name = args.served_model_name or args.verifier
    logger.info(
        "serving %s as %r with drafter %s: block %d, %d speculative tokens, aux layer ids %s, "
        "dtype %s, API key %s",
        args.verifier,
        served_name,
        engine.drafter_dir,
        engine.block_size,
        engine.num_speculative_tokens,
        engine.aux_layer_ids,
        str(engine.verifier.dtype).removeprefix("torch."),
        "required" if api_key else "off",
    )
    app = build_app(engine, served_name, api_key=api_key)
    serve(app, args)


if __name__ == "__main__":
    main()
