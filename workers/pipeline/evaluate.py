"""Stage: evaluate the best checkpoint the way it will be served.

The hidden-states server is stopped (its GPUs and memory are needed), then the job's best
checkpoint is served with exactly a deployment's command (``build_serve``: ``vllm serve
--speculative-config dflash``, or vLLM's CPU wheel on the local runtime) on the verifier's GPUs. Held-out prompts
are sent to its ``/v1/chat/completions``, greedily and one at a time; the difference of the
engine's speculative-decoding counters (``/metrics``) around them gives the mean acceptance
length, ``1 + accepted / drafts``, and the acceptance rate at each draft position. With the
baseline (the default), the same server then runs without speculative decoding on the same
prompts: the speedup is output tokens/s with the drafter over without, and the greedy texts are
compared (lossless decoding makes them the same). On GPUs the engines run one after the other;
on the local runtime two start together (each start is mostly one core's imports), and both are
ready before the first is measured, so no start runs beside a measurement. The result is
recorded on the checkpoint (and so in its model card), as job metrics and as an event.

Held-out prompts: the trainer validates on the last 10% of the prepared rows (speculators'
``train_data_ratio``), so the prompts are the first user turns of conversations whose first
reply lies in that split (found by decoding the rows' prompt tokens). When none can be found,
the last conversations of the dataset are used instead, and the evaluation says so.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from sqlalchemy import select

from app.db import session_scope
from app.db.models import Checkpoint, Job, JobMetric, utcnow
from app.schemas.jobs import EvaluateSpec
from app.services.state import Stage
from workers.publish import best_checkpoint
from workers.readiness import free_ports, wait_ready
from workers.runner import JobContext, StageFailed
from workers.supervisor import ManagedProcess
from app.runtimes import (
    EVALUATION_MODEL,
    JobPaths,
    StageCommand,
    data_settings,
    evaluation_command,
    evaluation_settings,
    training_data,
)
from app.logtail import tail

log = logging.getLogger(__name__)
T = TypeVar("T")

TRAIN_DATA_RATIO = 0.9  # speculators 0.9.0's default: the rest of the prepared rows validate
CANDIDATES_PER_PROMPT = 8  # validation rows decoded per prompt wanted (later turns don't count)
# One greedy completion of at most 8192 tokens; a cancel does not wait for it (while_running).
REQUEST_TIMEOUT = httpx.Timeout(connect=10.0, read=900.0, write=30.0, pool=10.0)
VALIDATION_SPLIT = "validation split"
LAST_CONVERSATIONS = "last conversations of the dataset"
COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:request_success": "requests",  # finished requests, summed over finished_reason
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool"}


# ---------------------------------------------------------------------------------------------
# The engine's counters and what they mean
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpecDecodeCounters:
    """vLLM's speculative-decoding counters, and its generated tokens and finished requests,
    summed over their label sets (engines, models, finish reasons)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)
    generation_tokens: float = 0.0
    requests: float = 0.0

    def __sub__(self, before: "SpecDecodeCounters") -> "SpecDecodeCounters":
        positions = set(self.accepted_per_position) | set(before.accepted_per_position)
        return SpecDecodeCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_position={p: self.accepted_per_position.get(p, 0.0)
                                   - before.accepted_per_position.get(p, 0.0) for p in positions},
            generation_tokens=self.generation_tokens - before.generation_tokens,
            requests=self.requests - before.requests)

    def went_down_from(self, before: "SpecDecodeCounters") -> bool:
        """Whether a counter is lower than in ``before``: another engine (a restart) since."""
        delta = self - before
        return min([delta.drafts, delta.draft_tokens, delta.accepted_tokens,
                    delta.generation_tokens, delta.requests,
                    *delta.accepted_per_position.values()]) < 0


def parse_counters(text: str) -> SpecDecodeCounters:
    """Read the speculative-decoding counters from a Prometheus text exposition.

    Counters are exposed with a ``_total`` suffix (``vllm:spec_decode_num_drafts_total``); a
    plain sample name is accepted too. Other series, ``_created`` samples among them, are
    ignored."""
    from prometheus_client.parser import text_string_to_metric_families

    values = {name: 0.0 for name in COUNTERS.values()}
    per_position: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            base = sample.name.removesuffix("_total")
            if sample.name not in (base, f"{base}_total"):
                continue
            if base in COUNTERS:
                values[COUNTERS[base]] += sample.value
            elif base == PER_POSITION and "position" in sample.labels:
                position = int(sample.labels["position"])
                per_position[position] = per_position.get(position, 0.0) + sample.value
    return SpecDecodeCounters(**values, accepted_per_position=per_position)


def acceptance(delta: SpecDecodeCounters, num_speculative_tokens: int) -> dict[str, Any]:
    """Mean acceptance length (tokens per verifier pass: ``1 + accepted / drafts``), the
    acceptance rate at each draft position (``accepted_per_pos[i] / drafts``) and the share
    of drafted tokens accepted. With no drafts the rates are unknown (None)."""
    drafts = delta.drafts
    positions = max([num_speculative_tokens, *(p + 1 for p in delta.accepted_per_position)])
    return {
        "mean_acceptance_length": round(1 + delta.accepted_tokens / drafts, 4) if drafts else None,
        "acceptance_rate_per_position": [
            round(delta.accepted_per_position.get(p, 0.0) / drafts, 4) for p in range(positions)
        ] if drafts else [],
        "draft_acceptance_rate": (round(delta.accepted_tokens / delta.draft_tokens, 4)
                                  if delta.draft_tokens else None),
        "drafts": int(drafts),
        "draft_tokens": int(delta.draft_tokens),
        "accepted_tokens": int(delta.accepted_tokens),
    }


# ---------------------------------------------------------------------------------------------
# Held-out prompts
# ---------------------------------------------------------------------------------------------

def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict)
                        and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def _normalized(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class FirstTurn:
    messages: list[dict[str, Any]]  # the turns before the first user turn (system) and it
    reply: str  # the first assistant reply's text ("" when there is none)


def first_turn(record: dict[str, Any]) -> FirstTurn | None:
    """The chat messages up to and including a conversation's first user turn, in OpenAI
    form, and the reply that followed; None when it has no user turn with text. Reads OpenAI
    ``messages`` and ShareGPT ``conversations`` ({from, value} or {role, content})."""
    turns = record.get("messages") or record.get("conversations") or []
    messages: list[dict[str, Any]] = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return None
        if "from" in turn:
            role, content = SHAREGPT_ROLES.get(turn["from"]), turn.get("value")
        else:
            role, content = SHAREGPT_ROLES.get(turn.get("role", "")), turn.get("content")
        if role == "system":
            messages.append({"role": "system", "content": content})
        elif role == "user":
            if not _text(content).strip():
                return None
            messages.append({"role": "user", "content": content})
            reply = next((t for t in turns[index + 1:] if isinstance(t, dict)), {})
            reply_text = _text(reply.get("value", reply.get("content")))
            return FirstTurn(messages, reply_text)
        else:
            return None  # the conversation opens with an assistant or tool turn
    return None


def conversations(path: Path) -> Iterator[FirstTurn]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                turn = first_turn(json.loads(line))
                if turn is not None:
                    yield turn


def last_conversations(path: Path, n: int) -> list[list[dict[str, Any]]]:
    return [turn.messages for turn in deque(conversations(path), maxlen=n)]


def match_prompts(prompt_texts: list[str], turns: Iterator[FirstTurn]) -> list[list[dict[str, Any]]]:
    """For each decoded validation prompt, the conversation whose first turn it is: every
    message's text appears in it and the first reply does not (that would be a later turn's
    row). The most specific (longest) match wins. Whitespace is normalized on both sides."""
    texts = [_normalized(t) for t in prompt_texts]
    best: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    for turn in turns:
        parts = [_normalized(_text(m["content"])) for m in turn.messages]
        reply = _normalized(turn.reply)
        score = sum(len(p) for p in parts)
        for k, text in enumerate(texts):
            if (all(p in text for p in parts) and not (reply and reply in text)
                    and score > best.get(k, (0, []))[0]):
                best[k] = (score, turn.messages)
    return [best[k][1] for k in sorted(best)]


def validation_prompt_texts(spec: dict[str, Any], data_dir: Path, n: int) -> list[str]:
    """Decode the prompt part (the tokens before the supervised reply) of the last validation
    rows of the prepared dataset."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    data = load_from_disk(str(data_dir)).with_format(None)
    start = int(len(data) * TRAIN_DATA_RATIO)
    if start >= len(data):
        return []
    rows = data.select(range(max(start, len(data) - CANDIDATES_PER_PROMPT * n), len(data)))
    tokenizer = AutoTokenizer.from_pretrained(spec["verifier_info"]["reference"])
    texts = []
    for ids, mask in zip(rows["input_ids"], rows["loss_mask"], strict=True):
        first = next((i for i, m in enumerate(mask) if m), 0)
        if first:
            texts.append(tokenizer.decode(ids[:first]))
    return texts


def validation_token_prompts(data_dir: Path, n: int) -> list[list[int]]:
    """The prompt ids (every token before the first supervised one) of the last ``n``
    validation rows of the prepared dataset: for regenerated data, the exact ids the verifier
    was prompted with, and the training never saw these rows."""
    from datasets import load_from_disk

    data = load_from_disk(str(data_dir)).with_format(None)
    start = int(len(data) * TRAIN_DATA_RATIO)
    prompts = []
    for index in range(len(data) - 1, start - 1, -1):
        row = data[index]
        first = next((i for i, m in enumerate(row["loss_mask"]) if m), 0)
        if first:
            prompts.append(list(row["input_ids"][:first]))
        if len(prompts) == n:
            break
    return prompts[::-1]


Prompt = list[dict[str, Any]] | list[int]  # chat messages, or the ids of a rendered prompt


def held_out_prompts(spec: dict[str, Any], paths: JobPaths,
                     n: int) -> tuple[list[Prompt], str, str | None]:
    """Up to ``n`` prompts, where they come from, and why the validation split could not be
    used (None when it was). Regenerated data gives the validation rows' own prompt ids."""
    why: str | None = None
    if data_settings(spec)["regenerate"]:
        try:
            prompts: list[Prompt] = list(validation_token_prompts(paths.data, n))
        except Exception as exc:
            raise StageFailed(f"the validation split could not be read: {exc}",
                              code="data_error") from exc
        return prompts, VALIDATION_SPLIT, None
    source = Path(training_data(spec, paths))
    try:
        texts = validation_prompt_texts(spec, paths.data, n)
        prompts = list(match_prompts(texts, conversations(source))[-n:])
        if prompts:
            return prompts, VALIDATION_SPLIT, None
        why = "no validation row could be traced back to a conversation's first turn"
    except Exception as exc:  # a best effort: the fallback below still measures the drafter
        log.warning("validation prompts unavailable: %s", exc, exc_info=True)
        why = f"the validation split could not be read: {type(exc).__name__}: {exc}"
    return list(last_conversations(source, n)), LAST_CONVERSATIONS, why


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------

def while_running(ctx: JobContext, pool: concurrent.futures.Executor, fn: Callable[[], T]) -> T:
    """Run ``fn`` (a request) in ``pool`` and wait for it, checking the job all the while: a
    cancel, a lost lease, a shutdown or a dead engine raises at once, not after the request."""
    future = pool.submit(fn)
    while True:
        try:
            return future.result(timeout=0.2)
        except concurrent.futures.TimeoutError:
            if ctx.should_stop():
                ctx.check()


def _already_evaluated(checkpoint: Checkpoint, settings: dict[str, Any]) -> bool:
    done = checkpoint.evaluation or {}
    return (done.get("checkpoint_id") == checkpoint.id and done.get("max_tokens") == settings["max_tokens"]
            and done.get("requested_prompts") == settings["prompts"]
            and ("speedup" in done) == settings["baseline"]
            and ("ngram_mean_acceptance_length" in done) == settings["ngram"]
            and done.get("checkpoints", "best") == settings["checkpoints"])


def _stop_verifier_server(ctx: JobContext) -> None:
    proc = ctx.verifier_server
    if proc is None:
        return
    ctx.stop(proc)
    ctx.verifier_server = None
    ctx.event("verifier_stopped", "hidden-states server stopped: the evaluation needs its GPUs")


def candidates(session: Any, job_id: str, settings: dict[str, Any]) -> list[Checkpoint]:
    """The checkpoints to serve: the trainer's best, or the last N epochs."""
    last = EvaluateSpec(**settings).last_epochs()
    if last is None:
        best = best_checkpoint(session, job_id)
        return [best] if best is not None else []
    rows = session.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id,
                                                    Checkpoint.partial.is_(False))
                           .order_by(Checkpoint.epoch.desc()).limit(last))
    return list(rows)[::-1]


def trainer_eal(metrics: dict[str, Any] | None) -> float | None:
    """The trainer's own estimate of the acceptance length (validation ``eal``), if logged."""
    value = (metrics or {}).get("eal_epoch", (metrics or {}).get("eal"))
    return float(value) if isinstance(value, (int, float)) else None


# The headline of a job's evaluation, in the order shown: what serving measured first, the
# baselines beside it, the trainer's estimate last.
HEADLINE = ("checkpoint_id", "epoch", "mean_acceptance_length", "ngram_mean_acceptance_length",
            "speedup", "ngram_speedup", "beats_ngram", "outputs_identical_to_baseline",
            "prompts", "prompt_source", "trainer_eal_estimate", "served_vs_trainer_eal", "warnings")


def _record(ctx: JobContext, evaluations: dict[str, dict[str, Any]], selected: str) -> None:
    chosen = evaluations[selected]
    names = {"eval/mean_acceptance_length": chosen["mean_acceptance_length"],
             "eval/draft_acceptance_rate": chosen["draft_acceptance_rate"],
             "eval/output_tokens_per_s": chosen["output_tokens_per_s"],
             "eval/speedup": chosen.get("speedup"),
             "eval/ngram_mean_acceptance_length": chosen.get("ngram_mean_acceptance_length"),
             "eval/ngram_speedup": chosen.get("ngram_speedup"),
             "eval/trainer_eal_estimate": chosen.get("trainer_eal_estimate"),
             **{f"eval/acceptance_rate_pos_{p}": rate
                for p, rate in enumerate(chosen["acceptance_rate_per_position"])}}

    def write(session: Any) -> None:
        for checkpoint_id, evaluation in evaluations.items():
            session.get(Checkpoint, checkpoint_id).evaluation = evaluation
        session.get(Job, ctx.job_id).evaluation = {k: chosen.get(k) for k in HEADLINE}
        session.add_all(JobMetric(job_id=ctx.job_id, step=None, epoch=chosen["epoch"], name=name,
                                  value=value) for name, value in names.items() if value is not None)

    ctx.write(write)  # one transaction: a rerun never finds metrics without the evaluation


@dataclass(frozen=True)
class Drafter:
    checkpoint_id: str
    epoch: int
    path: str
    trainer_eal: float | None


def evaluate(ctx: JobContext) -> None:
    settings = evaluation_settings(ctx.spec)
    assert settings is not None, "the pipeline runs this stage only when the job evaluates"
    assert ctx.plan is not None, "the verifier stage sets the plan"
    with session_scope() as session:
        chosen = candidates(session, ctx.job_id, settings)
        if not chosen:
            raise StageFailed("there is no checkpoint to evaluate", code="no_checkpoint")
        if all(_already_evaluated(c, settings) for c in chosen):
            ctx.event("skipped", "the checkpoints are already evaluated; keeping their evaluation",
                      {"checkpoint_ids": [c.id for c in chosen]})
            return
        drafters = [Drafter(c.id, c.epoch, c.path, trainer_eal(c.metrics)) for c in chosen]
    prompts, source, why = held_out_prompts(ctx.spec, ctx.paths, settings["prompts"])
    if not prompts:
        raise StageFailed("no conversation with a user turn to evaluate on", code="data_error")
    _stop_verifier_server(ctx)

    also = [what for what, on in (("n-gram drafting", settings["ngram"]),
                                  ("the verifier alone", settings["baseline"])) if on]
    which = (f"the epoch {drafters[0].epoch} checkpoint" if len(drafters) == 1
             else f"the last {len(drafters)} checkpoints")
    ctx.event("evaluation_started", f"serving {which} on {len(prompts)} held-out prompts "
              f"({source})" + (f", then {' and '.join(also)} on the same prompts" if also else ""),
              {"checkpoint_ids": [d.checkpoint_id for d in drafters], "prompt_source": source,
               **({"why_not_validation": why} if why else {})})
    wanted = engines_wanted(drafters, settings)
    steps = Steps(ctx, total=len(wanted) * (1 + len(prompts)))
    runs = serve_and_measure(ctx, wanted, prompts, settings["max_tokens"], steps)
    ngram, alone = runs.get("ngram"), runs.get("alone")

    num_speculative_tokens = ctx.spec["speculator"]["block_size"] - 1
    evaluations = {}
    for drafter in drafters:
        result = runs[drafter.checkpoint_id]
        evaluation = {
            "checkpoint_id": drafter.checkpoint_id,
            "epoch": drafter.epoch,
            "runtime": ctx.spec["runtime"],
            "engine": result.engine,
            "prompts": len(prompts),
            "requested_prompts": settings["prompts"],
            "prompt_source": source,
            "max_tokens": settings["max_tokens"],
            "checkpoints": settings["checkpoints"],
            "temperature": 0,
            "num_speculative_tokens": num_speculative_tokens,
            **acceptance(result.counters, num_speculative_tokens),
            "completion_tokens": result.completion_tokens,
            "seconds": round(result.seconds, 3),
            "output_tokens_per_s": result.tokens_per_s,
        }
        if ngram is not None:
            evaluation.update(ngram_figures(evaluation, ngram, num_speculative_tokens))
        if alone is not None:
            evaluation.update(baseline_figures(result, alone, ngram))
        evaluation.update(estimate_figures(evaluation, drafter.trainer_eal))
        evaluations[drafter.checkpoint_id] = evaluation
    selected = max(drafters, key=lambda d: (
        evaluations[d.checkpoint_id]["mean_acceptance_length"] or 0, d.epoch)).checkpoint_id
    for checkpoint_id, evaluation in evaluations.items():
        evaluation["selected"] = checkpoint_id == selected
    _record(ctx, evaluations, selected)
    ctx.event("evaluated", summary(evaluations[selected]), evaluations[selected])


def ngram_figures(evaluation: dict[str, Any], ngram: "Measurement",
                  num_speculative_tokens: int) -> dict[str, Any]:
    """n-gram (prompt lookup) drafting on the same prompts, and whether the trained drafter
    beats it: a DFlash drafter that does not is no better than the trivial one."""
    ngram_al = acceptance(ngram.counters, num_speculative_tokens)["mean_acceptance_length"]
    al = evaluation["mean_acceptance_length"]
    beats = None if al is None else al > (ngram_al or 1.0)
    figures: dict[str, Any] = {"ngram_mean_acceptance_length": ngram_al,
                               "ngram_output_tokens_per_s": ngram.tokens_per_s,
                               "beats_ngram": beats}
    if beats is False:
        figures["warnings"] = [f"the drafter does not beat n-gram drafting: served acceptance "
                               f"length {al:.2f} vs {ngram_al or 1.0:.2f} for prompt lookup"]
    return figures


def estimate_figures(evaluation: dict[str, Any], eal: float | None) -> dict[str, Any]:
    """The trainer's estimate beside the served number: speculators' validation eal averages
    over every anchor position, while serving drafts mostly where the last draft failed, so
    eal overstates the served acceptance length; the ratio shows by how much."""
    served = evaluation["mean_acceptance_length"]
    if eal is None or served is None:
        return {"trainer_eal_estimate": eal, "served_vs_trainer_eal": None}
    ratio = round(served / eal, 3) if eal else None
    figures: dict[str, Any] = {"trainer_eal_estimate": round(eal, 4), "served_vs_trainer_eal": ratio}
    if ratio is not None and ratio < 0.8:
        figures["warnings"] = [*evaluation.get("warnings", []),
                               f"the trainer's estimate (eal {eal:.2f}) overstates the served "
                               f"acceptance length ({served:.2f}) by {eal / served:.1f}x"]
    return figures


def baseline_figures(result: "Measurement", baseline: "Measurement",
                     ngram: "Measurement | None" = None) -> dict[str, Any]:
    """The speedup over the verifier alone (and n-gram drafting's), and whether greedy decoding
    gave the same text with and without the drafter (it must: speculative decoding is
    lossless)."""
    same = sum(a == b for a, b in zip(result.texts, baseline.texts, strict=True))
    figures = {
        "baseline_output_tokens_per_s": baseline.tokens_per_s,
        "speedup": speedup(result, baseline),
        "outputs_identical_to_baseline": f"{same}/{len(result.texts)}",
    }
    if ngram is not None:
        figures["ngram_speedup"] = speedup(ngram, baseline)
    return figures


def speedup(result: "Measurement", baseline: "Measurement") -> float | None:
    if result.tokens_per_s and baseline.tokens_per_s:
        return round(result.tokens_per_s / baseline.tokens_per_s, 3)
    return None


@dataclass
class Steps:
    """The evaluation's progress in the job row (JobOut.stage_progress): each engine's start is
    a step, and each held-out prompt it serves."""

    ctx: JobContext
    total: int
    done: int = 0
    started_at: str = field(default_factory=lambda: utcnow().isoformat())

    def report(self, what: str, *, step: bool = True) -> None:
        self.done += step
        progress = {"stage": Stage.EVALUATING.value, "what": what, "steps_done": self.done,
                    "total_steps": self.total, "started_at": self.started_at}
        self.ctx.write(lambda session: self.ctx.lease.update(session, stage_progress=progress))

    def starting(self, labels: list[str]) -> None:
        engines = "engines" if len(labels) > 1 else "engine"
        self.report(f"starting the {engines} for {' and '.join(labels)}", step=False)

    def of(self, label: str) -> "EngineSteps":
        return EngineSteps(self, label)


@dataclass(frozen=True)
class EngineSteps:
    """One engine's part of the evaluation's steps: its start (``Steps.starting``), then its
    prompts."""

    steps: Steps
    label: str

    def ready(self, prompts: int) -> None:
        self.steps.report(f"{self.label}: serving {prompts} held-out prompts")

    def prompt_done(self, done: int, prompts: int) -> None:
        self.steps.report(f"{self.label}: prompt {done} of {prompts} done")


ENGINE_LOGS = {"dflash": "evaluation-engine.log", "ngram": "ngram-engine.log",
               None: "baseline-engine.log"}
ENGINE_NAMES = {"dflash": "evaluation engine", "ngram": "n-gram engine",
                None: "baseline engine (no speculation)"}


def engines_wanted(drafters: list[Drafter], settings: dict[str, Any]) -> list[EngineWanted]:
    """The engines to measure, in order: each checkpoint's, then n-gram and the verifier alone."""
    one = len(drafters) == 1
    wanted = [EngineWanted(d.checkpoint_id, "dflash", d.path,
                           "the trained drafter" if one else f"the epoch {d.epoch} checkpoint",
                           ENGINE_LOGS["dflash"] if one else f"evaluation-engine-epoch-{d.epoch}.log")
              for d in drafters]
    if settings["ngram"]:
        wanted.append(EngineWanted("ngram", "ngram", None, "n-gram drafting", ENGINE_LOGS["ngram"]))
    if settings["baseline"]:
        wanted.append(EngineWanted("alone", None, None, "the verifier alone", ENGINE_LOGS[None]))
    return wanted


def serve_and_measure(ctx: JobContext, wanted: list[EngineWanted], prompts: list[Prompt],
                      max_tokens: int, steps: Steps) -> dict[str, Measurement]:
    """Each engine's measurement on the prompts, by its key. Engines start ``engines_at_once``
    at a time; the ones started together are all ready before the first is measured, and each
    is stopped once measured."""
    runs: dict[str, Measurement] = {}
    at_once = engines_at_once(ctx.spec)
    for first in range(0, len(wanted), at_once):
        together = wanted[first:first + at_once]
        steps.starting([w.label for w in together])
        batch = [start_engine(ctx, w, steps.of(w.label), port)
                 for w, port in zip(together, free_ports(len(together)), strict=True)]
        for engine in batch:
            wait_engine_ready(ctx, engine)
        for engine in batch:
            runs[engine.wanted.key] = measure_engine(ctx, engine, prompts, max_tokens)
    return runs


def engines_at_once(spec: dict[str, Any]) -> int:
    """How many of the evaluation's engines start together. On the local runtime two: a vLLM
    start is mostly one core's imports, so two on two cores take about the time of one, and
    they are all up before the first is measured (no start runs beside a measurement). On GPUs
    one: each engine takes most of the verifier's GPU memory."""
    return 2 if spec["runtime"] == "local" else 1


@dataclass(frozen=True)
class EngineWanted:
    key: str  # the checkpoint's id, "ngram" or "alone"
    method: str | None  # "dflash", "ngram", or None: no speculation
    drafter: str | None  # the checkpoint's directory for "dflash"
    label: str
    log_name: str


@dataclass
class Engine:
    """One started evaluation engine: made ready, then measured and stopped."""

    wanted: EngineWanted
    steps: EngineSteps
    command: StageCommand
    proc: ManagedProcess
    base_url: str
    headers: dict[str, str]
    log_path: Path

    @property
    def what(self) -> str:
        return ENGINE_NAMES[self.wanted.method]


def start_engine(ctx: JobContext, wanted: EngineWanted, steps: EngineSteps, port: int) -> Engine:
    """Start the engine (with the drafter, with n-gram drafting, or without speculation); it is
    stopped when measured, or when the attempt ends."""
    assert ctx.plan is not None
    api_key = secrets.token_urlsafe(32)  # the engine's internal key: in its environment only
    ctx.secrets.append(api_key)
    command = evaluation_command(ctx.spec, wanted.drafter, port=port, gpus=ctx.plan.verifier_gpus,
                                 api_key=api_key, method=wanted.method)
    log_path = ctx.paths.root / wanted.log_name
    proc = ctx.start(command, log_path=log_path)
    ctx.on_cleanup(lambda: ctx.stop(proc))
    return Engine(wanted, steps, command, proc, f"http://127.0.0.1:{port}",
                  {"Authorization": f"Bearer {api_key}"}, log_path)


def wait_engine_ready(ctx: JobContext, engine: Engine) -> None:
    """Wait for the engine's model; from then on its death fails the stage."""
    wait_ready(ctx, engine.proc, engine.base_url, EVALUATION_MODEL, what=engine.what,
               log_path=engine.log_path, timeout=ctx.settings.verifier_ready_seconds,
               headers=engine.headers)
    ctx.watch(engine.what, engine.proc, engine.log_path)


def measure_engine(ctx: JobContext, engine: Engine, prompts: list[Prompt], max_tokens: int
                   ) -> Measurement:
    """Send the prompts to a ready engine, then stop it."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluate")
    client = httpx.Client(base_url=engine.base_url, headers=engine.headers, timeout=REQUEST_TIMEOUT)
    try:
        engine.steps.ready(len(prompts))
        return measure(ctx, pool, client, prompts, max_tokens, engine.log_path,
                       on_prompt=engine.steps.prompt_done, engine=engine.command.description)
    finally:
        ctx.stop(engine.proc)  # the engine's exit also ends a request still in flight
        pool.shutdown(wait=False, cancel_futures=True)
        client.close()


def summary(evaluation: dict[str, Any]) -> str:
    """One line for the job's events, the served number first: "served mean acceptance length
    3.41 (n-gram 1.80, no speculation 1.00) over 8 held-out prompts (...)"."""
    al, speed = evaluation["mean_acceptance_length"], evaluation["output_tokens_per_s"]
    head = (f"served mean acceptance length {al:.2f}" if al is not None
            else "no speculative drafts were made")
    if evaluation.get("ngram_mean_acceptance_length") is not None or "beats_ngram" in evaluation:
        head += f" (n-gram {evaluation.get('ngram_mean_acceptance_length') or 1.0:.2f}"
        head += ", no speculation 1.00)" if "speedup" in evaluation else ")"
    speed_text = f", {speed:.1f} output tokens/s" if speed is not None else ""
    if evaluation.get("speedup") is not None:
        speed_text += (f", {evaluation['speedup']:.2f}x the verifier alone, outputs identical "
                       f"{evaluation['outputs_identical_to_baseline']}")
    estimate = (f"; the trainer's estimate was eal {evaluation['trainer_eal_estimate']:.2f}"
                if evaluation.get("trainer_eal_estimate") is not None else "")
    warnings = "".join(f". Warning: {w}" for w in evaluation.get("warnings", []))
    return (f"{head} over {evaluation['prompts']} held-out prompts (epoch {evaluation['epoch']} "
            f"checkpoint, {evaluation['runtime']} runtime{speed_text}){estimate}{warnings}")


@dataclass(frozen=True)
class Measurement:
    counters: SpecDecodeCounters  # the difference around the prompts
    completion_tokens: int
    seconds: float  # time spent in the requests
    texts: list[str] = field(default_factory=list)  # each prompt's completion
    engine: str = ""  # the engine's description (its command's)

    @property
    def tokens_per_s(self) -> float | None:
        return round(self.completion_tokens / self.seconds, 2) if self.seconds > 0 else None


def measure(ctx: JobContext, pool: concurrent.futures.Executor, client: httpx.Client,
            prompts: list[Prompt], max_tokens: int, log_path: Path,
            on_prompt: Callable[[int, int], None], engine: str = "") -> Measurement:
    def call(method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        try:
            response = while_running(ctx, pool, lambda: client.request(method, path, json=body))
        except httpx.HTTPError as exc:
            ctx.check()  # the engine died: that is the error worth reporting
            raise StageFailed(f"the evaluation engine did not answer {path}: {exc}",
                              code="evaluation_failed", log_tail=tail(log_path)) from exc
        if response.status_code != 200:
            raise StageFailed(f"the evaluation engine answered {path} with "
                              f"{response.status_code}: {response.text[:300]}",
                              code="evaluation_failed", log_tail=tail(log_path))
        return response

    # One request first, not counted: a fresh engine's first request pays one-time costs (lazy
    # allocations, first use of its kernels and caches) that are not its serving speed.
    call("POST", *request(prompts[0], max_tokens))
    before = parse_counters(call("GET", "/metrics").text)
    completion_tokens, seconds, texts = 0, 0.0, []
    for prompt in prompts:
        ctx.check()
        started = time.monotonic()
        reply = call("POST", *request(prompt, max_tokens)).json()
        seconds += time.monotonic() - started
        completion_tokens += int((reply.get("usage") or {}).get("completion_tokens") or 0)
        choice = (reply.get("choices") or [{}])[0]
        texts.append(choice.get("text") or (choice.get("message") or {}).get("content") or "")
        on_prompt(len(texts), len(prompts))
    after = parse_counters(call("GET", "/metrics").text)
    return Measurement(after - before, completion_tokens, seconds, texts, engine)


def request(prompt: Prompt, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The path and JSON body for one greedy completion: chat messages go to
    ``/v1/chat/completions``, a rendered prompt's token ids to ``/v1/completions``."""
    body: dict[str, Any] = {"model": EVALUATION_MODEL, "max_tokens": max_tokens,
                            "temperature": 0, "stream": False}
    if prompt and isinstance(prompt[0], int):
        return "/v1/completions", {**body, "prompt": prompt}
    return "/v1/chat/completions", {**body, "messages": prompt}
