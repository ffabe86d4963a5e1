"""OpenMP's waiting policy on a shared CPU: the local runtime's training work, one copy alone
and two copies at once, with OpenMP's default (threads spin for a while before they sleep) next
to ``OMP_WAIT_POLICY=PASSIVE`` (what the local runtime sets: app/runtimes/vllm.py's
``CPU_THREADS_ENV``); with ``--compare threads``, two OpenMP threads per process next to one
(``SPECDECK_LOCAL_THREADS=1``, what the tests set), both waiting passively.

The work is the demo job's own commands, from its dry-run plan (``POST /api/jobs/plan`` on a
real ``specdeck api``): vLLM's hidden-states server, prepare-data against it, then the trainer,
as benchmarks/pipeline_overhead.py runs them by hand. The variants run in turn, one alone then
two at once for each policy; each copy's time is its wall time, spawn to trainer exit.

    .venv/bin/python benchmarks/omp_wait.py              # 1 epoch, 1 round (~8 min on 2 cores)
    .venv/bin/python benchmarks/omp_wait.py --epochs 2 --rounds 2
    .venv/bin/python benchmarks/omp_wait.py --compare threads --rounds 2
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._stack import (  # noqa: E402
    Processes,
    base_env,
    create_key,
    exit_on_sigterm,
    load,
    machine,
    postgres_database,
    ratio,
    roots,
    specdeck,
    table,
)
from benchmarks.pipeline_overhead import CPU_SPECULATOR, direct_run  # noqa: E402

# --compare: the variants, each the environment its commands run with on top of the plan's.
COMPARISONS = {
    "waiting": {"default (spinning)": {"OMP_WAIT_POLICY": None},
                "passive (the local runtime's)": {"OMP_WAIT_POLICY": "PASSIVE"}},
    # SPECDECK_LOCAL_THREADS: 2 is the trainer's own default on 2 cores and torch's for the rest.
    "threads": {"2 threads": {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"},
                "1 thread (SPECDECK_LOCAL_THREADS=1)": {"OMP_WAIT_POLICY": "PASSIVE",
                                                        "OMP_NUM_THREADS": "1"}},
}


def demo_plan(base: Path, model: Path, data: Path, epochs: int) -> tuple[dict, str]:
    """The demo job's dry-run plan and the job directory its paths are under."""
    env_roots = {**roots(base / "specdeck"), "SPECDECK_MODELS_ROOT": str(model.parent)}
    with postgres_database("specdeck_bench_omp") as url, Processes(base) as procs:
        env = base_env(SPECDECK_DATABASE_URL=url, **env_roots)
        specdeck(env, "db", "upgrade")
        key = create_key(env, "bench")
        api = procs.api("api", env)
        with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {key}"},
                          timeout=30) as client:
            with data.open("rb") as f:
                dataset = client.post("/api/datasets", files={"file": ("demo.jsonl", f)})
            plan = client.post("/api/jobs/plan", json={
                "verifier": model.name, "dataset": dataset.raise_for_status().json()["id"],
                "runtime": "local", "speculator": {**CPU_SPECULATOR, "epochs": epochs},
                "evaluate": False})
    plan = plan.raise_for_status().json()
    training = next(s for s in plan["stages"] if s["stage"] == "training")["argv"]
    return plan, str(Path(training[training.index("--save-path") + 1]).parent)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--compare", choices=COMPARISONS, default="waiting",
                        help="OpenMP's waiting policy, or its threads per process")
    args = parser.parse_args()
    policies = COMPARISONS[args.compare]
    exit_on_sigterm()
    from workers.runtimes.local.demo import create_demo_model, write_demo_data

    alone: dict[str, list[float]] = {name: [] for name in policies}
    paired: dict[str, list[float]] = {name: [] for name in policies}
    with tempfile.TemporaryDirectory(prefix="specdeck-bench-omp-") as tmp:
        base = Path(tmp)
        model = create_demo_model(base / "models" / "demo")
        plan, job_root = demo_plan(base, model, write_demo_data(model, base / "demo.jsonl"),
                                   args.epochs)
        names = itertools.count(1)  # each run's own directory (next() is atomic)

        def run(changes: dict) -> float:
            return direct_run(plan, job_root, base, directory=f"run-{next(names)}",
                              env_changes=changes)["wall"]

        for _ in range(args.rounds):
            for name, changes in policies.items():
                alone[name].append(run(changes))
                with ThreadPoolExecutor(2) as pool:
                    paired[name] += pool.map(run, [changes, changes])
                print(f"{name}: alone {alone[name][-1]:.1f} s, two at once "
                      f"{paired[name][-2]:.1f} s and {paired[name][-1]:.1f} s", flush=True)

    print(f"\n## OpenMP {args.compare} on a shared CPU ({args.epochs} epoch(s), {args.rounds} "
          f"round(s)); {machine()}, load {load():.2f}\n")
    print(table([f"OpenMP {args.compare}", "one alone (median)", "two at once, each (median)",
                 "two at once / alone", "every run"],
                [[name, f"{statistics.median(alone[name]):.1f} s",
                  f"{statistics.median(paired[name]):.1f} s",
                  ratio(statistics.median(paired[name]), statistics.median(alone[name])),
                  "alone " + ", ".join(f"{t:.1f}" for t in alone[name]) + "; two at once "
                  + ", ".join(f"{t:.1f}" for t in paired[name])] for name in policies]))
    first, second = policies
    print(f"\ntwo at once, each copy of '{first}' took "
          f"{ratio(statistics.median(paired[first]), statistics.median(paired[second]))} as long "
          f"as one of '{second}'; alone, "
          f"{ratio(statistics.median(alone[first]), statistics.median(alone[second]))}")


if __name__ == "__main__":
    main()
