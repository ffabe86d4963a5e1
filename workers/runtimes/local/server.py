"""The local serving engine's (``engine``) server plumbing: vLLM's
error shape for client errors, their common command-line options, logging and torch set-up, the
one thread that runs all their torch work, and running the app on uvicorn."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


T = TypeVar("T")


class ComputeThread:
    """Runs every torch call of a server on one dedicated thread, off the event loop.

    torch's CPU ops run on an OpenMP team that belongs to the calling thread. Work spread over
    several threads (the event loop for a prefill, any of a thread pool's threads for the steps)
    makes several teams that spin against each other: on 2 cores, decoding with 2 torch threads
    ran 3-5x slower on another thread than the one that loaded the model (DFlash 452 vs 1550
    tokens/s, plain 116 vs 570, measured on the demo verifier). So the model is loaded on this
    thread too (``call``), and every request's work runs there (``run``)."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch")

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` on the compute thread, waited for (start-up: loading the model)."""
        return self._executor.submit(fn, *args, **kwargs).result()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))


def model_list(served_model_name: str, created: int, root: str, max_model_len: int
               ) -> dict[str, Any]:
    """vLLM's ``GET /v1/models`` body: the one served model."""
    return {"object": "list", "data": [{
        "id": served_model_name, "object": "model", "created": created,
        "owned_by": "specdeck-local", "root": root, "parent": None,
        "max_model_len": max_model_len}]}


_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}


class RequestError(ValueError):
    """A client error, answered with HTTP 400 (or ``status``) in vLLM's error shape."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code": status}}``."""
    body = {"error": {"message": message, "type": _ERROR_TYPES.get(status, "Error"),
                      "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    """``RequestError`` and malformed bodies answered as vLLM does (400, not FastAPI's 422)."""

    @app.exception_handler(RequestError)
    async def request_error(_request: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if not errors:
            return error_response(400, "invalid request body")
        loc = [str(p) for p in errors[0].get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        return error_response(
            400, f"invalid request: {where}: {errors[0].get('msg')}", loc[0] if loc else None
        )


def add_server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto")
    parser.add_argument(
        "--num-threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])


def set_up(args: argparse.Namespace) -> torch.dtype | None:
    """Logging and torch threads as the options say; the dtype asked for (None: the model's)."""
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    return None if args.dtype == "auto" else DTYPES[args.dtype]


def serve(app: ASGIApp, args: argparse.Namespace) -> None:
    uvicorn.run(app, host=args.host, port=args.port, access_log=False, log_level=args.log_level)
