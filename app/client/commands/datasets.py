"""``specdeck datasets``: upload, list, get and delete datasets."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from app.client import exits
from app.client.commands import command, get_command, list_command
from app.client.exits import CLIError
from app.client.http import Api
from app.client.output import note, show


def upload(api: Api, path: Path, name: str | None) -> dict[str, Any]:
    """Upload a JSONL file; the same content again answers the dataset made before (so a retry
    is safe)."""
    if not path.is_file():
        raise CLIError(exits.USAGE, f"no such file: {path}")

    def files(stack: contextlib.ExitStack) -> dict[str, Any]:
        return {"file": (path.name, stack.enter_context(path.open("rb")), "application/jsonl")}

    return api.json("POST", "/api/datasets", files=files, repeatable=True,
                    data={"name": name} if name else None, timeout=None)


def upload_command(args: argparse.Namespace, api: Api) -> int:
    dataset = upload(api, args.file, args.name)
    note(f"{dataset['id']}: {dataset['num_conversations']} conversations, "
         f"{dataset['num_bytes']} bytes")
    show(dataset, args.json, dataset["id"])
    return exits.SUCCEEDED


def delete(args: argparse.Namespace, api: Api) -> int:
    api.request("DELETE", f"/api/datasets/{args.dataset_id}")
    note(f"deleted {args.dataset_id}")
    return exits.SUCCEEDED


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    datasets = sub.add_parser("datasets", help="datasets (client)")
    datasets_sub = datasets.add_subparsers(dest="datasets_command", required=True)

    p = datasets_sub.add_parser("upload", parents=[common], help="upload a JSONL file; prints "
                                "the dataset's id (the same content again: the same dataset)")
    p.add_argument("file", type=Path)
    p.add_argument("--name")
    command(p, upload_command)

    list_command(datasets_sub.add_parser("list", parents=[common], help="the project's datasets"),
                 "/api/datasets", ("id", "name", "kind", "format", "num_conversations",
                                   "num_bytes", "created_at"), after="DATASET_ID")
    get_command(datasets_sub.add_parser("get", parents=[common], help="a dataset, as JSON"),
                "/api/datasets/{dataset_id}", "dataset_id")
    p = datasets_sub.add_parser("delete", parents=[common], help="delete a dataset no job uses")
    p.add_argument("dataset_id")
    command(p, delete)
