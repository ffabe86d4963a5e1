"""The gateway's upstream hop: its own client (app.services.upstream) beside aiohttp's.

One process of the benchmark upstream (``tests/support/upstream.py``, fixed tokens, on uvicorn)
and, in this process, the two clients taking turns: ``--rounds`` rounds of ``--requests``
non-streaming chat completions one at a time over a keep-alive connection (after 100 not
counted), then the same streaming. Per client: the wall time a request took (median of the
rounds) and the CPU time this process spent on it (the client's own cost: the upstream's is
the same for both). Prints the ratios, ours over aiohttp's.

aiohttp is not a SpecDeck dependency since 2026-12-04; the local runtime installs it with
speculators. Without it the script measures our client alone and says so.

    .venv/bin/python benchmarks/upstream_client.py [--requests 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _stack import HOST, Processes, exit_on_sigterm, load, machine, wall_cpu_table  # noqa: E402
from gateway import UPSTREAM_KEY, start_upstream  # noqa: E402

from app.services.upstream import UpstreamClient  # noqa: E402

HEADERS = {"Content-Type": "application/json", "Accept": "*/*", "Accept-Encoding": "identity",
           "User-Agent": "specdeck-gateway", "Authorization": f"Bearer {UPSTREAM_KEY}"}
Send = Callable[[bytes], Awaitable[bytes]]


def body(stream: bool) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "Measure."}],
                       "max_tokens": 8, "stream": stream}).encode()


async def ours(url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    client, inflight = UpstreamClient(5.0, 30.0, 64), {}

    async def send(content: bytes) -> bytes:
        response = await client.send(url, HEADERS, content, inflight, "bench")
        try:
            return await response.read()
        finally:
            response.close()

    return send, client.aclose


async def aiohttp_client(url: str) -> tuple[Send, Callable[[], Awaitable[None]]]:
    import aiohttp

    # As the gateway configured it until 2026-12-04: one session, a per-read timeout, no
    # decompression, every header it would add sent already.
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=64, keepalive_timeout=4.0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=30.0),
        auto_decompress=False)

    async def send(content: bytes) -> bytes:
        async with session.post(url, data=content, headers=HEADERS) as response:
            return await response.read()

    return send, session.close


async def measure(make: Callable[[str], Awaitable[tuple[Send, Callable[[], Awaitable[None]]]]],
                  url: str, stream: bool, requests: int) -> tuple[float, float]:
    """Seconds of wall and of this process's CPU per request."""
    send, close = await make(url)
    content = body(stream)
    try:
        for _ in range(100):
            await send(content)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(requests):
            answer = await send(content)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if not (answer.rstrip().endswith(b"[DONE]") if stream else b'"choices"' in answer):
            raise RuntimeError(f"unexpected answer: {answer[:300]!r}")
    finally:
        await close()
    return wall / requests, cpu / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    exit_on_sigterm()
    import uvloop

    uvloop.install()
    clients: dict[str, Callable[[str], Awaitable[tuple[Send, Callable[[], Awaitable[None]]]]]]
    clients = {"specdeck": ours}
    try:
        import aiohttp  # noqa: F401

        clients["aiohttp"] = aiohttp_client
    except ImportError:
        print("aiohttp is not installed: measuring SpecDeck's client alone")
    before = load()
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    import tempfile

    with tempfile.TemporaryDirectory(prefix="specdeck-bench-client-") as tmp, \
            Processes(Path(tmp)) as procs:
        port = start_upstream(procs, "upstream", "--tokens", "8")
        url = f"http://{HOST}:{port}/v1/chat/completions"
        for r in range(args.rounds):
            for kind, stream in (("non-streaming", False), ("streaming", True)):
                for name, make in clients.items():
                    wall, cpu = asyncio.run(measure(make, url, stream, args.requests))
                    results.setdefault((kind, name), []).append((wall, cpu))
                    print(f"  round {r + 1}, {kind}, {name}: {wall * 1e6:.0f} us wall, "
                          f"{cpu * 1e6:.0f} us CPU a request", flush=True)
    print(f"\n{machine()}; 1-minute load average {before:.2f} before, {load():.2f} after")
    print(f"{args.requests} requests a round, {args.rounds} rounds, one at a time; medians\n")
    print(wall_cpu_table(results, ["non-streaming", "streaming"], list(clients), "request"))

if __name__ == "__main__":
    main()
