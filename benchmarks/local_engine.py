"""Speed and acceptance of the local engine against plain greedy decoding.

Loads the engine in this process (``workers.runtimes.local.engine.LocalEngine``) and decodes a
few demo prompts in every mode, in the same run:

- ``hf-generate``: the verifier's ``generate(do_sample=False)``, the reference output;
- ``engine-plain``: the engine with the verifier alone (no ``--speculative-config``: no drafter
  loaded, one token per pass);
- ``engine-ngram``: n-gram prompt lookup (``{"method": "ngram", ...}``, vLLM's lookup 4..1);
- ``engine-dflash``: draft-and-verify blocks with a DFlash drafter (``--drafter``; the mode is
  left out without one).

It checks that every mode produces the same tokens, and prints tokens/s per mode, the
acceptance length (AL = 1 + accepted / drafts, vLLM's formula), the verifier passes and the
milliseconds per pass (the fixed cost of a speculative step: draft + verify of a block +
bookkeeping, against a plain step), and the ratios dflash/plain, ngram/plain and
plain/hf-generate. Each prompt is run ``--repeats`` times in every mode, the modes interleaved,
and the fastest run counts (the machine may be shared).

    python benchmarks/local_engine.py --verifier DIR [--drafter CKPT_DIR]
        [--data CONVERSATIONS.jsonl] [--num-prompts 8] [--max-tokens 64]
        [--num-speculative-tokens N] [--num-threads T] [--repeats 3]

A deeper demo verifier: ``workers.runtimes.local.demo.create_demo_model(path, num_layers=16)``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from app.runtimes import NGRAM_LOOKUP  # noqa: E402
from workers.runtimes.local.engine import LocalEngine  # noqa: E402

# Demo-style prompts (the demo verifier's training data uses the same vocabulary).
DEMO_PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Tell me about the quiet river in the north."}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Explain weather to a cold mountain."},
    ],
    [{"role": "user", "content": "Write a short story about a brave robot that paints a castle."}],
    [{"role": "user", "content": "What is the best way to learn poetry?"}],
    [{"role": "user", "content": "Give me three facts about music and the teacher."}],
    [{"role": "user", "content": "Describe a golden library near the harbor."}],
    [{"role": "user", "content": "How would a farmer explain astronomy in the valley?"}],
    [{"role": "user", "content": "Can you compare the old bridge with the modern station?"}],
]

_SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user"}


def load_prompts(data: Path | None, count: int) -> list[list[dict[str, str]]]:
    """``count`` prompts: the built-in ones, or the non-assistant turns of a ShareGPT JSONL."""
    if data is None:
        return DEMO_PROMPTS[:count]
    prompts = []
    with data.open(encoding="utf-8") as f:
        for line in f:
            turns = json.loads(line)["conversations"]
            messages = [
                {"role": _SHAREGPT_ROLES[t["from"]], "content": t["value"]}
                for t in turns
                if t["from"] in _SHAREGPT_ROLES
            ]
            prompts.append(messages)
            if len(prompts) == count:
                break
    return prompts


@dataclass
class ModeResult:
    name: str
    outputs: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # per prompt: the fastest run
    drafts: int = 0
    accepted: int = 0
    decode_passes: int = 0

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total_seconds

    @property
    def acceptance_length(self) -> float:
        return 1 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def ms_per_pass(self) -> float:
        """Milliseconds per decode step (prefill included in the time, not in the count)."""
        return 1000 * self.total_seconds / self.decode_passes if self.decode_passes else 0.0


@dataclass(frozen=True)
class Run:
    output_ids: list[int]
    drafts: int = 0
    accepted: int = 0
    decode_passes: int = 0


def hf_generate(model: torch.nn.Module, ids: list[int], max_tokens: int) -> Run:
    with torch.inference_mode():
        output = model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False)
    generated = output[0, len(ids) :].tolist()
    return Run(generated, decode_passes=len(generated) - 1)


def engine_generate(engine: LocalEngine, ids: list[int], max_tokens: int) -> Run:
    generation, steps = engine.generate(ids, max_tokens)
    return Run(
        generation.output_ids,
        drafts=sum(1 for s in steps if s.num_draft_tokens),
        accepted=sum(s.num_accepted_tokens for s in steps),
        decode_passes=len(steps) - 1,  # the first step is the prefill
    )


def measure(
    modes: dict[str, Callable[[list[int]], Run]], prompts: list[list[int]], repeats: int
) -> list[ModeResult]:
    """Time every mode on every prompt, interleaved so that load on a shared machine
    hits all modes alike; keep each (mode, prompt)'s fastest run."""
    results = {name: ModeResult(name) for name in modes}
    for ids in prompts:
        best: dict[str, float] = dict.fromkeys(modes, float("inf"))
        runs: dict[str, Run] = {}
        for _ in range(repeats):
            for name, run in modes.items():
                start = time.perf_counter()
                runs[name] = run(ids)
                best[name] = min(best[name], time.perf_counter() - start)
        for name, result in results.items():
            run = runs[name]
            result.outputs.append(run.output_ids)
            result.seconds.append(best[name])
            result.drafts += run.drafts
            result.accepted += run.accepted
            result.decode_passes += run.decode_passes
    return list(results.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True, type=Path)
    parser.add_argument("--drafter", type=Path, default=None, help="DFlash checkpoint")
    parser.add_argument("--data", type=Path, default=None, help="ShareGPT JSONL of prompts")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="for dflash and ngram (default: the drafter's block_size - 1, or 7)",
    )
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per prompt")
    args = parser.parse_args(argv)

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    plain = LocalEngine(args.verifier)
    engines: dict[str, LocalEngine] = {"engine-plain": plain}
    tokens = args.num_speculative_tokens
    if args.drafter is not None:
        dflash: dict[str, object] = {"method": "dflash", "model": str(args.drafter)}
        if tokens is not None:
            dflash["num_speculative_tokens"] = tokens
        engines["engine-dflash"] = LocalEngine(args.verifier, dflash)
        tokens = engines["engine-dflash"].num_speculative_tokens
    tokens = 7 if tokens is None else tokens
    ngram = {"method": "ngram", "num_speculative_tokens": tokens, **NGRAM_LOOKUP}
    engines["engine-ngram"] = LocalEngine(args.verifier, ngram)

    prompts = [plain.render(m) for m in load_prompts(args.data, args.num_prompts)]
    layers = plain.runner.num_layers
    print(
        f"verifier {args.verifier} ({layers} layers, hidden {plain.runner.hidden_size}, "
        f"{'lean' if plain.runner.lean else 'transformers'} forward); "
        + "; ".join(f"{name}: {engine.describe()}" for name, engine in engines.items())
        + f"; {len(prompts)} prompts (mean {statistics.mean(map(len, prompts)):.0f} tokens), "
        f"max_tokens {args.max_tokens}, {torch.get_num_threads()} threads, fastest of "
        f"{args.repeats}"
    )
    for engine in engines.values():
        engine.generate(prompts[0], 8)  # warm-up

    modes: dict[str, Callable[[list[int]], Run]] = {
        "hf-generate": lambda ids: hf_generate(plain.verifier, ids, args.max_tokens),
    }
    for name, engine in engines.items():
        modes[name] = lambda ids, engine=engine: engine_generate(engine, ids, args.max_tokens)
    results = {r.name: r for r in measure(modes, prompts, args.repeats)}
    reference = results["hf-generate"].outputs
    print(
        f"\n{'mode':<14} {'tokens':>7} {'seconds':>8} {'tok/s':>8} {'AL':>6} {'drafts':>7} "
        f"{'passes':>7} {'ms/pass':>8} {'identical':>10}"
    )
    for r in results.values():
        identical = sum(o == ref for o, ref in zip(r.outputs, reference, strict=True))
        print(
            f"{r.name:<14} {r.tokens:>7} {r.total_seconds:>8.3f} {r.tokens_per_s:>8.1f} "
            f"{r.acceptance_length:>6.2f} {r.drafts:>7} {r.decode_passes:>7} "
            f"{r.ms_per_pass:>8.2f} {identical:>6}/{len(reference)}"
        )
    speed = {name: r.tokens_per_s for name, r in results.items()}
    print()
    if "engine-dflash" in speed:
        print(f"dflash / plain:       {speed['engine-dflash'] / speed['engine-plain']:.2f}x")
    print(f"ngram / plain:        {speed['engine-ngram'] / speed['engine-plain']:.2f}x")
    print(f"plain / hf-generate:  {speed['engine-plain'] / speed['hf-generate']:.2f}x")
    if any(r.outputs != reference for r in results.values()):
        raise SystemExit("outputs differ from hf-generate: decoding is not lossless")


if __name__ == "__main__":
    main()
