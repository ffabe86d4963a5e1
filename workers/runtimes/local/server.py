"""What the local runtime's two servers (``engine`` and ``hidden_states_server``) share: their
common command-line options, logging and torch set-up, and running the app on uvicorn."""

from __future__ import annotations

import argparse
import logging

import torch
import uvicorn
from starlette.types import ASGIApp

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


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
