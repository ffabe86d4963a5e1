"""``specdeck deployments``: create, list, get, scale, delete and wait for deployments; promote
and roll back their drafters, and retrain them."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.client import exits
from app.client.commands import command, get_command, list_command
from app.client.commands.jobs import created_job
from app.client.http import Api
from app.client.jobfile import fresh_key, load_job_file
from app.client.output import listing, note, show
from app.client.wait import wait_deployment, wait_promotion, wait_retrain


def create(args: argparse.Namespace, api: Api) -> int:
    body = {"name": args.name, "checkpoint_id": args.checkpoint, "drafter": args.drafter,
            "verifier": args.verifier, "num_speculative_tokens": args.num_speculative_tokens,
            "runtime": args.runtime, "replicas": args.replicas}
    deployment = api.json("POST", "/api/deployments",
                          json={k: v for k, v in body.items() if v is not None})
    note(f"created {deployment['id']} ({deployment['status']})")
    if args.wait:
        return wait_deployment(api, deployment["id"], timeout=args.timeout, as_json=args.json)
    show(deployment, args.json, deployment["id"])
    return exits.SUCCEEDED


def scale(args: argparse.Namespace, api: Api) -> int:
    deployment = api.json("PATCH", f"/api/deployments/{args.deployment_id}",
                          json={"replicas": args.replicas})
    count = deployment["replicas"]
    states = ", ".join(f"{r['replica']} {r['status']}" for r in deployment["replica_states"])
    show(deployment, args.json,
         f"{deployment['id']} {count} replica{'' if count == 1 else 's'} ({states})")
    return exits.SUCCEEDED


def delete(args: argparse.Namespace, api: Api) -> int:
    deployment = api.json("DELETE", f"/api/deployments/{args.deployment_id}")
    show(deployment, args.json, f"{deployment['id']} {deployment['status']}")
    return exits.SUCCEEDED


def wait(args: argparse.Namespace, api: Api) -> int:
    return wait_deployment(api, args.deployment_id, timeout=args.timeout, as_json=args.json)


def promote(args: argparse.Namespace, api: Api) -> int:
    return _switch(args, api, api.json("POST", f"/api/deployments/{args.deployment_id}/promote",
                                       json={"checkpoint_id": args.checkpoint}))


def rollback(args: argparse.Namespace, api: Api) -> int:
    return _switch(args, api, api.json("POST", f"/api/deployments/{args.deployment_id}/rollback"))


def _switch(args: argparse.Namespace, api: Api, promotion: dict) -> int:
    note(f"{promotion['kind']} {promotion['id']} {promotion['status']}: to "
         f"{promotion['target']['drafter']}")
    if args.wait:
        return wait_promotion(api, promotion, timeout=args.timeout, as_json=args.json)
    show(promotion, args.json, promotion["id"])
    return exits.SUCCEEDED


def retrain(args: argparse.Namespace, api: Api) -> int:
    body = load_job_file(args.file, "retrain") if args.file else {}
    if args.dataset:
        body["dataset"] = args.dataset
    if args.deploy:
        body["deploy"] = True
    # Safe to send again: a retry carries the same Idempotency-Key, so it answers the same job.
    job = created_job(api.request("POST", f"/api/deployments/{args.deployment_id}/retrain",
                                  json=body, repeatable=True,
                                  headers={"Idempotency-Key": args.idempotency_key or fresh_key()}))
    if args.wait:
        return wait_retrain(api, job, timeout=args.timeout, as_json=args.json)
    show(job, args.json, job["id"])
    return exits.SUCCEEDED


def promotions(args: argparse.Namespace, api: Api) -> int:
    page = api.json("GET", f"/api/deployments/{args.deployment_id}/promotions",
                    params={"limit": args.limit} | ({"after": args.after} if args.after else {}))
    for promotion in page["data"]:
        promotion["drafter"] = promotion["target"]["drafter"]
    listing(page, args.json, ("id", "kind", "status", "drafter", "created_at", "finished_at",
                              "status_reason"))
    return exits.SUCCEEDED


def _wait_options(parser: argparse.ArgumentParser, flag: bool,
                  until: str = "it is ready (exit 0) or fails (exit 1)") -> None:
    if flag:
        parser.add_argument("--wait", action="store_true", help=f"wait until {until}")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="stop waiting after S seconds (exit 4)")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    deployments = sub.add_parser("deployments", help="deployments behind the gateway (client)")
    deployments_sub = deployments.add_subparsers(dest="deployments_command", required=True)

    p = deployments_sub.add_parser("create", parents=[common], help="serve a checkpoint, or a "
                                   "drafter with its verifier; prints the deployment's id")
    p.add_argument("--name", required=True, help="the model name clients ask the gateway for")
    p.add_argument("--checkpoint", metavar="CHECKPOINT_ID")
    p.add_argument("--drafter", help="a Hub id or a path under the models root (with --verifier)")
    p.add_argument("--verifier")
    p.add_argument("--num-speculative-tokens", type=int, metavar="N")
    p.add_argument("--runtime", choices=("vllm", "local"))
    p.add_argument("--replicas", type=int, metavar="N", help="engines serving it, each on a "
                   "worker slot of its own (default 1)")
    _wait_options(p, flag=True)
    command(p, create)

    list_command(deployments_sub.add_parser("list", parents=[common],
                                            help="the project's deployments"),
                 "/api/deployments", ("id", "name", "status", "replicas", "drafter", "verifier",
                                      "restarts", "created_at"), after="DEPLOYMENT_ID")
    get_command(deployments_sub.add_parser("get", parents=[common], help="a deployment, as JSON"),
                "/api/deployments/{deployment_id}", "deployment_id")
    p = deployments_sub.add_parser("scale", parents=[common], help="set a deployment's number "
                                   "of replicas (new ones start, extra ones drain and stop)")
    p.add_argument("deployment_id")
    p.add_argument("replicas", type=int)
    command(p, scale)
    p = deployments_sub.add_parser("delete", parents=[common], help="stop a deployment")
    p.add_argument("deployment_id")
    command(p, delete)

    p = deployments_sub.add_parser("wait", parents=[common], help="wait until a deployment is "
                                   "ready (0) or fails (1); 4 on --timeout")
    p.add_argument("deployment_id")
    _wait_options(p, flag=False)
    command(p, wait)

    switched = "every replica switched (exit 0) or the switch failed (exit 1: the previous " \
        "drafter serves on)"
    p = deployments_sub.add_parser("promote", parents=[common], help="switch a deployment to "
                                   "another checkpoint without downtime; prints the promotion's id")
    p.add_argument("deployment_id")
    p.add_argument("--checkpoint", required=True, metavar="CHECKPOINT_ID")
    _wait_options(p, flag=True, until=switched)
    command(p, promote)
    p = deployments_sub.add_parser("rollback", parents=[common], help="switch back to the "
                                   "drafter served before the current one, the same way")
    p.add_argument("deployment_id")
    _wait_options(p, flag=True, until=switched)
    command(p, rollback)
    p = deployments_sub.add_parser("retrain", parents=[common], help="train the deployment's "
                                   "drafter further on its captured traffic (or --dataset), "
                                   "warm-started from what it serves; prints the job's id")
    p.add_argument("deployment_id")
    p.add_argument("-f", "--file", type=Path, metavar="RETRAIN_FILE", help="the request's body "
                   "(POST /api/deployments/{id}/retrain: dataset, speculator, data, evaluate, "
                   "gate, deploy), .json or .yaml")
    p.add_argument("--dataset", metavar="DATASET_ID", help="retrain on this dataset instead of "
                   "the captured traffic")
    p.add_argument("--deploy", action="store_true", help="switch the deployment to the result "
                   "once it passes its gate")
    p.add_argument("--idempotency-key", metavar="KEY", help="the same key and request answer "
                   "the same job, e.g. \"$GITHUB_RUN_ID-$GITHUB_RUN_ATTEMPT\" (default: a new "
                   "one for this invocation, which its retries reuse)")
    _wait_options(p, flag=True, until="the job ends and, with --deploy, the switch to its "
                  "result too: 0 once it serves, 1 if either failed (the job's error, or the "
                  "switch's: the previous drafter serves on)")
    command(p, retrain)
    p = deployments_sub.add_parser("promotions", parents=[common], help="a deployment's "
                                   "promotions and rollbacks, newest first")
    p.add_argument("deployment_id")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--after", metavar="PROMOTION_ID", help="the page after this one")
    command(p, promotions)
