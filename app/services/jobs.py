"""Training jobs: create (validated, idempotent), read, list, cancel. Scoped to a project."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from app.db.models import Checkpoint, Job, JobCandidate, JobEvent, JobMetric, utcnow
from app.errors import APIError, not_found
from app.runtimes import JobPaths, build_plan
from app.schemas.drafters import KINDS, DrafterBase
from app.schemas.job_spec import DeployTarget, JobSpec, ResolvedData, WarmStart
from app.schemas.job_spec import VerifierInfo as JobVerifier
from app.schemas.jobs import GateSpec, JobCreate, JobOut, JobProgress, StageProgress
from app.services import candidates, quotas, state
from app.services.candidates import resolve_layers
from app.services.checkpoints import checkpoint_drafter
from app.services.datasets import resolve_for_job
from app.services.promotions import serving_deployment
from app.services.scheduling import schedule
from app.services.state import JobStatus, Stage
from app.services.verifier import VerifierInfo, check_layer_ids, resolve_verifier
from app.settings import Settings


def request_hash(body: BaseModel, scope: str = "") -> str:
    """What a replay's request must hash to: the body as sent (its fields left out stay out),
    after ``scope`` where the same body asks for different jobs (a retrain: its deployment)."""
    canonical = json.dumps(body.model_dump(mode="json", exclude_unset=True), sort_keys=True)
    return hashlib.sha256((scope + canonical).encode()).hexdigest()


def resolve_spec(session: Session, project_id: str, body: JobCreate, settings: Settings,
                 hub: Mapping[str, bytes]) -> JobSpec:
    """Everything the worker needs, resolved once at creation and recorded in the job."""
    verifier = resolve_verifier(body.verifier, settings=settings, hub=hub)
    runtime = body.runtime or settings.default_runtime
    candidates.check_body(body, settings)
    warm = resolve_init_from(session, project_id, body, verifier)
    speculator = warm[0] if warm else resolve_layers(body.speculator, verifier, "speculator")
    bakeoff = candidates.resolve_candidates(body, speculator, verifier, runtime)
    if not bakeoff:
        candidates.check_runtime(speculator, runtime, "speculator")
    dataset = resolve_for_job(session, project_id, body.dataset, settings)
    return JobSpec(
        name=body.name, verifier=body.verifier, dataset=body.dataset, **dataset,
        verifier_info=JobVerifier(reference=verifier.reference, source=verifier.source,
                                  num_hidden_layers=verifier.num_hidden_layers,
                                  hidden_size=verifier.hidden_size,
                                  vocab_size=verifier.vocab_size, dtype=verifier.dtype),
        speculator=speculator, bakeoff=bakeoff, mode=body.mode, resources=body.resources,
        runtime=runtime, publish=body.publish, evaluate=body.evaluate,
        data=resolve_data(body, speculator, dataset["dataset_kind"], runtime),
        gate=resolve_gate(body, runtime), metadata=body.metadata, init_from=body.init_from,
        init_from_info=warm[1] if warm else None,
        deploy=resolve_deploy(session, project_id, body, verifier.reference))


# The draft's shape: a warm start (init_from) takes the checkpoint's.
SHAPE = ("block_size", "num_layers", "target_layer_ids", "draft_vocab_size")


def resolve_init_from(session: Session, project_id: str, body: JobCreate,
                      verifier: VerifierInfo) -> tuple[DrafterBase, WarmStart] | None:
    """The warm start's drafter (the checkpoint's kind and shape, the body's other settings)
    and its checkpoint, recorded in the job. A checkpoint of another verifier or kind, or a
    shape named in the body that differs from the checkpoint's, is a 422: the trainer loads the
    checkpoint's architecture as it is (speculators refuses --num-layers beside
    --from-pretrained)."""
    if body.init_from is None:
        return None
    drafter = checkpoint_drafter(session, project_id, body.init_from, param="init_from")
    if drafter.verifier != verifier.reference:
        raise APIError(422, f"checkpoint {body.init_from} was trained for verifier "
                       f"'{drafter.verifier}', not '{verifier.reference}'",
                       code="init_from_incompatible", param="init_from")
    kind = drafter.drafter.kind
    asked = body.speculator
    if "type" in asked.model_fields_set and asked.type != kind:
        raise APIError(422, f"speculator.type is {asked.type}, but checkpoint {body.init_from} "
                       f"(init_from) is a {kind} drafter; a warm start keeps its kind: leave "
                       "type out", code="init_from_incompatible", param="speculator.type")
    config = drafter.config
    layers = (config.get("transformer_layer_config") or {}).get("num_hidden_layers")
    layer_ids = config.get("aux_hidden_state_layer_ids")
    if not isinstance(layers, int) or not isinstance(layer_ids, list) or not layer_ids:
        raise APIError(422, f"checkpoint {body.init_from}'s config.json lacks "
                       "transformer_layer_config.num_hidden_layers or aux_hidden_state_layer_ids",
                       code="invalid_drafter", param="init_from")
    vocab = config.get("draft_vocab_size")
    model = KINDS[kind]
    shape = {"block_size": drafter.drafter.block_size, "num_layers": layers,
             "target_layer_ids": layer_ids,
             # The verifier's whole vocabulary is what a job without draft_vocab_size trains.
             "draft_vocab_size": None if vocab in (None, verifier.vocab_size) else vocab}
    shape = {k: v for k, v in shape.items() if k in model.model_fields}
    for name in SHAPE:
        value = getattr(asked, name, None)
        if name in asked.model_fields_set and value is not None and value != shape.get(name):
            raise APIError(422, f"speculator.{name} is {value}, but checkpoint {body.init_from} "
                           f"(init_from) has {shape.get(name)}; a warm start keeps the "
                           "checkpoint's shape: leave it out", code="init_from_incompatible",
                           param=f"speculator.{name}")
    check_layer_ids(layer_ids, verifier.num_hidden_layers, param="init_from")
    settings = {k: getattr(asked, k) for k in asked.model_fields_set if k in model.model_fields}
    resolved = model.model_validate({**settings, **shape, "type": kind})
    return resolved, WarmStart(checkpoint_id=drafter.checkpoint.id, job_id=drafter.job.id,
                               epoch=drafter.checkpoint.epoch, path=drafter.checkpoint.path)


def resolve_deploy(session: Session, project_id: str, body: JobCreate,
                   verifier: str) -> DeployTarget | None:
    """The deployment a job promotes its evaluated checkpoint to: it must serve the same
    verifier, and the job must evaluate (the gate decides on the evaluation)."""
    if body.deploy is None:
        return None
    if body.evaluate is None:
        raise APIError(422, "deploy promotes the evaluated checkpoint once the gate passes; "
                       "enable \"evaluate\"", code="invalid_value", param="deploy")
    deployment = serving_deployment(session, project_id, body.deploy.deployment)
    if deployment is None:
        raise APIError(422, f"no starting or ready deployment named '{body.deploy.deployment}'",
                       code="deployment_not_found", param="deploy.deployment")
    if deployment.spec["verifier"] != verifier:
        raise APIError(422, f"deployment {deployment.name} serves verifier "
                       f"'{deployment.spec['verifier']}', not '{verifier}'",
                       code="incompatible_drafter", param="deploy.deployment")
    return DeployTarget(deployment=deployment.name, deployment_id=deployment.id)


def resolve_data(body: JobCreate, speculator: DrafterBase, dataset_kind: str,
                 runtime: str) -> ResolvedData:
    """The data settings with their defaults filled in: public presets are always regenerated
    (they hold other models' replies, and speculators' prepare-data takes conversations only);
    uploads are regenerated when asked."""
    data = body.data.model_dump()
    if dataset_kind == "public":
        if data["regenerate"] is False:
            raise APIError(422, f"dataset {body.dataset} is a public preset: its replies come "
                           "from other models, so it is trained on after the verifier "
                           "regenerates them; leave data.regenerate unset or true",
                           code="invalid_value", param="data.regenerate")
        data["regenerate"] = True
    data["regenerate"] = bool(data["regenerate"])
    if data["max_tokens"] is None:
        data["max_tokens"] = max(16, speculator.total_seq_len // 2)
    if data["regenerate"] and runtime == "local" and data["temperature"] != 0:
        raise APIError(422, "the local runtime's engine decodes greedily only: use "
                       "data.temperature 0, or the vllm runtime", code="invalid_value",
                       param="data.temperature")
    return ResolvedData.model_validate(data)


# What each gate condition needs the evaluation to measure.
GATE_NEEDS = {"min_acceptance_length": (None, "the evaluation"),
              "min_speedup": ("baseline", "the evaluation's no-speculation baseline"),
              "beat_ngram": ("ngram", "the evaluation's n-gram baseline")}


def resolve_gate(body: JobCreate, runtime: str) -> GateSpec | None:
    """The acceptance gate, or None. Unset: on the vllm runtime the drafter must at least not
    slow decoding down (speedup >= 1.0) when the evaluation measures it; none on local."""
    evaluation = body.evaluate
    if body.gate is None:
        if runtime == "vllm" and evaluation is not None and evaluation.baseline:
            return GateSpec(min_speedup=1.0)
        return None
    gate = body.gate.model_dump()
    for name, (switch, what) in GATE_NEEDS.items():
        asked = gate[name] not in (None, False)
        measured = evaluation is not None and (switch is None or getattr(evaluation, switch))
        if asked and not measured:
            raise APIError(422, f"gate.{name} needs {what}; enable it in \"evaluate\"",
                           code="invalid_value", param=f"gate.{name}")
    return body.gate if any(v not in (None, False) for v in gate.values()) else None


def create_job(session: Session, project_id: str, body: JobCreate, *, settings: Settings,
               hub: Mapping[str, bytes], idempotency_key: str | None = None,
               digest: str | None = None) -> tuple[Job, bool]:
    """Return ``(job, created)``; a replay with the same key and request (``digest``, default
    the body's ``request_hash``) returns the original. ``hub``: the configs of Hub models it
    names (``app.services.hub.fetch_configs``)."""
    digest = digest or request_hash(body)
    if idempotency_key is not None and (existing := replay(session, project_id, idempotency_key,
                                                             digest)) is not None:
        return existing, False
    spec = resolve_spec(session, project_id, body, settings, hub)
    job = Job(project_id=project_id, name=body.name, spec=spec.dump(),
              idempotency_key=idempotency_key, request_hash=digest)
    try:
        with session.begin_nested():
            state.initialize(session, job, "job created")
            candidates.add_rows(session, job, spec)
            # In the savepoint: pysqlite commits when it is released, so a refusal must come first.
            quotas.check_active(session, job, settings)
    except IntegrityError:
        # A concurrent request with the same key won the race.
        existing = _by_idempotency_key(session, project_id, idempotency_key or "")
        if existing is None:
            raise
        return _replay(existing, digest), False
    schedule(session, settings)
    return job, True


def replay(session: Session, project_id: str, idempotency_key: str, digest: str) -> Job | None:
    """The job this Idempotency-Key created (its request must have hashed to ``digest``: else
    422 ``idempotency_key_reused``), or None."""
    existing = _by_idempotency_key(session, project_id, idempotency_key)
    return None if existing is None else _replay(existing, digest)


def _by_idempotency_key(session: Session, project_id: str, key: str) -> Job | None:
    return session.scalars(select(Job).where(Job.project_id == project_id,
                                             Job.idempotency_key == key)).first()


def _replay(existing: Job, digest: str) -> Job:
    if existing.request_hash != digest:
        raise APIError(422, "this Idempotency-Key was already used with a different request body",
                       code="idempotency_key_reused", param="Idempotency-Key")
    return existing


def get_job(session: Session, project_id: str, job_id: str) -> Job:
    job = session.scalars(select(Job).where(Job.id == job_id, Job.project_id == project_id)).first()
    if job is None:
        raise not_found("job", job_id)
    return job


def list_jobs(session: Session, project_id: str, *, limit: int, after: str | None,
              status: JobStatus | None, name: str | None = None) -> tuple[list[Job], bool]:
    """Newest first; ``name``: the jobs whose name holds it, whatever the case."""
    query = select(Job).where(Job.project_id == project_id)
    if status is not None:
        query = query.where(Job.status == status.value)
    if name:
        query = query.where(func.lower(Job.name).contains(name.lower(), autoescape=True))
    if after is not None:
        query = query.where(Job.id < after)
    rows = list(session.scalars(query.order_by(Job.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def cancel_job(session: Session, project_id: str, job_id: str, settings: Settings) -> Job:
    """Queued jobs are cancelled at once; running ones move to ``cancelling`` and their worker
    stops the process group (SIGTERM, grace period, SIGKILL) on its next heartbeat."""
    job = get_job(session, project_id, job_id)
    current = JobStatus(job.status)
    if current in (JobStatus.CANCELLING, JobStatus.CANCELLED):
        return job
    if current == JobStatus.QUEUED:
        state.transition(session, job, JobStatus.CANCELLED, reason="cancelled by user",
                         message="cancelled before a worker claimed it")
        schedule(session, settings)  # what it held is free for the next job
    elif current == JobStatus.RUNNING:
        state.transition(session, job, JobStatus.CANCELLING, reason="cancel requested by user")
    else:
        raise APIError(409, f"job {job.id} already {current}; it cannot be cancelled",
                       code="job_not_cancellable")
    return job


def list_events(session: Session, job: Job, *, after: int | None, limit: int) -> tuple[list[JobEvent], bool]:
    query = select(JobEvent).where(JobEvent.job_id == job.id)
    if after is not None:
        query = query.where(JobEvent.id > after)
    rows = list(session.scalars(query.order_by(JobEvent.id).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def list_metrics(session: Session, job: Job, *, name: str | None,
                 after: int | None = None) -> list[JobMetric]:
    query = select(JobMetric).where(JobMetric.job_id == job.id)
    if name is not None:
        query = query.where(JobMetric.name == name)
    if after is not None:
        query = query.where(JobMetric.id > after)
    return list(session.scalars(query.order_by(JobMetric.id)))


def list_checkpoints(session: Session, job: Job) -> list[Checkpoint]:
    return list(session.scalars(select(Checkpoint).where(Checkpoint.job_id == job.id)
                                .order_by(Checkpoint.candidate, Checkpoint.epoch)))


def training_progress(session: Session, jobs: list[Job],
                      rows: dict[str, list[JobCandidate]]) -> dict[str, JobProgress]:
    """Each job's progress, from its latest training metric row and the first of the same
    candidate (the rows with a step and an epoch: the trainer's training lines; validation rows
    have no step, data regeneration rows no epoch). One query for all of them; a job without
    one is left out. ``rows``: the jobs' candidates (``candidates.rows_of``)."""
    if not jobs:
        return {}
    # Per job, a correlated max(id) and the min(id) of its candidate: each read on
    # ix_job_metrics_job_id_id, it stops at the row it looks for however many the job has.
    row, newest, first_row = aliased(JobMetric), aliased(JobMetric), aliased(JobMetric)
    training = (row.job_id == Job.id, row.step.is_not(None), row.epoch.is_not(None))
    latest_id = select(func.max(row.id)).where(*training).scalar_subquery()
    candidate = select(newest.candidate).where(newest.id == latest_id).scalar_subquery()
    first_id = select(func.min(first_row.id)).where(
        first_row.job_id == Job.id, first_row.step.is_not(None), first_row.epoch.is_not(None),
        first_row.candidate == candidate).scalar_subquery()
    wanted = [select(end).where(Job.id.in_([job.id for job in jobs]))
              for end in (first_id, latest_id)]
    found = session.execute(
        select(JobMetric.job_id, JobMetric.id, JobMetric.candidate, JobMetric.epoch,
               JobMetric.step, JobMetric.created_at)
        .where(JobMetric.id.in_(wanted[0].union(wanted[1]))).order_by(JobMetric.id))
    first: dict[str, Any] = {}
    latest: dict[str, Any] = {}
    for r in found:
        first.setdefault(r.job_id, r)
        latest[r.job_id] = r
    return {job.id: progress_of(job, rows[job.id], first[job.id], latest[job.id])
            for job in jobs if job.id in latest}


AFTER_TRAINING = frozenset({Stage.EVALUATING, Stage.PUBLISHING, Stage.DEPLOYING})


def progress_of(job: Job, candidates: list[JobCandidate], first: Any, latest: Any
                ) -> JobProgress:
    """Steps done of all, percent and time left, from two training rows (step, created_at) of
    the candidate training now."""
    spec = JobSpec.load(job.spec)
    index = latest.candidate if latest.candidate < len(spec.candidates) else 0
    epochs = spec.candidate(index).drafter.epochs
    row = next((c for c in candidates if c.idx == index), None)
    steps_per_epoch = (row.steps_per_epoch if row is not None else None) or job.steps_per_epoch
    done = latest.step + 1
    total = steps_per_epoch * epochs if steps_per_epoch else None
    percent = eta = None
    if total:
        # Training ended (a later stage, the candidate trained, success): every step is done,
        # even where an epoch had fewer steps than the first.
        trained = row is not None and row.status not in ("pending", "training")
        ended = job.stage in AFTER_TRAINING or job.status == JobStatus.SUCCEEDED or trained
        done = total if ended else min(done, total)
        percent = round(100 * done / total, 1)
        elapsed = (latest.created_at - first.created_at).total_seconds()
        if done == total:
            eta = 0.0
        elif latest.step > first.step and elapsed > 0:
            eta = round((total - done) * elapsed / (latest.step - first.step), 1)
    # The trainer counts epochs from 0; "epoch" here counts from 1 (JobProgress.epoch).
    return JobProgress(candidate=spec.candidate(index).name if spec.is_bakeoff else None,
                       epoch=latest.epoch + 1, epochs=epochs, step=latest.step, steps_done=done,
                       total_steps=total, percent=percent, eta_seconds=eta)


def job_outs(session: Session, jobs: list[Job]) -> list[JobOut]:
    """The answers for a page of jobs: their candidates, checkpoints and progress read in one
    query each."""
    rows = candidates.rows_of(session, jobs)
    checkpoints = candidates.checkpoints_of(session, jobs)
    progress = training_progress(session, jobs, rows)
    return [job_out(job, progress.get(job.id), rows[job.id], checkpoints) for job in jobs]


def job_out(job: Job, progress: JobProgress | None, rows: list[JobCandidate],
            checkpoints: dict[tuple[str, int], list[str]]) -> JobOut:
    """The one place a JobOut is built; ``progress`` from ``training_progress``, ``rows`` and
    ``checkpoints`` from ``app.services.candidates``."""
    spec = JobSpec.load(job.spec)
    leaderboard = (job.evaluation or {}).get("leaderboard") or {}
    return JobOut(
        id=job.id, name=job.name, status=job.status, stage=job.stage,
        status_reason=job.status_reason,
        error_code=job.error_code, served_acceptance_length=job.served_acceptance_length,
        progress=progress, stage_progress=stage_progress_of(job.stage_progress),
        verifier=spec.verifier, dataset=spec.dataset,
        speculator=spec.speculator.model_dump(), mode=spec.mode,
        resources=spec.resources.model_dump(), runtime=spec.runtime, publish=spec.publish,
        evaluate=spec.evaluate.model_dump() if spec.evaluate else False,
        data=spec.data.model_dump(), gate=spec.gate.model_dump() if spec.gate else None,
        init_from=spec.init_from, deploy=spec.deploy.model_dump() if spec.deploy else None,
        candidates=[candidates.candidate_out(row, spec, checkpoints.get((job.id, row.idx), []))
                    for row in rows],
        winner=leaderboard.get("winner"),
        evaluation=job.evaluation, metadata=spec.metadata,
        attempt=job.attempt, worker=job.worker_id, allocation=job.allocation,
        created_at=job.created_at, updated_at=job.updated_at,
        started_at=job.started_at, finished_at=job.finished_at,
    )


def stage_progress_of(stored: dict[str, Any] | None,
                      now: datetime | None = None) -> StageProgress | None:
    """The stored progress of a stage after training, with its percent and time left (from the
    rate since the stage began: seconds per step so far, times the steps left)."""
    if not stored:
        return None
    done, total = stored["steps_done"], stored["total_steps"]
    eta = None
    if done >= total:
        eta = 0.0
    elif done > 0:
        elapsed = ((now or utcnow()) - datetime.fromisoformat(stored["started_at"])).total_seconds()
        eta = round(max(elapsed, 0.0) * (total - done) / done, 1)
    return StageProgress(stage=stored["stage"], what=stored["what"], steps_done=done,
                         total_steps=total, percent=round(100 * done / total, 1) if total else 100.0,
                         eta_seconds=eta)


def job_log_path(job: Job, settings: Settings) -> Path:
    return JobPaths.for_job(settings, job.id).log


# Where a dry run's paths hold the id the job will get, as plans hold "<port>" for the ports the
# worker picks when it starts the servers.
UNKNOWN_JOB_ID = "<job_id>"


def job_plan(job: Job, settings: Settings) -> dict[str, Any]:
    placed = job.allocation or {}
    gpus = (placed["verifier"], placed["trainer"]) if "verifier" in placed else None
    return _plan(JobSpec.load(job.spec), settings, job.id, gpus)


def dry_run_plan(session: Session, project_id: str, body: JobCreate, *, settings: Settings,
                 hub: Mapping[str, bytes]) -> dict[str, Any]:
    """The plan of the job that ``body`` would create, checked and resolved as ``create_job``
    does, with nothing written: no job, no event, no quota used. Its GPUs are the default
    placement (the scheduler places a job once it is created); its paths hold ``<job_id>``."""
    return _plan(resolve_spec(session, project_id, body, settings, hub), settings, None, None)


def _plan(spec: JobSpec, settings: Settings, job_id: str | None,
          gpus: tuple[list[int], list[int]] | None) -> dict[str, Any]:
    plan = build_plan(spec, JobPaths.for_job(settings, job_id or UNKNOWN_JOB_ID), gpus=gpus)
    return {
        "job_id": job_id,
        "runtime": plan.runtime,
        "layer_ids": {"verifier_server": plan.server_layer_ids, "trainer": plan.trainer_layer_ids},
        "gpus": {"verifier": plan.verifier_gpus, "trainer": plan.trainer_gpus},
        "stages": [{"stage": s.stage, "candidate": s.candidate, "description": s.description,
                    "argv": s.argv, "env": s.redacted_env(), "gpus": s.gpus}
                   for s in plan.stages],
    }
