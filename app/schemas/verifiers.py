"""Request and response models for /api/verifiers."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from app.schemas.common import Strict

# A Hugging Face id ("org/name") or a directory under the models root, as jobs name it.
VerifierRef = Annotated[str, Field(min_length=1, max_length=512)]


class VerifierInspect(Strict):
    verifier: VerifierRef


class VerifierOut(BaseModel):
    """What a job learns of its verifier when it is created, from the model's config.json."""

    object: Literal["specdeck.verifier"] = "specdeck.verifier"
    verifier: str
    source: Literal["local", "hub"]
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str | None
    default_target_layer_ids: list[int] | None = Field(description=(
        "The speculator.target_layer_ids a job gets unless it names its own; null where the "
        "verifier is too shallow for the defaults, so a job must name them"))


class VerifierList(BaseModel):
    """The verifiers under the models root, by name."""

    object: Literal["list"] = "list"
    data: list[VerifierOut]
