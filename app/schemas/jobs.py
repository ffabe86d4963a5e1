"""Request and response models for /api/jobs (modelled on OpenAI's fine-tuning jobs API)."""

from __future__ import annotations

import re
from datetime import datetime
from collections.abc import Callable
from typing import Annotated, Any, Literal

from huggingface_hub.utils import HFValidationError, validate_repo_id
from pydantic import (
    AfterValidator,
    BaseModel,
    Discriminator,
    Field,
    Tag,
    computed_field,
    create_model,
    field_validator,
    model_validator,
)

from app.schemas.common import EventBase, Strict, readable_text, text_problem
from app.schemas.drafters import KINDS, DFlash, Drafter, DrafterBase, kind_of
from app.schemas.verifiers import VerifierRef

# Matched whole (fullmatch: "$" alone would let a trailing newline through); the same text is the
# JSON Schema "pattern", whose "$" is the end of the string.
HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def _repo_id(value: str) -> str:
    """An 'org/name' id that the Hub client takes too (its own validator: no '.git' at the end,
    no '--' or '..'), so that a publish is refused here, not half-way."""
    if not HF_REPO_ID.fullmatch(value):
        raise ValueError("must be a Hugging Face repo id such as 'org/name'")
    try:
        validate_repo_id(value)
    except HFValidationError as exc:
        raise ValueError(f"must be a Hugging Face repo id such as 'org/name': {exc}") from None
    return value


# Checked here with a clear message; declared as a pattern in the OpenAPI document.
RepoId = Annotated[str, Field(max_length=200, json_schema_extra={"pattern": HF_REPO_ID.pattern}),
                   AfterValidator(_repo_id)]


class VerifierResources(Strict):
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    data_parallel_size: int = Field(1, ge=1, le=64)


class Resources(Strict):
    verifier: VerifierResources = Field(default_factory=VerifierResources)
    trainer_gpus: int = Field(1, ge=1, le=64, description="GPUs (processes on the local "
                              "runtime) the trainer runs on; each candidate's, in a bake-off")
    candidates_in_parallel: bool = Field(False, exclude_if=lambda on: not on, description=(
        "vllm runtime, bake-offs: train the candidates side by side, each on trainer_gpus GPUs "
        "of its own (the job then needs trainer_gpus times its candidates); otherwise one "
        "after another on the same GPUs. The local runtime trains them one after another."))
    share_verifier_gpus: bool = Field(False, description=(
        "vllm runtime: the trainer runs on the verifier's GPUs (the first trainer_gpus of them) "
        "instead of GPUs of its own, and the hidden-states server takes only part of their "
        "memory. For a host with one GPU; the job then needs only the verifier's GPUs."))

    @model_validator(mode="after")
    def _trainer_fits_on_the_verifier(self) -> "Resources":
        verifier = self.verifier.tensor_parallel_size * self.verifier.data_parallel_size
        if self.share_verifier_gpus and self.trainer_gpus > verifier:
            raise ValueError(f"share_verifier_gpus puts the trainer on the verifier's {verifier} "
                             f"GPU(s): trainer_gpus must be at most {verifier}")
        return self


LAST_N = re.compile(r"^last:([1-9][0-9]{0,2})$")


class EvaluateSpec(Strict):
    """The evaluation after training: held-out prompts sent, greedily, to the trained drafter
    served the way a deployment serves it; the engine's counters give the served acceptance
    length, the number that decides the speedup (the trainer's eal is only its estimate)."""

    prompts: int = Field(8, ge=1, le=512)
    max_tokens: int = Field(64, ge=1, le=8192)
    # Also serve the verifier alone (no speculative decoding) on the same prompts: the speedup
    # is output tokens/s with the drafter over without it, and the outputs must be the same.
    baseline: bool = True
    # Also serve n-gram (prompt lookup) drafting on the same prompts: the trivial drafter a
    # trained one must beat.
    ngram: bool = True
    # Which checkpoints are served: "best" (the trainer's lowest validation loss) or "last:N"
    # (the last N epochs; the one with the highest served acceptance length is kept).
    checkpoints: str = Field("best", pattern=r"^(best|last:[1-9][0-9]{0,2})$")
    rounds: int = Field(3, ge=1, le=20, exclude_if=lambda rounds: rounds == 3, description=(
        "How many times every engine answers the prompts. The engines (each candidate's, "
        "n-gram's, the verifier alone's) all run at once and answer each prompt in turns; each "
        "round gives a speedup, the median is the one reported and the range its spread, so "
        "that a change in the machine's load between engines cannot pick the winner"))

    def last_epochs(self) -> int | None:
        """N of "last:N", None for "best"."""
        match = LAST_N.match(self.checkpoints)
        return int(match.group(1)) if match else None


class DataSpec(Strict):
    """How the training data is made. With ``regenerate``, the verifier itself writes every
    reply (``speculators regenerate-responses`` against the verifier served without
    speculation), so the drafter trains on the verifier's own token ids: on-policy data. On by
    default for public presets (they hold other models' replies), opt-in for uploads."""

    regenerate: bool | None = None
    max_samples: int | None = Field(None, ge=1, le=10_000_000)  # conversations regenerated
    # Longest reply (and prompt + reply) regenerated; default: half of speculator.total_seq_len.
    max_tokens: int | None = Field(None, ge=16, le=262144)
    temperature: float = Field(0.0, ge=0, le=2)  # 0: greedy, the replies the verifier serves
    concurrency: int = Field(16, ge=1, le=1024)  # requests in flight to the generating server


class GateSpec(Strict):
    """What the evaluation must show before the drafter is published: a missed gate fails the
    job with ``acceptance_gate_failed`` (the checkpoint is kept and can be published by hand)."""

    min_acceptance_length: float | None = Field(None, ge=1, le=65)
    min_speedup: float | None = Field(None, gt=0, le=100)
    beat_ngram: bool = False


class DeploySpec(Strict):
    """Promote the job's evaluated checkpoint to a deployment of the project once the
    acceptance gate passes (a job whose gate fails promotes nothing): the deployment switches
    to it without downtime (POST /api/deployments/{id}/promote)."""

    deployment: str = Field(min_length=1, max_length=100, description="The deployment's name")


CHECKPOINT_ID = r"^ckpt_[0-9a-f]{24}$"
METADATA_KEY_MAX, METADATA_VALUE_MAX = 64, 512


def _model_or(*others: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """The JSON schema of a model field whose before-validator also takes ``others`` (true or
    false for a switch; null): the model's $ref, or one of them."""

    def extra(schema: dict[str, Any]) -> None:
        model = next(branch for branch in schema["anyOf"] if "$ref" in branch)
        schema["anyOf"] = [model, *others]

    return extra


CANDIDATE_NAME = r"^[a-z0-9][a-z0-9_.-]{0,39}$"
# The most candidates a job body may list; the per-job limit is a setting below it
# (SPECDECK_QUOTA_CANDIDATES_PER_JOB, docs/quotas.md).
CANDIDATES_MAX = 32


def _candidate_model(kind: type[DrafterBase]) -> type[DrafterBase]:
    """A kind as a bake-off names it: its fields (each one it leaves out comes from the job's
    ``speculator``, else the kind's default) and a name of its own."""
    return create_model(
        f"{kind.__name__}Candidate", __base__=kind,
        name=(str | None, Field(None, pattern=CANDIDATE_NAME, description=(
            "How the leaderboard, the checkpoints and their paths name it; default its kind "
            "(kind-2, kind-3 ... for more of one kind)"))))


CANDIDATE_MODELS = {name: _candidate_model(kind) for name, kind in KINDS.items()}
CandidateCreate = Annotated[
    Annotated[CANDIDATE_MODELS["dflash"], Tag("dflash")]
    | Annotated[CANDIDATE_MODELS["dflash2"], Tag("dflash2")]
    | Annotated[CANDIDATE_MODELS["dspark"], Tag("dspark")]
    | Annotated[CANDIDATE_MODELS["eagle3"], Tag("eagle3")],
    Discriminator(kind_of, custom_error_type="unknown_kind", custom_error_message=(
        "unknown drafter kind: the supported kinds are " + ", ".join(KINDS)))]


JOB_NAME_MAX = 100


class JobCreate(Strict):
    name: str | None = Field(None, min_length=1, max_length=JOB_NAME_MAX, pattern=r"\S",
                             description="A name to tell the job apart in lists (need not be "
                             "unique); GET /api/jobs?name= finds it")
    verifier: VerifierRef
    dataset: str = Field(min_length=1, max_length=512, description=(
        "An uploaded dataset's id (ds_...; this project's own), or the path of a JSONL file "
        "under the data root (SPECDECK_DATA_ROOT). The data root is the install's, shared by "
        "every project: any project may name a file placed there (and so learn whether a name "
        "exists); uploads are kept apart, by id and per project, and not reachable by path."))
    speculator: Drafter = Field(default_factory=DFlash, description=(
        "The drafter to train: its kind (\"type\": dflash, the default, dflash2, dspark or "
        "eagle3) and settings. With \"candidates\", the settings every candidate starts from "
        "(each takes those of its kind's fields that it does not set itself)."))
    candidates: list[CandidateCreate] | None = Field(None, min_length=1, max_length=CANDIDATES_MAX,
                                                     description=(
        "A bake-off: several drafters trained on the same data, against one hidden-states "
        "server, then served side by side on the same held-out prompts; the fastest lossless "
        "one that passes the gate wins, and is what the job publishes and deploys. Each is a "
        "kind and the settings where it differs from \"speculator\"."))
    mode: Literal["online", "offline", "hybrid"] = "online"
    resources: Resources = Field(default_factory=Resources)
    runtime: Literal["vllm", "local"] | None = None
    publish: RepoId | None = None
    # After training, the best checkpoint served on held-out prompts (workers/pipeline/
    # evaluate.py). false skips it; true or {} uses the defaults.
    evaluate: EvaluateSpec | None = Field(default_factory=EvaluateSpec,
                                          json_schema_extra=_model_or({"type": "boolean"}))
    data: DataSpec = Field(default_factory=DataSpec)
    # The acceptance gate; default on the vllm runtime {"min_speedup": 1.0}, none on local;
    # false: no gate.
    gate: GateSpec | None = Field(None, json_schema_extra=_model_or({"const": False},
                                                                     {"type": "null"}))
    metadata: dict[str, str] = Field(default_factory=dict, max_length=32, json_schema_extra={
        "propertyNames": {"minLength": 1, "maxLength": METADATA_KEY_MAX},
        "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE_MAX}})
    init_from: str | None = Field(None, pattern=CHECKPOINT_ID, description=(
        "Warm start: a DFlash checkpoint of this project trained for the same verifier; the "
        "trainer starts from its weights (speculators' --from-pretrained). The job takes the "
        "checkpoint's shape (block_size, num_layers, target_layer_ids, draft_vocab_size); "
        "naming another value for one of them is a 422."))
    deploy: DeploySpec | None = None

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

    @field_validator("gate", mode="before")
    @classmethod
    def _gate_switch(cls, value: Any) -> Any:
        if value is False:
            return GateSpec()  # an explicit "no gate": nothing required
        if value is None or isinstance(value, (dict, GateSpec)):
            return value
        raise ValueError("must be an object such as {\"min_acceptance_length\": 2.5}, or false")

    @field_validator("metadata")
    @classmethod
    def _metadata_sizes(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not 1 <= len(key) <= METADATA_KEY_MAX or len(item) > METADATA_VALUE_MAX:
                raise ValueError(f"keys must be 1-{METADATA_KEY_MAX} characters and values at "
                                 f"most {METADATA_VALUE_MAX}")
        return value


SERVED_AL = ("Mean acceptance length measured by serving the drafter on held-out prompts "
             "(tokens per verifier pass): the number that decides the speedup. Null until "
             "the evaluation has run.")


class JobProgress(BaseModel):
    """Where training is, from the trainer's latest training metric line (in a bake-off: of the
    candidate training now)."""

    candidate: str | None = Field(None, exclude_if=lambda name: name is None, description=(
        "Bake-offs: the candidate it is the progress of; absent for a job of one drafter"))

    epoch: int = Field(description="The epoch being trained, counted from 1, so that \"epoch "
                       "{epoch}/{epochs}\" reads right: 1 during the first epoch, epochs during "
                       "and after the last. The trainer, the checkpoints and the metrics "
                       "(GET /api/jobs/{id}/metrics) number epochs from 0: this is their epoch "
                       "+ 1.")
    epochs: int = Field(description="The epochs the job trains (speculator.epochs)")
    step: int = Field(description="The trainer's global step at that line (counted over all "
                      "epochs, from 0)")
    steps_done: int = Field(description="Trainer steps done: step + 1")
    total_steps: int | None = Field(description="Trainer steps of the whole training: the "
                                    "steps of one epoch (known once the first epoch is "
                                    "trained) times epochs; null before")
    percent: float | None = Field(description="steps_done of total_steps, in percent; null "
                                  "while total_steps is")
    eta_seconds: float | None = Field(description="Training time left, estimated from the "
                                      "rate measured so far (steps per second between the "
                                      "job's first and latest training lines); null while "
                                      "total_steps is, and 0 once the steps are done")


class StageProgress(BaseModel):
    """How far a stage after training is (the served evaluation: each engine's start and each
    held-out prompt is a step), as the worker last wrote it."""

    stage: str = Field(description="The stage it is the progress of (\"evaluating\")")
    what: str = Field(description="What runs now, in a few words (\"serving the epoch 1 "
                      "checkpoint: prompt 3 of 8\")")
    steps_done: int
    total_steps: int
    percent: float = Field(description="steps_done of total_steps, in percent")
    eta_seconds: float | None = Field(description="Time left, estimated from the stage's rate "
                                      "so far (an engine's start weighs as one step); null "
                                      "before the first step, 0 once all are done")


class Verdict(BaseModel):
    """What a served evaluation says when the drafter does not pay off against its baselines."""

    code: Literal["slower_than_no_speculation", "below_ngram"] = Field(description=(
        "slower_than_no_speculation: the drafter's output tokens/s are below the verifier's "
        "alone (speedup < 1); below_ngram: faster than no speculation (or not measured "
        "against it) but no better than n-gram drafting"))
    summary: str = Field(description="A few words, for a badge")
    message: str = Field(description="A sentence with the measured numbers")


def verdict_of(evaluation: dict[str, Any] | None) -> Verdict | None:
    """Null when the drafter beats every baseline measured, or nothing was measured. A lead
    within the speedup's spread over the evaluation's rounds is no verdict: a tie."""
    evaluation = evaluation or {}
    speedup, ngram_speedup = evaluation.get("speedup"), evaluation.get("ngram_speedup")
    spread = evaluation.get("speedup_spread") or 0.0
    if isinstance(speedup, (int, float)) and 1 - speedup > spread:
        ngram = (f"; n-gram drafting: ×{ngram_speedup:.2f}"
                 if isinstance(ngram_speedup, (int, float)) else "")
        return Verdict(code="slower_than_no_speculation", summary="slower than no speculation",
                       message=f"This drafter is slower than no speculation: ×{speedup:.2f} the "
                       f"output tokens/s of the verifier alone{ngram}. Serving it would cost "
                       "throughput.")
    if evaluation.get("beats_ngram") is False:  # accepted no more than prompt lookup
        served, ngram = (evaluation.get("mean_acceptance_length"),
                         evaluation.get("ngram_mean_acceptance_length"))
        lengths = (f": served acceptance length {served:.2f} against n-gram's {ngram:.2f}"
                   if isinstance(served, (int, float)) and isinstance(ngram, (int, float)) else "")
        return Verdict(code="below_ngram", summary="does not beat n-gram",
                       message="This drafter does not beat n-gram drafting (prompt lookup, no "
                       f"training){lengths}.")
    if (isinstance(speedup, (int, float)) and isinstance(ngram_speedup, (int, float))
            and ngram_speedup - speedup > spread):  # accepted more, and still slower
        return Verdict(code="below_ngram", summary="does not beat n-gram",
                       message="This drafter does not beat n-gram drafting (prompt lookup, no "
                       f"training): ×{speedup:.2f} the output tokens/s of the verifier alone, "
                       f"against n-gram's ×{ngram_speedup:.2f}.")
    return None


class Judged(BaseModel):
    """A job or checkpoint with a served evaluation, and the verdict that evaluation gives."""

    evaluation: dict[str, Any] | None

    @computed_field(description="Set when the served evaluation found the drafter slower than "
                    "no speculation, or no better than n-gram drafting; null otherwise")
    @property
    def verdict(self) -> Verdict | None:
        return verdict_of(self.evaluation)


class CandidateOut(BaseModel):
    """One drafter of a job, and where it stands: trained, served, ranked. A job of one drafter
    has one candidate, named by its kind."""

    name: str
    index: int
    kind: str = Field(description="dflash, dflash2, dspark or eagle3")
    status: Literal["pending", "training", "trained", "evaluated", "failed", "stopped"]
    status_reason: str | None
    error_code: str | None
    log_tail: str | None = Field(description="The trainer's or engine's last lines, when it "
                                 "failed")
    settings: dict[str, Any] = Field(description="Its resolved settings (the speculator fields "
                                     "of its kind)")
    train_seconds: float | None = Field(description="The trainer's wall time")
    train_cpu_seconds: float | None = Field(description="CPU seconds the trainer's processes "
                                            "used (local runtime)")
    train_gpu_seconds: float | None = Field(description="Wall time times the trainer's GPUs "
                                            "(vllm runtime)")
    served_acceptance_length: float | None = Field(description=SERVED_AL)
    speedup: float | None = Field(description="Output tokens/s over the verifier alone on the "
                                  "same prompts: the median of the evaluation's rounds")
    speedup_spread: float | None = Field(description="The speedup's spread over the rounds "
                                         "(highest - lowest); a lead smaller than it is a tie")
    output_tokens_per_s: float | None
    outputs_identical_to_baseline: str | None = Field(description="\"n/m\": held-out prompts "
                                                      "whose output equals the verifier's alone")
    lossless: bool | None = Field(description="Every output token-identical to no speculation; "
                                  "null when the evaluation had no baseline")
    gate_passed: bool | None = Field(description="Whether it passes the job's acceptance gate; "
                                     "null without a gate")
    rank: int | None = Field(description="Its place on the leaderboard (1 is the winner's); "
                             "null until served")
    winner: bool
    tied_with: list[str] = Field(description="Candidates whose speedup it leads or trails by "
                                 "less than the spread: a tie, broken by served acceptance "
                                 "length, then by training cost")
    checkpoint_id: str | None = Field(description="The checkpoint the evaluation served and "
                                      "chose")
    checkpoint_ids: list[str] = Field(description="All its checkpoints, by epoch")
    evaluation: dict[str, Any] | None = Field(description="Its whole served evaluation")


class JobOut(Judged):
    object: Literal["specdeck.job"] = "specdeck.job"
    id: str
    name: str | None
    status: str
    stage: str | None
    status_reason: str | None
    error_code: str | None
    served_acceptance_length: float | None = Field(description=SERVED_AL)
    progress: JobProgress | None = Field(description="Training progress; null until the "
                                         "trainer reports its first training step")
    stage_progress: StageProgress | None = Field(description="The progress of a stage after "
                                                 "training (the served evaluation); null until "
                                                 "it starts")
    verifier: str
    dataset: str
    speculator: dict[str, Any]
    mode: str
    resources: dict[str, Any]
    runtime: str
    publish: str | None
    evaluate: dict[str, Any] | Literal[False]
    data: dict[str, Any]
    gate: dict[str, Any] | None
    init_from: str | None = Field(description="The checkpoint the trainer started from (warm "
                                  "start), or null")
    deploy: dict[str, Any] | None = Field(description="The deployment the evaluated checkpoint "
                                          "is promoted to once the gate passes, or null")
    candidates: list[CandidateOut] = Field(description=(
        "The drafters the job trains, in the order the body named them (one for a job without "
        "\"candidates\"), each with its status, cost, served figures and rank"))
    winner: str | None = Field(description="The candidate that won: the fastest lossless one "
                               "that passes the gate (a tie broken by served acceptance length, "
                               "then training cost); what the job publishes and deploys")
    # The served evaluation of the job's chosen checkpoint, headline first: the served mean
    # acceptance length, the baselines beside it, then the trainer's estimate (eal), labelled.
    evaluation: dict[str, Any] | None
    metadata: dict[str, str]
    attempt: int
    worker: str | None
    allocation: dict[str, list[int]] | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @field_validator("metadata", mode="before")
    @classmethod
    def _readable(cls, value: Any) -> Any:
        if isinstance(value, dict) and text_problem(value):  # a row stored before the check
            return {readable_text(k): readable_text(v) for k, v in value.items()}
        return value


class EventOut(EventBase):
    object: Literal["specdeck.job.event"] = "specdeck.job.event"


class MetricOut(BaseModel):
    candidate: int = Field(0, exclude_if=lambda index: index == 0, description=(
        "Bake-offs: the candidate (its index) whose trainer logged it; absent for the first"))
    step: int | None
    epoch: int | None
    name: str
    value: float
    created_at: datetime


class CheckpointOut(Judged):
    object: Literal["specdeck.checkpoint"] = "specdeck.checkpoint"
    id: str
    job_id: str
    candidate: int = Field(0, description="Which of the job's candidates it is of (its index)")
    kind: str = Field("dflash", description="Its drafter's kind: dflash, dflash2, dspark or "
                      "eagle3")
    epoch: int
    served_acceptance_length: float | None = Field(description=SERVED_AL)
    # Measured by the job's evaluating stage: acceptance length beside its n-gram and
    # no-speculation baselines, throughput, and the trainer's estimate, labelled as one.
    evaluation: dict[str, Any] | None
    path: str
    metrics: dict[str, Any] | None = Field(description=(
        "The trainer's validation metrics (val_metrics.json). Estimates: speculators' eal "
        "averages over every anchor position and overstates the served acceptance length."))
    is_best: bool = Field(description="The trainer's best checkpoint (lowest validation loss).")
    partial: bool = Field(description="Saved when the trainer was stopped during this epoch (a "
                          "cancel, a worker's shutdown): the weights so far, not the epoch's "
                          "end. Never the best nor evaluated; it can be deployed or warm-started "
                          "from. The epoch's own checkpoint replaces it if training resumes.")
    created_at: datetime
    publish_status: str | None
    publish_error: str | None
    hub_repo: str | None
    hub_commit: str | None
    hub_url: str | None
    published_at: datetime | None


class PublishRequest(Strict):
    repo_id: RepoId
    private: bool = True


class StagePlanOut(BaseModel):
    stage: str
    candidate: str | None = Field(None, exclude_if=lambda name: name is None,
                                  description="The bake-off candidate it trains or serves")
    description: str
    argv: list[str]
    env: dict[str, str]
    gpus: list[int]


class PlanOut(BaseModel):
    object: Literal["specdeck.plan"] = "specdeck.plan"
    job_id: str | None = Field(description="Null in a dry run (POST /api/jobs/plan), whose "
                               "paths hold <job_id> where the job's id will be")
    runtime: str
    layer_ids: dict[str, list[int]]
    gpus: dict[str, list[int]]
    stages: list[StagePlanOut]
