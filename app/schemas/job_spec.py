"""The job spec: everything a worker needs to run a job, resolved once when the API creates it,
stored as the job row's JSON and read back into this one typed model by every stage and command
builder. ``JobSpec.load`` reads the rows of every earlier version (dicts stay at the JSON
boundaries only)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.schemas.drafters import Drafter, DrafterBase
from app.schemas.jobs import DataSpec, EvaluateSpec, GateSpec, Resources


class Loaded(BaseModel):
    """A stored model: extra keys of older or newer rows are ignored, types as stored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class VerifierInfo(Loaded):
    """The verifier as the job resolved it: what servers and trainers are given (an absolute
    path under the models root, or a Hub id) and the numbers of its config.json."""

    reference: str
    source: str  # "local" or "hub"
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str | None = None


class WarmStart(Loaded):
    """The checkpoint a warm start (``init_from``) loads."""

    checkpoint_id: str
    job_id: str
    epoch: int
    path: str


class DeployTarget(Loaded):
    deployment: str
    deployment_id: str


class ResolvedData(DataSpec):
    """The data settings with their defaults filled in (regenerate decided, max_tokens set)."""

    model_config = ConfigDict(extra="ignore", strict=False)

    regenerate: bool = False
    max_tokens: int | None = Field(None, ge=16, le=262144)  # set by JobSpec.load


class Candidate(Loaded):
    """One drafter a job trains: the only one of a plain job, or one of a bake-off's."""

    index: int
    name: str
    drafter: Drafter

    @property
    def kind(self) -> str:
        return self.drafter.type


class JobSpec(Loaded):
    name: str | None = None
    verifier: str  # as the user named it; verifier_info.reference is what the processes get
    verifier_info: VerifierInfo
    dataset: str
    dataset_id: str | None = None
    dataset_path: str | None = None
    dataset_kind: Literal["upload", "public", "capture", "path"] = "path"
    dataset_format: str | None = None
    # The job's drafter; for a bake-off, the settings its candidates start from.
    speculator: Drafter
    # A bake-off's candidates, resolved. Empty: the job trains ``speculator`` alone.
    bakeoff: list[Candidate] = Field(default_factory=list)
    mode: Literal["online", "offline", "hybrid"] = "online"
    resources: Resources = Field(default_factory=Resources)
    runtime: Literal["vllm", "local"]
    publish: str | None = None
    evaluate: EvaluateSpec | None = Field(default_factory=EvaluateSpec)
    data: ResolvedData = Field(default_factory=ResolvedData)
    gate: GateSpec | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    init_from: str | None = None
    init_from_info: WarmStart | None = None
    deploy: DeployTarget | None = None
    # Where the scheduler placed it: the worker adds it when it claims the job.
    allocation: dict[str, list[int]] | None = None

    @field_validator("evaluate", mode="before")
    @classmethod
    def _evaluate(cls, value: Any) -> Any:
        return None if value is False else value  # stored as false when skipped

    @classmethod
    def load(cls, stored: dict[str, Any], **extra: Any) -> "JobSpec":
        """A job row's spec, from any version of it: before drafter kinds (no ``type``), before
        the data settings (never regenerated), before the evaluation (its defaults)."""
        spec = cls.model_validate({**stored, **extra}, strict=False)
        if spec.data.max_tokens is None:  # a row from before the data settings, or unresolved
            data = spec.data.model_copy(update={"max_tokens": max(16, spec.total_seq_len // 2)})
            spec = spec.model_copy(update={"data": data})
        return spec

    def dump(self) -> dict[str, Any]:
        """What the job row stores (the JSON boundary): ``evaluate`` false when skipped."""
        data = self.model_dump(mode="json", exclude={"allocation"})
        if self.evaluate is None:
            data["evaluate"] = False
        return data

    @property
    def candidates(self) -> list[Candidate]:
        """What the job trains: a bake-off's candidates, or its one drafter."""
        return self.bakeoff or [Candidate(index=0, name=self.speculator.type,
                                          drafter=self.speculator)]

    def candidate(self, index: int) -> Candidate:
        return self.candidates[index]

    @property
    def is_bakeoff(self) -> bool:
        return bool(self.bakeoff)

    @property
    def drafters(self) -> list[DrafterBase]:
        return [c.drafter for c in self.candidates]

    @property
    def total_seq_len(self) -> int:
        """The sequence length the data is prepared with: one for every candidate."""
        return self.speculator.total_seq_len

    @property
    def server_layer_ids(self) -> list[int]:
        """What the hidden-states server extracts: the union of the candidates' layer ids, in
        ascending order, and the verifier's last layer ``n``."""
        ids = sorted({i for d in self.drafters for i in d.target_layer_ids or []})
        return [*ids, self.verifier_info.num_hidden_layers]

    @property
    def verifier_gpu_count(self) -> int:
        verifier = self.resources.verifier
        return verifier.tensor_parallel_size * verifier.data_parallel_size
