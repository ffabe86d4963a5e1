"""The ``specdeck`` command: serve the API, run a worker, check a worker host (doctor), migrate,
administer keys and secrets, write the OpenAPI document, or run it all; and the client commands
(app/client/) that talk to the API over HTTP."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from app.client.commands import register as register_client
from app.client.config import write_private
from app.client.exits import CLIError
from app.roles import ROLES

ROOT = Path(__file__).resolve().parent.parent

# The entry points docker-compose.yml, the Makefile and `specdeck run` share.
API_COMMAND = ["specdeck", "api"]
WORKER_COMMAND = ["specdeck", "worker"]
MIGRATE_COMMAND = ["specdeck", "db", "upgrade"]
DEMO_MODEL, DEMO_DATA = "demo", "demo.jsonl"
# The development key `specdeck run` keeps and prints on every start (relative to where it runs,
# like the embedded default's var/).
DEV_KEY_FILE = Path("var") / "dev-api-key"
# The job the README shows: the demo verifier on the CPU, sized for a laptop (dflash-facts.md §3).
DEMO_JOB = {"verifier": DEMO_MODEL, "dataset": "<demo dataset id>", "runtime": "local",
            "speculator": {"block_size": 8, "num_layers": 2, "max_anchors": 32, "total_seq_len": 512,
                           "epochs": 6, "lr": 0.003}}


def migrate(database_url: str | None = None) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["configure_logger"] = False
    if database_url:
        config.attributes["database_url"] = database_url
    command.upgrade(config, "head")


# What a server process creates (the embedded database and broker, the dev key, logs, work and
# checkpoints) is its owner's alone: directories 0700, files 0600. The database holds the key
# hashes and the encrypted HF token; the development key decrypts it.
PRIVATE_UMASK = 0o077


def _ensure_sqlite_dirs() -> None:
    """The server's directories, made private (``PRIVATE_UMASK``), and this process's files and
    its children's private from here on."""
    from app.settings import get_settings

    os.umask(PRIVATE_UMASK)
    settings = get_settings()
    for path in (settings.data_root, settings.models_root, settings.logs_root, settings.work_root):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for url in (settings.database_url, settings.broker_url):
        if "sqlite:///" in url:
            Path(url.split("sqlite:///", 1)[1]).parent.mkdir(mode=0o700, parents=True,
                                                             exist_ok=True)


def cmd_db(args: argparse.Namespace) -> None:
    _ensure_sqlite_dirs()
    migrate()
    print("database is at the latest migration")


def cmd_api(args: argparse.Namespace) -> None:
    import uvicorn

    _ensure_sqlite_dirs()
    # uvicorn's proxy headers trust FORWARDED_ALLOW_IPS (default 127.0.0.1), read by uvicorn.
    uvicorn.run("app.main:create_server", factory=True, host=args.host, port=args.port,
                log_level="info", access_log=not args.no_access_log, workers=args.workers,
                server_header=False, http="httptools", loop="uvloop")


def cmd_worker(args: argparse.Namespace) -> None:
    # Celery retitles its worker when setproctitle is installed (vLLM brings it): `ps`, process
    # managers and the tests would no longer see `specdeck worker` in its command line. Read
    # when celery.platforms is imported, so set before.
    os.environ.setdefault("NOSETPS", "1")
    os.umask(PRIVATE_UMASK)  # its checkpoints, logs and hidden states: the owner's alone
    from app.celery_app import celery_app
    from app.gpus import detect_gpus
    from app.settings import get_settings

    _ensure_sqlite_dirs()
    settings = get_settings()
    # One thread per job or deployment it can hold: a training or serving slot each, or at
    # least one GPU each.
    concurrency = (settings.worker_concurrency + settings.worker_serving_slots
                   + len(detect_gpus(settings.worker_gpus)))
    celery_app.worker_main([
        "worker", "--pool=threads", f"--concurrency={concurrency}",
        f"--queues={settings.worker_queue}", f"--hostname={settings.worker_name}",
        "--without-gossip", "--without-mingle", "--loglevel=INFO",
    ])


def cmd_doctor(args: argparse.Namespace) -> int:
    from app.doctor.runner import host_runtime, run
    from app.gpus import detect_gpus
    from app.settings import get_settings

    runtime = args.runtime or host_runtime(detect_gpus(get_settings().worker_gpus))
    return run(runtime, as_json=args.json, offline=args.offline)


def cmd_keys_create(args: argparse.Namespace) -> None:
    from app.db import session_scope
    from app.services.keys import create_key

    with session_scope() as session:
        new = create_key(session, args.project, args.name, args.role)
        plaintext = new.plaintext
    print(plaintext)


def cmd_secrets_rotate(args: argparse.Namespace) -> None:
    from app.db import session_scope
    from app.services.secrets import rotate
    from app.settings import get_settings

    with session_scope() as session:
        count = rotate(session, get_settings())
    print(f"re-encrypted {count} secret(s) under the current SPECDECK_SECRET_KEY")


def cmd_openapi(args: argparse.Namespace) -> None:
    """The app's OpenAPI document as JSON, built without a database (start-up warnings, if any,
    go to stderr through logging, never into the document)."""
    from app.main import create_app

    document = json.dumps(create_app().openapi(), indent=2, sort_keys=False) + "\n"
    if args.output:
        Path(args.output).write_text(document, encoding="utf-8")
    else:
        sys.stdout.write(document)


def cmd_demo_model(args: argparse.Namespace) -> None:
    from workers.runtimes.local.demo import create_demo_model

    print(create_demo_model(args.path))


def cmd_demo_data(args: argparse.Namespace) -> None:
    from workers.runtimes.local.demo import write_demo_data

    print(write_demo_data(args.model, args.output, num_conversations=args.conversations))


def register_demo(project_id: str) -> str:
    """The demo verifier and conversations, the latter uploaded as the project's dataset."""
    from app.db import session_scope
    from app.services.datasets import create_upload
    from app.settings import get_settings

    _, data = ensure_demo()
    with session_scope() as session, (get_settings().data_root / data).open("rb") as stream:
        dataset, _ = create_upload(session, project_id, stream, filename=data, name="demo",
                                   settings=get_settings())
        return dataset.id


def ensure_demo() -> tuple[str, str]:
    """The demo verifier and conversations under the models and data roots (made once)."""
    from app.settings import get_settings
    from workers.runtimes.local.demo import (
        MARKER_FILE,
        create_demo_model,
        demo_model_is_valid,
        write_demo_data,
    )

    settings = get_settings()
    model, data = settings.models_root / DEMO_MODEL, settings.data_root / DEMO_DATA
    if not demo_model_is_valid(model):
        print(f"training the demo verifier at {model} (once, about a minute) ...", flush=True)
    create_demo_model(model)  # idempotent: returns an existing valid model as is
    if not data.is_file() or data.stat().st_mtime < (model / MARKER_FILE).stat().st_mtime:
        print(f"writing the demo conversations to {data} (once) ...", flush=True)
        write_demo_data(model, data)
    return DEMO_MODEL, DEMO_DATA


def development_key(project: str) -> tuple[str, str]:
    """The key `specdeck run` prints, and its project's id: the one kept in DEV_KEY_FILE while
    it still opens that project in this database (not revoked, not another database's), else a
    new one, which replaces it there (mode 0600)."""
    from app.db import session_scope
    from app.services.keys import authenticate, create_key, get_project

    stored = DEV_KEY_FILE.read_text(encoding="utf-8").strip() if DEV_KEY_FILE.is_file() else ""
    with session_scope() as session:
        key = authenticate(session, stored) if stored else None
        if key is not None and get_project(session, key.project_id).name == project:
            return stored, key.project_id
        new = create_key(session, project, "make run")
        plaintext, project_id = new.plaintext, new.key.project_id
    write_private(DEV_KEY_FILE, plaintext + "\n")  # once the key is committed
    return plaintext, project_id


def cmd_run(args: argparse.Namespace) -> int:
    """Development: migrate, then run the API and a worker together (app/supervise.py) until
    Ctrl-C, SIGTERM or SIGHUP; a child that dies is restarted."""
    from app.runtimes.local import vllm_missing
    from app.supervise import Child, Supervisor

    _ensure_sqlite_dirs()
    migrate()
    key, project_id = development_key(args.project)
    dataset_id = None if args.no_demo else register_demo(project_id)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    exe = str(Path(sys.executable).parent / "specdeck")
    api = [exe, *API_COMMAND[1:], "--host", args.host, "--port", str(args.port)]
    children = [Child("api", api), Child("worker", [exe, *WORKER_COMMAND[1:]])]
    url = f"http://{args.host}:{args.port}"
    print(f"\nSpecDeck is running at {url}\n  API key (project '{args.project}'): {key}  "
          f"(kept in {DEV_KEY_FILE}, printed again on the next start)", flush=True)
    if dataset_id:
        body = json.dumps({**DEMO_JOB, "dataset": dataset_id})
        print(f"  demo dataset: {dataset_id}\n  train a drafter for the demo verifier:\n"
              f"    curl -s -X POST {url}/api/jobs -H 'Authorization: Bearer {key}' "
              f"-H 'Content-Type: application/json' -d '{body}'", flush=True)
    print("  Ctrl-C stops the API, the worker and everything they started (so do SIGTERM and "
          "SIGHUP).\n", flush=True)
    if missing := vllm_missing():
        print(f"  Note: {missing}.\n", flush=True)
    return 0 if Supervisor(children, env, stop_timeout=args.stop_timeout).run() else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeck", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    api = sub.add_parser("api", help="serve the control plane and gateway (uvicorn)")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", type=int, default=8000)
    api.add_argument("--workers", type=int, default=1)
    api.add_argument("--no-access-log", action="store_true")
    api.set_defaults(func=cmd_api)

    worker = sub.add_parser("worker", help="run a Celery worker that executes job pipelines")
    worker.set_defaults(func=cmd_worker)

    doctor = sub.add_parser("doctor", help="check this worker host against what a runtime needs "
                            "(versions, GPUs, flags, disk, services); exit 1 when something is "
                            "missing (docs/gpu.md)")
    doctor.add_argument("--runtime", choices=["local", "vllm"], default=None,
                        help="default: vllm when this host has GPUs (NVML, SPECDECK_WORKER_GPUS), "
                        "else local")
    doctor.add_argument("--json", action="store_true", help="the rows as JSON")
    doctor.add_argument("--offline", action="store_true",
                        help="skip the Hugging Face Hub's check (a worker's start-up runs this)")
    doctor.set_defaults(func=cmd_doctor)

    db = sub.add_parser("db", help="database migrations")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("upgrade", help="apply all migrations").set_defaults(func=cmd_db)

    admin = sub.add_parser("admin", help="server-side administration, against the database "
                           "(SPECDECK_DATABASE_URL), not the API")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    keys = admin_sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key in a project (made if need be) and "
                                 "print it (shown once): a project's first key")
    create.add_argument("--project", default="default")
    create.add_argument("--name", default="")
    create.add_argument("--role", choices=ROLES, default="admin",
                        help="what the key may do (default admin: a project's first key "
                        "manages the others)")
    create.set_defaults(func=cmd_keys_create)

    secrets = admin_sub.add_parser("secrets", help="project secrets")
    secrets_sub = secrets.add_subparsers(dest="secrets_command", required=True)
    secrets_sub.add_parser("rotate", help="re-encrypt every secret under SPECDECK_SECRET_KEY "
                           "(old keys in SPECDECK_SECRET_KEY_PREVIOUS)").set_defaults(func=cmd_secrets_rotate)

    openapi = sub.add_parser("openapi", help="write the API's OpenAPI document (JSON)")
    openapi.add_argument("-o", "--output", metavar="FILE", help="write it here, not to stdout")
    openapi.set_defaults(func=cmd_openapi)

    run = sub.add_parser("run", help="migrate, then run the API and a worker (development)")
    run.add_argument("--host", default="127.0.0.1")
    run.add_argument("--port", type=int, default=8000)
    run.add_argument("--project", default="default")
    run.add_argument("--no-demo", action="store_true", help="skip the demo verifier and data")
    run.add_argument("--stop-timeout", type=float, default=120, metavar="SECONDS",
                     help="on stop, how long the API and the worker get to finish (the worker "
                     "stops its jobs and hands them back) before they are killed (default 120)")
    run.set_defaults(func=cmd_run)

    demo_model = sub.add_parser("demo-model", help="create the tiny demo verifier (trained locally, about a minute)")
    demo_model.add_argument("path")
    demo_model.set_defaults(func=cmd_demo_model)

    demo_data = sub.add_parser("demo-data", help="write conversations whose answers are the "
                               "verifier's own greedy continuations")
    demo_data.add_argument("--model", required=True)
    demo_data.add_argument("--output", required=True)
    demo_data.add_argument("--conversations", type=int, default=240)
    demo_data.set_defaults(func=cmd_demo_data)

    register_client(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except CLIError as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        code = exc.code
    except KeyboardInterrupt:  # a client command stopped by Ctrl-C; what it started keeps going
        print("interrupted", file=sys.stderr, flush=True)
        code = 130
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
