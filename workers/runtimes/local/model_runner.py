"""The local engine's model runner: the verifier's and the DFlash drafter's weights, their KV
caches and their forward passes, on the CPU.

Two ways to run the verifier:

- **Lean** (Qwen3, Qwen2 and Llama layouts, sdpa, static RoPE, no sliding window: the demo
  verifier and the usual verifiers): the decoder layers are run here with plain torch ops on the
  model's own weights, a preallocated KV cache (cropping is setting a length), a RoPE table
  computed once by the model's own rotary module, one mask per pass, and the drafter's aux hidden
  states written straight into one feature tensor. The ops are those of ``transformers`` in the
  same order (the single-token decode step gives bit-identical logits to ``generate``); what goes
  is the per-module Python overhead of ``transformers``, which dominates small models on a CPU.
- **Generic** (anything else ``AutoModelForCausalLM`` loads): the model's own forward with a
  ``DynamicCache``, and forward hooks for the aux hidden states, registered only when a DFlash
  drafter needs them.

The drafter's single-block inference pass is likewise built here from speculators' modules
(``fc`` and ``hidden_norm`` over the aux features, the decoder layers, ``norm``, ``lm_head``,
``d2t``), with the context keys and values of each draft layer in a preallocated cache: the
block's own keys are never cached, so nothing is cropped.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F  # noqa: N812
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

__all__ = [
    "DFlashDrafter",
    "DraftCache",
    "KVCache",
    "VerifierRunner",
    "resolve_drafter_dir",
]

logger = logging.getLogger("specdeck.local.engine")

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
LEAN_MODEL_TYPES = frozenset({"qwen3", "qwen2", "llama"})
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})
FUSED_WEIGHTS_MAX_BYTES = 1 << 30


# KV caches -----------------------------------------------------------------------------------


class VerifierCache(Protocol):
    @property
    def length(self) -> int: ...

    def crop(self, length: int) -> None: ...


class KVCache:
    """Keys and values of every verifier layer, ``[layers, 1, kv_heads, capacity, head_dim]``,
    valid up to ``length``. Grows (doubling) if a pass goes past ``capacity``."""

    def __init__(
        self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype
    ) -> None:
        shape = (num_layers, 1, num_kv_heads, max(capacity, 1), head_dim)
        self.keys = torch.empty(shape, dtype=dtype)
        self.values = torch.empty(shape, dtype=dtype)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def reserve(self, end: int) -> None:
        if end <= self.capacity:
            return
        capacity = max(end, 2 * self.capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:3], capacity, old.shape[4]))
            new[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, new)

    def crop(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise RuntimeError(f"cannot crop a cache of {self.length} to {length}")
        self.length = length


class _HFCache:
    """A ``DynamicCache`` behind the same ``length`` / ``crop`` interface."""

    def __init__(self, cache: DynamicCache) -> None:
        self.cache = cache

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        remove = self.length - length
        if remove < 0:
            raise RuntimeError(f"cannot crop a cache of {self.length} up to {length}")
        if remove:
            self.cache.crop(-remove)


class _RopeTable:
    """cos and a signed sin for positions ``[0, n)``, computed by the model's own rotary module
    (so any static RoPE variant and its attention scaling come out exactly as the model computes
    them), grown on demand. ``sin`` carries the sign of ``rotate_half``: ``x * cos +
    x.roll(half) * sin`` is transformers' ``x * cos + rotate_half(x) * sin`` bit for bit, in
    four ops instead of seven."""

    def __init__(self, rotary: torch.nn.Module, dtype: torch.dtype) -> None:
        self.rotary = rotary
        self.dtype = dtype
        self.cos = torch.empty(0)
        self.sin = torch.empty(0)

    def get(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        if end > self.cos.shape[0]:
            size = max(end, 2 * self.cos.shape[0], 512)
            probe = torch.empty(1, dtype=self.dtype)
            with torch.inference_mode():
                cos, sin = self.rotary(probe, torch.arange(size).unsqueeze(0))
                half = sin.shape[-1] // 2
                self.cos, self.sin = cos[0], torch.cat((-sin[0, :, :half], sin[0, :, half:]), -1)
        return self.cos[start:end], self.sin[start:end]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """transformers' Qwen3/Llama RMSNorm (``weight * (x * rsqrt(mean(x^2) + eps))``, in float32
    for other dtypes); for float32, torch's own rms_norm, which computes the same bits in one
    op."""
    dtype = x.dtype
    if dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x.to(dtype) if weight is None else weight * x.to(dtype)


def _head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head RMSNorm of ``[..., heads, head_dim]`` with a ``[heads, head_dim]`` weight (the
    query heads' q_norm weight, then the key heads' k_norm weight: both in one pass)."""
    return weight * _rms_norm(x, None, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return (x * cos) + (x.roll(x.shape[-1] // 2, -1) * sin)


def _weights(linear: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return linear.weight, linear.bias


def _fuse(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several projections of the same input: one matmul for all.

    A copy: the modules keep their own tensors. (Views of one fused tensor would save the
    memory, but a matmul over a view can sum in another order than over the model's own tensor,
    and the single-token steps must stay bit-identical to generate().)"""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    if all(linear.bias is None for linear in linears):
        return weight, None
    bias = torch.cat(
        [
            linear.bias.detach() if linear.bias is not None else weight.new_zeros(rows)
            for linear, rows in ((m, m.weight.shape[0]) for m in linears)
        ]
    )
    return weight, bias


# The verifier --------------------------------------------------------------------------------


class VerifierRunner:
    """The verifier, its tokenizer and its forward pass over a KV cache.

    ``capture(ids)`` names the aux hidden-state ids a DFlash drafter reads (id ``k`` is the
    residual stream after decoder layer ``k - 1``, id 0 the embeddings, id ``n`` before the
    final norm); ``forward(..., capture=True)`` returns them concatenated in that order.
    ``lean``: None picks the lean forward where it applies; False forces ``transformers``'.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: torch.dtype | None = None,
        lean: bool | None = None,
    ) -> None:
        self.path = str(path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        model = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype or "auto")
        self.model = model.eval().requires_grad_(False)
        self.config = self.model.config.get_text_config()
        self.dtype: torch.dtype = self.model.dtype
        self.max_model_len: int = self.config.max_position_embeddings
        self.num_layers: int = self.config.num_hidden_layers
        self.hidden_size: int = self.config.hidden_size
        self.vocab_size: int = self.config.vocab_size
        self.capture_layer_ids: list[int] = []
        why_not = self._lean_unsupported()
        if lean is None:
            lean = why_not is None
        elif lean and why_not is not None:
            raise ValueError(f"the lean forward does not support this verifier: {why_not}")
        self.lean: bool = lean
        if lean:
            self._build_lean()
        else:
            logger.info("the verifier runs through transformers' forward (%s)", why_not)
            self._captured: dict[int, torch.Tensor] = {}
            self._capturing = False
            self._hook_lock = threading.Lock()

    def capture(self, layer_ids: Sequence[int]) -> None:
        """Make ``forward(..., capture=True)`` return the hidden states of ``layer_ids`` (once,
        when a DFlash drafter is loaded; without one nothing is hooked or copied)."""
        if self.capture_layer_ids:
            raise RuntimeError("the aux layer ids are already set")
        if not all(0 <= i <= self.num_layers for i in layer_ids):
            raise ValueError(
                f"aux layer ids {list(layer_ids)} are outside [0, {self.num_layers}] for the "
                "verifier"
            )
        self.capture_layer_ids = list(layer_ids)
        if self.lean:
            self._capture_slots = {
                layer_id: slice(j * self.hidden_size, (j + 1) * self.hidden_size)
                for j, layer_id in enumerate(self.capture_layer_ids)
            }
        else:
            self._register_hooks()

    def fuse_block_projections(self, max_bytes: int = FUSED_WEIGHTS_MAX_BYTES) -> bool:
        """Verify blocks (several tokens after the cache) then run each layer's q/k/v and
        gate/up projections as one matmul each: fewer, larger ops per speculative step. The
        fused weights are a copy of those projections; skipped (False) when the copy would
        exceed ``max_bytes`` or the forward is not the lean one."""
        if not self.lean:
            return False
        if self._fused is None:
            layers = self.model.get_decoder().layers
            size = sum(
                m.weight.numel() * m.weight.element_size()
                for layer in layers
                for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                          layer.mlp.gate_proj, layer.mlp.up_proj)
            )  # fmt: skip
            if size > max_bytes:
                logger.info("verify blocks use separate projections: fusing them would copy "
                            "%.0f MiB", size / 2**20)  # fmt: skip
                return False
            self._fused = [
                (
                    *_fuse(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                    *_fuse(layer.mlp.gate_proj, layer.mlp.up_proj),
                )
                for layer in layers
            ]
        return True

    # Set-up -------------------------------------------------------------------------------

    def _lean_unsupported(self) -> str | None:
        """Why the lean forward cannot run this model (None: it can)."""
        config = self.config
        if config.model_type not in LEAN_MODEL_TYPES:
            return f"model type {config.model_type!r}"
        if getattr(config, "hidden_act", None) != "silu":
            return f"activation {getattr(config, 'hidden_act', None)!r}"
        if "sliding_attention" in (getattr(config, "layer_types", None) or []):
            return "sliding-window layers"
        if getattr(self.model.config, "_attn_implementation", None) not in ("sdpa", "eager"):
            return f"attention {self.model.config._attn_implementation!r}"  # noqa: SLF001
        inner = self.model.get_decoder()
        rotary = getattr(inner, "rotary_emb", None)
        if rotary is None or getattr(rotary, "rope_type", None) not in STATIC_ROPE_TYPES:
            return f"RoPE type {getattr(rotary, 'rope_type', None)!r}"
        if getattr(inner, "embed_scale", None) is not None:
            return "scaled embeddings"
        return None

    def _build_lean(self) -> None:
        inner = self.model.get_decoder()
        attention = inner.layers[0].self_attn
        self.num_heads: int = self.config.num_attention_heads
        self.num_kv_heads: int = self.config.num_key_value_heads
        self.head_dim: int = attention.head_dim
        self._scaling: float = attention.scaling
        self._embed = inner.embed_tokens.weight
        self._final_norm = (inner.norm.weight, inner.norm.variance_epsilon)
        self._lm_head = _weights(self.model.get_output_embeddings())
        self._rope = _RopeTable(inner.rotary_emb, self.dtype)
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        self._layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            q_norm = getattr(attn, "q_norm", None)
            qk_norm = None
            if q_norm is not None:
                qk_norm = torch.cat(
                    [
                        q_norm.weight.detach().expand(heads, head_dim),
                        attn.k_norm.weight.detach().expand(kv_heads, head_dim),
                    ]
                )
            self._layers.append(
                (
                    layer.input_layernorm.weight,
                    layer.input_layernorm.variance_epsilon,
                    *_weights(attn.q_proj),
                    *_weights(attn.k_proj),
                    *_weights(attn.v_proj),
                    qk_norm,
                    attn_eps(q_norm),
                    *_weights(attn.o_proj),
                    layer.post_attention_layernorm.weight,
                    layer.post_attention_layernorm.variance_epsilon,
                    *_weights(mlp.gate_proj),
                    *_weights(mlp.up_proj),
                    *_weights(mlp.down_proj),
                )
            )
        self._fused: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor,
                                torch.Tensor | None]] | None = None  # fmt: skip
        # Where each captured id's hidden state lands in the feature tensor (see capture()).
        self._capture_slots: dict[int, slice] = {}

    def _register_hooks(self) -> None:
        def capture(layer_id: int) -> Callable[[torch.nn.Module, Any, Any], None]:
            def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
                if self._capturing:
                    self._captured[layer_id] = output[0] if isinstance(output, tuple) else output

            return hook

        layers = self.model.get_decoder().layers
        for layer_id in self.capture_layer_ids:
            if layer_id == 0:
                self.model.get_input_embeddings().register_forward_hook(capture(0))
            else:
                layers[layer_id - 1].register_forward_hook(capture(layer_id))

    # Caches and passes ---------------------------------------------------------------------

    def new_cache(self, capacity: int) -> VerifierCache:
        """An empty KV cache for one sequence of about ``capacity`` tokens."""
        if self.lean:
            return KVCache(self.num_layers, self.num_kv_heads, self.head_dim, capacity, self.dtype)
        cache = DynamicCache(config=self.model.config)
        return _HFCache(cache)

    def forward(
        self,
        token_ids: Sequence[int],
        cache: VerifierCache,
        *,
        all_logits: bool = False,
        capture: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run ``token_ids`` after the cached tokens; the cache then holds them too.

        Returns the logits ``[T, V]`` (``[1, V]``, the last position, unless ``all_logits``)
        and, with ``capture``, the aux hidden states ``[1, T, len(ids) * hidden]``.
        """
        if capture and not self.capture_layer_ids:
            raise ValueError("no aux layer ids to capture")
        input_ids = torch.tensor([token_ids], dtype=torch.long)
        if self.lean:
            assert isinstance(cache, KVCache)
            return self._lean_forward(input_ids, cache, all_logits=all_logits, capture=capture)
        assert isinstance(cache, _HFCache)
        return self._hf_forward(input_ids, cache, all_logits=all_logits, capture=capture)

    def _hf_forward(
        self, input_ids: torch.Tensor, cache: _HFCache, *, all_logits: bool, capture: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self._hook_lock:
            self._capturing = capture
            try:
                output = self.model(
                    input_ids=input_ids,
                    past_key_values=cache.cache,
                    use_cache=True,
                    logits_to_keep=0 if all_logits else 1,
                )
                features = None
                if capture:
                    features = torch.cat(
                        [self._captured[i] for i in self.capture_layer_ids], dim=-1
                    )
            finally:
                self._capturing = False
                self._captured.clear()
        return output.logits[0], features

    def _lean_forward(
        self, input_ids: torch.Tensor, cache: KVCache, *, all_logits: bool, capture: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        length = input_ids.shape[1]
        start = cache.length
        end = start + length
        cache.reserve(end)
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        gqa = heads != kv_heads
        scaling = self._scaling
        cos, sin = self._rope.get(start, end)

        # One mask per pass: none for one token or a prefill (is_causal), else a block after
        # the cache sees all of it and itself causally.
        causal = length > 1 and start == 0
        mask = None
        if length > 1 and start > 0:
            mask = torch.ones(length, end, dtype=torch.bool).tril_(start)

        x = F.embedding(input_ids, self._embed)
        features = None
        slots = self._capture_slots
        if capture:
            features = x.new_empty((1, length, len(slots) * self.hidden_size))
            if 0 in slots:
                features[..., slots[0]] = x
        keys, values = cache.keys, cache.values
        qk_heads = heads + kv_heads
        # A verify block runs each layer's q/k/v and gate/up projections as one matmul each
        # when fuse_block_projections() made the weights. A single token and a prefill keep
        # transformers' separate matmuls: a fused one sums in another order (last-bit
        # differences), and those steps stay bit-identical to generate().
        fused_layers = self._fused if length > 1 and start > 0 else None
        for i, (
            ln1, ln1_eps, q_w, q_b, k_w, k_b, v_w, v_b, qk_norm, qk_eps, o_w, o_b,
            ln2, ln2_eps, gate_w, gate_b, up_w, up_b, down_w, down_b,
        ) in enumerate(self._layers):  # fmt: skip
            fused = None if fused_layers is None else fused_layers[i]
            h = _rms_norm(x, ln1, ln1_eps)
            if fused is not None:
                qkv = F.linear(h, fused[0], fused[1]).view(1, length, qk_heads + kv_heads, head_dim)
                qk, v = qkv[:, :, :qk_heads], qkv[:, :, qk_heads:]
            else:
                qk = torch.cat([F.linear(h, q_w, q_b), F.linear(h, k_w, k_b)], dim=-1)
                qk = qk.view(1, length, qk_heads, head_dim)
                v = F.linear(h, v_w, v_b).view(1, length, kv_heads, head_dim)
            if qk_norm is not None:
                qk = _head_norm(qk, qk_norm, qk_eps)
            qk = _rotate(qk.transpose(1, 2), cos, sin)  # queries and keys, one rotation
            keys[i, :, :, start:end] = qk[:, heads:]
            values[i, :, :, start:end] = v.transpose(1, 2)
            attn = F.scaled_dot_product_attention(
                qk[:, :heads],
                keys[i, :, :, :end],
                values[i, :, :, :end],
                attn_mask=mask,
                scale=scaling,
                is_causal=causal,
                enable_gqa=gqa,
            )
            x = x + F.linear(attn.transpose(1, 2).reshape(1, length, -1), o_w, o_b)
            h = _rms_norm(x, ln2, ln2_eps)
            if fused is not None:
                gate, up = F.linear(h, fused[2], fused[3]).chunk(2, -1)
            else:
                gate, up = F.linear(h, gate_w, gate_b), F.linear(h, up_w, up_b)
            x = x + F.linear(F.silu(gate) * up, down_w, down_b)
            if features is not None and i + 1 in slots:
                features[..., slots[i + 1]] = x
        cache.length = end
        if not all_logits:
            x = x[:, -1:]
        norm_weight, norm_eps = self._final_norm
        logits = F.linear(_rms_norm(x, norm_weight, norm_eps), *self._lm_head)
        return logits[0], features


def attn_eps(norm: torch.nn.Module | None) -> float:
    return 0.0 if norm is None else float(norm.variance_epsilon)


# The DFlash drafter --------------------------------------------------------------------------


def resolve_drafter_dir(path: str | os.PathLike[str]) -> Path:
    """The directory holding the drafter's ``config.json`` and weights.

    Accepts a checkpoint directory (``OUT/<epoch>``), a trainer save path (its
    ``checkpoint_best``), a Hugging Face Hub cache repository directory (``models--org--name``
    with ``refs/main`` and ``snapshots/<commit>/``), or a Hub id (downloaded, or found in the
    cache; with ``HF_HUB_OFFLINE=1`` only there).
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
        # The token, if any, comes from HF_TOKEN.
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(path), allow_patterns=["*.json", "*.safetensors"]))
    raise FileNotFoundError(
        f"no drafter at {root}: expected a Hub id, a config.json, a checkpoint_best link or a "
        "Hub snapshot layout (refs/main, snapshots/<commit>/config.json)"
    )


class DraftCache:
    """The context keys and values of every draft layer (the fused aux features projected by
    each layer's ``k_proj``/``v_proj``), ``[layers, 1, kv_heads, capacity, head_dim]``, valid
    up to ``length``; a block's own keys and values are written after them for one pass."""

    def __init__(self, shape: tuple[int, int, int, int, int], dtype: torch.dtype) -> None:
        self.keys = torch.empty(shape, dtype=dtype)
        self.values = torch.empty(shape, dtype=dtype)
        self.length = 0

    def reserve(self, end: int) -> None:
        capacity = self.keys.shape[3]
        if end <= capacity:
            return
        capacity = max(end, 2 * capacity)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_empty((*old.shape[:3], capacity, old.shape[4]))
            new[:, :, :, : self.length] = old[:, :, :, : self.length]
            setattr(self, name, new)


class DFlashDrafter:
    """A speculators DFlash checkpoint, loaded against ``verifier``, drafting one block per call.

    The drafter's forward pass in speculators is the training one (anchored blocks over a packed
    batch); the single-block pass is built here from the same modules. Per draft layer: sliding
    window size (None: full attention) and whether the block is causal, mirroring the training
    mask (speculators' ``create_anchor_block_mask_mod``): full-attention layers see the whole
    block; sliding layers see it causally unless ``sliding_window_non_causal``, and see the
    context from ``anchor - window`` on.
    """

    def __init__(self, path: str | os.PathLike[str], verifier: VerifierRunner) -> None:
        from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig

        self.dir = resolve_drafter_dir(path)
        config = DFlashSpeculatorConfig.from_pretrained(self.dir)
        if config.sample_from_anchor:
            raise ValueError("drafters with sample_from_anchor=True are not supported")
        if config.mask_token_id is None:
            raise ValueError(f"{self.dir}/config.json has no mask_token_id")
        if not config.aux_hidden_state_layer_ids:
            raise ValueError(f"{self.dir}/config.json has no aux_hidden_state_layer_ids")
        # Embeddings and lm_head come from the verifier being served, wherever the checkpoint
        # was trained; flex attention has no CPU path, sdpa does.
        config.speculators_config.verifier.name_or_path = verifier.path
        config.transformer_layer_config._attn_implementation = "sdpa"  # noqa: SLF001
        model = DFlashDraftModel.from_pretrained(self.dir, config=config, dtype=verifier.dtype)
        self.model: Any = model.eval().requires_grad_(False)
        self.config = config

        # The hidden-states server stacks layers in ascending id order and the trainer flattens
        # them in that order: the drafter's fc expects that concatenation.
        self.aux_layer_ids: list[int] = sorted(config.aux_hidden_state_layer_ids)
        if not all(0 <= i <= verifier.num_layers for i in self.aux_layer_ids):
            raise ValueError(
                f"aux layer ids {self.aux_layer_ids} are outside [0, {verifier.num_layers}] "
                "for the verifier"
            )
        expected_fc_in = len(self.aux_layer_ids) * verifier.hidden_size
        if self.model.fc.in_features != expected_fc_in:
            raise ValueError(
                f"drafter fc takes {self.model.fc.in_features} features, the verifier gives "
                f"{len(self.aux_layer_ids)} x {verifier.hidden_size} = {expected_fc_in}"
            )
        if self.model.verifier_vocab_size != verifier.vocab_size:
            raise ValueError(
                f"drafter vocab {self.model.verifier_vocab_size} != verifier vocab "
                f"{verifier.vocab_size}"
            )
        self.block_size: int = config.block_size
        self.mask_token_id: int = config.mask_token_id

        tl_config = config.transformer_layer_config
        sliding = set(self.model.sliding_window_indices)
        self._layer_attention: list[tuple[int | None, bool]] = [
            (
                (tl_config.sliding_window, not config.sliding_window_non_causal)
                if i in sliding
                else (None, False)
            )
            for i in range(len(self.model.layers))
        ]
        first = self.model.layers[0].self_attn
        self.num_heads: int = tl_config.num_attention_heads
        self.num_kv_heads: int = tl_config.num_key_value_heads
        self.head_dim: int = first.head_dim
        self._scaling: float = first.scaling
        self._rope = _RopeTable(self.model.rotary_emb, verifier.dtype)
        self.dtype = verifier.dtype
        d = self.model
        if tl_config.hidden_act != "silu":
            raise ValueError(f"draft activation {tl_config.hidden_act!r} is not supported")
        self._embed = d.embed_tokens.weight
        self._fc = d.fc.weight
        self._hidden_norm = (d.hidden_norm.weight, d.hidden_norm.variance_epsilon)
        self._norm = (d.norm.weight, d.norm.variance_epsilon)
        self._lm_head = d.lm_head.weight
        # The context rows and the block rows go through k_proj/v_proj together, as one
        # matmul (speculators concatenates them too); gate/up are one matmul as well.
        self._layers = [
            (
                layer.input_layernorm.weight,
                layer.input_layernorm.variance_epsilon,
                *_weights(layer.self_attn.q_proj),
                *_fuse(layer.self_attn.k_proj, layer.self_attn.v_proj),
                layer.self_attn.q_norm.weight,
                layer.self_attn.k_norm.weight,
                attn_eps(layer.self_attn.q_norm),
                *_weights(layer.self_attn.o_proj),
                layer.post_attention_layernorm.weight,
                layer.post_attention_layernorm.variance_epsilon,
                *_fuse(layer.mlp.gate_proj, layer.mlp.up_proj),
                *_weights(layer.mlp.down_proj),
            )
            for layer in d.layers
        ]
        # The block is [anchor, mask x N]: the mask rows' embedding never changes.
        self._mask_embedding = self._embed[self.mask_token_id].view(1, 1, -1)
        self._masks: dict[tuple[int, int, int | None, bool], torch.Tensor | None] = {}

    def new_cache(self, capacity: int) -> DraftCache:
        shape = (len(self.model.layers), 1, self.num_kv_heads, max(capacity, 1), self.head_dim)
        return DraftCache(shape, self.dtype)

    def draft(
        self, context: torch.Tensor, anchor: int, start: int, size: int, cache: DraftCache
    ) -> list[int]:
        """Propose ``size - 1`` tokens for positions ``start + 1 ...``.

        ``context`` holds the aux features ``[1, c, len(ids) * hidden]`` of the positions the
        cache does not have yet, which end right before ``start`` (the anchor's position).
        """
        d = self.model
        cached = cache.length
        new = context.shape[1]
        if cached + new != start:
            raise RuntimeError(
                f"drafter cache ({cached}) + new context ({new}) != anchor position {start}"
            )
        end = start + size
        cache.reserve(end)
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        gqa = heads != kv_heads
        anchor_embedding = F.embedding(torch.tensor([[anchor]]), self._embed)
        hidden = torch.cat(
            [anchor_embedding, self._mask_embedding.expand(1, size - 1, -1)], dim=1
        )
        target_hidden = None
        if new:
            fc_w, (hn_w, hn_eps) = self._fc, self._hidden_norm
            target_hidden = _rms_norm(F.linear(context, fc_w), hn_w, hn_eps)
        cos, sin = self._rope.get(cached, end)  # the new context's positions, then the block's
        block_cos, block_sin = cos[new:], sin[new:]
        keys_cache, values_cache = cache.keys, cache.values
        for i, (
            (ln1, ln1_eps, q_w, q_b, kv_w, kv_b, qn, kn, qk_eps, o_w, o_b,
             ln2, ln2_eps, gate_up_w, gate_up_b, down_w, down_b),
            kind,
        ) in enumerate(zip(self._layers, self._layer_attention, strict=True)):  # fmt: skip
            h = _rms_norm(hidden, ln1, ln1_eps)
            q = _rms_norm(F.linear(h, q_w, q_b).view(1, size, heads, head_dim), qn, qk_eps)
            rows = h if target_hidden is None else torch.cat([target_hidden, h], dim=1)
            kv = F.linear(rows, kv_w, kv_b).view(1, new + size, 2 * kv_heads, head_dim)
            k = _rms_norm(kv[:, :, :kv_heads], kn, qk_eps).transpose(1, 2)
            # The new context's keys and values join the cache; the block's go after them,
            # in the cache's spare room: attention reads one view, the next block overwrites.
            keys_cache[i, :, :, cached:end] = _rotate(k, cos, sin)
            values_cache[i, :, :, cached:end] = kv[:, :, kv_heads:].transpose(1, 2)
            output = F.scaled_dot_product_attention(
                _rotate(q.transpose(1, 2), block_cos, block_sin),
                keys_cache[i, :, :, :end],
                values_cache[i, :, :, :end],
                attn_mask=self._mask(start, size, kind),
                scale=self._scaling,
                enable_gqa=gqa,
            )
            hidden = hidden + F.linear(output.transpose(1, 2).reshape(1, size, -1), o_w, o_b)
            gate, up = F.linear(_rms_norm(hidden, ln2, ln2_eps), gate_up_w, gate_up_b).chunk(2, -1)
            hidden = hidden + F.linear(F.silu(gate) * up, down_w, down_b)
        cache.length = start
        norm_w, norm_eps = self._norm
        logits = F.linear(_rms_norm(hidden[:, 1:], norm_w, norm_eps), self._lm_head)
        ids = logits[0].argmax(dim=-1)
        if d.use_draft_vocab:
            ids = ids + d.d2t[ids]  # d2t holds offsets: target id = draft id + d2t[draft id]
        return ids.tolist()

    def _mask(self, start: int, size: int, kind: tuple[int | None, bool]) -> torch.Tensor | None:
        window, causal = kind
        if (window is None or window >= start) and not causal:
            return None  # everything visible: sdpa runs unmasked and non-causal
        key = (start, size, window, causal)
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) > 64:
                self._masks.clear()
            mask = _block_mask(start, size, window=window, causal=causal)
            self._masks[key] = mask
        return mask


def _block_mask(start: int, size: int, *, window: int | None, causal: bool) -> torch.Tensor:
    """Boolean mask ``[1, 1, size, start + size]`` for a block anchored at ``start``."""
    kv = torch.arange(start + size)
    query = torch.arange(size)[:, None]
    in_context = kv < start
    if window is not None:
        in_context = in_context & (kv >= start - window)
    in_block = kv >= start
    if causal:
        in_block = in_block & (kv - start <= query)
    return (in_context | in_block)[None, None]
