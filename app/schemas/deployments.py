"""Request and response models for /api/deployments."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from app.schemas.common import Strict


class DeploymentResources(Strict):
    tensor_parallel_size: int = Field(1, ge=1, le=64)


class DeploymentCreate(Strict):
    """A drafter to serve: a checkpoint of a job, or a Hub drafter id plus its verifier."""

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    checkpoint_id: str | None = Field(None, pattern=r"^ckpt_[0-9a-f]{24}$")
    drafter: str | None = Field(None, min_length=1, max_length=512)
    verifier: str | None = Field(None, min_length=1, max_length=512)
    num_speculative_tokens: int | None = Field(None, ge=1, le=64)
    resources: DeploymentResources = Field(default_factory=DeploymentResources)
    runtime: Literal["vllm", "local"] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "DeploymentCreate":
        if (self.checkpoint_id is None) == (self.drafter is None):
            raise ValueError("give either checkpoint_id, or drafter with verifier")
        if self.drafter is not None and self.verifier is None:
            raise ValueError("a drafter needs its verifier")
        if self.checkpoint_id is not None and self.verifier is not None:
            raise ValueError("a checkpoint's verifier is the one it was trained for; omit verifier")
        return self


class DeploymentOut(BaseModel):
    object: Literal["specdeck.deployment"] = "specdeck.deployment"
    id: str
    name: str
    status: str
    status_reason: str | None
    source: dict[str, Any]
    drafter: str
    verifier: str
    num_speculative_tokens: int
    runtime: str
    resources: dict[str, Any]
    restarts: int
    worker: str | None
    allocation: dict[str, list[int]] | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
