"""Stage: evaluate the best checkpoint the way it will be served.

The hidden-states server is stopped (its GPUs and memory are needed), then the job's best
checkpoint is served with exactly a deployment's command (``build_serve``: ``vllm serve
--speculative-config dflash``, or the local engine) on the verifier's GPUs. Held-out prompts
are sent to its ``/v1/chat/completions``, greedily and one at a time; the difference of the
engine's speculative-decoding counters (``/metrics``) around them gives the mean acceptance
length, ``1 + accepted / drafts``, and the acceptance rate at each draft position. With the
baseline (the default), the same server then runs without speculative decoding on the same
prompts: the speedup is output tokens/s with the drafter over without, and the greedy texts are
compared (lossless decoding makes them the same). The result is recorded on the checkpoint (and
so in its model card), as job metrics and as an event.

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

from app.db import session_scope
from app.db.models import Checkpoint, JobMetric
from workers.publish import best_checkpoint
from workers.readiness import free_port, wait_ready
from workers.runner import JobContext, StageFailed
from workers.runtimes import (
    EVALUATION_MODEL,
    JobPaths,
    StageCommand,
    evaluation_command,
    evaluation_settings,
    training_data,
)
from workers.supervisor import tail

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
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool"}


# ---------------------------------------------------------------------------------------------
# The engine's counters and what they mean
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpecDecodeCounters:
    """vLLM's speculative-decoding counters, summed over their label sets (engines, models)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)

    def __sub__(self, before: "SpecDecodeCounters") -> "SpecDecodeCounters":
        positions = set(self.accepted_per_position) | set(before.accepted_per_position)
        return SpecDecodeCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_position={p: self.accepted_per_position.get(p, 0.0)
                                   - before.accepted_per_position.get(p, 0.0) for p in positions})


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


def held_out_prompts(spec: dict[str, Any], paths: JobPaths,
                     n: int) -> tuple[list[list[dict[str, Any]]], str, str | None]:
    """Up to ``n`` prompts as chat messages, where they come from, and why the validation
    split could not be used (None when it was)."""
    source = Path(training_data(spec, paths))
    why: str | None = None
    try:
        texts = validation_prompt_texts(spec, paths.data, n)
        prompts = match_prompts(texts, conversations(source))[-n:]
        if prompts:
            return prompts, VALIDATION_SPLIT, None
        why = "no validation row could be traced back to a conversation's first turn"
    except Exception as exc:  # a best effort: the fallback below still measures the drafter
        log.warning("validation prompts unavailable: %s", exc, exc_info=True)
        why = f"the validation split could not be read: {type(exc).__name__}: {exc}"
    return last_conversations(source, n), LAST_CONVERSATIONS, why


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


def _already_evaluated(checkpoint: Checkpoint, settings: dict[str, int]) -> bool:
    done = checkpoint.evaluation or {}
    return (done.get("checkpoint_id") == checkpoint.id and done.get("max_tokens") == settings["max_tokens"]
            and done.get("requested_prompts") == settings["prompts"]
            and ("speedup" in done) == settings["baseline"])


def _stop_verifier_server(ctx: JobContext) -> None:
    proc = ctx.verifier_server
    if proc is None:
        return
    ctx.stop(proc)
    ctx.verifier_server = None
    ctx.event("verifier_stopped", "hidden-states server stopped: the evaluation needs its GPUs")


def _record(ctx: JobContext, checkpoint_id: str, epoch: int, evaluation: dict[str, Any]) -> None:
    names = {"eval/mean_acceptance_length": evaluation["mean_acceptance_length"],
             "eval/draft_acceptance_rate": evaluation["draft_acceptance_rate"],
             "eval/output_tokens_per_s": evaluation["output_tokens_per_s"],
             "eval/speedup": evaluation.get("speedup"),
             **{f"eval/acceptance_rate_pos_{p}": rate
                for p, rate in enumerate(evaluation["acceptance_rate_per_position"])}}

    def write(session: Any) -> None:
        session.get(Checkpoint, checkpoint_id).evaluation = evaluation
        session.add_all(JobMetric(job_id=ctx.job_id, step=None, epoch=epoch, name=name, value=value)
                        for name, value in names.items() if value is not None)

    ctx.write(write)  # one transaction: a rerun never finds metrics without the evaluation


def evaluate(ctx: JobContext) -> None:
    settings = evaluation_settings(ctx.spec)
    assert settings is not None, "the pipeline runs this stage only when the job evaluates"
    assert ctx.plan is not None, "the verifier stage sets the plan"
    with session_scope() as session:
        checkpoint = best_checkpoint(session, ctx.job_id)
        if checkpoint is None:
            raise StageFailed("there is no checkpoint to evaluate", code="no_checkpoint")
        checkpoint_id, epoch, drafter = checkpoint.id, checkpoint.epoch, checkpoint.path
        if _already_evaluated(checkpoint, settings):
            ctx.event("skipped", f"the epoch {epoch} checkpoint is already evaluated; keeping "
                      "its evaluation", {"checkpoint_id": checkpoint_id})
            return
    prompts, source, why = held_out_prompts(ctx.spec, ctx.paths, settings["prompts"])
    if not prompts:
        raise StageFailed("no conversation with a user turn to evaluate on", code="data_error")
    _stop_verifier_server(ctx)

    ctx.event("evaluation_started", f"evaluating the epoch {epoch} checkpoint on "
              f"{len(prompts)} prompts ({source})"
              + (", then the verifier alone on the same prompts" if settings["baseline"] else ""),
              {"checkpoint_id": checkpoint_id, "prompt_source": source,
               **({"why_not_validation": why} if why else {})})
    command, result = serve_and_measure(ctx, drafter, prompts, settings["max_tokens"])
    num_speculative_tokens = ctx.spec["speculator"]["block_size"] - 1
    evaluation = {
        "checkpoint_id": checkpoint_id,
        "epoch": epoch,
        "runtime": ctx.spec["runtime"],
        "engine": command.description,
        "prompts": len(prompts),
        "requested_prompts": settings["prompts"],
        "prompt_source": source,
        "max_tokens": settings["max_tokens"],
        "temperature": 0,
        "num_speculative_tokens": num_speculative_tokens,
        **acceptance(result.counters, num_speculative_tokens),
        "completion_tokens": result.completion_tokens,
        "seconds": round(result.seconds, 3),
        "output_tokens_per_s": result.tokens_per_s,
    }
    if settings["baseline"]:
        _, baseline = serve_and_measure(ctx, drafter, prompts, settings["max_tokens"],
                                        speculative=False)
        evaluation.update(baseline_figures(result, baseline))
    _record(ctx, checkpoint_id, epoch, evaluation)
    ctx.event("evaluated", summary(evaluation), evaluation)


def baseline_figures(result: "Measurement", baseline: "Measurement") -> dict[str, Any]:
    """The speedup over the verifier alone, and whether greedy decoding gave the same text
    with and without the drafter (it must: speculative decoding is lossless)."""
    same = sum(a == b for a, b in zip(result.texts, baseline.texts, strict=True))
    return {
        "baseline_output_tokens_per_s": baseline.tokens_per_s,
        "speedup": (round(result.tokens_per_s / baseline.tokens_per_s, 3)
                    if result.tokens_per_s and baseline.tokens_per_s else None),
        "outputs_identical_to_baseline": f"{same}/{len(result.texts)}",
    }


def serve_and_measure(ctx: JobContext, drafter: str, prompts: list[list[dict[str, Any]]],
                      max_tokens: int, speculative: bool = True
                      ) -> tuple[StageCommand, "Measurement"]:
    """Start the engine (with the drafter, or without speculation for the baseline), send the
    prompts, stop it."""
    assert ctx.plan is not None
    what = "evaluation engine" if speculative else "baseline engine (no speculation)"
    api_key = secrets.token_urlsafe(32)  # the engine's internal key: in its environment only
    ctx.secrets.append(api_key)
    port = free_port()
    command = evaluation_command(ctx.spec, drafter, port=port, gpus=ctx.plan.verifier_gpus,
                                 api_key=api_key, speculative=speculative)
    log_path = ctx.paths.root / ("evaluation-engine.log" if speculative else "baseline-engine.log")
    proc = ctx.start(command, log_path=log_path)
    ctx.on_cleanup(lambda: ctx.stop(proc))
    base_url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {api_key}"}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="evaluate")
    client = httpx.Client(base_url=base_url, headers=headers, timeout=REQUEST_TIMEOUT)
    try:
        wait_ready(ctx, proc, base_url, EVALUATION_MODEL, what=what, log_path=log_path,
                   timeout=ctx.settings.verifier_ready_seconds, headers=headers)
        ctx.watch(what, proc, log_path)
        return command, measure(ctx, pool, client, prompts, max_tokens, log_path)
    finally:
        ctx.stop(proc)  # the engine's exit also ends a request still in flight
        pool.shutdown(wait=False, cancel_futures=True)
        client.close()


def summary(evaluation: dict[str, Any]) -> str:
    """One line for the job's events: "mean acceptance length 2.31 over 8 prompts (...)"."""
    al, speed = evaluation["mean_acceptance_length"], evaluation["output_tokens_per_s"]
    head = f"mean acceptance length {al:.2f}" if al is not None else "no speculative drafts were made"
    speed_text = f", {speed:.1f} output tokens/s" if speed is not None else ""
    if evaluation.get("speedup") is not None:
        speed_text += (f", {evaluation['speedup']:.2f}x the verifier alone, outputs identical "
                       f"{evaluation['outputs_identical_to_baseline']}")
    return (f"{head} over {evaluation['prompts']} prompts (epoch {evaluation['epoch']} "
            f"checkpoint, {evaluation['runtime']} runtime{speed_text})")


@dataclass(frozen=True)
class Measurement:
    counters: SpecDecodeCounters  # the difference around the prompts
    completion_tokens: int
    seconds: float  # time spent in the requests
    texts: list[str] = field(default_factory=list)  # each prompt's completion

    @property
    def tokens_per_s(self) -> float | None:
        return round(self.completion_tokens / self.seconds, 2) if self.seconds > 0 else None


def measure(ctx: JobContext, pool: concurrent.futures.Executor, client: httpx.Client,
            prompts: list[list[dict[str, Any]]], max_tokens: int, log_path: Path) -> Measurement:
    def call(method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = while_running(ctx, pool, lambda: client.request(method, path, **kwargs))
        except httpx.HTTPError as exc:
            ctx.check()  # the engine died: that is the error worth reporting
            raise StageFailed(f"the evaluation engine did not answer {path}: {exc}",
                              code="evaluation_failed", log_tail=tail(log_path)) from exc
        if response.status_code != 200:
            raise StageFailed(f"the evaluation engine answered {path} with "
                              f"{response.status_code}: {response.text[:300]}",
                              code="evaluation_failed", log_tail=tail(log_path))
        return response

    before = parse_counters(call("GET", "/metrics").text)
    completion_tokens, seconds, texts = 0, 0.0, []
    for messages in prompts:
        ctx.check()
        started = time.monotonic()
        body = {"model": EVALUATION_MODEL, "messages": messages, "max_tokens": max_tokens,
                "temperature": 0, "stream": False}
        reply = call("POST", "/v1/chat/completions", json=body).json()
        seconds += time.monotonic() - started
        completion_tokens += int((reply.get("usage") or {}).get("completion_tokens") or 0)
        texts.append(((reply.get("choices") or [{}])[0].get("message") or {}).get("content") or "")
    after = parse_counters(call("GET", "/metrics").text)
    return Measurement(after - before, completion_tokens, seconds, texts)
