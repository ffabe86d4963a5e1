"""``specdeck keys``: the project's API keys, through the API (``specdeck admin keys create``
makes a project's first key, against the database)."""

from __future__ import annotations

import argparse

from app.client import exits
from app.client.commands import command, list_command
from app.client.http import Api
from app.client.output import note, show
from app.roles import ROLES


def create(args: argparse.Namespace, api: Api) -> int:
    body = {"name": args.name, **({"role": args.role} if args.role else {})}
    created = api.json("POST", "/api/keys", json=body)
    note(f"created {created['id']}; the key is shown once, store it now")
    show(created, args.json, created["key"])
    return exits.SUCCEEDED


def revoke(args: argparse.Namespace, api: Api) -> int:
    key = api.json("DELETE", f"/api/keys/{args.key_id}")
    show(key, args.json, f"{key['id']} revoked at {key['revoked_at']}")
    return exits.SUCCEEDED


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    keys = sub.add_parser("keys", help="the project's API keys (client)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)

    p = keys_sub.add_parser("create", parents=[common], help="create a key in the caller's "
                            "project and print it (shown once)")
    p.add_argument("--name", default="", help="a label, to tell keys apart")
    p.add_argument("--role", choices=ROLES, help="admin (everything), member (train, deploy, "
                   "chat; not keys, secrets or webhooks) or inference (/v1 alone); default: the "
                   "role of the key you use, and never more")
    command(p, create)

    list_command(keys_sub.add_parser("list", parents=[common], help="the project's keys "
                                     "(prefixes only)"),
                 "/api/keys", ("id", "name", "role", "prefix", "created_at", "last_used_at",
                               "revoked_at"), after="KEY_ID")

    p = keys_sub.add_parser("revoke", parents=[common], help="revoke a key: /api refuses it "
                            "from then on")
    p.add_argument("key_id")
    command(p, revoke)
