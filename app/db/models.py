"""Typed SQLAlchemy 2 models. The schema itself is owned by the Alembic migrations."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    """A sortable id: milliseconds since the epoch, then randomness (newest sorts last)."""
    return f"{prefix}_{int(time.time() * 1000):012x}{os.urandom(6).hex()}"


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite hands back naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


BigIntPK = BigInteger().with_variant(Integer, "sqlite")


class Base(DeclarativeBase):
    pass


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("proj"))
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("key"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100), default="")
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # What the key may do (app/services/keys.py ROLES): admin, member or inference.
    role: Mapped[str] = mapped_column(String(16), default="admin", server_default="admin")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Leased:
    """What a worker holds a lease on (jobs, deployments): the lease, the process groups it
    runs and their host (for reaping), where the scheduler placed it, and its times."""

    lock_owner: Mapped[str | None] = mapped_column(String(255))
    lock_token: Mapped[str | None] = mapped_column(String(64))
    lock_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The process groups it runs: [{"pgid", "started", "boot"}] (workers/supervisor.Group).
    pgids: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    pgid_host: Mapped[str | None] = mapped_column(String(255))
    kicked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A worker and its GPU indices (or a CPU slot).
    worker_id: Mapped[str | None] = mapped_column(String(255))
    allocation: Mapped[dict[str, list[int]] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Job(Leased, Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("project_id", "idempotency_key", name="uq_jobs_project_idempotency_key"),
        Index("ix_jobs_project_id_id", "project_id", "id"),
        Index("ix_jobs_project_status_id", "project_id", "status", "id"),
        Index("ix_jobs_status_lock_expires_at", "status", "lock_expires_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("job"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(String(100))  # the user's, to tell jobs apart
    # Only app.services.state.transition() writes status and stage.
    status: Mapped[str] = mapped_column(String(20))
    stage: Mapped[str | None] = mapped_column(String(32))
    status_reason: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    # The served evaluation of the checkpoint the job chose (headline: the served acceptance
    # length beside its baselines) and the acceptance gate's verdict; written by the worker.
    evaluation: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # No longer written: each candidate's (JobCandidate.steps_per_epoch); kept for old rows.
    steps_per_epoch: Mapped[int | None] = mapped_column(Integer)
    # A later stage's own progress (the served evaluation), written by the worker as it goes:
    # {"stage", "what", "steps_done", "total_steps", "started_at"} (app.services.jobs).
    stage_progress: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    @property
    def served_acceptance_length(self) -> float | None:
        return (self.evaluation or {}).get("mean_acceptance_length")


class JobCandidate(Base):
    """One drafter a job trains: a plain job's only one, or one of a bake-off's (its index in
    the job spec's candidates). Its status follows ``app.services.state.CANDIDATE_TRANSITIONS``;
    its training cost and served figures are written by the worker."""

    __tablename__ = "job_candidates"
    __table_args__ = (UniqueConstraint("job_id", "idx", name="uq_job_candidates_job_idx"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("cand"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    status_reason: Mapped[str | None] = mapped_column(Text)
    error_code: Mapped[str | None] = mapped_column(String(64))
    log_tail: Mapped[str | None] = mapped_column(Text)  # the trainer's last lines, when it failed
    # Trainer steps in one epoch, known once its first epoch is trained (its progress' total).
    steps_per_epoch: Mapped[int | None] = mapped_column(Integer)
    train_seconds: Mapped[float | None] = mapped_column(Float)  # the trainer's wall time
    train_cpu_seconds: Mapped[float | None] = mapped_column(Float)  # its processes' CPU time
    train_gpu_seconds: Mapped[float | None] = mapped_column(Float)  # wall time x its GPUs
    # Its served figures: the evaluation of its chosen checkpoint, its rank, the spread.
    evaluation: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class Event:
    """What happened to a job or a deployment: status changes, stages, processes, progress."""

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str | None] = mapped_column(String(20))
    stage: Mapped[str | None] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class JobEvent(Event, Base):
    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))


class JobMetric(Base):
    __tablename__ = "job_metrics"
    __table_args__ = (Index("ix_job_metrics_job_id_name_step", "job_id", "name", "step"),
                      # A job's latest rows first: its progress (app.services.jobs).
                      Index("ix_job_metrics_job_id_id", "job_id", "id"))

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    candidate: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    step: Mapped[int | None] = mapped_column(Integer)
    epoch: Mapped[int | None] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(100))
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "candidate", "epoch",
                                       name="uq_checkpoints_job_candidate_epoch"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ckpt"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    # Which of the job's candidates it is of (JobCandidate.idx), and that drafter's kind.
    candidate: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    kind: Mapped[str] = mapped_column(String(16), default="dflash", server_default="dflash")
    epoch: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    is_best: Mapped[bool] = mapped_column(Boolean, default=False)
    # Saved when the trainer was stopped mid-epoch (a cancel, a worker's shutdown): the weights
    # of ``epoch`` so far, in the trainer's "interrupted" directory. Never the best, never
    # evaluated; an epoch's own checkpoint replaces it.
    partial: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Written by the job's evaluating stage: the drafter served as a deployment serves it, on
    # held-out prompts (acceptance length, per-position acceptance, throughput).
    evaluation: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    @property
    def served_acceptance_length(self) -> float | None:
        return (self.evaluation or {}).get("mean_acceptance_length")
    # The worker whose disk holds it (publishing runs there).
    worker_id: Mapped[str | None] = mapped_column(String(255))
    # Set by a publish to the Hugging Face Hub: "publishing", "published" or "failed".
    publish_status: Mapped[str | None] = mapped_column(String(16))
    publish_error: Mapped[str | None] = mapped_column(Text)
    hub_repo: Mapped[str | None] = mapped_column(String(200))
    hub_commit: Mapped[str | None] = mapped_column(String(64))
    hub_url: Mapped[str | None] = mapped_column(Text)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Deployment(Leased, Base):
    """A served drafter: a verifier with a DFlash speculative config, behind the gateway."""

    __tablename__ = "deployments"
    __table_args__ = (Index("ix_deployments_project_id_id", "project_id", "id"),
                      Index("ix_deployments_project_name", "project_id", "name"))

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("dep"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))  # the served model name clients ask for
    # Only app.services.state.transition() writes status.
    status: Mapped[str] = mapped_column(String(20))
    status_reason: Mapped[str | None] = mapped_column(Text)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    upstream_url: Mapped[str | None] = mapped_column(Text)
    api_key_ciphertext: Mapped[str | None] = mapped_column(Text)  # the upstream's internal key
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Traffic capture (opt-in): the dataset the gateway records this deployment's sampled
    # requests into; null when capture is off, or once that dataset was deleted.
    capture_dataset_id: Mapped[str | None] = mapped_column(
        ForeignKey("datasets.id", ondelete="SET NULL"), index=True)
    capture_dataset: Mapped[Dataset | None] = relationship(lazy="selectin", viewonly=True)
    # Replicas: a deployment with ``spec["replicas"]`` > 1 serves from that many engines, each
    # on a worker slot of its own. The deployment's own row is replica 0; each other replica is a
    # row of its own (its own status, worker, engine, health and restarts) that names the
    # deployment in ``replica_of``, shares its name, spec and capture, and is run, leased and
    # restarted exactly as a deployment is. Only the deployment's row is shown by the API.
    replica_of: Mapped[str | None] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), index=True)
    replica: Mapped[int] = mapped_column(Integer, default=0)
    # The rows of its replicas past 0, every one ever created (app.services.replicas reads them).
    replica_set: Mapped[list[Deployment]] = relationship(
        foreign_keys=[replica_of], viewonly=True, order_by=lambda: (Deployment.replica,
                                                                   Deployment.created_at,
                                                                   Deployment.id))


class DeploymentEvent(Event, Base):
    __tablename__ = "deployment_events"
    __table_args__ = (Index("ix_deployment_events_deployment_id_id", "deployment_id", "id"),)

    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))


class Promotion(Base):
    """A switch of a deployment's drafter without downtime (a promotion to a checkpoint, or a
    rollback to the drafter served before): the new engine starts beside the old one, the
    route switches in one transaction, the old engine drains and stops. Its steps are a small
    state machine of their own (``app.services.state.PROMOTION_TRANSITIONS``); the deployment
    stays ``ready`` throughout. The succeeded rows are the deployment's history of drafters."""

    __tablename__ = "promotions"
    __table_args__ = (Index("ix_promotions_deployment_id_id", "deployment_id", "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("prom"))
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # "promote" or "rollback"
    # Only app.services.state.move_promotion() writes status.
    status: Mapped[str] = mapped_column(String(16))
    status_reason: Mapped[str | None] = mapped_column(Text)
    # The drafter switched to and the one it replaced: the deployment spec's drafter fields
    # (source, drafter, block_size, num_speculative_tokens); ``previous`` set at the switch.
    target: Mapped[dict[str, Any]] = mapped_column(JSON)
    previous: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    job_id: Mapped[str | None] = mapped_column(String(40))  # the job whose "deploy" asked for it
    # With replicas, each replica past 0 switches by a row of its own on its own deployments
    # row, naming the deployment's row (replica 0's) here; the API shows the deployment's row
    # with its replicas' steps (app.services.promotions.promotion_views).
    promotion_of: Mapped[str | None] = mapped_column(
        ForeignKey("promotions.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class DeploymentMetric(Base):
    """One scrape interval of a deployment's engine (its /metrics counters' deltas): the live
    acceptance series. Raw counts are kept so any window's acceptance is exact (weighted by
    drafts); the ratios are null for an interval with no drafts."""

    __tablename__ = "deployment_metrics"
    __table_args__ = (Index("ix_deployment_metrics_deployment_id_id", "deployment_id", "id"),
                      Index("ix_deployment_metrics_deployment_id_created_at", "deployment_id",
                            "created_at"))

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    deployment_id: Mapped[str] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"))
    replica: Mapped[int] = mapped_column(Integer, default=0)  # whose engine (0: its own row's)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    interval_seconds: Mapped[float] = mapped_column(Float)
    # What served the interval: the drafter (path or Hub id) and its checkpoint, when a job's.
    drafter: Mapped[str] = mapped_column(Text)
    checkpoint_id: Mapped[str | None] = mapped_column(String(40))
    num_drafts: Mapped[int] = mapped_column(BigInteger)
    num_draft_tokens: Mapped[int] = mapped_column(BigInteger)
    num_accepted_tokens: Mapped[int] = mapped_column(BigInteger)
    accepted_per_position: Mapped[list[int]] = mapped_column(JSON)
    generation_tokens: Mapped[int] = mapped_column(BigInteger)
    requests: Mapped[int] = mapped_column(BigInteger)
    acceptance_length: Mapped[float | None] = mapped_column(Float)
    draft_acceptance_rate: Mapped[float | None] = mapped_column(Float)
    per_position_acceptance: Mapped[list[float] | None] = mapped_column(JSON)
    tokens_per_second: Mapped[float] = mapped_column(Float)


class Usage(Base):
    """Tokens used through the gateway, per API key and deployment (one row per request)."""

    __tablename__ = "usage"
    __table_args__ = (Index("ix_usage_api_key_id_created_at", "api_key_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    api_key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"))
    project_id: Mapped[str] = mapped_column(String(40))
    deployment_id: Mapped[str | None] = mapped_column(String(40))
    model: Mapped[str] = mapped_column(String(100))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # The request's mean acceptance length, when the engine reports it per request (vLLM's
    # --per-request-spec-decode-metrics: metrics.speculative_decoding.mean_acceptance_length).
    acceptance_length: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Allocation(Base):
    """One GPU (or CPU slot) of a worker held by a job or deployment. The unique key is what
    guarantees that two owners never share a GPU, whatever races the schedulers run into."""

    __tablename__ = "allocations"
    __table_args__ = (UniqueConstraint("worker_id", "resource", "idx", name="uq_allocations_unit"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    worker_id: Mapped[str] = mapped_column(ForeignKey("workers.id", ondelete="CASCADE"))
    resource: Mapped[str] = mapped_column(String(8))  # "gpu", "slot" (training) or "serving"
    idx: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    deployment_id: Mapped[str | None] = mapped_column(ForeignKey("deployments.id", ondelete="CASCADE"),
                                                      index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Secret(Base):
    """A project secret, Fernet-encrypted with a key from settings (app/services/secrets.py)."""

    __tablename__ = "secrets"
    __table_args__ = (UniqueConstraint("project_id", "name", name="uq_secrets_project_name"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    ciphertext: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(255))
    gpus: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    capacity: Mapped[int] = mapped_column(Integer, default=1)  # training slots (local runtime)
    serving_slots: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Dataset(Base):
    """Chat data a job trains on: an uploaded JSONL file (stored once per content under
    ``<data_root>/datasets/<sha256>.jsonl``) or a public preset that speculators resolves."""

    __tablename__ = "datasets"
    __table_args__ = (
        UniqueConstraint("project_id", "sha256", name="uq_datasets_project_sha256"),
        UniqueConstraint("project_id", "public_name", name="uq_datasets_project_public_name"),
        Index("ix_datasets_project_id_id", "project_id", "id"),
        Index("ix_datasets_sha256", "sha256"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ds"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))  # "upload", "public" or "capture"
    format: Mapped[str | None] = mapped_column(String(16))  # "messages" or "conversations"
    sha256: Mapped[str | None] = mapped_column(String(64))
    path: Mapped[str | None] = mapped_column(Text)
    public_name: Mapped[str | None] = mapped_column(String(64))
    num_conversations: Mapped[int | None] = mapped_column(Integer)
    num_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # kind "capture": its settings and counters (its rows are CapturedRow).
    capture: Mapped[Capture | None] = relationship(lazy="selectin", cascade="all, delete-orphan",
                                                   passive_deletes=True)


class Capture(Base):
    """A capture dataset's settings (from the deployment's ``capture`` option) and counters.
    ``Dataset.num_conversations`` and ``num_bytes`` are its rows and their plaintext bytes."""

    __tablename__ = "captures"

    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"),
                                            primary_key=True)
    sample_rate: Mapped[float] = mapped_column(Float)
    max_rows: Mapped[int] = mapped_column(BigInteger)
    max_bytes: Mapped[int] = mapped_column(BigInteger)
    retention_days: Mapped[int] = mapped_column(Integer)
    # Sampled requests not recorded: the API process's queue was full, or the dataset was.
    dropped_queue_full: Mapped[int] = mapped_column(BigInteger, default=0)
    dropped_limit_reached: Mapped[int] = mapped_column(BigInteger, default=0)
    first_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class CapturedRow(Base):
    """One captured request: ``{"messages": [... the request's, the assistant's reply]}`` as
    JSON, Fernet-encrypted (app/services/secrets.py); ``num_bytes`` is the plaintext's size."""

    __tablename__ = "captured_rows"
    __table_args__ = (Index("ix_captured_rows_dataset_id_created_at", "dataset_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ciphertext: Mapped[str] = mapped_column(Text)
    num_bytes: Mapped[int] = mapped_column(Integer)


class Webhook(Base):
    """An endpoint that a project's events are sent to, signed with its secret (Standard
    Webhooks). The secret is Fernet-encrypted like the project's secrets."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_project_id_id", "project_id", "id"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("wh"))
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)
    description: Mapped[str] = mapped_column(String(500), default="")
    secret_ciphertext: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebhookDelivery(Base):
    """The outbox: one event for one endpoint, written in the transaction of the change it
    tells of, and sent by the workers (workers/webhooks.py) until it succeeds or runs out of
    attempts. Its id is the ``webhook-id`` of every attempt; ``body`` the exact bytes signed."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_webhook_id_id", "webhook_id", "id"),
        # The dispatcher's due rows: pending ones whose time came, and sends whose lease ran out.
        Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_status_locked_until", "status", "locked_until"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("msg"))
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    event_type: Mapped[str] = mapped_column(String(64))
    body: Mapped[str] = mapped_column(Text)
    # pending, delivering (a worker holds it until locked_until), succeeded or failed.
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lock_token: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)


class WebhookAttempt(Base):
    """One send of a delivery: written when a worker claims it, completed with the receiver's
    HTTP status or the network error once it answers."""

    __tablename__ = "webhook_attempts"
    __table_args__ = (Index("ix_webhook_attempts_delivery_id_id", "delivery_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"))
    worker_id: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[int | None] = mapped_column(Integer)
