"""Request and response models for /api/deployments."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.schemas.capture import CaptureOptions, CaptureOut
from app.schemas.common import EventBase, Strict
from app.schemas.jobs import CHECKPOINT_ID, DataSpec, EvaluateSpec, GateSpec


class DeploymentResources(Strict):
    tensor_parallel_size: int = Field(1, ge=1, le=64)


MAX_REPLICAS = 16
REPLICAS_DOC = ("Engines serving the deployment, each on a worker slot of its own (on distinct "
                "hosts when there are several); the gateway sends each request to the ready "
                "replica with the fewest requests in flight")


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
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description=REPLICAS_DOC)
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


class DeploymentUpdate(Strict):
    """What changes on a running deployment (the count is required: an empty body is no
    request to scale to one)."""

    replicas: int = Field(ge=1, le=MAX_REPLICAS, description=REPLICAS_DOC)


class ReplicaOut(BaseModel):
    """One engine of a deployment: replica 0 is the deployment's own."""

    replica: int
    status: str
    status_reason: str | None
    worker: str | None
    restarts: int
    drafter: str
    started_at: datetime | None


class DeploymentOut(BaseModel):
    object: Literal["specdeck.deployment"] = "specdeck.deployment"
    id: str
    name: str
    status: str
    status_reason: str | None
    source: dict[str, Any]
    drafter: str
    kind: str = Field(description="The drafter's kind (dflash, dflash2, dspark or eagle3): how "
                      "vLLM serves it")
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
    replicas: int = Field(description="How many replicas it should have")
    replica_states: list[ReplicaOut] = Field(description=(
        "Its replicas, each with its own status, worker and restarts; ``status`` above is "
        "``ready`` while any replica is"))


class DeploymentEventOut(EventBase):
    """An event of a deployment or of one of its replicas; ``stage`` is always null
    (deployments have no stages)."""

    object: Literal["specdeck.deployment.event"] = "specdeck.deployment.event"
    replica: int = Field(0, description="The replica it happened to (0: the deployment's own)")


class PromoteRequest(Strict):
    """The checkpoint to serve instead: a DFlash checkpoint of this project trained for the
    deployment's verifier."""

    checkpoint_id: str = Field(pattern=CHECKPOINT_ID)


PromotionStep = Literal["pending", "starting", "draining", "succeeded", "failed"]


class ReplicaPromotionOut(BaseModel):
    """One replica's switch: each replica's worker starts its new engine, switches its route
    and drains its old engine on its own."""

    replica: int
    status: PromotionStep
    status_reason: str | None
    finished_at: datetime | None


class PromotionOut(BaseModel):
    """A switch of a deployment's drafter without downtime. Steps: ``pending`` (the worker
    picks it up), ``starting`` (the new engine starts beside the old one), ``draining`` (the
    route points at the new engine; the old one finishes its requests), ``succeeded`` (the old
    engine stopped), or ``failed`` (the new engine never became ready: the old one serves on).
    The deployment stays ``ready`` throughout. With replicas, every serving replica switches
    (``replicas``), and ``status`` is the whole switch's: the least advanced step while any
    replica's is under way, ``succeeded`` once every replica's did, else ``failed``."""

    object: Literal["specdeck.promotion"] = "specdeck.promotion"
    id: str
    deployment_id: str
    kind: Literal["promote", "rollback"]
    status: PromotionStep
    status_reason: str | None
    target: dict[str, Any] = Field(description="The drafter switched to: source, drafter, "
                                   "block_size, num_speculative_tokens")
    previous: dict[str, Any] | None = Field(description="The drafter it replaced (set at the "
                                            "switch): what a rollback goes back to")
    job_id: str | None = Field(description="The job whose \"deploy\" option asked for it")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = Field(description="When the last replica's switch ended")
    replicas: list[ReplicaPromotionOut] = Field(description=(
        "Each replica's step: replica 0 (the deployment's own) and every replica that was "
        "serving when it was asked (one that starts later starts with the new drafter)"))


class RetrainSpeculator(Strict):
    """Training settings to change from the deployment's drafter's job; its shape (block size,
    layers, layer ids, draft vocabulary) is the drafter's."""

    epochs: int | None = Field(None, ge=1, le=1000)
    lr: float | None = Field(None, gt=0, le=1)
    max_anchors: int | None = Field(None, ge=1, le=65536)
    total_seq_len: int | None = Field(None, ge=64, le=262144)
    scheduler: Literal["cosine", "linear", "none"] | None = None
    seed: int | None = Field(None, ge=0, le=2**31 - 1)


class RetrainRequest(Strict):
    """A job that retrains the deployment's drafter: the deployment's verifier, its drafter's
    settings, warm-started from the checkpoint it serves (``init_from``), on ``dataset`` with
    the replies regenerated by the verifier (``data.regenerate`` defaults to true: sampled
    replies are not the verifier's greedy ones); the evaluation and the gate apply. With
    ``deploy``, the deployment is switched to the result once the gate passes."""

    dataset: str | None = Field(None, min_length=1, max_length=512, description=(
        "The data to retrain on: a dataset id (POST /api/datasets) or a file under the data "
        "root. Default: the traffic the deployment captured (its \"capture\" option)"))
    speculator: RetrainSpeculator = Field(default_factory=RetrainSpeculator)
    data: DataSpec | None = None
    evaluate: EvaluateSpec | None = None
    gate: GateSpec | None = None
    deploy: bool = False
