"""The gateway's code against another commit's, side by side in one run.

On a shared 2-core VM, ``benchmarks/gateway.py``'s added p50 moves by tens of microseconds from
one run to the next, even the bare proxy's (docs/benchmarks.md): two runs cannot tell whether a
change saved 10 us. This script starts two ``specdeck api`` processes in one stack, in front of
the same upstreams: the working tree's ("tree") and REF's ("ref": ``git archive REF app
workers`` unpacked in a temporary directory, first on its PYTHONPATH; the database is migrated
by the tree, so REF must share its schema). The targets are taken in turn, 50 requests in a row
each, for several rounds, and the difference is read within each round, where the machine's
state was the same for both: tree - ref per round, and its median. Every other round, ref's
targets go before tree's. Run it with ``--ref HEAD`` on a clean tree to see what the machine's
noise alone gives (an A/A run).

Targets: direct (the upstream), tree and ref (a one-replica deployment), and with
``--replicas`` direct-2r, tree-2r and ref-2r (two replicas; direct-2r takes the two upstreams
in turn). Also the CPU time each API process spent per request (from /proc).

``--cpu N`` runs every process the script starts (upstreams, APIs and its own client) on CPU N.
No request then waits for a process to wake on another CPU, which on a VM is most of the noise
and much of the latency (docs/benchmarks.md, "Pinned to one CPU"): the latency becomes the sum
of the CPU time spent on a request's way, and a change of a few microseconds shows. Postgres
and Redis are the machine's and stay where they are.

    .venv/bin/python benchmarks/gateway_ab.py --ref HEAD~1 [--cpu 0] [--replicas] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gateway as bench  # noqa: E402
from _stack import (  # noqa: E402
    HOST,
    ROOT,
    SPECDECK,
    Processes,
    exit_on_sigterm,
    free_port,
    load,
    machine,
    percentile,
    postgres_database,
    table,
)

KINDS = (bench.KINDS[0], bench.KINDS[2])  # non-streaming; a stream, whole
SWAP = {"tree": "ref", "ref": "tree", "tree-2r": "ref-2r", "ref-2r": "tree-2r"}


def unpack(ref: str, into: Path) -> Path:
    """REF's ``app`` and ``workers`` under ``into``."""
    archive = subprocess.run(["git", "archive", ref, "app", "workers"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def start_api(procs: Processes, name: str, env: dict[str, str]) -> tuple[int, int]:
    port = free_port()
    proc = procs.start(name, [SPECDECK, "api", "--host", HOST, "--port", str(port),
                              "--no-access-log"], env)
    bench.wait_http(procs, name, f"http://{HOST}:{port}/healthz", 60)
    return port, proc.proc.pid


def prepare(cpu: int | None) -> float:
    """Before a run: SIGTERM exits through the clean-ups, every process started from here on
    runs on ``cpu`` (if given), asyncio runs on uvloop; returns the load average before."""
    exit_on_sigterm()
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # inherited by every process started below
    import uvloop

    uvloop.install()
    return load()


def calls_per_target(requests: int, warmup: int, block: int) -> int:
    """What ``bench.measure_latency`` sends each target: both kinds, warm-up and skipped."""
    return 2 * (warmup + requests + 3 * -(-requests // block))


async def one_round(targets: list[bench.Target], requests: int, warmup: int, block: int,
                    pids: dict[str, int]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """p50 per target and kind (seconds), and each API process's CPU seconds per request."""
    before = {name: bench.cpu_seconds(pid) for name, pid in pids.items()}
    latency = await bench.measure_latency(targets, requests, warmup, block)
    calls = calls_per_target(requests, warmup, block)
    served = {name: sum(calls for t in targets if t.pid == pid) for name, pid in pids.items()}
    cpu = {name: (bench.cpu_seconds(pid) - before[name]) / served[name]
           for name, pid in pids.items()}
    p50 = {t.name: {kind: percentile(latency[t.name].samples[kind], 50) for kind in KINDS}
           for t in targets}
    return p50, cpu


def us(seconds: float) -> str:
    return f"{seconds * 1e6:+.1f}"


def report(rounds: list[tuple[dict[str, dict[str, float]], dict[str, float]]],
           pairs: list[tuple[str, str, str]]) -> None:
    """Per round and in median: each target's added p50, and tree - ref."""
    for kind in KINDS:
        rows = []
        for i, (p50, _) in enumerate(rounds, start=1):
            row: list[object] = [i]
            for tree, ref, base in pairs:
                row += [f"{(p50[tree][kind] - p50[base][kind]) * 1000:.3f}",
                        f"{(p50[ref][kind] - p50[base][kind]) * 1000:.3f}",
                        us(p50[tree][kind] - p50[ref][kind])]
            rows.append(row)
        medians: list[object] = ["median"]
        for tree, ref, _ in pairs:
            diffs = [p50[tree][kind] - p50[ref][kind] for p50, _ in rounds]
            faster = sum(d < 0 for d in diffs)
            medians += ["", "", f"{us(statistics.median(diffs))} ({faster} of {len(diffs)} "
                        "rounds faster)"]
        rows.append(medians)
        headers = ["round"]
        for tree, ref, base in pairs:
            headers += [f"{tree} added (ms)", f"{ref} added (ms)", f"{tree} - {ref} (us)"]
        print(f"\n{kind}, p50 added to {', '.join(sorted({b for *_, b in pairs}))}:\n")
        print(table(headers, rows))
    names = list(rounds[0][1])
    rows = [[i, *(f"{cpu[n] * 1e6:.0f}" for n in names)]
            for i, (_, cpu) in enumerate(rounds, start=1)]
    rows.append(["median", *(f"{statistics.median(c[n] for _, c in rounds) * 1e6:.0f}"
                             for n in names)])
    print("\nCPU per request of each API process (us), all its targets and kinds:\n")
    print(table(["round", *names], rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ref", default="HEAD", help="the commit to compare with (default HEAD)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1000,
                        help="measured requests per target, kind and round (default 1000)")
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument("--cpu", type=int, help="run every process started here on this CPU")
    parser.add_argument("--replicas", action="store_true",
                        help="also a deployment with two replicas (and direct-2r)")
    args = parser.parse_args(argv)
    load_before = prepare(args.cpu)
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-ab-") as tmp_name, \
            postgres_database("specdeck_bench_ab") as database_url, \
            Processes(Path(tmp_name)) as procs:
        tmp = Path(tmp_name)
        ref_dir = unpack(args.ref, tmp / "ref")
        upstream = bench.start_upstream(procs, "upstream", "--tokens", str(bench.TOKENS))
        upstream_b = bench.start_upstream(procs, "upstream-b", "--tokens", str(bench.TOKENS))
        env, key = bench.api_env(database_url, tmp)
        bench.add_deployment(database_url, "bench", bench.MODEL, upstream)
        bench.add_deployment(database_url, "bench", bench.REPLICATED, upstream,
                             replica_ports=[upstream_b])
        tree_port, tree_pid = start_api(procs, "tree", env)
        ref_port, ref_pid = start_api(procs, "ref", {**env, "PYTHONPATH": str(ref_dir)})
        targets = [bench.Target("direct", upstream, bench.UPSTREAM_KEY),
                   bench.Target("tree", tree_port, key, tree_pid),
                   bench.Target("ref", ref_port, key, ref_pid)]
        pairs = [("tree", "ref", "direct")]
        if args.replicas:
            targets += [bench.Target("direct-2r", upstream, bench.UPSTREAM_KEY,
                                     other_port=upstream_b),
                        bench.Target("tree-2r", tree_port, key, tree_pid, bench.REPLICATED),
                        bench.Target("ref-2r", ref_port, key, ref_pid, bench.REPLICATED)]
            pairs.append(("tree-2r", "ref-2r", "direct-2r"))
        by_name = {t.name: t for t in targets}
        rounds = []
        for i in range(args.rounds):
            # Every other round ref goes first: whatever a target gains or loses by its place
            # in the turn (a warmer cache after the target before it) falls on both alike.
            order = targets if i % 2 == 0 else [by_name[SWAP.get(t.name, t.name)]
                                                for t in targets]
            rounds.append(asyncio.run(one_round(order, args.requests, 20, args.block,
                                                {"tree": tree_pid, "ref": ref_pid})))
            p50 = rounds[-1][0]
            print(f"round {i + 1}: " + ", ".join(
                f"{name} {p50[name][KINDS[0]] * 1000:.3f} ms" for name in p50), flush=True)
        for proc in procs.children:
            proc.check_alive()
    pinned = f", every process started here on CPU {args.cpu}" if args.cpu is not None else ""
    print(f"\n.venv/bin/python benchmarks/gateway_ab.py {' '.join(argv or sys.argv[1:])}\n"
          f"{machine()}; tree: the working tree, ref: {args.ref}{pinned}; {args.requests} "
          f"requests per target, kind and round, {args.block} in a row; 1-minute load average "
          f"{load_before:.2f} before, {load():.2f} after")
    report(rounds, pairs)


if __name__ == "__main__":
    main()
