"""A job's drafters: resolved from the body when the job is created (a bake-off's candidates,
each one the job's ``speculator`` with its own kind and changes), recorded one row each, and read
back for the API with their status, cost and served figures."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, Job, JobCandidate
from app.errors import APIError
from app.schemas.drafters import KINDS, DrafterBase, runtime_refusal
from app.schemas.job_spec import Candidate, JobSpec
from app.schemas.jobs import CandidateOut, JobCreate
from app.services.state import CandidateStatus
from app.services.verifier import VerifierInfo, check_layer_ids, default_layer_ids
from app.settings import Settings

# What a candidate may not set apart from the others: the data is prepared once, at one length.
SHARED = frozenset({"total_seq_len"})


def resolve_layers(drafter: DrafterBase, verifier: VerifierInfo, param: str) -> DrafterBase:
    """The drafter with its layer ids checked against the verifier, or SpecDeck's defaults."""
    if drafter.target_layer_ids is not None:
        check_layer_ids(drafter.target_layer_ids, verifier.num_hidden_layers,
                        param=f"{param}.target_layer_ids")
        return drafter
    layer_ids = default_layer_ids(verifier.num_hidden_layers)
    if layer_ids is None:
        raise APIError(422, f"the verifier has only {verifier.num_hidden_layers} layers; pass "
                       f"{param}.target_layer_ids explicitly", code="invalid_layer_ids",
                       param=f"{param}.target_layer_ids")
    return drafter.model_copy(update={"target_layer_ids": layer_ids})


def check_runtime(drafter: DrafterBase, runtime: str, param: str) -> None:
    if why := runtime_refusal(drafter, runtime):
        raise APIError(422, why, code="unsupported_on_runtime", param=f"{param}.type")


def check_body(body: JobCreate, settings: Settings) -> None:
    """What the body alone tells of its candidates: not more than the quota allows, and no
    warm start beside them."""
    if body.candidates is None:
        return
    limit = settings.quota_candidates_per_job
    if limit and len(body.candidates) > limit:
        raise APIError(422, f"{len(body.candidates)} candidates; a job may train at most {limit} "
                       "(SPECDECK_QUOTA_CANDIDATES_PER_JOB, docs/quotas.md)",
                       code="too_many_candidates", param="candidates")
    if body.init_from is not None:
        raise APIError(422, "init_from warm-starts one drafter; a bake-off's candidates train "
                       "from scratch: leave out init_from or candidates",
                       code="invalid_value", param="init_from")


def resolve_candidates(body: JobCreate, shared: DrafterBase, verifier: VerifierInfo,
                       runtime: str) -> list[Candidate]:
    """A bake-off's candidates: each takes the fields set in ``speculator`` that its kind has,
    unless it sets them itself; named by its kind unless it names itself. Empty for a job
    without ``candidates``."""
    if body.candidates is None:
        return []
    given = body.speculator.model_fields_set - {"type"}
    names: list[str] = []
    resolved = []
    for index, asked in enumerate(body.candidates):
        param = f"candidates.{index}"
        kind = KINDS[asked.type]
        for name in SHARED & asked.model_fields_set:
            if getattr(asked, name) != getattr(shared, name):
                raise APIError(422, f"{name} is shared by every candidate (the data is prepared "
                               f"once): set it in speculator, not in {param}",
                               code="invalid_value", param=f"{param}.{name}")
        fields = {k: getattr(body.speculator, k) for k in given if k in kind.model_fields}
        fields |= {k: getattr(asked, k) for k in asked.model_fields_set - {"name"}}
        drafter = resolve_layers(kind.model_validate({**fields, "type": asked.type}), verifier,
                                 param)
        check_runtime(drafter, runtime, param)
        name = asked.name or next(n for n in (asked.type, *(f"{asked.type}-{i}" for i in
                                                            range(2, 100))) if n not in names)
        if name in names:
            raise APIError(422, f"two candidates are named '{name}': each needs a name of its own",
                           code="invalid_value", param=f"{param}.name")
        names.append(name)
        resolved.append(Candidate(index=index, name=name, drafter=drafter))
    return resolved


def add_rows(session: Session, job: Job, spec: JobSpec) -> None:
    """One row per candidate of a new job, pending."""
    session.add_all(JobCandidate(job_id=job.id, idx=c.index, name=c.name, kind=c.kind,
                                 status=CandidateStatus.PENDING.value) for c in spec.candidates)


def rows_of(session: Session, jobs: list[Job]) -> dict[str, list[JobCandidate]]:
    """The candidates of each job, in order: one query for all of them."""
    by_job: dict[str, list[JobCandidate]] = defaultdict(list)
    if jobs:
        for row in session.scalars(select(JobCandidate).where(
                JobCandidate.job_id.in_([job.id for job in jobs])).order_by(JobCandidate.idx)):
            by_job[row.job_id].append(row)
    return by_job


def checkpoints_of(session: Session, jobs: list[Job]) -> dict[tuple[str, int], list[str]]:
    """The checkpoint ids of each job's candidates, oldest epoch first: one query."""
    found: dict[tuple[str, int], list[str]] = defaultdict(list)
    if jobs:
        for job_id, candidate, checkpoint_id in session.execute(
                select(Checkpoint.job_id, Checkpoint.candidate, Checkpoint.id)
                .where(Checkpoint.job_id.in_([job.id for job in jobs]))
                .order_by(Checkpoint.epoch)):
            found[(job_id, candidate)].append(checkpoint_id)
    return found


def candidate_out(row: JobCandidate, spec: JobSpec, checkpoint_ids: list[str]) -> CandidateOut:
    evaluation = row.evaluation or {}
    drafter = spec.candidate(row.idx).drafter if row.idx < len(spec.candidates) else None
    return CandidateOut(
        name=row.name, index=row.idx, kind=row.kind, status=row.status,
        status_reason=row.status_reason, error_code=row.error_code,
        log_tail=row.log_tail if row.status == CandidateStatus.FAILED else None,
        settings=drafter.model_dump() if drafter is not None else {},
        train_seconds=row.train_seconds, train_cpu_seconds=row.train_cpu_seconds,
        train_gpu_seconds=row.train_gpu_seconds,
        served_acceptance_length=evaluation.get("mean_acceptance_length"),
        speedup=evaluation.get("speedup"), speedup_spread=evaluation.get("speedup_spread"),
        output_tokens_per_s=evaluation.get("output_tokens_per_s"),
        outputs_identical_to_baseline=evaluation.get("outputs_identical_to_baseline"),
        lossless=evaluation.get("lossless"), gate_passed=evaluation.get("gate_passed"),
        rank=evaluation.get("rank"), winner=bool(evaluation.get("winner")),
        tied_with=evaluation.get("tied_with", []), checkpoint_id=evaluation.get("checkpoint_id"),
        checkpoint_ids=checkpoint_ids, evaluation=row.evaluation)
