"""``specdeck secrets``: write-only project secrets. A value is read from stdin or a hidden
prompt, never from the command line (where other users' ``ps`` could read it)."""

from __future__ import annotations

import argparse
import getpass
import sys

from app.client import exits
from app.client.commands import command
from app.client.exits import CLIError
from app.client.http import Api
from app.client.output import listing, note, show


def read_secret(prompt: str) -> str:
    """One value from a hidden prompt on a terminal, else all of stdin (one trailing newline
    dropped, as `echo` and here-strings add one)."""
    value = getpass.getpass(prompt) if sys.stdin.isatty() else sys.stdin.read()
    value = value.removesuffix("\n").removesuffix("\r")
    if not value:
        raise CLIError(exits.USAGE, "no value: give it on stdin or at the prompt")
    return value


def set_secret(args: argparse.Namespace, api: Api) -> int:
    value = read_secret(f"value of {args.name}: ")
    secret = api.json("PUT", f"/api/secrets/{args.name}", json={"value": value})
    show(secret, args.json, f"{secret['name']} set at {secret['updated_at']}")
    return exits.SUCCEEDED


def list_secrets(args: argparse.Namespace, api: Api) -> int:
    listing(api.json("GET", "/api/secrets"), args.json, ("name", "created_at", "updated_at"))
    return exits.SUCCEEDED


def delete(args: argparse.Namespace, api: Api) -> int:
    api.request("DELETE", f"/api/secrets/{args.name}")
    note(f"deleted {args.name}")
    return exits.SUCCEEDED


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    secrets = sub.add_parser("secrets", help="project secrets (client; values are write-only)")
    secrets_sub = secrets.add_subparsers(dest="secrets_command", required=True)

    p = secrets_sub.add_parser("set", parents=[common], help="set a secret; its value from "
                               "stdin or a hidden prompt, never an argument")
    p.add_argument("name", help="e.g. HF_TOKEN")
    command(p, set_secret)

    p = secrets_sub.add_parser("list", parents=[common], help="the secrets' names (no values)")
    command(p, list_secrets)

    p = secrets_sub.add_parser("delete", parents=[common], help="delete a secret")
    p.add_argument("name")
    command(p, delete)
