"""The client's command groups, registered into the ``specdeck`` parser (app/cli.py): one
module per group, each with ``register(sub, common)`` adding its commands. A command is a
function ``(args, api) -> exit code``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from app.client import config, exits
from app.client.exits import CLIError
from app.client.http import Api

Handler = Callable[[argparse.Namespace, Api], int]


def command(parser: argparse.ArgumentParser, handler: Handler, *, needs_key: bool = True) -> None:
    parser.set_defaults(func=lambda args: run(args, handler, needs_key))


def run(args: argparse.Namespace, handler: Handler, needs_key: bool) -> int:
    settings = config.resolve(args, existing_profile=needs_key)
    if needs_key and not settings.api_key:
        raise CLIError(exits.USAGE, "no API key: set SPECDECK_API_KEY, run `specdeck login`, or "
                       "pass --api-key")
    api = Api(settings.url, settings.api_key, retries=settings.retries, backoff=settings.backoff)
    args.config = settings
    try:
        return handler(args, api)
    finally:
        api.close()


def register(sub: argparse._SubParsersAction) -> None:
    """Add every client command group to the ``specdeck`` subcommands."""
    from app.client.commands import (checkpoints, datasets, deployments, jobs, keys, login,
                                     secrets)

    common = argparse.ArgumentParser(add_help=False)
    config.add_arguments(common)
    for group in (login, jobs, datasets, checkpoints, deployments, keys, secrets):
        group.register(sub, common)
