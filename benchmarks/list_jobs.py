"""List latency: ``GET /api/jobs?limit=20`` with 100k jobs in one project, on Postgres.

A fresh Postgres database migrated by Alembic (``specdeck db upgrade``); 100k jobs for the
measured project plus 20k for another one, interleaved in time, bulk-inserted with one
``INSERT ... SELECT generate_series`` per project (ids in ``app.db.models.new_id("job")``'s
format, mixed statuses, the spec ``app.services.jobs.resolve_spec`` writes); then ANALYZE.

Three requests against a ``specdeck api`` subprocess over real HTTP: the first page, a page
deep in the cursor (``after=`` an id in the middle), and the status filter (``status=failed``).
Side by side in the same run, in this process on the same database: the service call alone
(``app.services.jobs.list_jobs``: the SELECT through SQLAlchemy, session included) and the
service call plus serialization (``job_outs``, which reads the page's training progress in one
query, and the ``Page`` JSON). All nine calls run once per round, in random order. The ratios
show what HTTP, auth and the framework add. EXPLAIN (ANALYZE) of the service's own SQL confirms
the index used.

    .venv/bin/python benchmarks/list_jobs.py [--quick] [--jobs N] [--requests N]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _stack import (  # noqa: E402
    REDIS_URL,
    Processes,
    Summary,
    base_env,
    clean_redis_queue,
    create_key,
    exit_on_sigterm,
    load,
    machine,
    ms,
    postgres_database,
    ratio,
    roots,
    specdeck,
    table,
    write_dataset,
    write_verifier,
)

TARGET_P95 = 0.030  # seconds, API over HTTP
PAGE = 20
WARMUP = 20
OTHER_PROJECT_JOBS = 20_000
SPAN_DAYS = 180  # the jobs' created_at (and so their ids) spread over this many days

# One statement per project. Ids: "job_" + 12 hex digits of ms since the epoch + 12 hex random,
# like app.db.models.new_id("job"). The newest 20 are queued, the 20 before them running; the
# rest succeeded (70 %), failed (20 %) or cancelled (10 %).
INSERT_JOBS = """
INSERT INTO jobs (id, project_id, status, stage, status_reason, error_code, spec, attempt,
                  idempotency_key, request_hash, lock_owner, lock_token, lock_expires_at, pgids,
                  pgid_host, kicked_at, created_at, updated_at, started_at, finished_at)
SELECT 'job_' || lpad(to_hex(g.ms), 12, '0') || substr(md5(random()::text), 1, 12),
       :project_id, s.status,
       CASE WHEN s.status = 'running' THEN 'training' END,
       CASE s.status WHEN 'failed' THEN 'training exited with code 1'
                     WHEN 'cancelled' THEN 'cancelled by user' END,
       CASE WHEN s.status = 'failed' THEN 'process_failed' END,
       jsonb_set(CAST(:spec AS jsonb), '{metadata}',
                 jsonb_build_object('experiment', 'exp-' || (g.i % 97), 'run', g.i::text))::json,
       CASE WHEN s.status = 'queued' THEN 0 ELSE 1 END,
       CASE WHEN g.i % 10 = 0 THEN 'idem-' || md5(random()::text) END,
       md5(random()::text) || md5(random()::text),
       CASE WHEN s.status = 'running' THEN 'worker@bench' END,
       CASE WHEN s.status = 'running' THEN md5(random()::text) END,
       CASE WHEN s.status = 'running' THEN now() + interval '30 seconds' END,
       CASE WHEN s.status = 'running' THEN '[4242]'::json END,
       CASE WHEN s.status = 'running' THEN 'bench-host' END,
       t.created, t.created, t.created,
       CASE WHEN s.status <> 'queued' THEN t.created + interval '2 seconds' END,
       CASE WHEN s.status IN ('succeeded', 'failed', 'cancelled')
            THEN t.created + interval '2 seconds' + g.r * interval '6 hours' END
FROM (SELECT i, random() AS r,
             CAST(:base_ms AS bigint) + CAST(i AS bigint) * CAST(:step AS bigint)
                 + CAST(floor(random() * :step) AS bigint) AS ms
      FROM generate_series(0, :n - 1) AS i) AS g
CROSS JOIN LATERAL (SELECT to_timestamp(g.ms / 1000.0) AS created) AS t
CROSS JOIN LATERAL (SELECT CASE WHEN g.i >= :n - 20 THEN 'queued'
                                WHEN g.i >= :n - 40 THEN 'running'
                                WHEN g.r < 0.70 THEN 'succeeded'
                                WHEN g.r < 0.90 THEN 'failed'
                                ELSE 'cancelled' END AS status) AS s
"""


def realistic_spec(base: Path) -> dict[str, Any]:
    """What POST /api/jobs stores, made by the service's own resolve_spec."""
    from app.schemas.jobs import JobCreate
    from app.services.jobs import resolve_spec
    from app.settings import Settings

    settings = Settings(models_root=base / "models", data_root=base / "data",
                        database_url="sqlite://", broker_url="memory://")
    body = JobCreate(verifier=write_verifier(base / "models"), dataset=write_dataset(base / "data"),
                     runtime="local")
    # A dataset named by its path and no warm start or deploy: nothing is read from a database.
    return resolve_spec(None, "proj_bench", body, settings, {}).dump()  # type: ignore[arg-type]


def seed(engine, main_project: str, other_project: str, jobs: int, spec: dict) -> None:  # noqa: ANN001
    import sqlalchemy as sa

    now_ms = int(time.time() * 1000)
    span_ms = SPAN_DAYS * 86_400_000
    with engine.begin() as conn:
        for project_id, n in ((main_project, jobs), (other_project, OTHER_PROJECT_JOBS)):
            conn.execute(sa.text(INSERT_JOBS), {
                "project_id": project_id, "spec": json.dumps(spec), "n": n,
                "base_ms": now_ms - span_ms, "step": span_ms // n})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE"))


def round_robin(fns: dict[Any, Callable[[], Any]], n: int) -> dict[Any, list[float]]:
    """Every call once per round, in a fresh random order each round: drift (other load, the
    API still finishing its previous request on the same two cores) hits them all alike."""
    rng = random.Random(1234)
    for _ in range(WARMUP):
        for fn in fns.values():
            fn()
    out: dict[Any, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for _ in range(n):
        rng.shuffle(order)
        for name in order:
            t0 = time.perf_counter()
            fns[name]()
            out[name].append(time.perf_counter() - t0)
    return out


def run(jobs: int, requests: int) -> tuple[dict[str, dict[str, Summary]], dict[str, list[str]], dict]:
    import httpx
    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    from app.db import make_engine
    from app.schemas.common import Page
    from app.services import jobs as service
    from app.services.state import JobStatus

    info: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-list-") as tmp, \
            contextlib.ExitStack() as stack:
        base = Path(tmp)
        queue = f"specdeck-bench-{uuid.uuid4().hex[:8]}"
        db_url = stack.enter_context(postgres_database("specdeck_bench_list"))
        stack.callback(clean_redis_queue, queue)
        env = base_env(SPECDECK_DATABASE_URL=db_url, SPECDECK_BROKER_URL=REDIS_URL,
                       SPECDECK_QUEUE=queue, SPECDECK_DEFAULT_RUNTIME="local", **roots(base))
        specdeck(env, "db", "upgrade")
        key = create_key(env, "bench")
        create_key(env, "bench-other")

        engine = make_engine(db_url)  # the API's own engine options
        stack.callback(engine.dispose)
        with engine.connect() as conn:
            projects = dict(conn.execute(sa.text("SELECT name, id FROM projects")).all())
        main_project, other_project = projects["bench"], projects["bench-other"]

        t0 = time.monotonic()
        seed(engine, main_project, other_project, jobs, realistic_spec(base))
        info["seed_s"] = time.monotonic() - t0
        with engine.connect() as conn:
            info["rows"] = dict(conn.execute(sa.text(
                "SELECT p.name, count(*) FROM jobs j JOIN projects p ON p.id = j.project_id "
                "GROUP BY p.name")).all())
            info["failed"] = conn.execute(sa.text(
                "SELECT count(*) FROM jobs WHERE project_id = :p AND status = 'failed'"),
                {"p": main_project}).scalar()
            info["table_size"] = conn.execute(sa.text(
                "SELECT pg_size_pretty(pg_total_relation_size('jobs'))")).scalar()
            ids = conn.execute(sa.text(
                "SELECT id FROM jobs WHERE project_id = :p ORDER BY id DESC OFFSET :o LIMIT 10"),
                {"p": main_project, "o": jobs // 2 - 5}).scalars().all()

        cursors = itertools.cycle(ids)  # ten different ids around the middle
        scenarios: dict[str, Callable[[], dict[str, Any]]] = {
            "first page": lambda: {"limit": PAGE},
            "deep cursor (after=middle)": lambda: {"limit": PAGE, "after": next(cursors)},
            "status=failed": lambda: {"limit": PAGE, "status": "failed"},
        }

        service_sessions = sessionmaker(engine, expire_on_commit=False)  # as app.db does

        def list_page(session: Any, params: dict[str, Any]) -> tuple[list, bool]:
            status = JobStatus(params["status"]) if "status" in params else None
            return service.list_jobs(session, main_project, limit=params["limit"],
                                     after=params.get("after"), status=status)

        def service_call(params: dict[str, Any]) -> tuple[list, bool]:
            with service_sessions() as session:
                return list_page(session, params)

        def service_and_json(params: dict[str, Any]) -> bytes:
            with service_sessions() as session:
                rows, has_more = list_page(session, params)
                page = Page(data=service.job_outs(session, rows), has_more=has_more,
                            last_id=rows[-1].id if rows else None)
            return page.model_dump_json().encode()

        # Same answers both ways, and EXPLAIN (ANALYZE) of the very SQL the service sends.
        plans: dict[str, list[str]] = {}
        captured: list[tuple[str, Any]] = []

        def capture(_conn, _cursor, statement, parameters, _context, _many):  # noqa: ANN001
            if statement.lstrip().upper().startswith("SELECT") and "FROM jobs" in statement:
                captured.append((statement, parameters))

        procs = stack.enter_context(Processes(base))
        api_url = procs.api("api", env)
        client = stack.enter_context(httpx.Client(
            base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=30))
        for name, params in scenarios.items():
            p = params()
            response = client.get("/api/jobs", params=p)
            response.raise_for_status()
            api_ids = [j["id"] for j in response.json()["data"]]
            sa.event.listen(engine, "before_cursor_execute", capture)
            try:
                rows, _ = service_call(p)
            finally:
                sa.event.remove(engine, "before_cursor_execute", capture)
            if api_ids != [r.id for r in rows] or len(api_ids) != PAGE:
                raise RuntimeError(f"{name}: the API and the service disagree ({len(api_ids)} rows)")
            statement, parameters = captured.pop()
            with engine.connect() as conn:
                plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement,
                                            parameters).scalars().all()
            plans[name] = plan

        def api_get(params: dict[str, Any]) -> None:
            response = client.get("/api/jobs", params=params)
            if response.status_code != 200:
                raise RuntimeError(f"GET /api/jobs answered {response.status_code}: {response.text}")
            response.content  # noqa: B018 (read the body)

        layers = {
            "service (SQLAlchemy)": service_call,
            "service + JSON": service_and_json,
            "API over HTTP": api_get,
        }
        timings = round_robin({(layer, name): (lambda c=call, p=params: c(p()))
                               for layer, call in layers.items()
                               for name, params in scenarios.items()}, requests)
        results = {layer: {name: Summary.of(timings[layer, name]) for name in scenarios}
                   for layer in layers}
        return results, plans, info


def report(results: dict[str, dict[str, Summary]], plans: dict[str, list[str]], info: dict,
           jobs: int, command: str, load_before: float) -> None:
    print(f"\n## List latency ({jobs:,} jobs in the project, Postgres)\n")
    print(f"machine: {machine()}\ncommand: `{command}`\n"
          f"1-minute load average: {load_before:.2f} before, {load():.2f} after")
    print(f"data: {info['rows']} rows per project, {info['failed']:,} failed in the measured "
          f"project, jobs table {info['table_size']} with indexes, seeded in {info['seed_s']:.1f} s\n")
    layers = list(results)
    scenarios = list(results[layers[0]])
    rows = []
    for name in scenarios:
        for layer in layers:
            s = results[layer][name]
            rows.append([name, layer, s.n, ms(s.p50), ms(s.p95), ms(s.max)])
    print(table(["request (limit=20)", "measured", "n", "p50 ms", "p95 ms", "max ms"], rows))
    print()
    raw, ser, api = (results[layer] for layer in layers)
    print(table(["request", "API/service p50", "API/service p95", "API/(service+JSON) p50"],
                [[name, ratio(api[name].p50, raw[name].p50), ratio(api[name].p95, raw[name].p95),
                  ratio(api[name].p50, ser[name].p50)] for name in scenarios]))
    print("\nEXPLAIN (ANALYZE, BUFFERS) of the service's SQL:")
    for name, plan in plans.items():
        scan = next((line.strip() for line in plan if "Scan" in line), "?")
        timing = next((line.strip() for line in plan if line.startswith("Execution Time")), "")
        print(f"  {name}: {plan[0].strip()}\n      {scan}\n      {timing}")
    print()
    for name in scenarios:
        p95 = api[name].p95
        verdict = "met" if p95 <= TARGET_P95 else "MISSED"
        print(f"target list p95 <= {TARGET_P95 * 1000:.0f} ms, {name}: {ms(p95)} ms -> {verdict}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true",
                        help="10k jobs and 50 requests per scenario instead of 100k and 200")
    parser.add_argument("--jobs", type=int, help="jobs in the measured project")
    parser.add_argument("--requests", type=int, help="measured requests per scenario and layer")
    args = parser.parse_args(argv)
    jobs = args.jobs or (10_000 if args.quick else 100_000)
    requests = args.requests or (50 if args.quick else 200)
    exit_on_sigterm()
    load_before = load()
    started = time.monotonic()
    results, plans, info = run(jobs, requests)
    command = " ".join([".venv/bin/python", "benchmarks/list_jobs.py", *(argv or sys.argv[1:])])
    report(results, plans, info, jobs, command, load_before)
    print(f"\n(total {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
