"""Shared helpers for the benchmarks: throwaway Postgres databases, real ``specdeck api`` and
``specdeck worker`` subprocesses (each in its own process group), statistics and tables.

Also the empty pipeline the dispatch benchmark's worker runs (``SPECDECK_PIPELINE=
benchmarks._stack:EMPTY_PIPELINE``), so that a job succeeds as soon as it is claimed and only
dispatch is measured. The worker imports this module, so it imports nothing heavy at the top.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

# The pipeline with no stages: claim -> succeeded, nothing else.
EMPTY_PIPELINE: list = []

ROOT = Path(__file__).resolve().parent.parent
SPECDECK = str(Path(sys.executable).parent / "specdeck")
PG_ADMIN_URL = os.environ.get("SPECDECK_BENCH_PG_ADMIN_URL",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("SPECDECK_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
HOST = "127.0.0.1"


# --- statistics --------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    n: int
    p50: float
    p95: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "Summary":
        return cls(len(values), percentile(values, 50), percentile(values, 95),
                   max(values) if values else math.nan)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (also readable on a terminal)."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def wall_cpu_table(results: dict[tuple[str, str], list[tuple[float, float]]],
                   cases: Sequence[str], names: Sequence[str], case_header: str) -> str:
    """Per case and name, the medians of the rounds' (wall, CPU) seconds per call, in us, and
    each name's over the last name's."""
    rows = []
    last = names[-1]
    for case in cases:
        medians = {name: (statistics.median(w for w, _ in results[case, name]),
                          statistics.median(c for _, c in results[case, name]))
                   for name in names}
        for name, (wall, cpu) in medians.items():
            ratio = (f"{wall / medians[last][0]:.2f}x / {cpu / medians[last][1]:.2f}x"
                     if name != last else "")
            rows.append([case, name, f"{wall * 1e6:.1f}", f"{cpu * 1e6:.1f}", ratio])
    return table([case_header, "client", "wall us", "CPU us", f"over {last} (wall / CPU)"],
                 rows)


def machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (f"{date.today().isoformat()}, {os.cpu_count()} cores ({model}), "
            f"Python {platform.python_version()}, {platform.system()} {platform.release()}")


def load() -> float:
    """The 1-minute load average: on a shared 2-core machine it explains most of the noise."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


def loop_ms() -> float:
    """Milliseconds a fixed Python loop takes here now (the best of 3): on a shared VM the
    same machine runs it 30-40% slower at times (a busy neighbour on the host), and every
    latency with it."""
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        sum(range(10**7))
        best = min(best, time.perf_counter() - started)
    return best * 1000


# --- lifecycle ---------------------------------------------------------------------------------

def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so every ``finally`` (processes, databases) still runs."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def postgres_database(prefix: str = "specdeck_bench") -> Iterator[str]:
    """A fresh, empty database on the local server, dropped (WITH FORCE) on the way out."""
    import sqlalchemy as sa

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        try:
            yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def clean_redis_queue(queue: str) -> None:
    """Delete the keys kombu made for our (unique) queue; shared keys are left alone."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = [k for k in client.scan_iter(match=f"*{queue}*", count=1000)]
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def base_env(**settings: str) -> dict[str, str]:
    """The environment for specdeck subprocesses: no stray SPECDECK_* from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECK_")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **settings)
    return env


def specdeck(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    """Run a short ``specdeck`` command (db upgrade, admin keys create); return its stdout."""
    done = subprocess.run([SPECDECK, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)
    if done.returncode != 0:
        raise RuntimeError(f"specdeck {' '.join(args)} failed ({done.returncode}):\n"
                           f"{done.stdout}\n{done.stderr}")
    return done.stdout


def create_key(env: dict[str, str], project: str) -> str:
    return specdeck(env, "admin", "keys", "create", "--project", project).strip().splitlines()[-1]


class Proc:
    """A long-running child in its own session (so its own process group), output to a log."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                               f"{self.log.read_text(errors='replace')[-4000:]}")

    def stop(self, grace: float = 15) -> None:
        """SIGTERM the group, wait up to ``grace`` seconds, then SIGKILL the group."""
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # the leader if it hung, and anything left in the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


class Processes(contextlib.AbstractContextManager["Processes"]):
    """Every child started through it is stopped on exit, newest first."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Proc] = []

    def __exit__(self, exc_type: object, *_: object) -> None:
        while self.children:
            child = self.children.pop()
            child.stop()
            if exc_type is not None:  # the logs go with the temporary directory: show them now
                tail = child.log.read_text(errors="replace").splitlines()[-25:]
                print(f"--- last lines of {child.name}'s log ---", *tail, sep="\n", file=sys.stderr)

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        proc = Proc(name, argv, env, self.log_dir / f"{name}.log")
        self.children.append(proc)
        return proc

    def api(self, name: str, env: dict[str, str], timeout: float = 60) -> str:
        """``specdeck api`` on a free port; returns its base URL once /healthz answers."""
        import httpx

        port = free_port()
        proc = self.start(name, [SPECDECK, "api", "--host", HOST, "--port", str(port)], env)
        url = f"http://{HOST}:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc.check_alive()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return url
            time.sleep(0.1)
        raise RuntimeError(f"{name} did not answer /healthz within {timeout} s")

    def worker(self, name: str, env: dict[str, str], timeout: float = 60) -> Proc:
        """``specdeck worker``; returns once Celery says it is ready."""
        proc = self.start(name, [SPECDECK, "worker"], env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc.check_alive()
            if b" ready." in proc.log.read_bytes():
                return proc
            time.sleep(0.1)
        raise RuntimeError(f"{name} not ready within {timeout} s:\n"
                           f"{proc.log.read_text(errors='replace')[-4000:]}")


# --- fixtures on disk --------------------------------------------------------------------------

def write_verifier(models_root: Path, name: str = "tiny-verifier") -> str:
    path = models_root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 8,
        "hidden_size": 64, "vocab_size": 512, "torch_dtype": "float32"}))
    return name


def write_dataset(data_root: Path, name: str = "chat.jsonl", rows: int = 8) -> str:
    data_root.mkdir(parents=True, exist_ok=True)
    with (data_root / name).open("w") as out:
        for i in range(rows):
            out.write(json.dumps({"messages": [
                {"role": "user", "content": f"question {i}: what is {i} + {i}?"},
                {"role": "assistant", "content": f"{i} + {i} = {2 * i}"}]}) + "\n")
    return name


def roots(base: Path) -> dict[str, str]:
    """SPECDECK_{DATA,MODELS,LOGS,WORK}_ROOT under ``base``, created."""
    env = {}
    for name in ("data", "models", "logs", "work"):
        (base / name).mkdir(parents=True, exist_ok=True)
        env[f"SPECDECK_{name.upper()}_ROOT"] = str(base / name)
    return env


# --- a new user's stack: `specdeck run`, then its API over HTTP ---------------------------------

def printed_job(proc: subprocess.Popen, log: Path, timeout: float) -> tuple[str, dict]:
    """The API key and the demo job body ``specdeck run`` prints once it is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        key = re.search(r"API key \(project '[^']+'\): (\S+)", text)
        body = re.search(r"-d '(\{.*\})'", text)
        if key and body:
            return key.group(1), json.loads(body.group(1))
        if proc.poll() is not None:
            raise RuntimeError(f"specdeck run exited with {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.5)
    raise RuntimeError(f"specdeck run printed no demo job within {timeout} s")


def healthy(client: Any) -> bool:
    with contextlib.suppress(Exception):
        return client.get("/healthz").status_code == 200
    return False


def job_ended(client: Any, job_id: str) -> dict | None:
    job = client.get(f"/api/jobs/{job_id}").json()
    return job if job["status"] in ("succeeded", "failed", "cancelled") else None


def all_events(client: Any, job_id: str) -> list[dict[str, Any]]:
    """Every event of the job, page after page."""
    found: list[dict[str, Any]] = []
    while True:
        params = {"limit": 100} | ({"after": found[-1]["id"]} if found else {})
        page = client.get(f"/api/jobs/{job_id}/events", params=params).json()
        found += page["data"]
        if not page["has_more"]:
            return found


def wait_until(fn: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := fn():
            return value
        time.sleep(0.5)
    raise RuntimeError(f"{what}: not done within {timeout} s")


@dataclass
class NewUserStack:
    """``specdeck run`` in an empty directory, up: a client with the key it printed, the demo
    job body it printed, and when it started and when its API answered (monotonic seconds)."""

    client: Any
    demo_job: dict[str, Any]
    started: float
    ready: float


@contextlib.contextmanager
def new_user_stack(base: Path) -> Iterator[NewUserStack]:
    """What a new user gets from ``make run``, without the install: ``specdeck run`` in ``base``
    (the embedded default; it makes the demo verifier and data the first time), stopped by
    process group on the way out."""
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECK_")}
    env.update(PYTHONUNBUFFERED="1", SPECDECK_DEFAULT_RUNTIME="local")
    log = base / "specdeck-run.log"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen([SPECDECK, "run", "--port", str(port)], cwd=base, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        key, demo_job = printed_job(proc, log, timeout=600)
        with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=30,
                          headers={"Authorization": f"Bearer {key}"}) as client:
            wait_until(lambda: healthy(client), 120, "the API")
            yield NewUserStack(client, demo_job, started, time.monotonic())
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)


def finished_job(client: Any, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Submit ``body`` and follow the job to its end; it must succeed."""
    created = client.post("/api/jobs", json=body)
    if created.status_code != 201:
        raise RuntimeError(f"the job was refused: {created.text}")
    job_id = created.json()["id"]
    job = wait_until(lambda: job_ended(client, job_id), timeout, f"job {job_id}")
    if job["status"] != "succeeded":
        raise RuntimeError(f"job {job_id} ended {job['status']}: {job['status_reason']}\n"
                           + client.get(f"/api/jobs/{job_id}/logs").text[-3000:])
    return job
