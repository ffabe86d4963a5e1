"""A new user's first run, timed: `specdeck run` in an empty directory (what `make run` starts),
the job it prints (the README's), then that job's drafter deployed and a first chat through the
gateway.

    .venv/bin/python benchmarks/first_run.py [--json]

Printed, in seconds from the moment `specdeck run` started:
- ``api_ready_seconds``: its API answers, the key and the job printed (the first start makes
  the demo verifier and the demo conversations, and uploads them);
- ``job_done_seconds``: the job has succeeded; ``job_seconds``: from its creation, with
  ``stages``: each stage's seconds (from the job's events: when each began, until the next
  began or the job ended);
- ``first_chat_seconds``: the first chat answered through the gateway (`/v1`, the OpenAI SDK),
  with the job's evaluated checkpoint deployed;
- ``served_al`` and ``speedup`` (``speedup_spread``): what the job's served evaluation measured
  on held-out prompts against the verifier alone; not the trainer's estimate.

Everything runs for real on this machine (vLLM's CPU wheel, the speculators trainer). The README
quotes the latest figures, with the machine.
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
    NewUserStack,
    all_events,
    exit_on_sigterm,
    finished_job,
    machine,
    new_user_stack,
    wait_until,
)


def stage_seconds(events: list[dict[str, Any]], finished_at: str) -> dict[str, float]:
    """Each stage's seconds: from its first event to the next stage's first event (the last
    one's to the job's end)."""
    starts: list[tuple[str, datetime]] = []
    for event in events:
        stage = event.get("stage")
        if stage and (not starts or starts[-1][0] != stage):
            starts.append((stage, datetime.fromisoformat(event["created_at"])))
    ends = [at for _, at in starts[1:]] + [datetime.fromisoformat(finished_at)]
    seconds: dict[str, float] = {}
    for (stage, began), ended in zip(starts, ends):
        seconds[stage] = round(seconds.get(stage, 0.0) + (ended - began).total_seconds(), 1)
    return seconds


def first_chat(stack: NewUserStack, checkpoint_id: str) -> None:
    """Deploy the checkpoint and ask until the gateway answers (503 while it starts)."""
    import openai

    client = stack.client
    deployed = client.post("/api/deployments", json={"name": "first-run", "runtime": "local",
                                                     "checkpoint_id": checkpoint_id})
    if deployed.status_code != 201:
        raise RuntimeError(f"the deployment was refused: {deployed.text}")
    chat = openai.OpenAI(base_url=f"{str(client.base_url).rstrip('/')}/v1", max_retries=0, timeout=120,
                         api_key=client.headers["Authorization"].removeprefix("Bearer "))

    def answered() -> bool:
        try:
            reply = chat.chat.completions.create(
                model="first-run", max_tokens=32, temperature=0,
                messages=[{"role": "user", "content": "Tell me about the harbor."}])
        except openai.APIStatusError as exc:
            if exc.status_code == 503:  # starting
                return False
            raise
        return bool(reply.choices[0].message.content)
    wait_until(answered, 600, "the first chat answer")


def first_run(base: Path) -> dict[str, Any]:
    with new_user_stack(base) as stack:
        since = lambda: round(time.monotonic() - stack.started, 1)  # noqa: E731
        api_ready = round(stack.ready - stack.started, 1)
        created = since()
        job = finished_job(stack.client, stack.demo_job, timeout=3600)
        job_done = since()
        evaluation = job["evaluation"] or {}
        first_chat(stack, evaluation["checkpoint_id"])
        return {
            "api_ready_seconds": api_ready,
            "job_done_seconds": job_done,
            "job_seconds": round(job_done - created, 1),
            "stages": stage_seconds(all_events(stack.client, job["id"]), job["finished_at"]),
            "first_chat_seconds": since(),
            "served_al": evaluation.get("mean_acceptance_length"),
            "speedup": evaluation.get("speedup"),
            "speedup_spread": evaluation.get("speedup_spread"),
            "machine": machine(),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="specdeck-first-run-") as tmp:
        figures = first_run(Path(tmp))
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    print(f"first run: {figures['machine']}")
    print(f"  API ready        {figures['api_ready_seconds']:7.1f} s")
    print(f"  job succeeded    {figures['job_done_seconds']:7.1f} s  (the job {figures['job_seconds']:.0f} s: "
          + ", ".join(f"{stage} {s:.0f} s" for stage, s in figures["stages"].items()) + ")")
    print(f"  first chat       {figures['first_chat_seconds']:7.1f} s")
    print(f"  served AL {figures['served_al']:.2f}, speedup x{figures['speedup']:.2f} "
          f"±{figures['speedup_spread'] or 0:.2f}")


if __name__ == "__main__":
    main()
