"""Drafter kinds: one class per kind that speculators trains and vLLM serves, each with its own
fields, its trainer flags and its serving config. A new kind is one class here and one entry in
``KINDS``.

speculators 0.9.0 trains all four (``--speculator-type``); vLLM serves each from the
checkpoint the trainer writes. vLLM's CPU wheel (the local runtime) serves ``dflash`` and
``eagle3`` only: ``dspark`` and DFlash 2 need vLLM's Model Runner V2, which needs Triton, so a
GPU (shared/docs/vllm-cpu.md, "Drafter kinds on the CPU"; docs/api.md, "Drafter kinds").
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag

from app.schemas.common import Strict

GPU_ONLY = "served only by vLLM's Model Runner V2, which needs a GPU"


class DrafterBase(Strict):
    """The settings every kind trains with: the shape of the draft, which verifier layers feed
    it, and the training run itself."""

    type: str
    # Declared by each kind: how speculators and vLLM name it, and where vLLM serves it.
    vllm_method: ClassVar[str]
    cpu_served: ClassVar[bool]
    summary: ClassVar[str]

    num_layers: int = Field(5, ge=1, le=32, description="Decoder layers of the draft")
    target_layer_ids: list[int] | None = Field(None, min_length=1, max_length=16, description=(
        "The verifier layers whose hidden states feed the draft; default [2, n/2, n-3]"))
    draft_vocab_size: int | None = Field(None, ge=16, le=1_000_000, description=(
        "A reduced draft vocabulary (the most frequent tokens of the data); default the "
        "verifier's whole vocabulary"))
    total_seq_len: int = Field(8192, ge=64, le=262144, description=(
        "Tokens per training sequence; shared by every candidate of a job (the data is "
        "prepared once)"))
    epochs: int = Field(20, ge=1, le=1000)
    lr: float = Field(1e-3, gt=0, le=1)
    scheduler: Literal["cosine", "linear", "none"] = "cosine"
    seed: int = Field(42, ge=0, le=2**31 - 1)

    def kind_flags(self) -> list[str]:
        """speculators' flags that only this kind has."""
        return []

    def num_speculative_tokens(self) -> int:
        """The tokens drafted per step when served, as the checkpoint's config says
        (``speculators_config.proposal_methods[0].speculative_tokens``)."""
        raise NotImplementedError

    def trainer_flags(self, *, warm: bool) -> list[str]:
        """The trainer's flags for this drafter. A warm start (``--from-pretrained``) brings its
        architecture with it, and speculators refuses the decoder-shaping flags beside it."""
        assert self.target_layer_ids is not None, "resolved when the job is created"
        flags = ["--speculator-type", self.type]
        if not warm:
            flags += ["--num-layers", str(self.num_layers)]
        flags += [
            *self.kind_flags(),
            "--target-layer-ids", *[str(i) for i in self.target_layer_ids],
            "--total-seq-len", str(self.total_seq_len),
            "--epochs", str(self.epochs),
            "--lr", str(self.lr),
            "--scheduler-type", self.scheduler,
            "--seed", str(self.seed),
        ]
        if self.draft_vocab_size:
            flags += ["--draft-vocab-size", str(self.draft_vocab_size)]
        return flags


class BlockDrafter(DrafterBase):
    """The DFlash family: one forward pass drafts a whole block."""

    block_size: int = Field(16, ge=2, le=64, description=(
        "Tokens per drafted block: the last accepted token and block_size - 1 mask tokens"))
    max_anchors: int = Field(3072, ge=1, le=65536, description=(
        "Anchor positions sampled per training sequence"))

    def kind_flags(self) -> list[str]:
        return ["--block-size", str(self.block_size), "--max-anchors", str(self.max_anchors)]

    def num_speculative_tokens(self) -> int:
        return self.block_size - 1


class DFlash(BlockDrafter):
    type: Literal["dflash"] = "dflash"
    vllm_method: ClassVar[str] = "dflash"
    cpu_served: ClassVar[bool] = True
    summary: ClassVar[str] = "DFlash: a block drafted in one pass from the verifier's hidden states"


class DFlash2(BlockDrafter):
    type: Literal["dflash2"] = "dflash2"
    # vLLM reads a DFlash 2 checkpoint under the dflash method (DFlash2DraftModel).
    vllm_method: ClassVar[str] = "dflash"
    cpu_served: ClassVar[bool] = False
    summary: ClassVar[str] = "DFlash 2: DFlash with a local convolution and a candidate selector"
    block_size: int = Field(8, ge=2, le=64, description=(
        "Tokens per drafted block: the last accepted token and block_size - 1 mask tokens"))


class DSpark(BlockDrafter):
    type: Literal["dspark"] = "dspark"
    vllm_method: ClassVar[str] = "dspark"
    cpu_served: ClassVar[bool] = False
    summary: ClassVar[str] = "DSpark: a DFlash block with a Markov head and a confidence head"
    block_size: int = Field(8, ge=2, le=64, description=(
        "Tokens per drafted block; every position drafts (the anchor too)"))

    def num_speculative_tokens(self) -> int:
        return self.block_size  # speculators samples from the anchor for dspark


class Eagle3(DrafterBase):
    type: Literal["eagle3"] = "eagle3"
    vllm_method: ClassVar[str] = "eagle3"
    cpu_served: ClassVar[bool] = True
    summary: ClassVar[str] = "EAGLE-3: an autoregressive draft head on the verifier's features"
    num_layers: int = Field(1, ge=1, le=32, description="Decoder layers of the draft")
    ttt_steps: int = Field(3, ge=1, le=16, description=(
        "Test-time-training steps the draft is unrolled over; also the tokens it drafts per "
        "step when served"))

    def kind_flags(self) -> list[str]:
        return ["--ttt-steps", str(self.ttt_steps)]

    def num_speculative_tokens(self) -> int:
        return self.ttt_steps


KINDS: dict[str, type[DrafterBase]] = {k.model_fields["type"].default: k
                                        for k in (DFlash, DFlash2, DSpark, Eagle3)}


def kind_of(value: Any) -> str:
    """The discriminator: a drafter without ``type`` is DFlash (what jobs were before kinds)."""
    if isinstance(value, dict):
        return value.get("type", "dflash")
    return getattr(value, "type", "dflash")


Drafter = Annotated[
    Annotated[DFlash, Tag("dflash")] | Annotated[DFlash2, Tag("dflash2")]
    | Annotated[DSpark, Tag("dspark")] | Annotated[Eagle3, Tag("eagle3")],
    Discriminator(kind_of, custom_error_type="unknown_kind", custom_error_message=(
        "unknown drafter kind: the supported kinds are " + ", ".join(KINDS)),
        custom_error_context={"kinds": ", ".join(KINDS)}),
]


def runtime_refusal(drafter: DrafterBase, runtime: str) -> str | None:
    """Why ``runtime`` cannot serve this kind, or None."""
    if runtime == "local" and not drafter.cpu_served:
        return (f"{drafter.type} is {GPU_ONLY}; the local runtime (vLLM's CPU wheel) serves "
                f"{', '.join(k for k, c in KINDS.items() if c.cpu_served)}: use the vllm runtime")
    return None
