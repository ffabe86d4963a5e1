"""The floors under the gateway's added latency: proxies that do less and less, side by side.

On a small VM, a proxy's added latency is mostly not its own work: a request through a proxy
wakes two more processes than a request sent direct, and on this machine that costs more than
most of what the gateway does (docs/benchmarks.md). This script puts the gateway next to the
proxies that do less, in one stack, against the same upstream (``tests/support/upstream.py``),
so that each layer's cost can be read off one run:

* direct: the upstream itself;
* socat: a byte relay in C (``socat``, if on the PATH; each connection relayed by a process of
  its own): two more processes woken per request, and next to nothing else;
* raw-proxy: a proxy in Python with no server framework (this file, ``--raw-proxy``): an
  asyncio protocol that parses the request with httptools, forwards its body with the gateway's
  upstream client and writes the answer in one write;
* bare-direct: ``benchmarks/bare_proxy.py`` on `specdeck api`'s protocol (``app.server``): the
  same forwarding, in uvicorn, answered as the gateway's route is (its direct route);
* bare-asgi: the same app on uvicorn's own protocol, the ASGI way (``gateway.py``'s bare-proxy);
* specdeck: a real ``specdeck api`` in front of the upstream (a key, a project and a ready
  deployment: what ``gateway.py`` measures).

Requests one at a time, non-streaming, 50 in a row per target, the targets in turn, several
rounds; added p50 per round and the median of rounds, and each Python proxy's CPU per request
from /proc. ``--cpu N`` runs every process started here on CPU N: no request then waits for a
process to wake on another CPU, and the added latency becomes the CPU spent on the request's
way.

    .venv/bin/python benchmarks/proxy_floor.py [--rounds 5] [--requests 1000] [--cpu 0]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gateway as bench  # noqa: E402
from _stack import (  # noqa: E402
    HOST,
    Processes,
    base_env,
    free_port,
    load,
    machine,
    percentile,
    postgres_database,
    table,
)
from gateway_ab import calls_per_target, prepare, start_api  # noqa: E402

KIND = bench.KINDS[0]  # non-streaming


def raw_proxy(port: int, upstream: str, key: str) -> None:
    """Serve the raw proxy on ``port`` until killed."""
    import httptools
    import uvloop

    from app.services.upstream import UpstreamClient

    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    client: list[UpstreamClient] = []

    class Proxy(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]
            self.parser = httptools.HttpRequestParser(self)
            self.url, self.body = b"", b""

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            body, self.body = self.body, b""
            if self.url == b"/health":
                self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            else:
                asyncio.get_running_loop().create_task(self.forward(body))

        async def forward(self, body: bytes) -> None:
            if not client:
                client.append(UpstreamClient(connect_timeout=5, read_timeout=60,
                                             max_connections=100))
            response = await client[0].send(upstream, headers, body, {}, "raw")
            try:
                answer = await response.read()
            finally:
                response.close()
            content_type = response.headers.get("content-type", "").encode()
            self.transport.write(b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\ncontent-length: %d"
                                 b"\r\n\r\n%s" % (response.status, content_type, len(answer),
                                                  answer))

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Proxy, HOST, port)
        await server.serve_forever()

    uvloop.run(serve())


def start_proxies(procs: Processes, upstream: int) -> list[bench.Target]:
    """Every proxy but specdeck, in front of ``upstream``."""
    url = f"http://{HOST}:{upstream}/v1/chat/completions"
    env = base_env(BARE_PROXY_UPSTREAM=url, BARE_PROXY_KEY=bench.UPSTREAM_KEY)
    targets = []
    socat = shutil.which("socat")
    if socat:
        port = free_port()
        proc = procs.start("socat", [socat, f"TCP-LISTEN:{port},bind={HOST},reuseaddr,fork,nodelay",
                                     f"TCP:{HOST}:{upstream},nodelay"], env)
        targets.append(bench.Target("socat", port, bench.UPSTREAM_KEY, proc.proc.pid))
    else:
        print("skipping socat: not on the PATH (apt-get install socat)")
    port = free_port()
    proc = procs.start("raw-proxy", [sys.executable, __file__, "--raw-proxy", str(port), url],
                       env)
    bench.wait_http(procs, "raw-proxy", f"http://{HOST}:{port}/health", 30)
    targets.append(bench.Target("raw-proxy", port, bench.UPSTREAM_KEY, proc.proc.pid))
    for name, http in (("bare-direct", "app.server:HttpProtocol"), ("bare-asgi", "httptools")):
        port = free_port()
        proc = procs.start(name, [sys.executable, "-m", "uvicorn", "benchmarks.bare_proxy:app",
                                  "--host", HOST, "--port", str(port), "--loop", "uvloop",
                                  "--http", http, "--no-proxy-headers", "--no-server-header",
                                  "--no-access-log", "--log-level", "warning"], env)
        bench.wait_http(procs, name, f"http://{HOST}:{port}/health", 30)
        targets.append(bench.Target(name, port, bench.UPSTREAM_KEY, proc.proc.pid))
    return targets


async def one_round(targets: list[bench.Target], requests: int
                    ) -> tuple[dict[str, tuple[float, float]], dict[str, float]]:
    """(p50, p99) per target, and each Python proxy's CPU seconds per request."""
    pids = {t.name: t.pid for t in targets if t.name not in ("direct", "socat")}
    before = {name: bench.cpu_seconds(pid) for name, pid in pids.items()}
    latency = await bench.measure_latency(targets, requests, 20, 50)
    calls = calls_per_target(requests, 20, 50)
    cpu = {name: (bench.cpu_seconds(pid) - before[name]) / calls for name, pid in pids.items()}
    return ({t.name: (percentile(latency[t.name].samples[KIND], 50),
                      percentile(latency[t.name].samples[KIND], 99)) for t in targets}, cpu)


def report(rounds: list[tuple[dict[str, tuple[float, float]], dict[str, float]]],
           names: list[str]) -> None:
    proxies = [n for n in names if n != "direct"]

    def added(p: dict[str, tuple[float, float]], name: str, i: int) -> float:
        return p[name][i] - p["direct"][i]

    rows: list[list[object]] = [
        [i, f"{p['direct'][0] * 1000:.3f}", *(f"{added(p, n, 0) * 1000:.3f}" for n in proxies)]
        for i, (p, _) in enumerate(rounds, start=1)]
    medians = {n: statistics.median(added(p, n, 0) for p, _ in rounds) for n in proxies}
    rows.append(["median", f"{statistics.median(p['direct'][0] for p, _ in rounds) * 1000:.3f}",
                 *(f"{medians[n] * 1000:.3f}" for n in proxies)])
    print(f"\n{KIND}: direct's p50, and each proxy's added p50 (ms):\n")
    print(table(["round", "direct p50", *proxies], rows))
    base = medians["bare-asgi"]
    print("\nMedian of rounds, against the bare ASGI proxy (the gateway's floor before):\n")
    summary = []
    for name in proxies:
        cpu = [c[name] for _, c in rounds if name in c]
        summary.append([name, f"{medians[name] * 1000:.3f}",
                        f"{statistics.median(added(p, name, 1) for p, _ in rounds) * 1000:.3f}",
                        f"{(medians[name] - base) * 1e6:+.1f}",
                        f"{medians[name] / base:.2f}x" if base > 0 else "-",
                        f"{statistics.median(cpu) * 1e6:.0f}" if cpu else "-"])
    print(table(["proxy", "added p50 (ms)", "added p99 (ms)", "vs bare-asgi (us)",
                 "ratio to bare-asgi", "its CPU a request (us)"], summary))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1000,
                        help="measured requests per target, kind and round (default 1000)")
    parser.add_argument("--cpu", type=int, help="run every process started here on this CPU")
    parser.add_argument("--raw-proxy", nargs=2, metavar=("PORT", "UPSTREAM_URL"),
                        help=argparse.SUPPRESS)  # how the script starts its raw proxy
    args = parser.parse_args(argv)
    if args.raw_proxy:
        raw_proxy(int(args.raw_proxy[0]), args.raw_proxy[1], os.environ["BARE_PROXY_KEY"])
        return
    load_before = prepare(args.cpu)
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-floor-") as tmp_name, \
            postgres_database("specdeck_bench_floor") as database_url, \
            Processes(Path(tmp_name)) as procs:
        upstream = bench.start_upstream(procs, "upstream", "--tokens", str(bench.TOKENS))
        targets = [bench.Target("direct", upstream, bench.UPSTREAM_KEY),
                   *start_proxies(procs, upstream)]
        env, key = bench.api_env(database_url, Path(tmp_name))
        bench.add_deployment(database_url, "bench", bench.MODEL, upstream)
        port, pid = start_api(procs, "specdeck", env)
        targets.append(bench.Target("specdeck", port, key, pid))
        rounds = []
        for i in range(args.rounds):
            rounds.append(asyncio.run(one_round(targets, args.requests)))
            print(f"round {i + 1}: " + ", ".join(
                f"{name} {p50 * 1000:.3f} ms" for name, (p50, _) in rounds[-1][0].items()),
                flush=True)
        for proc in procs.children:
            proc.check_alive()
    pinned = f"; every process started here on CPU {args.cpu}" if args.cpu is not None else ""
    print(f"\n.venv/bin/python benchmarks/proxy_floor.py {' '.join(argv or sys.argv[1:])}\n"
          f"{machine()}{pinned}; {args.requests} requests per target and round, 50 in a row; "
          f"1-minute load average {load_before:.2f} before, {load():.2f} after")
    report(rounds, [t.name for t in targets])


if __name__ == "__main__":
    main()
