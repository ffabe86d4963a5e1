"""How long the local runtime's vLLM hidden-states server takes to start, side by side: the
command the worker runs (app.runtimes.vllm.verifier_server_argv with CPU_ENV: vLLM's API server
through workers/runtimes/local/serve.py, which forks the engine core), the same arguments to
vLLM's API server module itself (its CPU platform spawns the engine core, a fresh Python), and
that with vLLM's default CPU executor as well (VLLM_ENABLE_V1_MULTIPROCESSING=1: the engine core
spawns a separate worker process too); and the worker's command with a KV cache of 1 GiB (the
default SPECDECK_LOCAL_KV_CACHE_BYTES, which vLLM allocates and zeroes at the start) against one
of 64 MiB (what the tests' demo verifier gets). Each start is timed from spawn to /health 200, then
one trainer-style request (prompt ids, one token) must write its hidden-states file; the CPU
seconds are those of the server's processes by then (user and system).

    .venv/bin/python benchmarks/vllm_start.py                 # the demo verifier, 3 rounds
    .venv/bin/python benchmarks/vllm_start.py --model DIR --rounds 5
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.runtimes import JobPaths  # noqa: E402
from app.runtimes.vllm import CPU_ENV, CPU_SERVER_MODULE, verifier_server_argv  # noqa: E402
from app.schemas.job_spec import JobSpec  # noqa: E402
from app.settings import Settings  # noqa: E402
from benchmarks._stack import free_port, load, machine, ratio, table  # noqa: E402

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
GiB, MiB = 1 << 30, 1 << 20
# name: (the module after `python -m`, environment on top of CPU_ENV, the KV cache's bytes)
VARIANTS = {"worker's command (engine core forked)": (CPU_SERVER_MODULE, {}, GiB),
            "vLLM's module (engine core spawned)": (VLLM_MODULE, {}, GiB),
            "vLLM's module, default executor":
                (VLLM_MODULE, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, GiB),
            "worker's command, KV cache 64 MiB": (CPU_SERVER_MODULE, {}, 64 * MiB)}
HZ = os.sysconf("SC_CLK_TCK")


def server_argv(model: Path, layers: int, work: Path, port: int) -> list[str]:
    """The worker's command for a hidden-states server of ``model`` on ``port``."""
    paths = JobPaths.for_job(Settings(work_root=work, logs_root=work), f"bench-{port}")
    spec = JobSpec.load({
        "verifier": str(model), "dataset": "-", "runtime": "local",
        "verifier_info": {"reference": str(model), "source": "local", "num_hidden_layers": layers,
                          "hidden_size": 0, "vocab_size": 0},  # not read by this command
        "speculator": {"target_layer_ids": [2, layers // 2, layers - 3]}})
    return verifier_server_argv(spec, paths, port, cpu=True)


def start_once(model: Path, layers: int, module: str, extra_env: dict[str, str], kv_bytes: int,
               work: Path) -> tuple[float, float, float, float]:
    """Seconds to /health 200, and to the first hidden-states file after that; the server's
    user and system CPU seconds by then."""
    port = free_port()
    argv = server_argv(model, layers, work, port)
    argv[argv.index(CPU_SERVER_MODULE)] = module
    argv[argv.index("--kv-cache-memory-bytes") + 1] = str(kv_bytes)
    cpu: list[float] = []
    healthy, written = time_server(argv, {**os.environ, **CPU_ENV, **extra_env}, model, work, port,
                                   keep=lambda proc: cpu.extend(session_cpu(proc.pid)))
    return healthy, written, *cpu


def session_cpu(sid: int) -> tuple[float, float]:
    """User and system CPU seconds of the live processes of session ``sid``."""
    user = system = 0
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:
            user, system = user + int(fields[11]), system + int(fields[12])
    return user / HZ, system / HZ


def time_server(argv: list[str], env: dict[str, str], model: Path, work: Path, port: int,
                keep: Callable[[subprocess.Popen[bytes]], None] | None = None
                ) -> tuple[float, float]:
    """Start ``argv`` (a hidden-states server on ``port``) in a session of its own: seconds to
    /health 200, and to the first hidden-states file after that. Then ``keep(proc)`` if given,
    and SIGTERM to its group."""
    log = (work / f"server-{port}.log").open("w")
    began = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}: see {log.name}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        healthy = time.perf_counter() - began
        response = httpx.post(f"{base}/v1/completions", timeout=120, json={
            "model": str(model), "prompt": list(range(1, 17)), "max_tokens": 1})
        response.raise_for_status()
        written = Path(response.json()["kv_transfer_params"]["hidden_states_path"])
        while not written.exists():
            time.sleep(0.01)
        timings = healthy, time.perf_counter() - began - healthy
        if keep is not None:
            keep(proc)
        return timings
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
        log.close()


def demo_model(work: Path) -> Path:
    from workers.runtimes.local.demo import create_demo_model

    return create_demo_model(work / "demo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a verifier directory (default: the demo's)")
    parser.add_argument("--layers", type=int, default=12, help="its number of hidden layers")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specdeck-vllm-start-") as tmp:
        work = Path(tmp)
        model = args.model or demo_model(work)
        times: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):  # interleaved, so a busy moment hits both alike
            for name, (module, env, kv_bytes) in VARIANTS.items():
                times[name].append(start_once(model, args.layers, module, env, kv_bytes, work))
        medians = {name: statistics.median(r[0] for r in rows) for name, rows in times.items()}
        cpu = {name: (statistics.median(r[2] for r in rows), statistics.median(r[3] for r in rows))
               for name, rows in times.items()}
        print(f"{machine()}, load {load():.2f}\n")
        print(table(["variant", f"healthy after (median of {args.rounds})", "each",
                     "first hidden-states file after", "CPU by then: user + system"],
                    [[name, f"{medians[name]:.1f} s", ", ".join(f"{r[0]:.1f}" for r in rows),
                      f"{statistics.median(r[1] for r in rows):.2f} s",
                      f"{cpu[name][0]:.1f} + {cpu[name][1]:.1f} s"]
                     for name, rows in times.items()]))
        ours, spawned, default, small = medians.values()
        print(f"\nthe worker's command starts in {ratio(ours, spawned)} the time of vLLM's "
              f"module with the same flags, {ratio(ours, default)} that of its default executor")
        big_kv = cpu["worker's command (engine core forked)"]
        small_kv = cpu["worker's command, KV cache 64 MiB"]
        print(f"a KV cache of 64 MiB: {ratio(small, ours)} the start, "
              f"{ratio(sum(small_kv), sum(big_kv))} the CPU and {ratio(small_kv[1], big_kv[1])} "
              f"the system CPU of 1 GiB's")


if __name__ == "__main__":
    main()
