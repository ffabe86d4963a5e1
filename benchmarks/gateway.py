"""Gateway overhead: what the OpenAI-compatible gateway adds in front of a model server.

Side by side in one run, against the same fast OpenAI-compatible upstream
(``tests/support/upstream.py`` as its own process: fixed tokens, usage, nothing else, so the
proxies are what is measured):

* direct: the upstream itself;
* direct-2r: the upstream and a second process of it, one request on each in turn (what a client
  that balances by itself does): the direct baseline of specdeck-2r below;
* bare-proxy: benchmarks/bare_proxy.py, an ASGI app on uvicorn that forwards each request with
  the gateway's upstream client and nothing else (no key, limit, JSON, routing, usage or
  metrics): the floor of a proxy on this stack, against which the gateway's own work reads;
* specdeck: a real ``specdeck api`` (Postgres; a key, a project and a ready deployment row pointing
  at the upstream, with its encrypted internal key): auth, rate limit, routing, usage recording;
* specdeck-2p: the same with ``--workers 2``, two API processes behind one port (their CPU is the
  process tree's);
* specdeck-2r: the first ``specdeck api``, to a deployment with two replicas, each a process of
  the same upstream (the gateway balances over them; their CPU is counted together); its added
  latency is taken against direct-2r (a request that finds its upstream idle costs more on a
  small VM, with or without a proxy in between), and printed against direct too;
* litellm: LiteLLM's proxy (``litellm --config``, a master key, the same upstream as an
  ``openai/`` model), if it is installed (see below); skipped with a message otherwise;
* vllm-router: vLLM's own router (``vllm-router``, a load balancer in Rust, compiled, which does
  less work than the gateway: no keys, limits or usage), ``--worker-urls`` pointing at the
  upstream, if it is installed (see below); skipped otherwise. The gateway's figures are read as
  ratios to its own: added p50 and proxy CPU at most 3x, a whole stream's added p50 at most 2x
  (issue 60's "must"; its aim is 1.5x).

Latency: requests one at a time over one keep-alive connection per target, measured by a lean
asyncio HTTP/1.1 client (so the client adds little noise): non-streaming (8 tokens), streaming
(time to the first chunk and to the end of the stream; bare-proxy buffers a stream whole, so
its streaming rows are a stream's end). Added latency = percentile(target) - percentile(its
direct baseline). Two orders: ``--block`` (50) requests in a row per target, after 3 that are
not counted, the targets taken in turn (so that drifts in load hit them alike), as under steady
traffic; and one request per target in turn, where every request finds the processes idle (in a
VM an idle vCPU halts, and waking it costs; a proxy has two processes to wake).

Throughput: N concurrent keep-alive connections sending streaming requests for a few seconds,
per target in turn, a few rounds (median), with the CPU time each process (client, proxy,
upstream) spent per request, read from /proc around each round. Two upstreams:

* paced: 16 chunks 5 ms apart (200 chunks/s per stream: faster than a real engine, which sends a
  chunk per step, 10-20 ms for an 8B model): the upstream's pace bounds the throughput, as a GPU
  does, and the question is whether the proxy keeps up with it;
* unpaced: 8 chunks with no pause at all, everything CPU-bound on the same cores (the client, the
  proxy and the upstream compete for them): what a request costs the proxy in CPU.

Targets: added p50 <= 1 ms, >= 90 % of the direct throughput, below LiteLLM's added latency;
issue 22's: added p50 <= 0.25 ms, proxy CPU per request <= 2x the upstream's, unpaced >= 50 % of
direct. ``--json`` prints one JSON object as the last line (the single-process, single-replica
figures, and the same under "two_api_processes" and "two_replicas").

LiteLLM is not a SpecDeck dependency (``litellm[proxy]`` pins versions of openai, fastapi and
huggingface_hub that the project does not use): install it in a venv of its own,

    python3 -m venv var/litellm-venv && var/litellm-venv/bin/pip install 'litellm[proxy]'

and the script finds ``var/litellm-venv/bin/litellm`` (or ``--litellm PATH``, or ``litellm`` on
the PATH). vLLM's router, likewise in a venv of its own (a wheel with its binary, 130 MB):

    python3 -m venv var/vllm-router-venv && var/vllm-router-venv/bin/pip install vllm-router

found as ``var/vllm-router-venv/bin/vllm-router`` (or ``--vllm-router PATH``, or on the PATH).
``--json``'s object holds ``peers``: ``litellm`` (``added_p50_ms``) and ``vllm_router``
(``added_p50_ms``, ``proxy_cpu_us``, ``stream_added_p50_ms``), each null when not installed.

    .venv/bin/python benchmarks/gateway.py [--quick] [--requests N] [--concurrency N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _stack import (  # noqa: E402
    HOST,
    ROOT,
    Processes,
    base_env,
    create_key,
    exit_on_sigterm,
    free_port,
    load,
    loop_ms,
    machine,
    percentile,
    postgres_database,
    roots,
    specdeck,
    table,
)

TARGET_ADDED_P50 = 0.001  # seconds
TARGET_CAPTURE_P50 = 0.0001  # what capture at sample rate 1.0 may add to the gateway's p50
TARGET_THROUGHPUT = 0.90
# Issue 22's: what the gateway may add, and cost, next to the engine it fronts.
TARGET_ADDED_P50_NOW = 0.00025  # seconds
TARGET_CPU_RATIO = 2.0  # proxy CPU per request over the upstream's (unpaced)
TARGET_UNPACED_SHARE = 0.50
UPSTREAM_KEY = "bench-upstream-key"
REDIS_URL = os.environ.get("SPECDECK_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
LITELLM_KEY = "sk-bench-litellm-master"
MODEL, PACED = "bench", "bench-paced"
REPLICATED, PACED_REPLICATED = "bench-2r", "bench-paced-2r"  # the same, two replicas
CAPTURED, PACED_CAPTURED = "bench-captured", "bench-paced-captured"  # the same, capturing
TOKENS, PACED_TOKENS, PACE = 8, 16, 0.005
PROMPT = [{"role": "user", "content": "Measure the gateway, not the model."}]


# --- a lean HTTP/1.1 client --------------------------------------------------------------------

class Connection:
    """One keep-alive connection; just enough HTTP/1.1 (Content-Length and chunked bodies)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(HOST, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None

    async def request(self, raw: bytes) -> tuple[int, float, float, bytes]:
        """Status, seconds to the first body bytes, seconds to the end, body."""
        if self.writer is None:
            await self.open()
        reader, start = self.reader, time.perf_counter()
        assert reader is not None and self.writer is not None
        self.writer.write(raw)
        status = int((await reader.readline()).split(b" ", 2)[1])
        length, chunked, close = None, False, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = b"close" in value.lower()
        first = None
        if length is not None:
            body = await reader.readexactly(length)
        elif chunked:
            parts = []
            while size := int((await reader.readline()).split(b";")[0], 16):
                parts.append((await reader.readexactly(size + 2))[:-2])
                first = first or time.perf_counter()
            await reader.readline()
            body = b"".join(parts)
        else:
            body, close = await reader.read(), True
        end = time.perf_counter()
        if close:
            self.close()
        return status, (first or end) - start, end - start, body


@dataclass
class Target:
    name: str
    port: int
    key: str
    pid: int = 0  # the process that serves the port (a proxy's; the upstream's for direct)
    model: str | None = None  # the served name it asks for instead of the run's (capture)
    other_port: int | None = None  # direct-2r: a second upstream, taken in turn with the first

    def raw(self, model: str, stream: bool) -> bytes:
        body = json.dumps({"model": self.model or model, "messages": PROMPT, "stream": stream,
                           "max_tokens": 64}).encode()
        return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n"
                f"Authorization: Bearer {self.key}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode() + body


class InTurn:
    """Two keep-alive connections, one request on each in turn: what a client that balances
    over two replicas by itself does (the direct baseline of a two-replica deployment)."""

    def __init__(self, port: int, other: int) -> None:
        self.connections = [Connection(port), Connection(other)]
        self.turn = 0

    async def request(self, raw: bytes) -> tuple[int, float, float, bytes]:
        self.turn ^= 1
        return await self.connections[self.turn].request(raw)

    def close(self) -> None:
        for connection in self.connections:
            connection.close()


def connect(target: Target) -> Connection | InTurn:
    return (Connection(target.port) if target.other_port is None
            else InTurn(target.port, target.other_port))


# The direct target each proxy's added latency is taken against (default: "direct"): a
# deployment with two replicas against the same two upstreams taken in turn by the client, not
# against one upstream that every request finds warm (on a 2-core VM, a request that finds its
# upstream idle costs tens of microseconds more, with or without a proxy in between).
BASELINE = {"specdeck-2r": "direct-2r"}


def check(target: Target, status: int, body: bytes, stream: bool) -> None:
    ok = status == 200 and (body.rstrip().endswith(b"data: [DONE]") if stream
                            else b'"choices"' in body)
    if not ok:
        raise RuntimeError(f"{target.name}: unexpected answer {status}: {body[:500]!r}")


# --- measurements ------------------------------------------------------------------------------

KINDS = ("non-streaming", "streaming: first chunk", "streaming: whole stream")


@dataclass
class Latencies:
    samples: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})


async def measure_latency(targets: Sequence[Target], requests: int, warmup: int,
                          block: int) -> dict[str, Latencies]:
    """``requests`` per target and kind, in blocks of ``block`` in a row (after 3 unmeasured)
    per target, the targets taken in turn; ``block=1``: one request per target in turn."""
    connections = {t.name: connect(t) for t in targets}
    raws = {(t.name, s): t.raw(MODEL, s) for t in targets for s in (False, True)}
    out = {t.name: Latencies() for t in targets}
    skip = 0 if block == 1 else 3

    async def one(target: Target, stream: bool) -> tuple[float, float]:
        status, first, total, body = await connections[target.name].request(
            raws[target.name, stream])
        check(target, status, body, stream)
        return first, total

    for _ in range(warmup):
        for stream in (False, True):
            for target in targets:
                await one(target, stream)
    done = 0
    while done < requests:
        n = min(block, requests - done)
        for stream in (False, True):
            for target in targets:
                samples = out[target.name].samples
                for i in range(skip + n):
                    first, total = await one(target, stream)
                    if i < skip:
                        continue
                    if stream:
                        samples["streaming: first chunk"].append(first)
                        samples["streaming: whole stream"].append(total)
                    else:
                        samples["non-streaming"].append(total)
        done += n
    for connection in connections.values():
        connection.close()
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and its live descendants (an API started
    with --workers serves from its children)."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for process in (root, *root.children(recursive=True)):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


@dataclass
class Throughput:
    rate: float  # completed requests per second
    cpu: dict[str, float]  # CPU seconds per request: "client", "proxy", "upstream"


async def measure_throughput(target: Target, model: str, concurrency: int, seconds: float,
                             max_requests: int, upstream_pids: list[int]) -> Throughput:
    """Completed streaming requests per second with ``concurrency`` connections, and what each
    request cost each process in CPU time (the client is this process; the upstreams' CPU is
    their sum: only a replicated deployment keeps the second one busy)."""
    raw = target.raw(model, True)
    done = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        connection = Connection(target.port)
        try:
            while time.perf_counter() < stop_at and done < max_requests:
                status, _, _, body = await connection.request(raw)
                check(target, status, body, True)
                done += 1
        finally:
            connection.close()

    # Warm every connection first, then count.
    await asyncio.gather(*(Connection(target.port).request(raw) for _ in range(2)))
    pids = {"upstream": upstream_pids}
    if target.pid and target.pid not in upstream_pids:
        pids["proxy"] = [target.pid]
    cpu_before = {name: sum(map(cpu_seconds, group)) for name, group in pids.items()}
    client_before = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu = {name: (sum(map(cpu_seconds, group)) - cpu_before[name]) / max(done, 1)
           for name, group in pids.items()}
    cpu["client"] = (time.process_time() - client_before) / max(done, 1)
    return Throughput(done / elapsed, cpu)


# --- the processes -----------------------------------------------------------------------------

def wait_http(procs: Processes, name: str, url: str, timeout: float,
              headers: dict[str, str] | None = None) -> None:
    import httpx

    proc = next(p for p in procs.children if p.name == name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.check_alive()
        try:
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{name} did not answer {url} within {timeout} s")


def start_upstream(procs: Processes, name: str, *extra: str) -> int:
    port = free_port()
    procs.start(name, [sys.executable, "-m", "tests.support.upstream", "--port", str(port),
                       "--key", UPSTREAM_KEY, *extra], base_env())
    wait_http(procs, name, f"http://{HOST}:{port}/health", 30)
    return port


def start_bare_proxy(procs: Processes, upstream: int) -> int:
    """benchmarks/bare_proxy.py in front of the upstream: the floor of a proxy on this stack."""
    port = free_port()
    procs.start("bare-proxy", [sys.executable, "-m", "uvicorn", "benchmarks.bare_proxy:app",
                               "--host", HOST, "--port", str(port), "--loop", "uvloop",
                               "--http", "httptools", "--no-access-log", "--log-level", "warning"],
                base_env(BARE_PROXY_UPSTREAM=f"http://{HOST}:{upstream}/v1/chat/completions",
                         BARE_PROXY_KEY=UPSTREAM_KEY))
    wait_http(procs, "bare-proxy", f"http://{HOST}:{port}/health", 30)
    return port


def api_env(database_url: str, tmp: Path) -> tuple[dict[str, str], str]:
    """The environment of the benchmark's ``specdeck api`` processes, the database migrated,
    and an API key of the project "bench". Redis is the broker, as in production
    (docker-compose.yml): the rate limit is the one bucket per key in Redis that every API
    process shares (app/services/limits.py), with room for every request of the run."""
    env = base_env(SPECDECK_DATABASE_URL=database_url, **roots(tmp / "specdeck"),
                   SPECDECK_BROKER_URL=REDIS_URL, SPECDECK_GATEWAY_RATE_LIMIT_RPM="100000000",
                   SPECDECK_GATEWAY_RATE_LIMIT_BURST="1000000")
    specdeck(env, "db", "upgrade")
    return env, create_key(env, "bench")


def add_deployment(database_url: str, key_project: str, name: str, upstream_port: int,
                   capture: bool = False, replica_ports: Sequence[int] = ()) -> None:
    """A ready deployment row, moved there through the state machine as a worker would; with
    ``capture``, capturing every request (sample rate 1.0) into a dataset with room for all;
    with ``replica_ports``, a ready replica row for each (replicas 1, 2, ...)."""
    os.environ["SPECDECK_DATABASE_URL"] = database_url
    from app.db import get_engine, get_sessionmaker, session_scope
    from app.db.models import Deployment, Project
    from app.services.secrets import cipher
    from app.services.state import DeploymentStatus, initialize, transition
    from app.settings import get_settings

    for cached in (get_settings, get_engine, get_sessionmaker):
        cached.cache_clear()
    from sqlalchemy import select

    with session_scope() as session:
        project = session.scalars(select(Project).where(Project.name == key_project)).one()
        deployment = Deployment(project_id=project.id, name=name, spec={})
        if capture:
            from app.schemas.capture import CaptureOptions
            from app.services import capture as captures

            deployment.capture_dataset_id = captures.start(
                session, project.id, name, CaptureOptions(sample_rate=1.0, max_rows=10_000_000,
                                                          max_bytes=64 * 1024**3)).id
        initialize(session, deployment)
        rows = [(deployment, upstream_port)]
        for index, port in enumerate(replica_ports, start=1):
            replica = Deployment(project_id=project.id, name=name, spec={},
                                 replica_of=deployment.id, replica=index)
            initialize(session, replica)
            rows.append((replica, port))
        for row, port in rows:
            transition(session, row, DeploymentStatus.STARTING, columns={
                "upstream_url": f"http://{HOST}:{port}",
                "api_key_ciphertext": cipher(get_settings()).encrypt(UPSTREAM_KEY.encode()).decode()})
            transition(session, row, DeploymentStatus.READY)
    get_engine().dispose()


def find_peer(explicit: str | None, program: str) -> str | None:
    """A peer's executable: ``explicit``, else in var/<program>-venv, else on the PATH."""
    for candidate in (explicit, str(ROOT / "var" / f"{program}-venv" / "bin" / program),
                      shutil.which(program)):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def start_vllm_router(procs: Processes, executable: str, upstream: int) -> int:
    port = free_port()
    procs.start("vllm-router", [executable, "--host", HOST, "--port", str(port),
                                "--worker-urls", f"http://{HOST}:{upstream}",
                                "--policy", "round_robin", "--log-level", "warning"], base_env())
    wait_http(procs, "vllm-router", f"http://{HOST}:{port}/health", 60)
    return port


def start_litellm(procs: Processes, executable: str, tmp: Path, upstreams: dict[str, int]) -> int:
    port = free_port()
    config = tmp / "litellm.yaml"
    models = "".join(
        f"  - model_name: {name}\n    litellm_params:\n      model: openai/{name}\n"
        f"      api_base: http://{HOST}:{upstream}/v1\n      api_key: {UPSTREAM_KEY}\n"
        for name, upstream in upstreams.items())
    config.write_text(f"model_list:\n{models}general_settings:\n  master_key: {LITELLM_KEY}\n"
                      "litellm_settings:\n  telemetry: false\n")
    env = {k: v for k, v in base_env().items() if not k.startswith(("DATABASE_URL", "LITELLM"))}
    env.update(LITELLM_LOG="ERROR", LITELLM_TELEMETRY="False", DISABLE_ADMIN_UI="True",
               NO_DOCS="True", LITELLM_LOCAL_MODEL_COST_MAP="True")  # loopback only
    procs.start("litellm", [executable, "--config", str(config), "--host", HOST, "--port",
                            str(port), "--num_workers", "1"], env)
    wait_http(procs, "litellm", f"http://{HOST}:{port}/v1/models", 180,
              {"Authorization": f"Bearer {LITELLM_KEY}"})
    return port


# --- report ------------------------------------------------------------------------------------

def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def is_direct(name: str) -> bool:
    return name.startswith("direct")


def baseline(name: str) -> str:
    return BASELINE.get(name, "direct")


def latency_table(latency: dict[str, Latencies]) -> str:
    rows = []
    for kind in KINDS:
        for name, result in latency.items():
            values = result.samples[kind]
            p50, p99 = percentile(values, 50), percentile(values, 99)
            added = ""
            if not is_direct(name):
                base = latency[baseline(name)].samples[kind]
                added = (f"{ms(p50 - percentile(base, 50))} / {ms(p99 - percentile(base, 99))}"
                         + (f" (vs {baseline(name)})" if baseline(name) != "direct" else ""))
            rows.append([kind, name, len(values), ms(p50), ms(p99), added])
    return table(["request", "target", "n", "p50", "p99", "added p50 / p99"], rows)


def added_p50(latency: dict[str, Latencies], name: str, kind: str) -> float:
    return (percentile(latency[name].samples[kind], 50)
            - percentile(latency[baseline(name)].samples[kind], 50))


def median_rate(runs: list[Throughput]) -> float:
    return statistics.median(run.rate for run in runs)


def report(latency: dict[str, Latencies], cold: dict[str, Latencies],
           throughput: dict[str, dict[str, list[Throughput]]], command: str, load_before: float,
           loop_before: float, concurrency: int, block: int, skipped: str | None) -> None:
    names = list(latency)
    print(f"\n{command}\n{machine()}; 1-minute load average {load_before:.2f} before, "
          f"{load():.2f} after; sum(range(10**7)) {loop_before:.0f} ms before, "
          f"{loop_ms():.0f} ms after\n")
    print(f"Latency, one request at a time, {block} in a row per target (ms):\n")
    print(latency_table(latency))
    print("\nLatency, one request at a time, one per target in turn (every request wakes idle "
          "processes) (ms):\n")
    print(latency_table(cold))

    rows = []
    for scenario, per_target in throughput.items():
        direct = median_rate(per_target["direct"])
        for name, runs in per_target.items():
            value = median_rate(runs)
            cpu = {part: statistics.median(run.cpu.get(part, 0.0) for run in runs) * 1e6
                   for part in ("client", "proxy", "upstream")}
            rows.append([scenario, name, f"{value:.0f}",
                         " ".join(f"{run.rate:.0f}" for run in runs),
                         "" if name == "direct" else f"{value / direct:.1%}",
                         f"{cpu['client']:.0f}", "" if name == "direct" else f"{cpu['proxy']:.0f}",
                         f"{cpu['upstream']:.0f}"])
    print(f"\nThroughput, {concurrency} concurrent streaming connections (requests/s, median of "
          "rounds; CPU time per request of each process, us):\n")
    print(table(["upstream", "target", "req/s", "rounds", "of direct", "client us", "proxy us",
                 "upstream us"], rows))

    print("\nTargets:")
    kind = "non-streaming"
    added = {n: added_p50(latency, n, kind) for n in names if not is_direct(n)}
    for scenario, per_target in throughput.items():
        if "specdeck" in per_target:
            share = median_rate(per_target["specdeck"]) / median_rate(per_target["direct"])
            verdict = "met" if share >= TARGET_THROUGHPUT else "MISSED"
            print(f"- throughput >= {TARGET_THROUGHPUT:.0%} of direct ({scenario} upstream): "
                  f"{share:.1%}: {verdict}")
    if "specdeck" in added:
        verdict = "met" if added["specdeck"] <= TARGET_ADDED_P50 else "MISSED"
        print(f"- added p50 <= {ms(TARGET_ADDED_P50)} ms ({kind}, {block} in a row): "
              f"{ms(added['specdeck'])} ms: {verdict}")
        others = [f"{k}: {ms(added_p50(latency, 'specdeck', k))} ms" for k in KINDS[1:]]
        others.append(f"one per target in turn: {ms(added_p50(cold, 'specdeck', kind))} ms")
        print(f"  ({'; '.join(others)})")
    if "litellm" in added and "specdeck" in added:
        verdict = "met" if added["specdeck"] < added["litellm"] else "MISSED"
        print(f"- below LiteLLM's added p50: {ms(added['specdeck'])} vs "
              f"{ms(added['litellm'])} ms: {verdict}")
    elif skipped:
        print(f"- below LiteLLM's added p50: not measured ({skipped})")


def captured_rows(database_url: str) -> tuple[int, int, int]:
    """Rows captured, and the drops (queue full, limits), over both capturing deployments."""
    import sqlalchemy as sa

    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            return tuple(conn.execute(sa.text(
                "SELECT coalesce(sum(d.num_conversations), 0), "
                "coalesce(sum(c.dropped_queue_full), 0), coalesce(sum(c.dropped_limit_reached), 0) "
                "FROM captures c JOIN datasets d ON d.id = c.dataset_id")).one())
    finally:
        engine.dispose()


def capture_report(latency: dict[str, Latencies], cold: dict[str, Latencies],
                   throughput: dict[str, dict[str, list[Throughput]]],
                   captured: tuple[int, int, int]) -> None:
    """Capture on (sample rate 1.0) beside capture off: the same gateway, the same upstream."""
    rows = []
    for label, result in (("in a row", latency), ("one per target in turn", cold)):
        for kind in KINDS:
            off, on = (percentile(result[n].samples[kind], 50) for n in ("specdeck", "capture"))
            rows.append([label, kind, ms(off), ms(on), f"{(on - off) * 1000:+.3f}",
                         f"{on / off:.3f}"])
    print("\nTraffic capture (sample rate 1.0) beside capture off, p50 (ms):\n")
    print(table(["order", "request", "capture off", "capture on", "added ms", "on / off"], rows))
    rows = []
    for scenario, per_target in throughput.items():
        off, on = median_rate(per_target["specdeck"]), median_rate(per_target["capture"])
        cpu = [statistics.median(run.cpu.get("proxy", 0.0) for run in per_target[n]) * 1e6
               for n in ("specdeck", "capture")]
        rows.append([scenario, f"{off:.0f}", f"{on:.0f}", f"{on / off:.1%}", f"{cpu[0]:.0f}",
                     f"{cpu[1]:.0f}"])
    print("\nThroughput with capture (requests/s, median of rounds; gateway CPU us per request):\n")
    print(table(["upstream", "capture off", "capture on", "on / off", "off us", "on us"], rows))
    added = added_p50(latency, "capture", KINDS[0]) - added_p50(latency, "specdeck", KINDS[0])
    verdict = "met" if added <= TARGET_CAPTURE_P50 else "MISSED"
    print(f"\n- capture adds <= {TARGET_CAPTURE_P50 * 1000:.1f} ms to the added p50 "
          f"({KINDS[0]}, in a row): {added * 1000:+.3f} ms: {verdict}")
    print(f"  rows captured: {captured[0]}; dropped: {captured[1]} (queue full), "
          f"{captured[2]} (limits)")


def summary(latency: dict[str, Latencies], throughput: dict[str, dict[str, list[Throughput]]],
            name: str) -> dict[str, float]:
    """One proxy's figures against its direct baseline (``BASELINE``: latency in a row) and the
    direct upstream (unpaced throughput). With another baseline than "direct", the added p50
    against "direct" too (``added_p50_ms_vs_direct``)."""
    def added(kind: str, q: float, base: str = baseline(name)) -> float:
        return (percentile(latency[name].samples[kind], q)
                - percentile(latency[base].samples[kind], q)) * 1000

    unpaced = throughput["unpaced"]
    proxy = statistics.median(run.cpu.get("proxy", 0.0) for run in unpaced[name])
    upstream = statistics.median(run.cpu.get("upstream", 0.0) for run in unpaced["direct"])
    figures = {"added_p50_ms": round(added(KINDS[0], 50), 4),
               "added_p99_ms": round(added(KINDS[0], 99), 4),
               "stream_added_p50_ms": round(added(KINDS[2], 50), 4),
               "proxy_cpu_us": round(proxy * 1e6, 1), "upstream_cpu_us": round(upstream * 1e6, 1),
               "proxy_cpu_ratio": round(proxy / upstream, 3) if upstream else math.nan,
               "unpaced_share_of_direct": round(median_rate(unpaced[name])
                                                / median_rate(unpaced["direct"]), 4)}
    if baseline(name) != "direct":
        figures["added_p50_ms_vs_direct"] = round(added(KINDS[0], 50, "direct"), 4)
    return figures


def targets_now(figures: dict[str, dict[str, float]]) -> None:
    """Issue 22's targets, for one API process, for two, and for two replicas."""
    print("\nIssue 22's targets (non-streaming latency in a row; unpaced throughput):")
    for name, f in figures.items():
        against = (f" (against {baseline(name)}; {f['added_p50_ms_vs_direct']:.3f} ms against "
                   "direct)" if "added_p50_ms_vs_direct" in f else "")
        checks = [(f"added p50 <= {TARGET_ADDED_P50_NOW * 1000:.2f} ms",
                   f"{f['added_p50_ms']:.3f} ms{against}",
                   f["added_p50_ms"] <= TARGET_ADDED_P50_NOW * 1000),
                  (f"proxy CPU <= {TARGET_CPU_RATIO:.0f}x the upstream's",
                   f"{f['proxy_cpu_us']:.0f} vs {f['upstream_cpu_us']:.0f} us "
                   f"({f['proxy_cpu_ratio']:.2f}x)", f["proxy_cpu_ratio"] <= TARGET_CPU_RATIO),
                  (f"unpaced >= {TARGET_UNPACED_SHARE:.0%} of direct",
                   f"{f['unpaced_share_of_direct']:.1%}",
                   f["unpaced_share_of_direct"] >= TARGET_UNPACED_SHARE)]
        for label, value, met in checks:
            print(f"- {name}: {label}: {value}: {'met' if met else 'MISSED'}")


# --- main --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true",
                        help="300 requests, 2 s x 2 rounds of throughput")
    parser.add_argument("--requests", type=int, help="measured requests per target and kind")
    parser.add_argument("--block", type=int, default=50,
                        help="latency: requests in a row per target (default 50)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, help="seconds per throughput run")
    parser.add_argument("--rounds", type=int, help="throughput rounds")
    parser.add_argument("--litellm", help="the litellm executable (default: var/litellm-venv)")
    parser.add_argument("--no-litellm", action="store_true")
    parser.add_argument("--vllm-router",
                        help="the vllm-router executable (default: var/vllm-router-venv)")
    parser.add_argument("--capture", action="store_true",
                        help="also measure the gateway with traffic capture on (sample rate 1.0): "
                        "a second deployment of the same upstream, a target of its own")
    parser.add_argument("--access-log", action="store_true",
                        help="log each chat completion in specdeck api's access log too "
                        "(SPECDECK_GATEWAY_ACCESS_LOG=true; as shipped, only its other "
                        "requests are logged)")
    parser.add_argument("--json", action="store_true",
                        help="print the figures of issue 22's targets as one JSON object, last")
    args = parser.parse_args(argv)
    requests = args.requests or (300 if args.quick else 2000)
    seconds = args.seconds or (2.0 if args.quick else 4.0)
    rounds = args.rounds or (2 if args.quick else 3)
    exit_on_sigterm()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    load_before, loop_before = load(), loop_ms()
    started = time.monotonic()
    litellm = None if args.no_litellm else find_peer(args.litellm, "litellm")
    router = find_peer(args.vllm_router, "vllm-router")
    if router is None:
        print("skipping vLLM's router: python3 -m venv var/vllm-router-venv && "
              "var/vllm-router-venv/bin/pip install vllm-router", flush=True)
    skipped = None
    if litellm is None:
        skipped = ("disabled with --no-litellm" if args.no_litellm else
                   "LiteLLM is not installed: python3 -m venv var/litellm-venv && "
                   "var/litellm-venv/bin/pip install 'litellm[proxy]'")
        print(f"skipping LiteLLM: {skipped}", flush=True)
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-gateway-") as tmp_name, \
            postgres_database("specdeck_bench_gateway") as database_url, \
            Processes(Path(tmp_name)) as procs:
        tmp = Path(tmp_name)
        upstream = start_upstream(procs, "upstream", "--tokens", str(TOKENS))
        paced = start_upstream(procs, "upstream-paced", "--tokens", str(PACED_TOKENS),
                               "--delay", str(PACE))
        upstream_b = start_upstream(procs, "upstream-b", "--tokens", str(TOKENS))
        paced_b = start_upstream(procs, "upstream-paced-b", "--tokens", str(PACED_TOKENS),
                                 "--delay", str(PACE))
        env, key = api_env(database_url, tmp)
        add_deployment(database_url, "bench", MODEL, upstream)
        add_deployment(database_url, "bench", PACED, paced)
        add_deployment(database_url, "bench", REPLICATED, upstream, replica_ports=[upstream_b])
        add_deployment(database_url, "bench", PACED_REPLICATED, paced, replica_ports=[paced_b])
        if args.capture:
            add_deployment(database_url, "bench", CAPTURED, upstream, capture=True)
            add_deployment(database_url, "bench", PACED_CAPTURED, paced, capture=True)
        api_ports = {}
        for name, workers in (("specdeck-api", 1), ("specdeck-api-2p", 2)):
            api_ports[name] = free_port()
            argv_api = [str(Path(sys.executable).parent / "specdeck"), "api", "--host", HOST,
                        "--port", str(api_ports[name]), "--workers", str(workers)]
            # As shipped: uvicorn's access log on, the completions left out of it (unless
            # --access-log).
            procs.start(name, argv_api, {**env, "SPECDECK_GATEWAY_ACCESS_LOG": "true"}
                        if args.access_log else env)
        for name, port in api_ports.items():
            wait_http(procs, name, f"http://{HOST}:{port}/healthz", 60)
        api_port = api_ports["specdeck-api"]
        bare = start_bare_proxy(procs, upstream)
        pids = {proc.name: proc.proc.pid for proc in procs.children}
        targets = [Target("direct", upstream, UPSTREAM_KEY, pids["upstream"]),
                   Target("direct-2r", upstream, UPSTREAM_KEY, pids["upstream"],
                          other_port=upstream_b),
                   Target("bare-proxy", bare, UPSTREAM_KEY, pids["bare-proxy"]),
                   Target("specdeck", api_port, key, pids["specdeck-api"]),
                   Target("specdeck-2p", api_ports["specdeck-api-2p"], key,
                          pids["specdeck-api-2p"]),
                   Target("specdeck-2r", api_port, key, pids["specdeck-api"], REPLICATED)]
        if args.capture:
            targets.append(Target("capture", api_port, key, pids["specdeck-api"], CAPTURED))
        if litellm is not None:
            print(f"starting LiteLLM's proxy ({litellm}) ...", flush=True)
            litellm_port = start_litellm(procs, litellm, tmp, {MODEL: upstream, PACED: paced})
            litellm_pid = next(p.proc.pid for p in procs.children if p.name == "litellm")
            targets.append(Target("litellm", litellm_port, LITELLM_KEY, litellm_pid))
        if router is not None:
            router_port = start_vllm_router(procs, router, upstream)
            router_pid = next(p.proc.pid for p in procs.children if p.name == "vllm-router")
            targets.append(Target("vllm-router", router_port, UPSTREAM_KEY, router_pid))
        print(f"[{time.monotonic() - started:5.1f} s] processes ready", flush=True)
        # The paced upstream serves PACED; the direct target reaches it on its own port.
        paced_models = {"capture": PACED_CAPTURED, "specdeck-2r": PACED_REPLICATED}
        unpaced_only = {"bare-proxy", "vllm-router"}  # they forward to the unpaced upstream only
        # Throughput is taken against the one direct upstream (direct-2r is a latency baseline).
        unpaced_targets = [t for t in targets if t.other_port is None]
        paced_targets = [Target(t.name, paced, t.key, pids["upstream-paced"]) if t.name == "direct"
                         else Target(t.name, t.port, t.key, t.pid, paced_models[t.name])
                         if t.name in paced_models else t for t in unpaced_targets
                         if t.name not in unpaced_only]
        latency, cold, throughput = asyncio.run(measure_all(
            targets, unpaced_targets, paced_targets, requests, min(50, requests), args.block,
            args.concurrency, seconds, rounds,
            {"paced": [pids["upstream-paced"], pids["upstream-paced-b"]],
             "unpaced": [pids["upstream"], pids["upstream-b"]]}))
        for proc in procs.children:
            proc.check_alive()
        captured = captured_rows(database_url) if args.capture else None
    command = " ".join([".venv/bin/python", "benchmarks/gateway.py", *(argv or sys.argv[1:])])
    report(latency, cold, throughput, command, load_before, loop_before, args.concurrency,
           args.block, skipped)
    if captured is not None:
        capture_report(latency, cold, throughput, captured)
    figures = {name: summary(latency, throughput, name)
               for name in ("specdeck", "specdeck-2p", "specdeck-2r")}
    targets_now(figures)
    peers = {"litellm": ({"added_p50_ms": round(added_p50(latency, "litellm", KINDS[0]) * 1000, 4)}
                         if "litellm" in latency else None),
             "vllm_router": ({k: v for k, v in summary(latency, throughput, "vllm-router").items()
                              if k in ("added_p50_ms", "proxy_cpu_us", "stream_added_p50_ms")}
                             if "vllm-router" in latency else None)}
    if peers["vllm_router"] is not None:
        against_router(figures["specdeck"], peers["vllm_router"])
    print(f"\n(total {time.monotonic() - started:.0f} s)")
    if args.json:
        print(json.dumps({**figures["specdeck"], "two_api_processes": figures["specdeck-2p"],
                          "two_replicas": figures["specdeck-2r"],
                          "bare_proxy_added_p50_ms": round(
                              added_p50(latency, "bare-proxy", KINDS[0]) * 1000, 4),
                          "peers": peers, "machine": machine(), "command": command}))


# Issue 60: the gateway against vLLM's router in the same run, as ratios (must; aim 1.5x).
AGAINST_ROUTER = (("added p50", "added_p50_ms", 3.0), ("proxy CPU a request", "proxy_cpu_us", 3.0),
                  ("whole stream's added p50", "stream_added_p50_ms", 2.0))
AIM = 1.5


def against_router(specdeck: dict[str, float], router: dict[str, float]) -> None:
    print("\nAgainst vLLM's router (vllm-router, the same run; issue 60: must, aim "
          f"{AIM:.1f}x):")
    for label, key, most in AGAINST_ROUTER:
        ratio = specdeck[key] / router[key] if router[key] > 0 else math.inf
        verdict = "met" if ratio <= most else "MISSED"
        aim = "the aim met" if ratio <= AIM else "above the aim"
        print(f"- {label}: {specdeck[key]:.3f} vs {router[key]:.3f} ({ratio:.2f}x; <= "
              f"{most:.0f}x: {verdict}; {aim})")


async def measure_all(
        targets: list[Target], unpaced_targets: list[Target], paced_targets: list[Target],
        requests: int, warmup: int,
        block: int, concurrency: int, seconds: float, rounds: int,
        upstream_pids: dict[str, list[int]],
) -> tuple[dict[str, Latencies], dict[str, Latencies], dict[str, dict[str, list[Throughput]]]]:
    print(f"latency: {warmup} warm-up + {requests} requests per kind and target, {block} in a "
          "row", flush=True)
    latency = await measure_latency(targets, requests, warmup, block)
    cold_requests = max(100, requests // 4)
    print(f"latency: {cold_requests} requests per kind and target, one per target in turn",
          flush=True)
    cold = await measure_latency(targets, cold_requests, 0, 1)
    throughput: dict[str, dict[str, list[Throughput]]] = {}
    for scenario, model, group in (("paced", PACED, paced_targets),
                                   ("unpaced", MODEL, unpaced_targets)):
        throughput[scenario] = {t.name: [] for t in group}
        for r in range(rounds):
            for target in group:
                value = await measure_throughput(target, model, concurrency, seconds, 200_000,
                                                 upstream_pids[scenario])
                throughput[scenario][target.name].append(value)
                print(f"  throughput, {scenario}, round {r + 1}: {target.name} "
                      f"{value.rate:.0f} req/s", flush=True)
    return latency, cold, throughput


if __name__ == "__main__":
    main()
