"""The FastAPI application factory."""

from __future__ import annotations

from fastapi import FastAPI

from app.api import checkpoints, datasets, deployments, jobs, openai, secrets, service, workers
from app.errors import install_error_handlers
from app.middleware import BodySizeLimit, PrometheusMetrics
from app.services.datasets import max_upload_body_bytes
from app.settings import get_settings, warn_if_default_secret_key


def create_app() -> FastAPI:
    settings = get_settings()
    warn_if_default_secret_key(settings)
    app = FastAPI(title="SpecDeck", version="0.1.0",
                  description="Train and serve DFlash speculative-decoding drafters.")
    install_error_handlers(app)
    for module in (service, jobs, workers, datasets, secrets, deployments, openai, checkpoints):
        app.include_router(module.router)
    # Added first, so innermost: the gateway's hot path still passes the body limit and metrics.
    app.add_middleware(openai.GatewayFastPath)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes,
                       overrides={"/api/datasets": max_upload_body_bytes(settings)})
    app.add_middleware(PrometheusMetrics)
    return app
