"""``specdeck checkpoints``: get a checkpoint, publish it to the Hugging Face Hub."""

from __future__ import annotations

import argparse

from app.client import exits
from app.client.commands import command, get_command
from app.client.http import Api
from app.client.output import note, show


def publish(args: argparse.Namespace, api: Api) -> int:
    checkpoint = api.json("POST", f"/api/checkpoints/{args.checkpoint_id}/publish",
                          json={"repo_id": args.repo, "private": not args.public})
    note(f"publishing {checkpoint['id']} to {args.repo}: the worker uploads it; "
         f"`specdeck checkpoints get {checkpoint['id']}` shows publish_status and hub_url")
    show(checkpoint, args.json, f"{checkpoint['id']} {checkpoint['publish_status']}")
    return exits.SUCCEEDED


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    checkpoints = sub.add_parser("checkpoints", help="checkpoints (client)")
    checkpoints_sub = checkpoints.add_subparsers(dest="checkpoints_command", required=True)

    get_command(checkpoints_sub.add_parser("get", parents=[common], help="a checkpoint, as JSON"),
                "/api/checkpoints/{checkpoint_id}", "checkpoint_id")

    p = checkpoints_sub.add_parser("publish", parents=[common],
                                   help="publish a checkpoint to the Hugging Face Hub")
    p.add_argument("checkpoint_id")
    p.add_argument("--repo", required=True, metavar="ORG/NAME", help="the Hub repo id")
    p.add_argument("--public", action="store_true", help="a public repo (default: private)")
    command(p, publish)
