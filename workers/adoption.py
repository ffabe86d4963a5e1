"""Engines outlive their worker.

A serving engine is not its worker: like a container under a restarted kubelet, it can go on
serving while the worker process is restarted on its host (``specdeck run`` restarts a dead
worker within a second or two; so would systemd). A worker that starts and finds the engine of
a deployment it held still running and ready adopts it instead of killing it: it takes the
deployment's lease again, keeps it ``ready`` (the gateway routed to the engine all along and
goes on) and watches the engine as if it had started it.

It knows an engine by what the deployment's row recorded: the process groups it started (the
leader's pid and start time, the boot), the port (``upstream_url``), the deployment and replica
(the row itself, whose id every process it started carries in its environment). An engine that
is not ready, or a deployment no longer wanted (being deleted, never ready), is stopped and
handed back as before. A job's processes (trainers, hidden-states servers) are never adopted:
the job is retried. An engine restarted with its worker (a container's restart) is not adopted
either: replicas on two workers are the answer there (docs/operations.md).
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from sqlalchemy.orm import Session

from app.db import after_commit
from app.db.models import Deployment, utcnow
from app.services.dispatch import ADOPT_DEPLOYMENT_TASK, send
from app.services.secrets import cipher
from app.services.state import DeploymentStatus, record_event
from app.settings import Settings
from workers.promotion import Engine, engine_headers
from workers.readiness import is_ready
from workers.runner import JobContext
from workers.runtimes.local.preload import preloader_socket
from workers.supervisor import AdoptedProcess, Group, belongs_to

READY_CHECK_SECONDS = 3.0  # how long an engine has to answer ready to be adopted


@dataclass(frozen=True)
class Found:
    """A deployment's engine left running by an earlier run of its worker (and, on the local
    runtime, the preloader it was forked from, with its socket)."""

    engine: Group
    port: int
    preloader: Group | None = None
    socket: str | None = None


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def find(row: Deployment, host: str) -> Found | None:
    """The engine ``row`` recorded, if it still runs as recorded: the deployment was ready on
    this host, each of its process groups is led by the very process it started (same boot,
    same start time) that runs for this deployment, and exactly one of them is an engine."""
    if (row.status != DeploymentStatus.READY or row.pgid_host != host or not row.upstream_url
            or (port := urlsplit(row.upstream_url).port) is None):
        return None
    groups = [Group.from_json(g) for g in row.pgids or []]
    if not groups or not all(g.leads() and belongs_to(g.pgid, row.id) for g in groups):
        return None
    preloaders = {g: socket for g in groups if (socket := preloader_socket(_argv(g.pgid)))}
    engines = [g for g in groups if g not in preloaders]
    if len(engines) != 1 or len(preloaders) > 1:
        return None  # mid-promotion (two engines): not worth the guess
    [(preloader, socket)] = preloaders.items() or [(None, None)]
    return Found(engines[0], port, preloader, socket)


def ready(row: Deployment, found: Found, settings: Settings) -> bool:
    """Whether the engine answers ready under the deployment's name, with its internal key."""
    if not row.api_key_ciphertext:
        return False
    api_key = cipher(settings).decrypt(row.api_key_ciphertext.encode()).decode()
    with httpx.Client(timeout=READY_CHECK_SECONDS, headers=engine_headers(api_key)) as client:
        return is_ready(client, f"http://127.0.0.1:{found.port}", row.name)


def adopt(session: Session, row: Deployment, settings: Settings, host: str) -> bool:
    """At a worker's start-up, for a deployment its earlier run held: when that run's engine
    still serves, take the lease again (a new token), keep the deployment ready, and have this
    worker watch the engine (the adoption task, sent once this commits). False when there is
    nothing to adopt: the caller hands the deployment back."""
    found = find(row, host)
    if found is None or not ready(row, found, settings):
        return False
    token = secrets.token_hex(16)
    row.lock_token = token
    row.lock_expires_at = utcnow() + timedelta(seconds=settings.lease_seconds)
    record_event(session, row, "adopted",
                 f"worker {settings.worker_name} restarted and adopted the engine it left "
                 f"serving (pid {found.engine.pgid}, port {found.port}): it serves on",
                 {"pid": found.engine.pgid, "port": found.port})
    after_commit(session, lambda: send(ADOPT_DEPLOYMENT_TASK, [row.id, token],
                                       settings.worker_queue))
    return True


def take_over(ctx: JobContext, found: Found) -> Engine:
    """Make the adopted processes the deployment's, as if ``ctx`` had started them: the engine
    it watches and stops, the preloader its next engine is forked from, stopped at the end."""
    engine = AdoptedProcess(found.engine, "serving engine (adopted)")
    if found.preloader is None or found.socket is None:  # the vllm runtime: no preloader
        ctx.adopt([found.engine], None)
    else:
        preloader = AdoptedProcess(found.preloader, "preloader (adopted)")
        folder = os.path.dirname(found.socket)
        ctx.on_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        ctx.on_cleanup(lambda: ctx.stop(preloader))
        ctx.adopt([found.engine, found.preloader], (preloader, found.socket))
    gpus = list(((ctx.spec.get("allocation") or {}).get("verifier")) or [])
    return Engine(engine, found.port, gpus)
