"""The client's command groups, registered into the ``specdeck`` parser (app/cli.py): one
module per group, each with ``register(sub, common)`` adding its commands. A command is a
function ``(args, api) -> exit code``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from app.client import config, exits
from app.client.exits import CLIError
from app.client.http import Api
from app.client.output import emit_json, listing

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


def list_command(parser: argparse.ArgumentParser, path: str, columns: Sequence[str],
                 after: str, filters: Sequence[str] = ()) -> None:
    """A page of a list (``--limit``, ``--after``, and the query ``filters`` its parser has):
    a table, or the page as JSON."""
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--after", metavar=after, help="the page after this one")

    def handler(args: argparse.Namespace, api: Api) -> int:
        params: dict[str, Any] = {"limit": args.limit}
        params |= {name: getattr(args, name) for name in ("after", *filters)
                   if getattr(args, name) is not None}
        listing(api.json("GET", path, params=params), args.json, columns)
        return exits.SUCCEEDED

    command(parser, handler)


def get_command(parser: argparse.ArgumentParser, path: str, ident: str) -> None:
    """One object, as JSON: ``path`` with ``{ident}`` filled in from the argument."""
    parser.add_argument(ident)

    def handler(args: argparse.Namespace, api: Api) -> int:
        emit_json(api.json("GET", path.format(**{ident: getattr(args, ident)})))
        return exits.SUCCEEDED

    command(parser, handler)


def register(sub: argparse._SubParsersAction) -> None:
    """Add every client command group to the ``specdeck`` subcommands."""
    from app.client.commands import (checkpoints, datasets, deployments, jobs, keys, login,
                                     secrets)

    common = argparse.ArgumentParser(add_help=False)
    config.add_arguments(common)
    for group in (login, jobs, datasets, checkpoints, deployments, keys, secrets):
        group.register(sub, common)
