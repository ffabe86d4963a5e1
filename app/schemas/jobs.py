"""Request and response models for /api/jobs (modelled on OpenAI's fine-tuning jobs API)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SpeculatorSpec(Strict):
    type: Literal["dflash"] = "dflash"
    block_size: int = Field(16, ge=2, le=64)
    num_layers: int = Field(5, ge=1, le=32)
    target_layer_ids: list[int] | None = Field(None, min_length=1, max_length=16)
    max_anchors: int = Field(3072, ge=1, le=65536)
    draft_vocab_size: int | None = Field(None, ge=16, le=1_000_000)
    total_seq_len: int = Field(8192, ge=64, le=262144)
    epochs: int = Field(20, ge=1, le=1000)
    lr: float = Field(1e-3, gt=0, le=1)
    scheduler: Literal["cosine", "linear", "none"] = "cosine"
    seed: int = Field(42, ge=0, le=2**31 - 1)


class VerifierResources(Strict):
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    data_parallel_size: int = Field(1, ge=1, le=64)


class Resources(Strict):
    verifier: VerifierResources = Field(default_factory=VerifierResources)
    trainer_gpus: int = Field(1, ge=1, le=64)


class EvaluateSpec(Strict):
    """The evaluation after training: held-out prompts sent, greedily, to the best checkpoint
    served the way a deployment serves it; the engine's counters give the acceptance length."""

    prompts: int = Field(8, ge=1, le=512)
    max_tokens: int = Field(64, ge=1, le=8192)
    # Also serve the verifier alone (no speculative decoding) on the same prompts: the speedup
    # is output tokens/s with the drafter over without it, and the outputs must be the same.
    baseline: bool = True


class JobCreate(Strict):
    verifier: str = Field(min_length=1, max_length=512)
    dataset: str = Field(min_length=1, max_length=512)
    speculator: SpeculatorSpec = Field(default_factory=SpeculatorSpec)
    mode: Literal["online", "offline", "hybrid"] = "online"
    resources: Resources = Field(default_factory=Resources)
    runtime: Literal["vllm", "local"] | None = None
    publish: str | None = Field(None, max_length=200)
    # After training, the best checkpoint served on held-out prompts (workers/pipeline/
    # evaluate.py). false skips it; true or {} uses the defaults.
    evaluate: EvaluateSpec | None = Field(default_factory=EvaluateSpec)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=32)

    @field_validator("evaluate", mode="before")
    @classmethod
    def _evaluate_switch(cls, value: Any) -> Any:
        if value is True:
            return {}
        if value is False:
            return None
        if not isinstance(value, (dict, EvaluateSpec)):
            raise ValueError("must be an object such as {\"prompts\": 8, \"max_tokens\": 64}, "
                             "true for the defaults, or false to skip the evaluation")
        return value

    @field_validator("publish")
    @classmethod
    def _repo_id(cls, value: str | None) -> str | None:
        if value is not None and not HF_REPO_ID.match(value):
            raise ValueError("must be a Hugging Face repo id such as 'org/name'")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_sizes(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not 1 <= len(key) <= 64 or len(item) > 512:
                raise ValueError("keys must be 1-64 characters and values at most 512")
        return value


class JobOut(BaseModel):
    object: Literal["specdeck.job"] = "specdeck.job"
    id: str
    status: str
    stage: str | None
    status_reason: str | None
    error_code: str | None
    verifier: str
    dataset: str
    speculator: dict[str, Any]
    mode: str
    resources: dict[str, Any]
    runtime: str
    publish: str | None
    evaluate: dict[str, int] | Literal[False]
    metadata: dict[str, str]
    attempt: int
    worker: str | None
    allocation: dict[str, list[int]] | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class EventOut(BaseModel):
    object: Literal["specdeck.job.event"] = "specdeck.job.event"
    id: int
    created_at: datetime
    kind: str
    attempt: int
    status: str | None
    stage: str | None
    message: str
    data: dict[str, Any] | None


class MetricOut(BaseModel):
    step: int | None
    epoch: int | None
    name: str
    value: float
    created_at: datetime


class CheckpointOut(BaseModel):
    object: Literal["specdeck.checkpoint"] = "specdeck.checkpoint"
    id: str
    job_id: str
    epoch: int
    path: str
    metrics: dict[str, Any] | None
    is_best: bool
    # Measured by the job's evaluating stage: acceptance length and throughput when served.
    evaluation: dict[str, Any] | None
    created_at: datetime
    publish_status: str | None
    publish_error: str | None
    hub_repo: str | None
    hub_commit: str | None
    hub_url: str | None
    published_at: datetime | None


class PublishRequest(Strict):
    repo_id: str = Field(max_length=200)
    private: bool = True

    @field_validator("repo_id")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        if not HF_REPO_ID.match(value):
            raise ValueError("must be a Hugging Face repo id such as 'org/name'")
        return value


class StagePlanOut(BaseModel):
    stage: str
    description: str
    argv: list[str]
    env: dict[str, str]
    gpus: list[int]


class PlanOut(BaseModel):
    object: Literal["specdeck.plan"] = "specdeck.plan"
    job_id: str
    runtime: str
    layer_ids: dict[str, list[int]]
    gpus: dict[str, list[int]]
    stages: list[StagePlanOut]
