"""The FastAPI application factory."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from functools import cache
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html
from fastapi.responses import HTMLResponse
from fastapi_offline import FastAPIOffline
from starlette.routing import BaseRoute

from app.api import (checkpoints, datasets, deployments, jobs, keys, me, openai, secrets,
                     service, verifiers, webhooks, workers)
from app.dashboard import DashboardRoute
from app.errors import install_error_handlers
from app.middleware import BodySizeLimit, PrometheusMetrics
from app.services.datasets import max_upload_body_bytes
from app.settings import get_settings, warn_if_default_secret_key


DOCS_ASSETS = "/docs/assets"


def create_app() -> FastAPI:
    settings = get_settings()
    warn_if_default_secret_key(settings)
    # /docs and /redoc with Swagger UI's and ReDoc's files served from here, not a CDN (air-gapped
    # hosts), and no spec sent to Swagger's online validator.
    app = FastAPIOffline(title="SpecDeck", version="0.1.0",
                         description="Train and serve DFlash speculative-decoding drafters.",
                         static_url=DOCS_ASSETS, swagger_ui_parameters={"validatorUrl": None},
                         redoc_url=None, routes=[openai.CHAT_ROUTE, *api_routes()],
                         lifespan=openai.gateway_lifespan)
    app.get("/redoc", include_in_schema=False)(redoc)
    install_error_handlers(app)
    app.openapi = _no_null_parameters(app.openapi)  # type: ignore[method-assign]
    app.router.routes.append(DashboardRoute(settings.dashboard_dir))  # last: it matches the rest
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes,
                       overrides={"/api/datasets": max_upload_body_bytes(settings)})
    app.add_middleware(PrometheusMetrics)
    return app


def create_server() -> FastAPI:
    """What `specdeck api` serves: the app, the gateway's chat completions left out of uvicorn's
    access log unless SPECDECK_GATEWAY_ACCESS_LOG (a line per completion cost as much as half of
    what the gateway adds: docs/benchmarks.md, "The access log").

    What is alive once the app is made (modules, routes, schemas: some 150,000 objects, most of
    the heap) lives as long as the process, and is frozen: Python's full collections, which come
    every few thousand requests, no longer walk it. Each held the event loop about 70 ms
    (docs/benchmarks.md, "Why the gateway is built as it is")."""
    app = create_app()
    if not get_settings().gateway_access_log:
        logging.getLogger("uvicorn.access").addFilter(not_a_completion)
    gc.collect()  # the garbage of the imports goes first: nothing frozen is ever freed
    gc.freeze()
    return app


def not_a_completion(record: logging.LogRecord) -> bool:
    """uvicorn's access log record (its arguments: client, method, path, HTTP version, status)
    of anything but a chat completion."""
    args = record.args
    return not (isinstance(args, tuple) and len(args) >= 3 and args[1] == "POST"
                and args[2] == openai.CHAT_COMPLETIONS)


@cache
def api_routes() -> tuple[BaseRoute, ...]:
    """The resource modules' routes, as their routers built them when imported (prefix, tags,
    error responses and dependencies included), handed to each app as they are: FastAPI's
    ``include_router`` would build every route again, about 95 ms an app (its dependency and
    response models), which each API process and each test's app paid. The gateway router's
    lifespan becomes the app's (``create_app``)."""
    return tuple(route for module in (service, jobs, workers, datasets, secrets, deployments,
                                      openai, checkpoints, keys, me, verifiers, webhooks)
                 for route in module.router.routes)


async def redoc() -> HTMLResponse:
    """ReDoc from the local assets. Its footer's "API docs by Redocly" logo is an image on
    cdn.redoc.ly; the page's Content-Security-Policy keeps images on this host, so an air-gapped
    browser makes no request to another host (and waits on none)."""
    page = get_redoc_html(openapi_url="/openapi.json", title="SpecDeck - ReDoc",
                          redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
                          redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png", with_google_fonts=False)
    page.headers["Content-Security-Policy"] = "img-src 'self' data:"
    return page


def _no_null_parameters(openapi: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """FastAPI's document, less the ``null`` that an optional parameter's schema allows: a query
    parameter or header is left out, never sent as null (a client would send the text "null",
    which is refused)."""

    def document() -> dict[str, Any]:
        schema = openapi()
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for parameter in operation.get("parameters", ()):
                    branches = parameter["schema"].get("anyOf")
                    if branches and {"type": "null"} in branches:
                        rest = [b for b in branches if b != {"type": "null"}]
                        del parameter["schema"]["anyOf"]
                        if len(rest) == 1:
                            parameter["schema"].update(rest[0])
                        else:
                            parameter["schema"]["anyOf"] = rest
        return schema

    return document
