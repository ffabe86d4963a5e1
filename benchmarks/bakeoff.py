"""Which drafter for my traffic: a bake-off of drafter kinds on the demo verifier.

As a new user runs it: ``specdeck run`` in an empty directory (the embedded default; it makes
the demo verifier and uploads the demo conversations), then one job with three candidates, the
demo job's settings shared, submitted over HTTP and followed to its end:

- ``dflash``: the demo drafter (block 8, 2 layers);
- ``dflash-small``: another DFlash (block 4, 1 layer);
- ``eagle3``: EAGLE-3 (1 layer, the demo's other settings).

Everything runs for real: one vLLM hidden-states server (the CPU wheel) for all three, one
prepare-data, the speculators trainer for each in turn, then every candidate served by vLLM with
a deployment's command beside n-gram drafting and the verifier alone, answering the held-out
prompts in turns, in rounds. Printed: the leaderboard (served acceptance length, speedup over no
speculation with its spread over the rounds, lossless or not, training cost), the winner, how
often each shared step ran, and the job's wall time next to an estimate of separate jobs:

    separate_jobs_seconds_estimate = sum over the candidates of (the job's shared steps before
    training + the candidate's own training + the evaluation's time x 3 / its engines)

(a separate job would serve its drafter, n-gram and the verifier alone: 3 engines of the
evaluation's; its share of the evaluation's time is that fraction).

    .venv/bin/python benchmarks/bakeoff.py [--json] [--epochs 4] [--prompts 16] [--rounds 3]

``--json`` prints one JSON object as the last line: candidates (kind, served_al,
speedup_vs_nospec, speedup_spread, identical, prompts, train_seconds, status), winner,
hidden_states_server_starts, prepare_data_runs, baseline_runs, wall_seconds,
separate_jobs_seconds_estimate, checks.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks._stack import (  # noqa: E402
    all_events,
    exit_on_sigterm,
    finished_job,
    load,
    machine,
    new_user_stack,
    table,
)

CANDIDATES = [{"type": "dflash"},
              {"type": "dflash", "name": "dflash-small", "block_size": 4, "num_layers": 1},
              {"type": "eagle3", "num_layers": 1}]


def bakeoff_body(demo: dict[str, Any], epochs: int, prompts: int, rounds: int) -> dict[str, Any]:
    """The demo job ``specdeck run`` prints, as a bake-off of CANDIDATES."""
    return {**demo, "name": "bake-off", "speculator": {**demo["speculator"], "epochs": epochs},
            "candidates": CANDIDATES, "evaluate": {"prompts": prompts, "rounds": rounds}}



def at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["created_at"].replace("Z", "+00:00")).timestamp()


def run_bakeoff(base: Path, epochs: int, prompts: int, rounds: int) -> dict[str, Any]:
    """``specdeck run`` in ``base``; the bake-off submitted and followed; its job and events."""
    with new_user_stack(base) as stack:
        body = bakeoff_body(stack.demo_job, epochs, prompts, rounds)
        job = finished_job(stack.client, body, 3600)
        return {"job": job, "events": all_events(stack.client, job["id"])}


def started(events: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    """The job's processes started whose description has ``what``."""
    return [e for e in events if e["kind"] == "process" and e["message"].startswith("starting: ")
            and what in e["message"]]


def figures(job: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    candidates = job["candidates"]
    evaluated = [c for c in candidates if c["status"] == "evaluated"]
    engines = len(evaluated) + 2  # and n-gram's, the verifier alone's
    first_trainer = min(at(e) for e in started(events, "speculators trainer"))
    evaluating = next(at(e) for e in events if e["kind"] == "status" and e["stage"] == "evaluating")
    evaluated_at = next(at(e) for e in events if e["kind"] == "evaluated")
    shared = first_trainer - datetime.fromisoformat(job["started_at"]).timestamp()
    evaluation = evaluated_at - evaluating
    wall = (datetime.fromisoformat(job["finished_at"]).timestamp()
            - datetime.fromisoformat(job["started_at"]).timestamp())
    separate = sum(shared + (c["train_seconds"] or 0) + evaluation * 3 / engines for c in candidates)
    rows = [{"name": c["name"], "kind": c["kind"], "status": c["status"], "rank": c["rank"],
             "winner": c["winner"], "served_al": c["served_acceptance_length"],
             "speedup_vs_nospec": c["speedup"], "speedup_spread": c["speedup_spread"],
             "speedups": (c["evaluation"] or {}).get("speedups"),
             "identical": c["outputs_identical_to_baseline"], "lossless": c["lossless"],
             "prompts": (c["evaluation"] or {}).get("prompts"), "tied_with": c["tied_with"],
             "train_seconds": c["train_seconds"], "train_cpu_seconds": c["train_cpu_seconds"]}
            for c in sorted(candidates, key=lambda c: (c["rank"] is None, c["rank"] or 0))]
    eligible = [r for r in rows if r["lossless"] and r["status"] == "evaluated"]
    winner = next((r for r in rows if r["winner"]), None)
    checks = {
        "hidden_states_server_started_once": len(started(events, "extracts hidden states")) == 1,
        "prepare_data_ran_once": len(started(events, "prepare-data")) == 1,
        "baselines_measured_once": len(started(events, "no-speculation baseline")) == 1
        and len(started(events, "n-gram (prompt lookup) baseline")) == 1,
        "every_finished_candidate_lossless": all(r["lossless"] for r in rows
                                                 if r["status"] == "evaluated"),
        # The fastest eligible, or one it ties with (a lead within the spread).
        "winner_is_the_fastest_or_tied": winner is not None and all(
            winner["speedup_vs_nospec"] >= r["speedup_vs_nospec"] or r["name"] in winner["tied_with"]
            for r in eligible),
    }
    board = job["evaluation"]["leaderboard"]
    return {
        "candidates": rows,
        "winner": job["winner"],
        "hidden_states_server_starts": len(started(events, "extracts hidden states")),
        "prepare_data_runs": len(started(events, "prepare-data")),
        "baseline_runs": len(started(events, "no-speculation baseline")),
        "ngram_runs": len(started(events, "n-gram (prompt lookup) baseline")),
        "no_speculation_tokens_per_s": board["baselines"]["no_speculation"],
        "ngram_speedup": board["baselines"]["ngram_speedup"],
        "rounds": board["rounds"],
        "wall_seconds": round(wall, 1),
        "separate_jobs_seconds_estimate": round(separate, 1),
        "shared_seconds": round(shared, 1),
        "evaluation_seconds": round(evaluation, 1),
        "checks": checks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    parser.add_argument("--epochs", type=int, default=4, help="each candidate's epochs")
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts")
    parser.add_argument("--rounds", type=int, default=3, help="the evaluation's rounds")
    args = parser.parse_args()
    exit_on_sigterm()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specdeck-bakeoff-") as tmp:
        run = run_bakeoff(Path(tmp), args.epochs, args.prompts, args.rounds)
    result = {**figures(run["job"], run["events"]), "seconds_in_all": round(time.monotonic() - began, 1),
              "machine": machine(), "load_after": round(load(), 2)}
    rows = [[r["rank"] or "-", r["name"] + (" (winner)" if r["winner"] else ""), r["kind"],
             r["status"], f"{r['served_al']:.2f}" if r["served_al"] else "-",
             f"{r['speedup_vs_nospec']:.2f}x ±{r['speedup_spread']:.2f}"
             if r["speedup_vs_nospec"] is not None else "-",
             r["identical"] or "-", f"{r['train_seconds']:.0f}" if r["train_seconds"] else "-",
             f"{r['train_cpu_seconds']:.0f}" if r["train_cpu_seconds"] else "-"]
            for r in result["candidates"]]
    print(table(["rank", "candidate", "kind", "status", "served AL", "speedup (spread)",
                 "identical", "train s", "train CPU s"], rows))
    print(f"\nwinner: {result['winner']}; n-gram {result['ngram_speedup']}x; no speculation "
          f"{result['no_speculation_tokens_per_s']} tokens/s; {result['rounds']} rounds")
    print(f"hidden-states server starts {result['hidden_states_server_starts']}, prepare-data "
          f"runs {result['prepare_data_runs']}, baseline runs {result['baseline_runs']}")
    print(f"wall {result['wall_seconds']} s, separate jobs (estimate) "
          f"{result['separate_jobs_seconds_estimate']} s; shared steps {result['shared_seconds']} "
          f"s, evaluation {result['evaluation_seconds']} s")
    print("checks: " + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in result["checks"].items()))
    print(f"machine: {result['machine']}; load after {result['load_after']}")
    if args.json:
        print(json.dumps(result))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
