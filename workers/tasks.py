"""Thin Celery tasks and the worker's lifecycle hooks."""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Any

from celery import signals
from sqlalchemy import select

from app.celery_app import celery_app
from app.db import session_scope
from app.db.models import Checkpoint, Deployment, Job
from app.doctor.runner import host_runtime, warn_at_startup
from app.gpus import detect_gpus
from app.logtail import tail
from app.services import replicas
from app.services import workers as registry
from app.services.scheduling import schedule
from app.services.dispatch import ADOPT_DEPLOYMENT_TASK
from app.services.state import DeploymentStatus, transition
from app.services.publishing import PublishError
from app.schemas.job_spec import JobSpec
from app.services.secrets import HF_TOKEN, cipher
from app.settings import get_settings
from workers.deployments import run_deployment
from workers.adoption import find
from workers.lease import Lease, claim
from workers.publish import MissingToken, prepare, record
from workers.reconciler import Reconciler, recover_own
from workers.runner import HOST, SHUTTING_DOWN, run_job
from workers.supervisor import ManagedProcess
from workers.webhooks import WebhookDispatcher

log = logging.getLogger(__name__)
_reconciler: Reconciler | None = None
_webhooks: WebhookDispatcher | None = None


@celery_app.task(name="specdeck.run_job", acks_late=True, ignore_result=True)
def run_job_task(job_id: str) -> None:
    """Load the job, claim its lease, run the pipeline. A duplicate message does nothing."""
    settings = get_settings()
    lease = claim(job_id, settings.worker_name, settings.lease_seconds)
    if lease is None:
        log.info("job %s is not queued (duplicate or stale message): nothing to do", job_id)
        return
    with session_scope() as session:
        row = session.execute(select(Job.spec, Job.allocation).where(Job.id == job_id)).one()
        spec = JobSpec.load(row.spec, allocation=row.allocation)  # the GPUs it was given
    run_job(lease, spec, settings)


@celery_app.task(name="specdeck.run_deployment", acks_late=True, ignore_result=True)
def run_deployment_task(deployment_id: str) -> None:
    """Claim a pending deployment placed here and serve it until it is deleted."""
    settings = get_settings()
    api_key = secrets.token_urlsafe(32)  # the engine's internal key: only the gateway has it
    lease = claim(deployment_id, settings.worker_name, settings.lease_seconds, model=Deployment,
                  columns={"api_key_ciphertext": cipher(settings).encrypt(api_key.encode()).decode()})
    if lease is None:
        log.info("deployment %s is not pending here (duplicate or stale message)", deployment_id)
        return
    with session_scope() as session:
        row = session.get(Deployment, deployment_id)
        parent = session.get(Deployment, row.replica_of) if row.replica_of else None
        if parent is not None and parent.status not in replicas.RUNNING:
            # A replica of a deployment deleted (or failed) since it was placed: no engine.
            why = f"deployment {parent.id} is {parent.status}"
            transition(session, row, DeploymentStatus.STOPPING, token=lease.token, reason=why)
            transition(session, row, DeploymentStatus.STOPPED, token=lease.token, reason=why)
            schedule(session, settings)  # its slot is free
            return
        deployment = served(row)
    run_deployment(lease, deployment, settings, api_key)


def served(row: Deployment) -> dict[str, Any]:
    """What a worker serves of a deployment's row."""
    # A replica's live acceptance goes to its deployment's series, marked with its index.
    return {"name": row.name, "restarts": row.restarts,
            "spec": {**row.spec, "allocation": row.allocation,
                     "series": row.replica_of or row.id, "replica": row.replica}}


@celery_app.task(name=ADOPT_DEPLOYMENT_TASK, acks_late=True, ignore_result=True)
def adopt_deployment_task(deployment_id: str, token: str) -> None:
    """Watch the engine an earlier run of this worker left serving (workers/adoption.py):
    the lease was taken again at start-up with ``token``."""
    settings = get_settings()
    with session_scope() as session:
        row = session.get(Deployment, deployment_id)
        if row is None or row.lock_token != token:
            log.info("deployment %s is no longer this adoption's", deployment_id)
            return
        lease = Lease(deployment_id, token, settings.worker_name, row.attempt, Deployment)
        api_key = cipher(settings).decrypt(row.api_key_ciphertext.encode()).decode()
        found, deployment = find(row, HOST), served(row)
        if found is None:  # it died since: a fresh engine, as after a crash
            transition(session, row, DeploymentStatus.STARTING, token=token,
                       reason="the adopted engine is gone; starting another",
                       columns={"upstream_url": None})
    run_deployment(lease, deployment, settings, api_key, adopted=found)


@celery_app.task(name="specdeck.publish_checkpoint", acks_late=True, ignore_result=True)
def publish_checkpoint_task(checkpoint_id: str, repo_id: str, private: bool) -> None:
    """Upload a checkpoint held on this worker; the outcome is recorded on the checkpoint, and
    every outcome ends the publish: ``published``, or ``failed`` with the reason."""
    settings = get_settings()
    work_dir = (settings.work_root / "publish" / checkpoint_id).resolve()
    log_path = (settings.logs_root / f"{checkpoint_id}-publish.log").resolve()
    try:
        with session_scope() as session:
            command = prepare(session, session.get(Checkpoint, checkpoint_id), repo_id,
                              private=private, work_dir=work_dir, settings=settings)
        token = command.env[HF_TOKEN]
        proc = ManagedProcess(command.argv, env=command.env, log_path=log_path, job_id=checkpoint_id,
                              secrets=[token], description=command.description)
        code = proc.wait(lambda: SHUTTING_DOWN.is_set(), grace=settings.cancel_grace_seconds)
        with session_scope() as session:
            if code == 0:
                record(session, checkpoint_id, work_dir, repo_id)
                return
            checkpoint = session.get(Checkpoint, checkpoint_id)
            checkpoint.publish_status = "failed"
            checkpoint.publish_error = tail(log_path, 5) or f"exited with code {code}"
    except Exception as exc:  # any exception would leave it "publishing" for good
        if not isinstance(exc, (MissingToken, PublishError)):
            log.exception("publishing %s failed", checkpoint_id)
        reason = str(exc) if isinstance(exc, (MissingToken, PublishError)) else (
            f"publishing failed: {type(exc).__name__}: {exc}")
        with session_scope() as session:
            checkpoint = session.get(Checkpoint, checkpoint_id)
            checkpoint.publish_status, checkpoint.publish_error = "failed", reason


@signals.worker_ready.connect
def _on_worker_ready(**_: object) -> None:
    global _reconciler, _webhooks
    settings = get_settings()
    gpus = detect_gpus(settings.worker_gpus)
    with session_scope() as session:
        registry.register(session, worker_id=settings.worker_name, host=HOST, queue=settings.worker_queue,
                          gpus=gpus, capacity=settings.worker_concurrency,
                          serving_slots=settings.worker_serving_slots)
    if handed_back := recover_own(settings, HOST):
        log.warning("handed back %d job(s)/deployment(s) an earlier run of %s held", handed_back,
                    settings.worker_name)
    _reconciler = Reconciler(settings, settings.worker_name, HOST)
    _reconciler.start()
    _webhooks = WebhookDispatcher(settings, settings.worker_name)
    _webhooks.start()
    log.info("worker %s ready on %s with %d GPU(s)", settings.worker_name, HOST, len(gpus))
    # The doctor's checks, off the start-up path: a warning names what this host lacks.
    threading.Thread(target=warn_at_startup, args=(host_runtime(gpus),), daemon=True,
                     name="doctor").start()


@signals.worker_shutting_down.connect
def _on_shutdown(**_: object) -> None:
    for thread in (_reconciler, _webhooks):
        if thread is not None:
            thread.stopped.set()
    with session_scope() as session:
        registry.retire(session, get_settings().worker_name)
    SHUTTING_DOWN.set()  # running jobs are handed back, and go to another worker
