"""The local engine's speculative loop: propose (DFlash drafter or n-gram prompt lookup), verify
a block in one verifier pass, accept the longest matching prefix plus the verifier's next token.

In-process API (what ``benchmarks/`` and tests call; the HTTP server in ``api.py`` is built on
it)::

    engine = LocalEngine(verifier_dir, speculative_config=None | dict | JSON str, dtype=None)
    ids = engine.render(messages, chat_template_kwargs=None, tools=None)  # -> list[int]
    generation = engine.start(ids, max_tokens, ignore_eos=False, num_speculative_tokens=None)
    while not generation.finished:
        step = generation.step()  # DecodeStep(token_ids, num_draft_tokens, num_accepted_tokens)
    generation.output_ids, generation.finish_reason  # "stop" | "length"
    generation, steps = engine.generate(ids, max_tokens, ...)  # the same loop in one call

``speculative_config`` is vLLM's ``--speculative-config``: ``{"method": "dflash", "model":
DRAFTER, "num_speculative_tokens": N}`` (N defaults to the drafter's block_size - 1) or
``{"method": "ngram", "num_speculative_tokens": N, "prompt_lookup_max": 4,
"prompt_lookup_min": 1}``; None serves the verifier alone and loads no drafter.
``num_speculative_tokens`` per generation may lower the engine's (0: plain decoding, nothing
proposed, no aux hidden states kept). ``DFlashEngine(verifier, drafter,
num_speculative_tokens=None)`` is the same engine with a DFlash config.

Decoding is greedy and lossless: the output is token-identical to
``verifier.generate(do_sample=False)`` (plain argmax; up to floating-point differences between
scoring a block in one pass and one token at a time, which can only matter at an exact argmax
tie). Counting follows vLLM: a step with a proposal is one draft of ``len(proposal)`` tokens; a
step without one (n-gram found no match, or one token of budget left) is a plain decode step and
no draft; AL = 1 + accepted / drafts.

DFlash (z-lab's ``dflash_generate``): the prefill keeps the verifier's aux hidden states; each
step the drafter sees the fused context features of every earlier position and the block
``[last token, mask x N]``; the argmax of the mask slots is the proposal. The verifier's aux
hidden states of the accepted positions become the drafter's next context.

N-gram (vLLM's ``ngram`` proposer, prompt lookup): the longest suffix of the context (prompt and
output so far) of ``prompt_lookup_max`` down to ``prompt_lookup_min`` tokens that occurred
earlier in the context, at its earliest occurrence (as vLLM's proposer picks it); the proposal
is the up-to-N tokens that followed that occurrence.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from workers.runtimes.local.model_runner import (
    DFlashDrafter,
    DraftCache,
    VerifierRunner,
)

__all__ = [
    "DFlashEngine",
    "DecodeStep",
    "Generation",
    "LocalEngine",
    "NgramProposer",
    "SpeculativeConfig",
    "SpeculativeConfigError",
]

logger = logging.getLogger("specdeck.local.engine")

FinishReason = Literal["stop", "length"]


class SpeculativeConfigError(ValueError):
    """A ``--speculative-config`` this engine does not serve."""


_KEYS = {
    "dflash": {"method", "model", "num_speculative_tokens"},
    "ngram": {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"},
}
NGRAM_DEFAULT_LOOKUP = 5  # vLLM's default when neither prompt_lookup_min nor _max is given


def _positive_int(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpeculativeConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's ``--speculative-config``, the subset this engine serves."""

    method: Literal["dflash", "ngram"]
    num_speculative_tokens: int | None = None  # dflash: None means block_size - 1
    model: str | None = None  # dflash: the drafter (directory, save path, Hub cache or id)
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None

    @classmethod
    def parse(
        cls, value: SpeculativeConfig | Mapping[str, Any] | str | None
    ) -> SpeculativeConfig | None:
        """A config from its JSON text or dict (None: no speculation); anything else, an
        unknown method or key, or a bad value raises :class:`SpeculativeConfigError`."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise SpeculativeConfigError(f"not valid JSON: {e}") from e
        if not isinstance(value, Mapping):
            raise SpeculativeConfigError(f"expected a JSON object, got {type(value).__name__}")
        method = value.get("method")
        if method not in _KEYS:
            raise SpeculativeConfigError(
                f"method {method!r} is not served by the local engine: use \"dflash\" (with "
                "\"model\") or \"ngram\", or no --speculative-config for the verifier alone"
            )
        unknown = sorted(set(value) - _KEYS[method])
        if unknown:
            raise SpeculativeConfigError(
                f"unsupported key(s) for method {method!r}: {', '.join(unknown)} (accepted: "
                f"{', '.join(sorted(_KEYS[method]))})"
            )
        tokens = _positive_int(value, "num_speculative_tokens")
        if method == "dflash":
            model = value.get("model")
            if not isinstance(model, str | os.PathLike) or not str(model):
                raise SpeculativeConfigError(
                    "method \"dflash\" needs \"model\": the drafter's directory or Hub id"
                )
            return cls("dflash", tokens, model=str(model))
        if tokens is None:
            raise SpeculativeConfigError("method \"ngram\" needs num_speculative_tokens")
        lookup_max = _positive_int(value, "prompt_lookup_max")
        lookup_min = _positive_int(value, "prompt_lookup_min")
        if lookup_max is None and lookup_min is None:
            lookup_max = lookup_min = NGRAM_DEFAULT_LOOKUP
        lookup_max = lookup_max if lookup_max is not None else lookup_min
        lookup_min = lookup_min if lookup_min is not None else lookup_max
        assert lookup_min is not None and lookup_max is not None
        if lookup_min > lookup_max:
            raise SpeculativeConfigError(
                f"prompt_lookup_min ({lookup_min}) must not exceed prompt_lookup_max "
                f"({lookup_max})"
            )
        return cls("ngram", tokens, prompt_lookup_max=lookup_max, prompt_lookup_min=lookup_min)


@dataclass(frozen=True)
class DecodeStep:
    """What one engine step produced: the prefill, a plain decode step or a draft-and-verify
    round."""

    token_ids: list[int]
    num_draft_tokens: int  # tokens proposed (0 for the prefill or a plain step)
    num_accepted_tokens: int  # proposed tokens the verifier accepted (before stop truncation)


class NgramProposer:
    """Prompt lookup over one sequence, kept incrementally: for every n in ``[min_n, max_n]``
    the earliest start of each n-gram seen, so a proposal is a few dictionary look-ups whatever
    the context length."""

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.tokens: list[int] = []
        self._first: dict[tuple[int, ...], int] = {}  # n-gram -> earliest start

    def extend(self, token_ids: Sequence[int]) -> None:
        tokens = self.tokens
        old = len(tokens)
        tokens.extend(token_ids)
        first = self._first
        for n in range(self.min_n, self.max_n + 1):
            for s in range(max(0, old - n + 1), len(tokens) - n + 1):
                first.setdefault(tuple(tokens[s : s + n]), s)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the earliest earlier occurrence of the longest
        matching suffix; [] when no suffix of ``min_n`` or more tokens occurred before."""
        tokens = self.tokens
        total = len(tokens)
        if k < 1:
            return []
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            start = self._first.get(tuple(tokens[total - n :]))
            if start is not None and start < total - n:  # not the suffix itself
                return tokens[start + n : start + n + k]
        return []


class LocalEngine:
    """A verifier on the CPU, decoding greedily and losslessly, with an optional speculative
    method (see the module docstring)."""

    def __init__(
        self,
        verifier: str | os.PathLike[str],
        speculative_config: SpeculativeConfig | Mapping[str, Any] | str | None = None,
        *,
        dtype: torch.dtype | None = None,
        lean: bool | None = None,
    ) -> None:
        config = SpeculativeConfig.parse(speculative_config)
        self.speculative_config = config
        self.method: Literal["dflash", "ngram"] | None = config.method if config else None
        self.verifier_path = str(verifier)
        self.runner = VerifierRunner(verifier, dtype=dtype, lean=lean)
        self.verifier = self.runner.model  # the transformers model (generate(), config)
        self.tokenizer = self.runner.tokenizer
        self.max_model_len: int = self.runner.max_model_len

        self.drafter: DFlashDrafter | None = None
        self.ngram_lookup: tuple[int, int] | None = None
        if config is None:
            self.num_speculative_tokens = 0
            self.max_speculative_tokens = 0
        elif config.method == "dflash":
            assert config.model is not None
            try:
                self.drafter = DFlashDrafter(config.model, self.runner)
            except (FileNotFoundError, ValueError) as e:  # missing, or not for this verifier
                raise SpeculativeConfigError(f"drafter {config.model}: {e}") from e
            self.runner.capture(self.drafter.aux_layer_ids)
            limit = self.drafter.block_size - 1
            n = limit if config.num_speculative_tokens is None else config.num_speculative_tokens
            if n > limit:
                raise SpeculativeConfigError(
                    f"num_speculative_tokens must be at most {limit} for the drafter's block "
                    f"size {self.drafter.block_size}, got {n}"
                )
            self.num_speculative_tokens = n
            self.max_speculative_tokens = limit
        else:
            assert config.prompt_lookup_min is not None and config.prompt_lookup_max is not None
            assert config.num_speculative_tokens is not None
            self.ngram_lookup = (config.prompt_lookup_min, config.prompt_lookup_max)
            self.num_speculative_tokens = config.num_speculative_tokens
            self.max_speculative_tokens = config.num_speculative_tokens

        if config is not None:
            self.runner.fuse_block_projections()  # verify blocks: fewer, larger matmuls
        self.stop_token_ids: frozenset[int] = frozenset(self._stop_token_ids())
        penalty = self.verifier.generation_config.repetition_penalty
        if penalty is not None and penalty != 1.0:
            logger.warning(
                "the verifier's generation_config sets repetition_penalty=%s: this engine "
                "decodes by plain argmax and does not apply it",
                penalty,
            )

    # What the old single-file engine exposed, for benchmarks and logs.

    @property
    def drafter_dir(self) -> os.PathLike[str] | None:
        return None if self.drafter is None else self.drafter.dir

    @property
    def block_size(self) -> int:
        """The verified block: the drafter's block size, or N + 1 for n-gram (1 alone)."""
        if self.drafter is not None:
            return self.drafter.block_size
        return self.max_speculative_tokens + 1

    @property
    def aux_layer_ids(self) -> list[int]:
        return [] if self.drafter is None else self.drafter.aux_layer_ids

    def describe(self) -> str:
        if self.method is None:
            return "no speculative decoding"
        if self.drafter is not None:
            return (
                f"DFlash drafter {self.drafter.dir}: block {self.drafter.block_size}, "
                f"{self.num_speculative_tokens} speculative tokens, aux layer ids "
                f"{self.drafter.aux_layer_ids}"
            )
        assert self.ngram_lookup is not None
        return (
            f"n-gram prompt lookup {self.ngram_lookup[1]}..{self.ngram_lookup[0]} tokens, "
            f"{self.num_speculative_tokens} speculative tokens"
        )

    def _stop_token_ids(self) -> set[int]:
        """The ids ``generate`` stops at (generation config) plus the tokenizer's EOS, as vLLM
        does."""
        ids: set[int] = set()
        for source in (self.verifier.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if source is None:
                continue
            ids.update([source] if isinstance(source, int) else source)
        return ids

    # Prompts ------------------------------------------------------------------------------

    def render(
        self,
        messages: list[dict[str, Any]],
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Apply the verifier's chat template with the generation prompt and tokenize."""
        kwargs = dict(chat_template_kwargs or {})
        if tools:
            kwargs["tools"] = tools
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **kwargs
        )
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # Decoding -----------------------------------------------------------------------------

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


class DFlashEngine(LocalEngine):
    """``LocalEngine`` with a DFlash drafter: the single-file engine's constructor."""

    def __init__(
        self,
        verifier: str | os.PathLike[str],
        drafter: str | os.PathLike[str],
        *,
        num_speculative_tokens: int | None = None,
        dtype: torch.dtype | None = None,
        lean: bool | None = None,
    ) -> None:
        config: dict[str, Any] = {"method": "dflash", "model": str(drafter)}
        if num_speculative_tokens is not None:
            config["num_speculative_tokens"] = num_speculative_tokens
        super().__init__(verifier, config, dtype=dtype, lean=lean)


class Generation:
    """One request's decoding state: call :meth:`step` until :attr:`finished`.

    ``num_speculative_tokens`` (default: the engine's) may be lowered per generation; 0 is plain
    greedy decoding through the same verifier path, with nothing proposed or kept for a drafter.
    """

    def __init__(
        self,
        engine: LocalEngine,
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
        if not 0 <= n <= engine.max_speculative_tokens:
            raise ValueError(
                f"num_speculative_tokens must be in [0, {engine.max_speculative_tokens}], got {n}"
            )
        self.engine = engine
        self.num_speculative_tokens = n
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = max_tokens
        self.ignore_eos = ignore_eos
        self.output_ids: list[int] = []
        self.finish_reason: FinishReason | None = None
        self._stop_ids = frozenset() if ignore_eos else engine.stop_token_ids
        capacity = len(self.prompt_ids) + max_tokens
        self._cache = engine.runner.new_cache(capacity)
        self._drafter: DFlashDrafter | None = engine.drafter if n else None
        self._drafter_cache: DraftCache | None = None
        self._context: list[torch.Tensor] = []  # aux features not yet in the drafter cache
        if self._drafter is not None:
            self._drafter_cache = self._drafter.new_cache(capacity)
        self._ngram: NgramProposer | None = None
        if n and engine.ngram_lookup is not None:
            self._ngram = NgramProposer(*engine.ngram_lookup)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def step(self) -> DecodeStep:
        if self.finished:
            raise RuntimeError("the generation is finished")
        with torch.inference_mode():
            return self._prefill() if not self.output_ids else self._decode()

    def _prefill(self) -> DecodeStep:
        capture = self._drafter is not None
        logits, features = self.engine.runner.forward(self.prompt_ids, self._cache, capture=capture)
        if features is not None:
            self._context.append(features)
        if self._ngram is not None:
            self._ngram.extend(self.prompt_ids)
        return DecodeStep(self._emit([int(logits[-1].argmax())]), 0, 0)

    def _propose(self, anchor: int, start: int, size: int) -> list[int]:
        if self._drafter is not None:
            assert self._drafter_cache is not None
            context = self._context[0] if len(self._context) == 1 else torch.cat(self._context, 1)
            self._context.clear()
            return self._drafter.draft(context, anchor, start, size, self._drafter_cache)
        if self._ngram is not None:
            return self._ngram.propose(size - 1)
        return []

    def _decode(self) -> DecodeStep:
        runner = self.engine.runner
        capture = self._drafter is not None
        anchor = self.output_ids[-1]
        start = len(self.prompt_ids) + len(self.output_ids) - 1  # the anchor's position
        size = min(self.num_speculative_tokens + 1, self.max_tokens - len(self.output_ids))
        drafted = self._propose(anchor, start, size) if size > 1 else []
        if not drafted:  # a plain decode step
            logits, features = runner.forward([anchor], self._cache, capture=capture)
            if features is not None:
                self._context.append(features)
            return DecodeStep(self._emit([int(logits[-1].argmax())]), 0, 0)

        logits, features = runner.forward(
            [anchor, *drafted], self._cache, all_logits=True, capture=capture
        )
        target = logits.argmax(dim=-1).tolist()  # target[i]: the verifier's token after slot i
        accepted = 0
        while accepted < len(drafted) and drafted[accepted] == target[accepted]:
            accepted += 1
        emitted = self._emit([*drafted[:accepted], target[accepted]])
        # The cache keeps the anchor and the accepted drafts; the last emitted token is the
        # next anchor. Their hidden states are the drafter's next context.
        self._cache.crop(start + len(emitted))
        if features is not None:
            self._context.append(features[:, : len(emitted)])
        return DecodeStep(emitted, len(drafted), accepted)

    def _emit(self, token_ids: list[int]) -> list[int]:
        """Append tokens up to a stop token or max_tokens; return those appended."""
        emitted = []
        for token in token_ids:
            self.output_ids.append(token)
            emitted.append(token)
            if token in self._stop_ids:
                self.finish_reason = "stop"
            elif len(self.output_ids) >= self.max_tokens:
                self.finish_reason = "length"
            if self.finished:
                break
        if self._ngram is not None and not self.finished:
            self._ngram.extend(emitted)
        return emitted
