"""All configuration, in one pydantic-settings class (environment prefix ``SPECDECK_``)."""

from __future__ import annotations

import socket
import logging
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_SECRET_KEY = "dev-insecure-secret-key-change-me"
VAR = Path("var")
REPOSITORY = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECDECK_", env_file=".env", extra="ignore")

    env: Literal["development", "production"] = "development"
    # Embedded default: a SQLite file and kombu's SQLAlchemy transport, no servers needed.
    database_url: str = f"sqlite:///{VAR}/specdeck.db"
    broker_url: str = f"sqla+sqlite:///{VAR}/broker.db"
    secret_key: str = DEFAULT_SECRET_KEY
    # Old keys, comma-separated, still accepted for decryption while `specdeck admin secrets rotate`
    # re-encrypts every secret under secret_key.
    secret_key_previous: str | None = None

    data_root: Path = VAR / "data"
    models_root: Path = VAR / "models"
    logs_root: Path = VAR / "logs"
    work_root: Path = VAR / "work"

    # Local copies of public dataset presets, "<preset>.jsonl" (conversations), read by data
    # regeneration instead of downloading the preset from the Hub (air-gapped hosts, tests).
    public_datasets_mirror: Path | None = None

    # The dashboard's build (`npm run build` in frontend/), served at / (app/dashboard.py).
    dashboard_dir: Path = REPOSITORY / "frontend" / "dist"

    # The runtime a job gets when it names none: "vllm" on GPU hosts, "local" on a laptop.
    default_runtime: Literal["vllm", "local"] = "vllm"

    # HTTP limits.
    max_body_bytes: int = 1_048_576
    # POST /api/datasets: the uploaded JSONL file, and each of its lines.
    max_dataset_bytes: int = 268_435_456
    max_dataset_line_bytes: int = 1_048_576

    # Per-project quotas (0: no limit): jobs not yet ended (queued, running, cancelling),
    # deployments not stopped or failed, the bytes of the project's uploaded datasets, and keys.
    quota_active_jobs: int = Field(default=20, ge=0)
    quota_active_deployments: int = Field(default=8, ge=0)
    quota_dataset_bytes: int = Field(default=10 * 1024**3, ge=0)
    # API keys not revoked (POST /api/keys; `specdeck admin` and `make run` are not limited).
    quota_api_keys: int = Field(default=50, ge=0)
    # Webhook endpoints per project.
    quota_webhooks: int = Field(default=20, ge=0)
    # Candidates of one bake-off job (docs/quotas.md); at most 32 either way.
    quota_candidates_per_job: int = Field(default=6, ge=0)

    # Webhook deliveries (workers/webhooks.py): the seconds to wait after each failed attempt
    # (comma-separated; the first attempt is immediate, so 7 delays make 8 attempts over about a
    # day, Svix's schedule), how often each worker looks for due deliveries, how many it sends
    # at once, one attempt's timeout, and the lease a worker holds on a delivery it is sending
    # (after which another worker sends it again). Hosts (names or IPs, comma-separated) that
    # webhook URLs may name although they resolve to private addresses.
    webhook_retry_seconds: str = Field(default="5,300,1800,7200,18000,36000,36000",
                                       pattern=r"^\s*\d+(\.\d+)?(\s*,\s*\d+(\.\d+)?)*\s*$")
    webhook_poll_seconds: float = Field(default=1.0, gt=0)
    webhook_batch: int = Field(default=8, ge=1)
    webhook_timeout_seconds: float = Field(default=10.0, gt=0)
    webhook_lease_seconds: float = Field(default=60.0, gt=0)
    webhook_allowed_hosts: str = ""

    # Celery queue that kicks go to, and the worker's identity.
    queue: str = "specdeck"
    worker_name: str = Field(default_factory=lambda: f"worker@{socket.gethostname()}")
    # What a worker offers the local (CPU) runtime: training slots, each running one job, and
    # serving slots, each running one deployment's engine. Kept apart so that a deployment,
    # which serves until deleted, never holds the slot the next job needs (nor the reverse).
    # The vllm runtime uses GPUs instead. 0 serving slots: this worker serves nothing locally.
    worker_concurrency: int = Field(default=1, ge=0)
    worker_serving_slots: int = Field(default=1, ge=0)
    # "0,1,2,3" pins the GPUs a worker offers; "" means none. Unset: ask NVML.
    worker_gpus: str | None = None

    # Leases and the reconciler.
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 5.0
    reconcile_seconds: float = 5.0
    rekick_after_seconds: float = 30.0
    max_attempts: int = 3
    # How long a worker keeps retrying its bookkeeping (progress, events, status) while the
    # database is unreachable before it gives up on the write.
    database_retry_seconds: float = Field(default=60.0, ge=0)
    cancel_grace_seconds: float = 5.0
    # A trainer stopped (a cancel, a worker's shutdown) saves the epoch so far before it exits
    # (speculators, on SIGTERM): the seconds it gets for that before SIGKILL.
    trainer_stop_grace_seconds: float = Field(default=60.0, ge=0)
    # The local runtime: a job imports vLLM, prepare-data and the trainer once and forks each of
    # its processes from that import (workers/runtimes/local/preload.py), and a deployment its
    # engines (restarts and promotions): on 2 cores about 13 s less per vLLM server after the
    # first, and most of prepare-data's and the trainer's starts.
    vllm_preload: bool = True
    # The KV cache of each of the local runtime's vLLM engines, in bytes (--kv-cache-memory-bytes):
    # vLLM allocates and zeroes it when the engine starts. 1 GiB holds about 4,600 tokens of a
    # Qwen3-0.6B in float32; the tests' demo verifier needs a few MiB.
    local_kv_cache_bytes: int = Field(default=1 << 30, gt=0)
    # OpenMP threads of each of the local runtime's processes (vLLM's engines, prepare-data, a
    # one-process trainer): unset, torch's default (every core) and 2 for the trainer. One suits
    # tiny models, where a second thread costs more than it gives, and a host whose cores several
    # engines and jobs share (docs/benchmarks.md, "OpenMP on a shared CPU").
    local_threads: int | None = Field(default=None, gt=0)
    # The Hugging Face Hub endpoint for publishing and model lookups (unset: huggingface_hub's
    # default, or HF_ENDPOINT).
    hf_endpoint: str | None = None
    # Reading a Hub model's config.json when a job or deployment is created: one try, at most
    # this long (then 503 hub_unavailable), and the answer is cached this long.
    hub_timeout_seconds: float = Field(default=10.0, gt=0)
    hub_cache_seconds: float = Field(default=300.0, ge=0)

    # How long the hidden-states server or a serving engine may take to load and answer.
    verifier_ready_seconds: float = 900.0

    # Deployments: health checks, restarts after a crash (backoff 2^n s, at most 60 s), and
    # the address the gateway reaches a worker's engines at (127.0.0.1: same host only).
    health_check_seconds: float = 5.0
    deployment_max_restarts: int = 5
    worker_advertise_host: str = "127.0.0.1"
    # Promotions (a drafter switched without downtime): once the route points at the new
    # engine, the old one keeps running at least gateway_route_cache_seconds plus this grace
    # (gateways may still route to it from their cache), then until its in-flight requests
    # end (vllm:num_requests_running and _waiting on its /metrics), at most the drain timeout.
    promotion_drain_grace_seconds: float = Field(default=2.0, ge=0)
    promotion_drain_timeout_seconds: float = Field(default=600.0, ge=0)
    # Live acceptance: the worker scrapes each ready engine's /metrics every
    # live_metrics_seconds (on a health-check round: at most as often as those) and stores the
    # interval's deltas. Drift alert: the acceptance length over the last drift_window_seconds
    # (once it rests on drift_min_drafts drafts at least) below drift_alert_fraction of the
    # drafter's evaluated one records an acceptance_dropped event, once per episode. Points
    # older than live_metrics_retention_days are deleted by the reconciler.
    live_metrics_seconds: float = Field(default=15.0, gt=0)
    live_metrics_retention_days: int = Field(default=90, ge=1)
    drift_window_seconds: float = Field(default=600.0, gt=0)
    drift_alert_fraction: float = Field(default=0.8, gt=0, le=1)
    drift_min_drafts: int = Field(default=1000, ge=1)

    # The OpenAI-compatible gateway (/v1). Auth and routing are cached in memory for a few
    # seconds (a changed deployment is seen within that; a revoked key too where no Redis
    # announces it); the rate limit is one bucket per API key, in Redis for every API process
    # when the broker is Redis, else in the process (0 disables it); usage rows are written in
    # batches every gateway_usage_flush_seconds.
    gateway_auth_cache_seconds: float = Field(default=5.0, gt=0)
    gateway_route_cache_seconds: float = Field(default=1.0, gt=0)
    gateway_rate_limit_rpm: float = Field(default=600.0, ge=0)
    gateway_rate_limit_burst: int = Field(default=100, ge=1)
    gateway_max_tokens: int = Field(default=4096, ge=1)
    gateway_usage_flush_seconds: float = Field(default=1.0, gt=0)
    # uvicorn's access log line for each chat completion `specdeck api` answers (every other
    # request is logged, unless --no-access-log): off by default, as vLLM's request log is.
    # Each completion is counted in /metrics already (and, answered, in the usage rows), and
    # the line added about 70 us to a request's latency (docs/benchmarks.md, "The access log").
    gateway_access_log: bool = False
    # Traffic capture: sampled requests wait in a queue of at most this many per API process
    # (beyond: not captured, counted as dropped) and are written every this many seconds.
    gateway_capture_queue_rows: int = Field(default=10_000, ge=1)
    gateway_capture_flush_seconds: float = Field(default=1.0, gt=0)
    # The longest an upstream may take to answer, or between two streamed chunks.
    gateway_upstream_timeout_seconds: float = Field(default=600.0, gt=0)
    gateway_upstream_connect_timeout_seconds: float = Field(default=5.0, gt=0)
    # Concurrent connections to one upstream (more requests wait for one to be free).
    gateway_upstream_max_connections: int = Field(default=1024, ge=1)
    # A deployment's replica that refused a connection or broke gets no requests for this long
    # (unless every replica did), then is tried again.
    gateway_replica_eject_seconds: float = Field(default=5.0, gt=0)
    # Retry-After on a 503 for a deployment that is starting, or an upstream that is down.
    gateway_starting_retry_after_seconds: int = Field(default=5, ge=1)
    gateway_unavailable_retry_after_seconds: int = Field(default=1, ge=1)

    # Which pipeline the worker runs: "module:ATTRIBUTE". Tests point this at test-only stages.
    pipeline: str = "workers.pipeline:PIPELINE"

    @model_validator(mode="after")
    def _refuse_default_secrets_in_production(self) -> "Settings":
        if self.env == "production":
            if self.secret_key == DEFAULT_SECRET_KEY or len(self.secret_key) < 32:
                raise ValueError(
                    "SPECDECK_SECRET_KEY must be set to a random value of at least 32 characters "
                    "in production (SPECDECK_ENV=production)"
                )
            if self.database_url.startswith("sqlite"):
                raise ValueError("SPECDECK_DATABASE_URL must point to Postgres in production")
        return self

    @model_validator(mode="after")
    def _webhook_lease_outlasts_an_attempt(self) -> "Settings":
        if self.webhook_lease_seconds <= self.webhook_timeout_seconds:
            raise ValueError("SPECDECK_WEBHOOK_LEASE_SECONDS must be longer than "
                             "SPECDECK_WEBHOOK_TIMEOUT_SECONDS: a delivery being sent would be "
                             "sent again by another worker")
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def webhook_retry_delays(self) -> list[float]:
        """The waits between attempts: attempt n+1 comes this long after attempt n failed."""
        return [float(part) for part in self.webhook_retry_seconds.split(",")]

    @property
    def worker_queue(self) -> str:
        """Each worker consumes its own queue: the scheduler routes a job to where it placed it."""
        return f"{self.queue}.{self.worker_name}"


def warn_if_default_secret_key(settings: Settings) -> bool:
    """In development the secret key may be left unset, and secrets are then encrypted with a
    key anyone can read in this file: say so at start-up. True when it warned."""
    if settings.secret_key != DEFAULT_SECRET_KEY:
        return False
    logging.getLogger("specdeck").warning(
        "SPECDECK_SECRET_KEY is not set: secrets (HF_TOKEN ...) are encrypted with the built-in "
        "development key, which anyone can read in SpecDeck's source. Set SPECDECK_SECRET_KEY "
        "(openssl rand -hex 32) before storing a real token; SPECDECK_ENV=production refuses "
        "to start without one.")
    return True


@lru_cache
def get_settings() -> Settings:
    return Settings()
