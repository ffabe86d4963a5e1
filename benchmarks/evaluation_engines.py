"""How long the evaluating stage waits for its engines on the local runtime, side by side: two
of them (the n-gram baseline and the verifier alone, the worker's own commands from
``app.runtimes.evaluation_command``) started one after the other, each once the previous one
was ready and stopped (as every evaluation did before, and as the GPU runtime still does), and
the two started together, waited for until both are ready (``workers.pipeline.evaluate``'s
``engines_at_once`` on the local runtime). Timed from the first spawn to the last engine's
model listed by ``/v1/models``; interleaved rounds.

    .venv/bin/python benchmarks/evaluation_engines.py                 # the demo verifier, 3 rounds
    .venv/bin/python benchmarks/evaluation_engines.py --model DIR --rounds 5
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
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.runtimes import EVALUATION_MODEL, evaluation_command  # noqa: E402
from benchmarks._stack import free_port, load, machine, ratio, table  # noqa: E402
from benchmarks.vllm_start import demo_model  # noqa: E402

KEY = "benchmark-key"
METHODS = ("ngram", None)  # the two baselines: neither needs a trained drafter


def spawn(model: Path, method: str | None, work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    spec = {"verifier_info": {"reference": str(model)}, "runtime": "local",
            "speculator": {"block_size": 8},
            "resources": {"verifier": {"tensor_parallel_size": 1}}}
    command = evaluation_command(spec, None, port=port, gpus=[], api_key=KEY, method=method)
    log = (work / f"engine-{port}.log").open("w")
    proc = subprocess.Popen(command.argv, env={**os.environ, **command.env}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen, base: str) -> None:
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"an engine exited with {proc.returncode} (logs in the work dir)")
        try:
            models = httpx.get(f"{base}/v1/models", timeout=1,
                               headers={"Authorization": f"Bearer {KEY}"})
            if models.status_code == 200 and any(
                    m["id"] == EVALUATION_MODEL for m in models.json()["data"]):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(60)


def one_after_the_other(model: Path, work: Path) -> float:
    waited = 0.0
    for method in METHODS:
        start = time.perf_counter()
        proc, base = spawn(model, method, work)
        wait_ready(proc, base)
        waited += time.perf_counter() - start
        stop(proc)  # not counted: the evaluation measures the engine here, then stops it
    return waited


def together(model: Path, work: Path) -> float:
    began = time.perf_counter()
    engines = [spawn(model, method, work) for method in METHODS]
    try:
        for proc, base in engines:
            wait_ready(proc, base)
        return time.perf_counter() - began
    finally:
        for proc, _ in engines:
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a verifier directory (default: the demo's)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specdeck-evaluation-engines-") as tmp:
        work = Path(tmp)
        model = args.model or demo_model(work)
        variants = {"one after the other (GPU runtime; local before)": one_after_the_other,
                    "two together (local runtime)": together}
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):  # interleaved, so a busy moment hits both alike
            for name, run in variants.items():
                times[name].append(run(model, work))
        medians = {name: statistics.median(rows) for name, rows in times.items()}
        print(f"{machine()}, load {load():.2f}\n")
        print(table(["two evaluation engines", f"waited for them (median of {args.rounds})",
                     "each round"],
                    [[name, f"{medians[name]:.1f} s", ", ".join(f"{t:.1f}" for t in rows)]
                     for name, rows in times.items()]))
        sequential, paired = medians.values()
        print(f"\nstarted together, the two engines are ready in {ratio(paired, sequential)} the "
              f"time the stage waited for them one after the other")


if __name__ == "__main__":
    main()
