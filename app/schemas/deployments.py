"""Request and response models for /api/deployments."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.schemas.capture import CaptureOptions, CaptureOut
from app.schemas.common import EventBase, Strict


class DeploymentResources(Strict):
    tensor_parallel_size: int = Field(1, ge=1, le=64)


# The one-source rule of DeploymentCreate._one_source, for the OpenAPI document: a field left
# out and a field sent as null are the same.
_ONE_SOURCE = {"oneOf": [
    {"title": "A checkpoint of a job", "required": ["checkpoint_id"],
     "properties": {"checkpoint_id": {"type": "string"}, "drafter": {"type": "null"},
                    "verifier": {"type": "null"}}},
    {"title": "A drafter with its verifier", "required": ["drafter", "verifier"],
     "properties": {"checkpoint_id": {"type": "null"}, "drafter": {"type": "string"},
                    "verifier": {"type": "string"}}},
]}


class DeploymentCreate(Strict):
    """A drafter to serve: a checkpoint of a job, or a drafter (a Hub id or a path under the
    models root) plus its verifier."""

    model_config = ConfigDict(json_schema_extra=_ONE_SOURCE)

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    checkpoint_id: str | None = Field(None, pattern=r"^ckpt_[0-9a-f]{24}$")
    drafter: str | None = Field(None, min_length=1, max_length=512)
    verifier: str | None = Field(None, min_length=1, max_length=512)
    num_speculative_tokens: int | None = Field(None, ge=1, le=64)
    resources: DeploymentResources = Field(default_factory=DeploymentResources)
    runtime: Literal["vllm", "local"] | None = None
    capture: CaptureOptions | None = Field(None, description="Opt-in traffic capture into a "
                                           "project dataset (see CaptureOptions)")

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
    capture: CaptureOut | None = None


class DeploymentEventOut(EventBase):
    """An event of a deployment; ``stage`` is always null (deployments have no stages)."""

    object: Literal["specdeck.deployment.event"] = "specdeck.deployment.event"
