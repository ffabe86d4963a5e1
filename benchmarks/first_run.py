"""A new user's first run, timed: `specdeck run` in an empty directory (what `make run` starts),
then the README's job, then its drafter deployed and a first chat through the gateway.

    .venv/bin/python benchmarks/first_run.py [--json] [--keep DIR]

It prints, from the moment `specdeck run` starts:
- ``api_ready_seconds``: /readyz answers 200 (the first start makes the demo verifier and the
  demo conversations, and uploads them);
- ``job_seconds``: the README's job, from its creation to its success, with ``stages``: each
  stage's seconds (from the job's events: when each stage began, until the next or the end);
- ``job_done_seconds``: to the job's success, from the start (the README quotes it);
- ``first_chat_seconds``: to the first chat answered through the gateway (`/v1`, the OpenAI
  SDK), with the job's best checkpoint deployed;
- ``served_al`` and ``speedup``: the served evaluation's acceptance length and speedup over the
  verifier alone (held-out prompts; measured by the job, not estimated).

Everything runs for real on this machine (vLLM's CPU wheel, the speculators trainer); nothing is
simulated. Ctrl-C, or the end, stops `specdeck run` and everything it started.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent
SPECDECK = str(Path(sys.executable).parent / "specdeck")


def readme_job() -> dict[str, Any]:
    """The quick start's job body, as the README writes it."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"curl -s -X POST http://127\.0\.0\.1:8000/api/jobs.*?-d '(.*?)'", readme, re.S)
    if match is None:
        raise SystemExit("the README's quick start has no job curl")
    return json.loads(match.group(1))


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait(what: str, check, timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := check()):
            return value
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


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


def all_events(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    while True:
        params = {"limit": 100} | ({"after": found[-1]["id"]} if found else {})
        page = client.get(f"/api/jobs/{job_id}/events", params=params).json()
        found += page["data"]
        if not page["has_more"]:
            return found


def run(cwd: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = cwd / "specdeck-run.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECK_")}
    started = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen([SPECDECK, "run", "--port", str(port)], cwd=cwd, env=environ,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    since = lambda: round(time.monotonic() - started, 1)  # noqa: E731
    try:
        banner = wait("`specdeck run`'s key and demo dataset", lambda: (
            (text := log_path.read_text(errors="replace")) and "Ctrl-C stops" in text and text),
            900)

        def ready() -> bool:
            try:
                return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False
        wait("/readyz", ready, 600, every=0.2)
        api_ready = since()
        key = re.search(r"API key \(project 'default'\): (\S+)", banner).group(1)
        dataset = re.search(r"demo dataset: (ds_\w+)", banner).group(1)
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)

        created_at = since()
        created = client.post("/api/jobs", json={**readme_job(), "dataset": dataset})
        created.raise_for_status()
        job_id = created.json()["id"]
        job = wait("the job to end", lambda: (j := client.get(f"/api/jobs/{job_id}").json())[
            "status"] in ("succeeded", "failed", "cancelled") and j, 3600, every=1)
        job_done = since()
        if job["status"] != "succeeded":
            raise SystemExit(f"the job {job['status']}: {job.get('status_reason')}")
        evaluation = job["evaluation"] or {}

        deployed = client.post("/api/deployments", json={
            "name": "first-run", "checkpoint_id": evaluation["checkpoint_id"], "runtime": "local"})
        deployed.raise_for_status()
        chat = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)

        def answered() -> bool:
            try:
                reply = chat.chat.completions.create(
                    model="first-run", max_tokens=32, temperature=0,
                    messages=[{"role": "user", "content": "Tell me about the harbor."}])
            except openai.APIStatusError as exc:
                if exc.status_code == 503:  # starting: the gateway says so
                    return False
                raise
            return bool(reply.choices[0].message.content)
        wait("the first chat answer", answered, 600, every=1)
        first_chat = since()
        return {
            "api_ready_seconds": api_ready,
            "job_seconds": round(job_done - created_at, 1),
            "stages": stage_seconds(all_events(client, job_id), job["finished_at"]),
            "job_done_seconds": job_done,
            "first_chat_seconds": first_chat,
            "served_al": evaluation.get("mean_acceptance_length"),
            "speedup": evaluation.get("speedup"),
            "speedup_spread": evaluation.get("speedup_spread"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "date": datetime.now().date().isoformat(),
        }
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: it stops everything it started
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--keep", type=Path, help="run in this (empty) directory and keep it")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        if any(args.keep.iterdir()):
            raise SystemExit(f"{args.keep} is not empty")
        figures = run(args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="specdeck-first-run-") as tmp:
            figures = run(Path(tmp))
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    print(f"first run on {figures['machine']}, {figures['date']}")
    print(f"  API ready            {figures['api_ready_seconds']:7.1f} s")
    print(f"  the README's job     {figures['job_seconds']:7.1f} s  "
          + ", ".join(f"{stage} {s:.0f} s" for stage, s in figures["stages"].items()))
    print(f"  job done             {figures['job_done_seconds']:7.1f} s after `specdeck run`")
    print(f"  first chat           {figures['first_chat_seconds']:7.1f} s after `specdeck run`")
    print(f"  served AL {figures['served_al']}, speedup x{figures['speedup']} "
          f"(spread {figures['speedup_spread']})")


if __name__ == "__main__":
    main()
