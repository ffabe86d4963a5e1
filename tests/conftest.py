"""Shared fixtures: a fresh Postgres database built by Alembic, a SQLite file, Redis, real
``specdeck worker`` processes, and an API client with a project-scoped key."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from app.runtimes.vllm import CPU_THREADS_ENV  # imports no torch

# OpenMP's threads wait passively in the test processes too, as the local runtime's processes
# do (docs/benchmarks.md, "OpenMP on a shared CPU"): pytest-xdist's workers train the
# demo verifier in process, beside other tests' engines and trainers. OpenMP reads it when torch
# loads, so before anything imports torch; pytest-xdist's workers inherit it.
for _name, _value in CPU_THREADS_ENV.items():
    os.environ.setdefault(_name, _value)
# The demo verifier's engines (12 layers, 2 KV heads of 32, float32: 6 KiB a token) in a KV cache
# of 64 MiB, not the default 1 GiB that every engine start would allocate and zero.
os.environ.setdefault("SPECDECK_LOCAL_KV_CACHE_BYTES", str(64 << 20))
# One OpenMP thread for each of the local runtime's processes: the demo verifier's ops are too
# small for a second thread to pay, and two tests' engines and trainers share the 2 cores
# (docs/benchmarks.md, "OpenMP on a shared CPU").
os.environ.setdefault("SPECDECK_LOCAL_THREADS", "1")

from app.supervise import die_with_parent  # noqa: E402
from tests.support import processes  # noqa: E402
from tests.support.waiting import wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SPECDECK = str(Path(sys.executable).parent / "specdeck")
PG_ADMIN_URL = os.environ.get("SPECDECK_TEST_PG_ADMIN_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SPECDECK_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# Short leases and heartbeats so fault tests finish quickly; not so short that a loaded 2-core
# machine misses them: a lease is renewed 12 times before it runs out, and a worker counts as
# offline after 3 reconcile rounds without a heartbeat (3 s).
FAST_WORKER_ENV = {
    "SPECDECK_LEASE_SECONDS": "6",
    "SPECDECK_HEARTBEAT_SECONDS": "0.5",
    "SPECDECK_RECONCILE_SECONDS": "1",
    "SPECDECK_REKICK_AFTER_SECONDS": "3",
    "SPECDECK_CANCEL_GRACE_SECONDS": "2",
}


# --- no process outlives its owner -------------------------------------------------------------

def xdist_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker (docs/testing.md): the controlling pytest owns the session,
    so its processes carry the controller's session mark, and the controller checks them."""
    return hasattr(config, "workerinput")


def stop_like_ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    # `kill`, `timeout` and CI runners stop a run with SIGTERM, which would end pytest at once
    # and leave the engines and servers of the running tests (in sessions of their own) behind.
    # Taken as Ctrl-C, it tears the fixtures down and ends the session, which stops the rest.
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, stop_like_ctrl_c)
    if not xdist_worker(config):
        processes.begin_session()


def pytest_sessionstart(session: pytest.Session) -> None:
    """A killed earlier run left processes behind: stop them before they skew this one."""
    if xdist_worker(session.config):
        return
    if orphans := processes.orphans_of_dead_sessions():
        print(f"\nstopping {len(orphans)} process(es) left by a test session that no longer "
              f"runs:\n{processes.describe(orphans)}", flush=True)
        processes.stop(orphans)


@pytest.hookimpl(trylast=True)  # after the session's fixtures were torn down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite fails if anything it started still runs, and names it."""
    if xdist_worker(session.config):
        return
    left = processes.wait_gone(processes.SESSION_ENV, os.environ[processes.SESSION_ENV],
                               processes.EXIT_GRACE)
    if left:
        session.config.get_terminal_writer().line(
            f"\nFAILED: {len(left)} process(es) started by this test session still ran after "
            f"it ended (now stopped):\n{processes.describe(left)}", red=True)
        processes.stop(left)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- the order of the suite, and its work units under pytest-xdist ---------------------------------

DEMO_DRAFTER_TRAINER = "test_serving.py"  # the e2e module that trains the session's demo drafter
# `make test` keeps the order below (--no-loadscope-reorder). First the longest work units: the
# demo drafter's chain (its trainer and the tests that serve it, about 10 minutes on one worker),
# then Schemathesis, which needs no demo assets (on a cold cache one worker fuzzes the API while
# the other makes them), then the dashboard's flow.
FIRST = ("tests/e2e/test_serving.py", "tests/integration/test_schemathesis.py",
         "tests/e2e/test_dashboard.py")
# Then the other end-to-end tests, and the many short ones at the end, so that neither worker
# waits long for the other. (The integration and unit tests right after FIRST, beside the
# chain, took longer in all: the end-to-end tests then ended the run, and one worker waited
# 123 s for the other's last one; docs/ci.md, run 51.)
ORDER = ("e2e", "local_runtime", "integration", "unit")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite's order and the work units pytest-xdist's ``loadgroup`` hands out, in that
    order. The order: the longest units first (FIRST), then by directory (ORDER). The units: a
    test alone where it shares nothing with its neighbours (most end-to-end tests), else its
    module (fixtures of module scope are set up once), tests/local_runtime/ whole (one vLLM
    server for it), and the demo drafter's trainer with the tests that serve it (it is trained
    once)."""
    def directory(item: pytest.Item) -> str:
        return item.path.parent.name

    def serves_demo_drafter(item: pytest.Item) -> bool:
        return item.get_closest_marker("uses_demo_drafter") is not None

    def in_demo_drafter_group(item: pytest.Item) -> bool:
        return serves_demo_drafter(item) or (directory(item) == "e2e"
                                             and item.path.name == DEMO_DRAFTER_TRAINER)

    def first(item: pytest.Item) -> int:
        path = "tests/e2e/" + DEMO_DRAFTER_TRAINER if in_demo_drafter_group(item) \
            else str(item.path.relative_to(config.rootpath))
        return FIRST.index(path) if path in FIRST else len(FIRST)

    # Within a directory, the tests that serve the session's demo drafter after the one that
    # trains it (tests/e2e/conftest.py, DemoDrafter).
    items.sort(key=lambda item: (first(item), ORDER.index(directory(item))
                                 if directory(item) in ORDER else len(ORDER),
                                 serves_demo_drafter(item)))
    for item in items:
        if directory(item) == "local_runtime":
            group = "local_runtime"
        elif in_demo_drafter_group(item):
            group = "e2e-demo-drafter"  # one worker: the drafter's trainer, then its servers
        elif directory(item) == "e2e" and not any(
                fixture.scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values()
                for fixture in defs):
            continue
        else:
            group = str(item.path.relative_to(config.rootpath))
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def no_process_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test's processes are gone once its fixtures are torn down, even when it failed or
    timed out; a survivor is stopped and fails the test, by name. (Autouse, so set up before
    the test's other function fixtures, and torn down after them.)"""
    mark = uuid.uuid4().hex[:12]
    os.environ[processes.TEST_ENV] = mark
    yield
    del os.environ[processes.TEST_ENV]
    left = processes.wait_gone(processes.TEST_ENV, mark, processes.EXIT_GRACE)
    if left:
        description = processes.describe(left)
        processes.stop(left)
        pytest.fail(f"{request.node.nodeid} left {len(left)} process(es) running "
                    f"(now stopped):\n{description}", pytrace=False)


def configure(env: dict[str, str]) -> None:
    """Point this process's settings, engine and Celery app at ``env``."""
    from app.celery_app import get_celery
    from app.db import get_engine, get_sessionmaker
    from app.settings import get_settings

    os.environ.update(env)
    if get_engine.cache_info().currsize:
        get_engine().dispose()
    for cached in (get_settings, get_engine, get_sessionmaker, get_celery):
        cached.cache_clear()


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A database migrated once by Alembic; each test gets a copy (CREATE DATABASE ... TEMPLATE)."""
    from app.cli import migrate

    name = f"specdeck_tpl_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN_URL} (run `make test`, which "
                    f"starts it): {exc}")
    migrate(PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}")
    yield name
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


class Copies:
    """Copies of the template database, each made while the test before it runs: a
    ``CREATE DATABASE ... TEMPLATE`` takes about 0.17 s, which the ~450 Postgres tests would
    otherwise each wait for. One copy is made ahead, in one thread."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        self.maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-copies")
        self.next = self.maker.submit(self._create)

    def _create(self) -> str:
        name = f"specdeck_test_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
        return name

    def take(self) -> str:
        name, self.next = self.next.result(), self.maker.submit(self._create)
        return name

    def drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        self.maker.shutdown()
        self.drop(self.next.result())  # the copy made ahead that no test took
        self.admin.dispose()


@pytest.fixture(scope="session")
def pg_copies(pg_template: str) -> Iterator[Copies]:
    copies = Copies(pg_template)
    yield copies
    copies.close()


@pytest.fixture
def pg_url(pg_copies: Copies) -> Iterator[str]:
    name = pg_copies.take()
    yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    from app.db import get_engine

    get_engine().dispose()
    pg_copies.drop(name)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from app.cli import migrate

    path = tmp_path_factory.mktemp("sqlite") / "template.db"
    migrate(f"sqlite:///{path}")
    return path


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "specdeck.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("roots")
    paths = {name: base / name for name in ("data", "models", "logs", "work")}
    for path in paths.values():
        path.mkdir()
    return {f"SPECDECK_{name.upper()}_ROOT": str(path) for name, path in paths.items()}


@dataclass
class Stack:
    """One backend (database + broker) that the in-process API and worker processes share."""

    name: str
    env: dict[str, str]
    tmp: Path
    workers: list["WorkerProcess"] = field(default_factory=list)

    @property
    def models_root(self) -> Path:
        return Path(self.env["SPECDECK_MODELS_ROOT"])

    @property
    def data_root(self) -> Path:
        return Path(self.env["SPECDECK_DATA_ROOT"])

    def start_worker(self, name: str | None = None, **env: str) -> "WorkerProcess":
        worker = WorkerProcess.start(self, name or f"w-{uuid.uuid4().hex[:6]}", env)
        self.workers.append(worker)
        return worker

    def scalar(self, sql: str, **params: Any) -> Any:
        from app.db import get_engine

        with get_engine().connect() as conn:
            return conn.execute(sa.text(sql), params).scalar()


def _stack(name: str, db_url: str, broker_url: str, roots: dict[str, str], tmp: Path) -> Iterator[Stack]:
    env = {
        "SPECDECK_DATABASE_URL": db_url,
        "SPECDECK_BROKER_URL": broker_url,
        "SPECDECK_QUEUE": f"specdeck-test-{uuid.uuid4().hex[:8]}",
        "SPECDECK_DEFAULT_RUNTIME": "local",
        **roots,
        **FAST_WORKER_ENV,
    }
    configure(env)
    stack = Stack(name=name, env=env, tmp=tmp)
    try:
        yield stack
    finally:
        for worker in stack.workers:
            worker.stop()


@pytest.fixture(params=["postgres", "sqlite"])
def stack(request: pytest.FixtureRequest, roots: dict[str, str], tmp_path: Path) -> Iterator[Stack]:
    """The API tests run on both: Postgres + Redis, and the embedded SQLite default."""
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        yield from _stack("postgres", url, REDIS_URL, roots, tmp_path)
    else:
        url = request.getfixturevalue("sqlite_url")
        broker = f"sqla+sqlite:///{Path(url.split(':///', 1)[1]).parent / 'broker.db'}"
        yield from _stack("sqlite", url, broker, roots, tmp_path)


@pytest.fixture
def pg_stack(pg_url: str, roots: dict[str, str], tmp_path: Path) -> Iterator[Stack]:
    """Postgres + Redis only: the concurrent paths (SKIP LOCKED, several workers)."""
    yield from _stack("postgres", pg_url, REDIS_URL, roots, tmp_path)


@dataclass
class WorkerProcess:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, stack: Stack, name: str, extra: dict[str, str]) -> "WorkerProcess":
        env = {**os.environ, **stack.env, "SPECDECK_WORKER_NAME": name,
               "SPECDECK_PIPELINE": "tests.support.stages:PIPELINE",
               "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **extra}
        log = stack.tmp / f"{name}.log"
        proc = subprocess.Popen([SPECDECK, "worker"], env=env, stdout=log.open("wb"),
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT,
                                preexec_fn=die_with_parent)
        worker = cls(name=name, proc=proc, log=log)
        worker.wait_ready(stack)
        return worker

    def wait_ready(self, stack: Stack, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.name} exited:\n{self.log.read_text()}")
            if b"ready." in self.log.read_bytes() and stack.scalar(
                    "SELECT count(*) FROM workers WHERE id = :id", id=self.name):
                return
            time.sleep(0.1)
        raise AssertionError(f"worker {self.name} not ready:\n{self.log.read_text()}")

    def stop(self, timeout: float = processes.EXIT_GRACE * 2) -> None:
        """What a process manager does: SIGTERM, then wait. The worker stops the processes of
        its jobs and deployments and hands them back; SIGKILL only if it hangs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"worker {self.name} did not stop within {timeout:.0f} s of "
                                     f"SIGTERM:\n{self.log.read_text()[-4000:]}") from None

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Kill only the worker process (its stage children live in their own sessions)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


class Api:
    """The in-process FastAPI app with one project's key."""

    def __init__(self, client: Any, key: str) -> None:
        self.client, self.key = client, key

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}", **(extra or {})}

    def get(self, path: str, **kw: Any) -> Any:
        return self.client.get(path, headers=self.headers(kw.pop("headers", None)), **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.client.post(path, headers=self.headers(kw.pop("headers", None)), **kw)

    def put(self, path: str, **kw: Any) -> Any:
        return self.client.put(path, headers=self.headers(kw.pop("headers", None)), **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.client.delete(path, headers=self.headers(kw.pop("headers", None)), **kw)

    def patch(self, path: str, **kw: Any) -> Any:
        return self.client.patch(path, headers=self.headers(kw.pop("headers", None)), **kw)

    def job(self, job_id: str) -> dict[str, Any]:
        response = self.get(f"/api/jobs/{job_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def events(self, job_id: str) -> list[dict[str, Any]]:
        response = self.get(f"/api/jobs/{job_id}/events", params={"limit": 100})
        assert response.status_code == 200, response.text
        return response.json()["data"]

    def wait_status(self, job_id: str, statuses: set[str], timeout: float = 60) -> dict[str, Any]:
        try:
            return wait_for(lambda: (job := self.job(job_id))["status"] in statuses and job,
                            timeout, f"{job_id} to reach {statuses}")
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}: {json.dumps(self.job(job_id))}\n"
                                 f"{json.dumps(self.events(job_id), indent=1)}") from None


def new_key(project: str | None = None) -> str:
    from app.db import session_scope
    from app.services.keys import create_key

    with session_scope() as session:
        return create_key(session, project or f"proj-{uuid.uuid4().hex[:8]}").plaintext


def _client(stack: Stack) -> Iterator[Api]:
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app()) as client:
        yield Api(client, new_key())


@pytest.fixture
def api(stack: Stack) -> Iterator[Api]:
    yield from _client(stack)


@pytest.fixture
def pg_api(pg_stack: Stack) -> Iterator[Api]:
    yield from _client(pg_stack)


@pytest.fixture
def make_api() -> Callable[[Api], Api]:
    """Another project's client on the same app."""
    return lambda api: Api(api.client, new_key())


def write_verifier(models_root: Path, name: str = "tiny", layers: int = 8) -> str:
    path = models_root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": layers,
        "hidden_size": 64, "vocab_size": 512, "torch_dtype": "float32"}))
    return name


def write_dataset(data_root: Path, name: str = "chat.jsonl") -> str:
    path = data_root / name
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    return name


def _body_factory(stack: Stack) -> Callable[..., dict[str, Any]]:
    verifier = write_verifier(stack.models_root)
    dataset = write_dataset(stack.data_root)

    def body(**overrides: Any) -> dict[str, Any]:
        return {"verifier": verifier, "dataset": dataset, "runtime": "local", **overrides}

    return body


@pytest.fixture
def job_body(stack: Stack) -> Callable[..., dict[str, Any]]:
    return _body_factory(stack)


@pytest.fixture
def pg_job_body(pg_stack: Stack) -> Callable[..., dict[str, Any]]:
    return _body_factory(pg_stack)


@pytest.fixture(scope="session")
def demo_assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The demo verifier and its on-policy conversations, made once per session: about a
    minute and a half of CPU on 2 cores, so kept between runs (tests.support.demo_cache)."""
    from tests.support.demo_cache import cached_demo_assets

    return cached_demo_assets(tmp_path_factory.mktemp("demo"))
