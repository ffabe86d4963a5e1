"""``specdeck jobs``: create (and wait for), list, get, cancel, wait for, and follow jobs."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import httpx

from app.client import exits
from app.client.commands import command, get_command, list_command
from app.client.commands.datasets import upload
from app.client.exits import CLIError
from app.client.http import RETRY_STATUSES, Api, backoff, describe_error
from app.client.jobfile import AUTO, idempotency_key, load_job_file
from app.client.output import emit_json, note, show, table
from app.client.wait import wait_job

LOG_WAIT_SECONDS = 20  # how long the API may hold `logs --follow`'s request (its timeout: 30 s)


def create(args: argparse.Namespace, api: Api) -> int:
    body = load_job_file(args.file)
    key = idempotency_key(args.idempotency_key, args.file, args.dataset_file)
    if args.dataset_file:
        dataset = upload(api, args.dataset_file, name=None)
        note(f"dataset {dataset['id']} ({dataset['num_conversations']} conversations) from "
             f"{args.dataset_file}")
        body["dataset"] = dataset["id"]
    # Safe to send again: a retry carries the same Idempotency-Key, so it answers the same job.
    response = api.request("POST", "/api/jobs", json=body, headers={"Idempotency-Key": key},
                           repeatable=True)
    job = created_job(response)
    if args.wait:
        return wait_job(api, job["id"], timeout=args.timeout, as_json=args.json)
    show(job, args.json, job["id"])
    return exits.SUCCEEDED


def created_job(response: httpx.Response) -> dict[str, Any]:
    """The job a create answered with, told on stderr: created, or a replay (200) of the one
    this Idempotency-Key made before."""
    job = response.json()
    if response.status_code == 200:
        note(f"{job['id']} already exists for this Idempotency-Key (a replay): {job['status']}")
    else:
        note(f"created {job['id']} ({job['status']})")
    return job


def cancel(args: argparse.Namespace, api: Api) -> int:
    job = api.json("POST", f"/api/jobs/{args.job_id}/cancel")
    show(job, args.json, f"{job['id']} {job['status']}")
    return exits.SUCCEEDED


def wait(args: argparse.Namespace, api: Api) -> int:
    return wait_job(api, args.job_id, timeout=args.timeout, as_json=args.json)


def _print_event(event: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(event), flush=True)
    else:
        print(f"{event['created_at'][:19].replace('T', ' ')}  {event['kind']:<10} "
              f"{event['message']}", flush=True)


def events(args: argparse.Namespace, api: Api) -> int:
    if args.follow:
        return follow_events(api, args.job_id, args.json)
    params = {"limit": args.limit} | ({"after": args.after} if args.after is not None else {})
    page = api.json("GET", f"/api/jobs/{args.job_id}/events", params=params)
    if args.json:
        emit_json(page)
    else:
        for event in page["data"]:
            _print_event(event, False)
        if page["has_more"]:
            note(f"more: --after {page['last_id']}")
    return exits.SUCCEEDED


def follow_events(api: Api, job_id: str, as_json: bool) -> int:
    """The job's events as the server sends them (SSE) until the job ends; a dropped stream is
    opened again from the last event seen (Last-Event-ID), with the client's retries."""
    last: str | None = None
    failures = 0
    while True:
        headers = {"Last-Event-ID": last} if last is not None else {}
        try:
            with api.http.stream("GET", f"/api/jobs/{job_id}/events/stream", headers=headers,
                                 timeout=httpx.Timeout(30.0, read=120.0)) as response:
                if not response.is_success:
                    response.read()
                    if response.status_code not in RETRY_STATUSES or failures >= api.retries:
                        raise CLIError(exits.exit_code_for_status(response.status_code),
                                       describe_error(response))
                    failures += 1
                    time.sleep(backoff(failures - 1, api.backoff,
                                       response.headers.get("retry-after")))
                    continue
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if line:
                        name, _, value = line.partition(":")
                        fields[name] = value.removeprefix(" ")
                        continue
                    if fields.get("event") == "end":
                        return exits.SUCCEEDED
                    if fields.get("event") == "job.event":
                        _print_event(json.loads(fields["data"]), as_json)
                        last = fields.get("id", last)
                        failures = 0
                    fields = {}
        except httpx.TransportError as exc:
            if failures >= api.retries:
                raise CLIError(exits.UNREACHABLE, f"cannot reach {api.url}: {exc}") from exc
            failures += 1
            note(f"the event stream broke ({type(exc).__name__}); reconnecting")
            time.sleep(backoff(failures - 1, api.backoff))


def logs(args: argparse.Namespace, api: Api) -> int:
    """The log's last lines; with --follow, the lines written after them until the job ends
    (the API answers each request once there are new lines, or after LOG_WAIT_SECONDS)."""
    path = f"/api/jobs/{args.job_id}/logs"
    response = api.request("GET", path, params={"tail": args.tail})
    print(response.text, end="", flush=True)
    while args.follow and response.headers.get("X-Log-Ended") != "true":
        response = api.request("GET", path, params={"after": response.headers["X-Log-Offset"],
                                                    "wait": LOG_WAIT_SECONDS})
        print(response.text, end="", flush=True)
    return exits.SUCCEEDED


def metrics(args: argparse.Namespace, api: Api) -> int:
    page = api.json("GET", f"/api/jobs/{args.job_id}/metrics",
                    params={"name": args.name} if args.name else None)
    if args.json:
        emit_json(page)
    else:
        print(table(page["data"], ("step", "epoch", "name", "value", "created_at")), flush=True)
    return exits.SUCCEEDED


def _timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="stop waiting after S seconds (exit 4); the job keeps going")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    jobs = sub.add_parser("jobs", help="training jobs (client)")
    jobs_sub = jobs.add_subparsers(dest="jobs_command", required=True)

    p = jobs_sub.add_parser("create", parents=[common], help="submit a job from a JSON or YAML "
                            "file; prints its id (or, with --wait, its summary)")
    p.add_argument("-f", "--file", type=Path, required=True, metavar="JOB_FILE",
                   help="the job's body (POST /api/jobs), .json or .yaml")
    p.add_argument("--dataset-file", type=Path, metavar="JSONL",
                   help="upload this dataset (the same content again is the same dataset) and "
                   "train on it: sets the job's 'dataset'")
    p.add_argument("--idempotency-key", metavar="KEY",
                   help=f"the Idempotency-Key: the same key and body answer the same job; "
                   f"'{AUTO}' derives it from the job and dataset files' content (default: a "
                   f"new one for this invocation, which its retries reuse)")
    p.add_argument("--wait", action="store_true",
                   help="follow the job until it ends; the exit code says how it ended")
    _timeout(p)
    command(p, create)

    p = jobs_sub.add_parser("list", parents=[common], help="the project's jobs, newest first")
    p.add_argument("--status", choices=("queued", "running", "succeeded", "failed",
                                        "cancelling", "cancelled"))
    p.add_argument("--name", help="jobs whose name holds this text, whatever the case")
    list_command(p, "/api/jobs", ("id", "name", "status", "stage", "error_code",
                                  "served_acceptance_length", "created_at"),
                 after="JOB_ID", filters=("status", "name"))
    get_command(jobs_sub.add_parser("get", parents=[common], help="a job, as JSON"),
                "/api/jobs/{job_id}", "job_id")
    p = jobs_sub.add_parser("cancel", parents=[common], help="cancel a job")
    p.add_argument("job_id")
    command(p, cancel)

    p = jobs_sub.add_parser("wait", parents=[common], help="follow a job until it ends (exit "
                            "0 succeeded, 1 failed, 3 cancelled, 4 timed out)")
    p.add_argument("job_id")
    _timeout(p)
    command(p, wait)

    p = jobs_sub.add_parser("events", parents=[common], help="a job's events")
    p.add_argument("job_id")
    p.add_argument("--follow", action="store_true", help="stream them until the job ends")
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--after", type=int, metavar="EVENT_ID")
    command(p, events)

    p = jobs_sub.add_parser("logs", parents=[common], help="the end of a job's log")
    p.add_argument("job_id")
    p.add_argument("--tail", type=int, default=200, metavar="N")
    p.add_argument("--follow", action="store_true", help="print new lines until the job ends")
    command(p, logs)

    p = jobs_sub.add_parser("metrics", parents=[common], help="a job's metrics")
    p.add_argument("job_id")
    p.add_argument("--name", help="only this metric, e.g. train/loss")
    command(p, metrics)
