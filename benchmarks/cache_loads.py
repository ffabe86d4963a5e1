"""The gateway's cache loads, in a transaction of their own or not, side by side in one run.

The gateway keeps a key's caller and a project's routes in caches that load in a thread and
reload in the background while the key or project has traffic (a project every half
``gateway_route_cache_seconds``, a key every half ``gateway_auth_cache_seconds``): CPU that each
API process spends every second per active project and key, whatever the traffic. Each load is
one SELECT. This runs the gateway's own loaders (``load_caller``, ``routes_loader``) against a
migrated database with a key and a deployment with two replicas, two ways, taken in turn:

* session: in a ``session_scope()``, as before 2026-12-06 (the pool's pre-ping, BEGIN, the
  query, COMMIT);
* read: in ``read_scope()``, as now (the pool's pre-ping, the query, in autocommit).

Both on Postgres (a throwaway database on the local server) and on SQLite (the embedded
default, a file in a temporary directory). Prints the wall and CPU time of a load per way
(medians of rounds) and the ratio.

    .venv/bin/python benchmarks/cache_loads.py [--rounds 5] [--loads 300]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _stack import machine, postgres_database, table  # noqa: E402
from gateway import add_deployment, api_env  # noqa: E402


@contextlib.contextmanager
def in_a_session() -> Iterator[object]:
    from app.db import session_scope

    with session_scope() as session:
        yield session


def measure(fn: Callable[[], object], loads: int) -> tuple[float, float]:
    """Wall and CPU microseconds of one call, over ``loads`` calls in a row."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(loads):
        fn()
    return ((time.perf_counter() - wall) / loads * 1e6, (time.process_time() - cpu) / loads * 1e6)


def run(database_url: str, tmp: Path, rounds: int, loads: int) -> list[list[str]]:
    from sqlalchemy import select

    env, key = api_env(database_url, tmp)
    add_deployment(database_url, "bench", "bench-model", 9, replica_ports=[10])  # configures
    import app.services.gateway as gateway
    from app.db import read_scope, session_scope
    from app.db.models import Project
    from app.services.keys import hash_key
    from app.settings import get_settings

    with session_scope() as session:
        project_id = session.scalars(select(Project.id).where(Project.name == "bench")).one()
    routes, key_hash = gateway.routes_loader(get_settings()), hash_key(key)
    loaders = {"caller": lambda: gateway.load_caller(key_hash),
               "routes": lambda: routes(project_id)}
    scopes = {"session": in_a_session, "read": read_scope}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for _ in range(rounds):
            for loader, load in loaders.items():
                for way, scope in scopes.items():
                    gateway.read_scope = scope  # type: ignore[assignment]
                    assert load() is not None
                    results.setdefault((loader, way), []).append(measure(load, loads))
    finally:
        gateway.read_scope = read_scope
    rows = []
    for loader in loaders:
        before = [statistics.median(v) for v in zip(*results[(loader, "session")])]
        for way in scopes:
            wall, cpu = (statistics.median(v) for v in zip(*results[(loader, way)]))
            rows.append([loader, way, f"{wall:.0f}", f"{cpu:.0f}",
                         f"{wall / before[0]:.2f}x / {cpu / before[1]:.2f}x"])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loads", type=int, default=300, help="loads in a row per round")
    args = parser.parse_args(argv)
    print(f"{machine()}; {args.rounds} rounds of {args.loads} loads per loader and way")
    headers = ["loader", "way", "wall us", "CPU us", "of session (wall / CPU)"]
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-loads-") as tmp:
        with postgres_database("specdeck_bench_loads") as url:
            print("\nPostgres (medians of rounds):\n")
            print(table(headers, run(url, Path(tmp) / "pg", args.rounds, args.loads)))
        sqlite_url = f"sqlite:///{Path(tmp) / 'specdeck.db'}"
        print("\nSQLite (medians of rounds):\n")
        print(table(headers, run(sqlite_url, Path(tmp) / "sqlite", args.rounds, args.loads)))


if __name__ == "__main__":
    main()
