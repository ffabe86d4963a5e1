"""Throughput of the local hidden-states server against the raw in-process forward.

Starts ``workers.runtimes.local.hidden_states_server`` on the demo verifier (or
``--model``), sends ``/v1/completions`` requests the way the trainer does (token ids,
``max_tokens=1``, ``return_token_ids``; the client deletes each file after reading its
path), and reports prompt tokens processed per second at each concurrency. In the same
run it measures the verifier's plain forward pass in this process (no hooks, no HTTP, no
file) on the same prompts, and prints the ratio server / raw: the server's overhead.

    python benchmarks/hidden_states_server.py [--model DIR] [--prompt-tokens 256]
        [--requests 48] [--concurrency 1 4 8]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from transformers import AutoConfig, AutoModelForCausalLM

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from workers.runtimes.local.demo import create_demo_model  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(count)]


@torch.inference_mode()
def raw_forward_tokens_per_s(model_dir: Path, prompts: list[list[int]]) -> float:
    """Sequential batch-1 forward passes of the decoder stack, as the server runs them."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    decoder = model.get_decoder()
    for ids in prompts[:3]:  # warm-up
        decoder(input_ids=torch.tensor([ids]), use_cache=False)
    start = time.perf_counter()
    for ids in prompts:
        decoder(input_ids=torch.tensor([ids]), use_cache=False)
    elapsed = time.perf_counter() - start
    return sum(map(len, prompts)) / elapsed


def _request(client: httpx.Client, url: str, model: str, ids: list[int]) -> float:
    start = time.perf_counter()
    response = client.post(
        url,
        json={"model": model, "prompt": ids, "max_tokens": 1, "return_token_ids": True},
        timeout=120,
    )
    response.raise_for_status()
    body = response.json()
    if body["choices"][0]["prompt_token_ids"] != ids:
        raise RuntimeError("prompt_token_ids differ from the ids sent")
    Path(body["kv_transfer_params"]["hidden_states_path"]).unlink()
    return time.perf_counter() - start


def server_tokens_per_s(
    base_url: str, model: str, prompts: list[list[int]], concurrency: int
) -> tuple[float, float]:
    """Prompt tokens per second and median latency (s) at a given concurrency."""
    url = f"{base_url}/v1/completions"
    limits = httpx.Limits(max_connections=concurrency)
    with httpx.Client(limits=limits) as client, ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda ids: _request(client, url, model, ids), prompts[:concurrency]))
        start = time.perf_counter()
        latencies = list(pool.map(lambda ids: _request(client, url, model, ids), prompts))
        elapsed = time.perf_counter() - start
    return sum(map(len, prompts)) / elapsed, statistics.median(latencies)


def _wait_ready(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.2)
    raise RuntimeError(f"server not ready after {timeout_s}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the demo verifier")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="hs-bench-") as tmp:
        workdir = Path(tmp)
        model_dir = args.model or create_demo_model(workdir / "verifier")
        config = AutoConfig.from_pretrained(model_dir).get_text_config()
        n = config.num_hidden_layers
        layer_ids = sorted({2, n // 2, n - 3, n})
        prompts = _prompts(args.requests, args.prompt_tokens, config.vocab_size, args.seed)

        port = _free_port()
        base_url = f"http://127.0.0.1:{port}"
        argv = [
            sys.executable, "-m", "workers.runtimes.local.hidden_states_server",
            "--model", str(model_dir), "--served-model-name", "bench",
            "--port", str(port), "--layer-ids", *map(str, layer_ids),
            "--hidden-states-dir", str(workdir / "hidden_states"), "--log-level", "warning",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"}
        server = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, start_new_session=True)
        try:
            _wait_ready(base_url, server)
            raw = raw_forward_tokens_per_s(model_dir, prompts)
            print(
                f"verifier: {model_dir} ({n} layers, hidden {config.hidden_size}); "
                f"layer ids {layer_ids}; {args.requests} prompts x {args.prompt_tokens} tokens; "
                f"torch threads {torch.get_num_threads()}"
            )
            print(f"raw in-process forward: {raw:,.0f} tokens/s")
            print(f"{'concurrency':>11} {'tokens/s':>10} {'p50 ms':>8} {'server/raw':>10}")
            for concurrency in args.concurrency:
                tps, p50 = server_tokens_per_s(base_url, "bench", prompts, concurrency)
                print(f"{concurrency:>11} {tps:>10,.0f} {p50 * 1000:>8.1f} {tps / raw:>10.2f}")
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


if __name__ == "__main__":
    main()
