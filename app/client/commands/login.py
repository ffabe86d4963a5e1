"""``specdeck login``: check a key against the API and keep it in a profile (mode 0600)."""

from __future__ import annotations

import argparse

from app.client import exits
from app.client.commands import command
from app.client.commands.secrets import read_secret
from app.client.config import config_path, write_profile
from app.client.http import Api
from app.client.output import note


def login(args: argparse.Namespace, api: Api) -> int:
    key = read_secret(f"API key for {api.url}: ")
    checked = Api(api.url, key, retries=api.retries, backoff=api.backoff)
    try:
        identity = checked.json("GET", "/api/me")
    finally:
        checked.close()
    path = config_path()
    write_profile(path, args.config.profile, api.url, key)
    note(f"signed in to project '{identity['project']['name']}' with key "
         f"{identity['key']['prefix']}...; profile '{args.config.profile}' saved in {path}")
    return exits.SUCCEEDED


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("login", parents=[common], help="check an API key (from stdin or a "
                       "hidden prompt) and save it with the URL in a profile")
    command(p, login, needs_key=False)
