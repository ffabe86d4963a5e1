"""``specdeck datasets``: upload, list, get and delete datasets."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from app.client import exits
from app.client.commands import command
from app.client.exits import CLIError
from app.client.http import Api
from app.client.output import emit_json, listing, note, show


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


def list_datasets(args: argparse.Namespace, api: Api) -> int:
    params = {"limit": args.limit} | ({"after": args.after} if args.after else {})
    listing(api.json("GET", "/api/datasets", params=params), args.json,
            ("id", "name", "kind", "format", "num_conversations", "num_bytes", "created_at"))
    return exits.SUCCEEDED


def get(args: argparse.Namespace, api: Api) -> int:
    emit_json(api.json("GET", f"/api/datasets/{args.dataset_id}"))
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

    p = datasets_sub.add_parser("list", parents=[common], help="the project's datasets")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--after", metavar="DATASET_ID")
    command(p, list_datasets)

    for name, handler, text in (("get", get, "a dataset, as JSON"),
                                ("delete", delete, "delete a dataset no job uses")):
        p = datasets_sub.add_parser(name, parents=[common], help=text)
        p.add_argument("dataset_id")
        command(p, handler)
