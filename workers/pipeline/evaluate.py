"""Stage: every trained drafter served the way a deployment serves it, beside the baselines, on
the same held-out prompts (workers/pipeline/held_out.py), and ranked.

The hidden-states server is stopped (its GPUs and memory are needed). Then an engine per drafter
(each candidate's chosen checkpoints: the trainer's best, or the last N epochs), one with n-gram
drafting and one with the verifier alone start together, each exactly a deployment's serving
command (``build_serve``: ``vllm serve --speculative-config <kind>``, or vLLM's CPU wheel on the
local runtime); on GPUs they share the verifier's GPUs, each with its share of their memory. Once
all are ready they answer the prompts in turns: each prompt goes to every engine, one request at
a time, in an order that rotates from prompt to prompt, and the whole is repeated
``evaluate.rounds`` times. So a change in the machine's load between engines falls on all of them
alike: each round gives each drafter a speedup (its output tokens/s over the verifier alone's in
that round), the median is the one reported and the range its spread.

The difference of each engine's speculative-decoding counters (``/metrics``) around the rounds
gives its served mean acceptance length, ``1 + accepted / drafts``, and the acceptance at each
draft position; greedy decoding is lossless, so every output must equal the verifier's alone.
Each candidate keeps its checkpoint with the highest acceptance length; the candidates are ranked
by speedup (app/services/leaderboard.py), and the winner is the fastest lossless one that passes
the gate. A candidate whose engine fails is marked failed and the others go on. Everything is
recorded on the checkpoints, the candidates, the job (its winner's figures, headline first), as
metrics and as an event.
"""

from __future__ import annotations

import concurrent.futures
import logging
import secrets
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy import select

from app.db import session_scope
from app.db.models import Checkpoint, Job, JobCandidate, JobMetric, utcnow
from app.logtail import tail
from app.runtimes import EVALUATION_MODEL, EngineKind, StageCommand, evaluation_command
from app.schemas.job_spec import Candidate, JobSpec
from app.schemas.jobs import EvaluateSpec
from app.services.leaderboard import Entry, Standing, rank
from app.services.state import CandidateStatus, Stage, move_candidate, record_event
from workers.pipeline.counters import SpecDecodeCounters, acceptance, parse_counters
from workers.pipeline.gate import gate_failures
from workers.pipeline.held_out import Prompt, held_out_prompts
from workers.pipeline.training import candidate_row
from workers.readiness import NotReady, free_ports, wait_ready
from workers.runner import JobContext, StageFailed
from workers.supervisor import ManagedProcess

log = logging.getLogger(__name__)
T = TypeVar("T")

# One greedy completion of at most 8192 tokens; a cancel does not wait for it (while_running).
REQUEST_TIMEOUT = httpx.Timeout(connect=10.0, read=900.0, write=30.0, pool=10.0)


class EngineDown(StageFailed):
    """An engine stopped answering while the job goes on (its own crash)."""


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


# ---------------------------------------------------------------------------------------------
# What is served
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Drafter:
    """A checkpoint to serve, of one of the job's candidates."""

    candidate: Candidate
    checkpoint_id: str
    epoch: int
    path: str
    trainer_eal: float | None


def chosen(session: Any, job_id: str, candidate: int, settings: EvaluateSpec) -> list[Checkpoint]:
    """A candidate's checkpoints to serve: the trainer's best, or the last N epochs."""
    from workers.publish import best_checkpoint

    last = settings.last_epochs()
    if last is None:
        best = best_checkpoint(session, job_id, candidate=candidate)
        return [best] if best is not None else []
    rows = session.scalars(select(Checkpoint).where(
        Checkpoint.job_id == job_id, Checkpoint.candidate == candidate,
        Checkpoint.partial.is_(False)).order_by(Checkpoint.epoch.desc()).limit(last))
    return list(rows)[::-1]


def _already_evaluated(checkpoint: Checkpoint, settings: EvaluateSpec) -> bool:
    """Whether the checkpoint's recorded evaluation is of these settings (one recorded before
    rounds were counted had one)."""
    done = checkpoint.evaluation or {}
    return (done.get("checkpoint_id") == checkpoint.id and done.get("max_tokens") == settings.max_tokens
            and done.get("requested_prompts") == settings.prompts
            and ("speedup" in done) == settings.baseline
            and ("ngram_mean_acceptance_length" in done) == settings.ngram
            and done.get("checkpoints", "best") == settings.checkpoints
            and done.get("rounds", 1) == settings.rounds)


def trainer_eal(metrics: dict[str, Any] | None) -> float | None:
    """The trainer's own estimate of the acceptance length (validation ``eal``), if logged."""
    value = (metrics or {}).get("eal_epoch", (metrics or {}).get("eal"))
    return float(value) if isinstance(value, (int, float)) else None


def drafters_to_serve(ctx: JobContext[JobSpec], settings: EvaluateSpec
                      ) -> tuple[list[Drafter], bool]:
    """The trained candidates' checkpoints, and whether all of them are evaluated already (a
    job resumed after its worker died), with these settings."""
    found: list[Drafter] = []
    done = True
    with session_scope() as session:
        for candidate in ctx.spec.candidates:
            status = candidate_row(session, ctx.job_id, candidate).status
            if status not in (CandidateStatus.TRAINED, CandidateStatus.EVALUATED):
                continue
            rows = chosen(session, ctx.job_id, candidate.index, settings)
            done = done and bool(rows) and all(_already_evaluated(c, settings) for c in rows)
            found += [Drafter(candidate, c.id, c.epoch, c.path, trainer_eal(c.metrics)) for c in rows]
    return found, done and bool(found)


# ---------------------------------------------------------------------------------------------
# The engines
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineWanted:
    key: str  # the checkpoint's id, "ngram" or "alone"
    kind: EngineKind
    drafter: Drafter | None
    label: str
    log_name: str


ENGINE_NAMES = {"ngram": "n-gram engine", None: "baseline engine (no speculation)"}


def engines_wanted(spec: JobSpec, drafters: list[Drafter], settings: EvaluateSpec
                   ) -> list[EngineWanted]:
    """The engines to serve: each drafter's, then n-gram's and the verifier alone's."""
    wanted = []
    for d in drafters:
        several = sum(o.candidate.index == d.candidate.index for o in drafters) > 1
        if spec.is_bakeoff:
            label = f"{d.candidate.name} (epoch {d.epoch + 1})" if several else d.candidate.name
            log_name = f"evaluation-engine-{d.candidate.name}" + (f"-epoch-{d.epoch + 1}" if several else "")
        else:
            label = f"the epoch {d.epoch + 1} checkpoint" if several else "the trained drafter"
            log_name = f"evaluation-engine-epoch-{d.epoch + 1}" if several else "evaluation-engine"
        wanted.append(EngineWanted(d.checkpoint_id, EngineKind.of(spec, d.candidate), d, label,
                                   f"{log_name}.log"))
    if settings.ngram:
        wanted.append(EngineWanted("ngram", EngineKind.baseline("ngram"), None, "n-gram drafting",
                                   "ngram-engine.log"))
    if settings.baseline:
        wanted.append(EngineWanted("alone", EngineKind.baseline(None), None, "the verifier alone",
                                   "baseline-engine.log"))
    return wanted


@dataclass
class Engine:
    """One evaluation engine: started, made ready, then asked the prompts in turns."""

    wanted: EngineWanted
    command: StageCommand
    proc: ManagedProcess
    base_url: str
    headers: dict[str, str]
    log_path: Path
    failure: StageFailed | None = None  # a drafter's engine that failed is left out
    before: SpecDecodeCounters = field(default_factory=SpecDecodeCounters)
    counters: SpecDecodeCounters = field(default_factory=SpecDecodeCounters)
    tokens: list[int] = field(default_factory=list)  # per round
    seconds: list[float] = field(default_factory=list)  # per round
    texts: list[list[str]] = field(default_factory=list)  # per round, per prompt

    @property
    def what(self) -> str:
        return ENGINE_NAMES[self.wanted.kind.method] if self.is_baseline else "evaluation engine"

    @property
    def is_baseline(self) -> bool:
        return self.wanted.drafter is None


def start_engines(ctx: JobContext[JobSpec], wanted: list[EngineWanted]) -> list[Engine]:
    """Every engine at once, each on a port of its own; each is stopped once measured, or
    when the attempt ends."""
    assert ctx.plan is not None
    engines = []
    for w, port in zip(wanted, free_ports(len(wanted)), strict=True):
        api_key = secrets.token_urlsafe(32)  # the engine's internal key: in its environment only
        ctx.secrets.append(api_key)
        command = evaluation_command(ctx.spec, w.kind, w.drafter.path if w.drafter else None,
                                     port=port, gpus=ctx.plan.verifier_gpus, api_key=api_key,
                                     engines=len(wanted))
        log_path = ctx.paths.root / w.log_name
        proc = ctx.start(command, log_path=log_path)
        ctx.on_cleanup(lambda proc=proc: ctx.stop(proc))
        engines.append(Engine(w, command, proc, f"http://127.0.0.1:{port}",
                              {"Authorization": f"Bearer {api_key}"}, log_path))
    return engines


def wait_all_ready(ctx: JobContext[JobSpec], engines: list[Engine]) -> None:
    """Wait for each engine's model; from then on a baseline's death fails the stage. A
    drafter's engine that fails to start is left out (in a bake-off; else the stage fails)."""
    for engine in engines:
        try:
            wait_ready(ctx, engine.proc, engine.base_url, EVALUATION_MODEL, what=engine.what,
                       log_path=engine.log_path, timeout=ctx.settings.verifier_ready_seconds,
                       headers=engine.headers)
        except NotReady as exc:
            if engine.is_baseline or not ctx.spec.is_bakeoff:
                raise
            engine.failure = exc
            ctx.stop(engine.proc)
            continue
        if engine.is_baseline or not ctx.spec.is_bakeoff:
            ctx.watch(engine.what, engine.proc, engine.log_path)


# ---------------------------------------------------------------------------------------------
# Serving the prompts in turns
# ---------------------------------------------------------------------------------------------

def request(prompt: Prompt, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The path and JSON body for one greedy completion: chat messages go to
    ``/v1/chat/completions``, a rendered prompt's token ids to ``/v1/completions``."""
    body: dict[str, Any] = {"model": EVALUATION_MODEL, "max_tokens": max_tokens,
                            "temperature": 0, "stream": False}
    if prompt and isinstance(prompt[0], int):
        return "/v1/completions", {**body, "prompt": prompt}
    return "/v1/chat/completions", {**body, "messages": prompt}


class Caller:
    """Requests to one engine, through a worker thread that the job's checks can interrupt."""

    def __init__(self, ctx: JobContext, engine: Engine) -> None:
        self.ctx, self.engine = ctx, engine
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                          thread_name_prefix="evaluate")
        self.client = httpx.Client(base_url=engine.base_url, headers=engine.headers,
                                   timeout=REQUEST_TIMEOUT)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        engine = self.engine
        try:
            response = while_running(self.ctx, self.pool,
                                     lambda: self.client.request(method, path, json=body))
        except httpx.HTTPError as exc:
            self.ctx.check()  # the job stopped, or a baseline died: that is the error to report
            raise EngineDown(f"the {engine.what} did not answer {path}: {exc}",
                             code="evaluation_failed", log_tail=tail(engine.log_path)) from exc
        if response.status_code != 200:
            raise EngineDown(f"the {engine.what} answered {path} with {response.status_code}: "
                             f"{response.text[:300]}", code="evaluation_failed",
                             log_tail=tail(engine.log_path))
        return response

    def complete(self, prompt: Prompt, max_tokens: int) -> tuple[int, float, str]:
        started = time.monotonic()
        reply = self.call("POST", *request(prompt, max_tokens)).json()
        seconds = time.monotonic() - started
        choice = (reply.get("choices") or [{}])[0]
        text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
        return int((reply.get("usage") or {}).get("completion_tokens") or 0), seconds, text

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def serve_in_turns(ctx: JobContext[JobSpec], engines: list[Engine], prompts: list[Prompt],
                   settings: EvaluateSpec, steps: "Steps") -> None:
    """Each round, each prompt to every engine in turn (the order rotating by one from prompt
    to prompt, so no engine always goes first); the counters before and after. A drafter's
    engine that stops answering is left out (in a bake-off)."""
    callers = {id(e): Caller(ctx, e) for e in engines if e.failure is None}

    def guarded(engine: Engine, fn: Callable[[Caller], T]) -> T | None:
        try:
            return fn(callers[id(engine)])
        except EngineDown as exc:
            if engine.is_baseline or not ctx.spec.is_bakeoff:
                raise
            engine.failure = exc
            ctx.stop(engine.proc)
            return None

    def live() -> list[Engine]:
        return [e for e in engines if e.failure is None]

    try:
        # One request first, not counted: a fresh engine's first request pays one-time costs
        # (lazy allocations, first use of its kernels and caches) that are not its speed.
        for engine in live():
            guarded(engine, lambda c: c.complete(prompts[0], settings.max_tokens))
        for engine in live():
            before = guarded(engine, lambda c: parse_counters(c.call("GET", "/metrics").text))
            engine.before = before or SpecDecodeCounters()
        turn = 0
        for round_ in range(settings.rounds):
            for engine in live():
                engine.tokens.append(0)
                engine.seconds.append(0.0)
                engine.texts.append([])
            for number, prompt in enumerate(prompts, 1):
                ctx.check()
                order = live()
                shift = turn % len(order)
                for engine in order[shift:] + order[:shift]:
                    answer = guarded(engine, lambda c: c.complete(prompt, settings.max_tokens))
                    if answer is not None:
                        engine.tokens[-1] += answer[0]
                        engine.seconds[-1] += answer[1]
                        engine.texts[-1].append(answer[2])
                turn += 1
                steps.report(f"round {round_ + 1} of {settings.rounds}: prompt {number} of "
                             f"{len(prompts)} done")
        for engine in live():
            after = guarded(engine, lambda c: parse_counters(c.call("GET", "/metrics").text))
            if after is not None:
                engine.counters = after - engine.before
    finally:
        for caller in callers.values():
            caller.close()
        for engine in engines:
            ctx.stop(engine.proc)  # the engine's exit also ends a request still in flight


# ---------------------------------------------------------------------------------------------
# The figures
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    """What one engine did over the rounds."""

    counters: SpecDecodeCounters  # the difference around the rounds
    tokens: list[int]  # per round
    seconds: list[float]  # per round
    texts: list[list[str]] = field(default_factory=list)  # per round, each prompt's completion
    engine: str = ""  # the engine's description (its command's)

    @classmethod
    def of(cls, engine: Engine) -> "Measurement":
        return cls(engine.counters, engine.tokens, engine.seconds, engine.texts,
                   engine.command.description)

    @property
    def completion_tokens(self) -> int:
        """Per round (greedy decoding gives the same completions every round)."""
        return self.tokens[0] if self.tokens else 0

    @property
    def mean_seconds(self) -> float:
        return sum(self.seconds) / len(self.seconds) if self.seconds else 0.0

    @property
    def tokens_per_s(self) -> float | None:
        total = sum(self.seconds)
        return round(sum(self.tokens) / total, 2) if total > 0 else None

    def round_rates(self) -> list[float | None]:
        return [t / s if s > 0 else None for t, s in zip(self.tokens, self.seconds, strict=True)]


def speedups(result: Measurement, baseline: Measurement) -> list[float]:
    """Each round's output tokens/s over the baseline's in the same round."""
    return [round(r / b, 3) for r, b in zip(result.round_rates(), baseline.round_rates(),
                                            strict=False) if r and b]


def spread_figures(rounds: list[float]) -> dict[str, Any]:
    """The speedup as reported (the median of the rounds), the rounds and their spread."""
    if not rounds:
        return {"speedup": None, "speedups": [], "speedup_spread": None}
    return {"speedup": round(statistics.median(rounds), 3), "speedups": rounds,
            "speedup_spread": round(max(rounds) - min(rounds), 3)}


def ngram_figures(evaluation: dict[str, Any], ngram: Measurement,
                  num_speculative_tokens: int) -> dict[str, Any]:
    """n-gram (prompt lookup) drafting on the same prompts, and whether the trained drafter
    beats it: a drafter that does not is no better than the trivial one."""
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


def baseline_figures(result: Measurement, baseline: Measurement,
                     ngram: Measurement | None = None) -> dict[str, Any]:
    """The speedup over the verifier alone (the median of the rounds, and its spread; n-gram
    drafting's too), and whether greedy decoding gave the same text with and without the drafter
    on every prompt in every round (it must: speculative decoding is lossless)."""
    prompts = len(result.texts[0]) if result.texts else 0
    same = sum(all(r[p] == b[p] for r, b in zip(result.texts, baseline.texts, strict=False)
                   if p < len(r) and p < len(b)) for p in range(prompts))
    figures = {
        "baseline_output_tokens_per_s": baseline.tokens_per_s,
        **spread_figures(speedups(result, baseline)),
        "outputs_identical_to_baseline": f"{same}/{prompts}",
        "lossless": same == prompts,
    }
    if ngram is not None:
        figures["ngram_speedup"] = spread_figures(speedups(ngram, baseline))["speedup"]
    return figures


def drafter_figures(ctx: JobContext[JobSpec], drafter: Drafter, result: Measurement,
                    ngram: Measurement | None, alone: Measurement | None, prompts: int,
                    source: str, settings: EvaluateSpec) -> dict[str, Any]:
    """One checkpoint's served evaluation, the served numbers first, the estimate last."""
    tokens = drafter.candidate.drafter.num_speculative_tokens()
    evaluation = {
        "checkpoint_id": drafter.checkpoint_id,
        "epoch": drafter.epoch,
        "candidate": drafter.candidate.name,
        "kind": drafter.candidate.kind,
        "runtime": ctx.spec.runtime,
        "engine": result.engine,
        "prompts": prompts,
        "requested_prompts": settings.prompts,
        "prompt_source": source,
        "max_tokens": settings.max_tokens,
        "checkpoints": settings.checkpoints,
        "rounds": settings.rounds,
        "temperature": 0,
        "num_speculative_tokens": tokens,
        **acceptance(result.counters, tokens),
        "completion_tokens": result.completion_tokens,
        "seconds": round(result.mean_seconds, 3),
        "output_tokens_per_s": result.tokens_per_s,
    }
    if ngram is not None:
        evaluation.update(ngram_figures(evaluation, ngram, tokens))
    if alone is not None:
        evaluation.update(baseline_figures(result, alone, ngram))
    evaluation.update(estimate_figures(evaluation, drafter.trainer_eal))
    return evaluation


# ---------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------

@dataclass
class Steps:
    """The evaluation's progress in the job row (JobOut.stage_progress): each engine's start is
    a step, and each turn of a prompt (every engine answering it) in each round."""

    ctx: JobContext
    total: int
    done: int = 0
    started_at: str = field(default_factory=lambda: utcnow().isoformat())

    def report(self, what: str, *, steps: int = 1) -> None:
        self.done += steps
        progress = {"stage": Stage.EVALUATING.value, "what": what, "steps_done": self.done,
                    "total_steps": self.total, "started_at": self.started_at}
        self.ctx.write(lambda session: self.ctx.lease.update(session, stage_progress=progress))


# ---------------------------------------------------------------------------------------------
# The stage
# ---------------------------------------------------------------------------------------------

def _stop_verifier_server(ctx: JobContext) -> None:
    proc = ctx.verifier_server
    if proc is None:
        return
    ctx.stop(proc)
    ctx.verifier_server = None
    ctx.event("verifier_stopped", "hidden-states server stopped: the evaluation needs its GPUs")


def evaluate(ctx: JobContext[JobSpec]) -> None:
    settings = ctx.spec.evaluate
    assert settings is not None, "the pipeline runs this stage only when the job evaluates"
    assert ctx.plan is not None, "the verifier stage sets the plan"
    drafters, done = drafters_to_serve(ctx, settings)
    if not drafters:
        raise StageFailed("there is no checkpoint to evaluate", code="no_checkpoint")
    if done:
        ctx.event("skipped", "the checkpoints are already evaluated; keeping their evaluation",
                  {"checkpoint_ids": [d.checkpoint_id for d in drafters]})
        return
    prompts, source, why = held_out_prompts(ctx.spec, ctx.paths, settings.prompts)
    if not prompts:
        raise StageFailed("no conversation with a user turn to evaluate on", code="data_error")
    _stop_verifier_server(ctx)

    wanted = engines_wanted(ctx.spec, drafters, settings)
    which = (f"{len({d.candidate.index for d in drafters})} candidates" if ctx.spec.is_bakeoff
             else f"the epoch {drafters[0].epoch + 1} checkpoint" if len(drafters) == 1
             else f"the last {len(drafters)} checkpoints")
    also = [w.label for w in wanted if w.drafter is None]
    ctx.event("evaluation_started", f"serving {which}" + (f" beside {' and '.join(also)}"
              if also else "") + f" on {len(prompts)} held-out prompts ({source}), every engine "
              f"answering each prompt in turn, {settings.rounds} rounds",
              {"checkpoint_ids": [d.checkpoint_id for d in drafters], "prompt_source": source,
               "engines": [w.label for w in wanted], "rounds": settings.rounds,
               **({"why_not_validation": why} if why else {})})
    steps = Steps(ctx, total=len(wanted) + settings.rounds * len(prompts))
    steps.report(f"starting the engines for {', '.join(w.label for w in wanted)}", steps=0)
    engines = start_engines(ctx, wanted)
    wait_all_ready(ctx, engines)
    steps.report(f"{sum(e.failure is None for e in engines)} engines ready", steps=len(engines))
    serve_in_turns(ctx, engines, prompts, settings, steps)

    by_key = {e.wanted.key: e for e in engines}
    ngram = Measurement.of(by_key["ngram"]) if "ngram" in by_key else None
    alone = Measurement.of(by_key["alone"]) if "alone" in by_key else None
    evaluations: dict[str, dict[str, Any]] = {}
    failed: dict[int, StageFailed] = {}
    for drafter in drafters:
        engine = by_key[drafter.checkpoint_id]
        if engine.failure is not None:
            failed.setdefault(drafter.candidate.index, engine.failure)
            continue
        evaluations[drafter.checkpoint_id] = drafter_figures(
            ctx, drafter, Measurement.of(engine), ngram, alone, len(prompts), source, settings)
    record(ctx, drafters, evaluations, failed)


def selected_per_candidate(drafters: list[Drafter], evaluations: dict[str, dict[str, Any]]
                           ) -> dict[int, str]:
    """Each candidate's checkpoint with the highest served acceptance length (then the latest)."""
    best: dict[int, Drafter] = {}
    for d in drafters:
        if d.checkpoint_id not in evaluations:
            continue
        al = evaluations[d.checkpoint_id]["mean_acceptance_length"] or 0
        current = best.get(d.candidate.index)
        if current is None or (al, d.epoch) >= (
                evaluations[current.checkpoint_id]["mean_acceptance_length"] or 0, current.epoch):
            best[d.candidate.index] = d
    return {index: d.checkpoint_id for index, d in best.items()}


def standing_of(ctx: JobContext[JobSpec], selected: dict[int, str],
                evaluations: dict[str, dict[str, Any]], costs: dict[int, float | None]
                ) -> Standing:
    """Every evaluated candidate's place: eligible when lossless (or not compared) and it
    passes the gate."""
    gate = ctx.spec.gate.model_dump() if ctx.spec.gate else None
    entries = []
    for index, checkpoint_id in selected.items():
        evaluation = evaluations[checkpoint_id]
        failures = gate_failures(gate, evaluation) if gate else []
        evaluation["gate_passed"] = not failures if gate else None
        entries.append(Entry(ctx.spec.candidate(index).name, evaluation.get("speedup"),
                             evaluation.get("speedup_spread") or 0.0,
                             evaluation["mean_acceptance_length"], costs.get(index),
                             eligible=evaluation.get("lossless") is not False and not failures))
    return rank(entries)


# The headline of a job's evaluation, in the order shown: what serving measured first, the
# baselines beside it, the trainer's estimate last.
HEADLINE = ("checkpoint_id", "epoch", "mean_acceptance_length", "ngram_mean_acceptance_length",
            "speedup", "ngram_speedup", "beats_ngram", "outputs_identical_to_baseline",
            "prompts", "prompt_source", "trainer_eal_estimate", "served_vs_trainer_eal", "warnings",
            "candidate", "kind", "speedup_spread", "lossless", "rounds")


def record(ctx: JobContext[JobSpec], drafters: list[Drafter],
           evaluations: dict[str, dict[str, Any]], failed: dict[int, StageFailed]) -> None:
    """In one transaction: every checkpoint's evaluation, each candidate's figures, rank and
    status, the job's headline (its winner's, or the best ranked's) with the leaderboard, the
    headline's metrics, and the event. A rerun never finds part of it."""
    spec = ctx.spec
    selected = selected_per_candidate(drafters, evaluations)
    for checkpoint_id, evaluation in evaluations.items():
        evaluation["selected"] = checkpoint_id in selected.values()

    def write(session: Any) -> None:
        job = ctx.lease.load(session)
        rows = {c.index: candidate_row(session, ctx.job_id, c) for c in spec.candidates}
        costs = {i: next((v for v in (r.train_cpu_seconds, r.train_gpu_seconds, r.train_seconds)
                          if v is not None), None) for i, r in rows.items()}
        standing = standing_of(ctx, selected, evaluations, costs)
        for checkpoint_id, evaluation in evaluations.items():
            session.get(Checkpoint, checkpoint_id).evaluation = evaluation
        for index, failure in failed.items():
            move_candidate(session, job, rows[index], CandidateStatus.FAILED,
                           f"{rows[index].name} failed in the evaluation: {failure}",
                           reason=str(failure), error_code=failure.code,
                           columns={"log_tail": failure.log_tail})
        for index, checkpoint_id in selected.items():
            name = rows[index].name
            figures = {**evaluations[checkpoint_id], "rank": standing.ranking.index(name) + 1,
                       "winner": name == standing.winner, "tied_with": standing.ties[name]}
            move_candidate(session, job, rows[index], CandidateStatus.EVALUATED,
                           f"{name}: {short(figures)}", columns={"evaluation": figures},
                           data={"rank": figures["rank"]})
        if not standing.ranking:
            return
        head = spec.candidates[[c.name for c in spec.candidates].index(standing.ranking[0])]
        chosen = evaluations[selected[head.index]]
        board = {"winner": standing.winner, "ranking": standing.ranking,
                 "rounds": chosen.get("rounds"),
                 "baselines": {"no_speculation": chosen.get("baseline_output_tokens_per_s"),
                               "ngram": chosen.get("ngram_output_tokens_per_s"),
                               "ngram_speedup": chosen.get("ngram_speedup"),
                               "ngram_mean_acceptance_length":
                                   chosen.get("ngram_mean_acceptance_length")}}
        job.evaluation = {**{k: chosen.get(k) for k in HEADLINE}, "leaderboard": board}
        names = {"eval/mean_acceptance_length": chosen["mean_acceptance_length"],
                 "eval/draft_acceptance_rate": chosen["draft_acceptance_rate"],
                 "eval/output_tokens_per_s": chosen["output_tokens_per_s"],
                 "eval/speedup": chosen.get("speedup"),
                 "eval/ngram_mean_acceptance_length": chosen.get("ngram_mean_acceptance_length"),
                 "eval/ngram_speedup": chosen.get("ngram_speedup"),
                 "eval/trainer_eal_estimate": chosen.get("trainer_eal_estimate"),
                 **{f"eval/acceptance_rate_pos_{p}": rate
                    for p, rate in enumerate(chosen["acceptance_rate_per_position"])}}
        session.add_all(JobMetric(job_id=ctx.job_id, candidate=head.index, step=None,
                                  epoch=chosen["epoch"], name=name, value=value)
                        for name, value in names.items() if value is not None)
        message = (leaderboard_summary(standing, {rows[i].name: evaluations[c]
                                                  for i, c in selected.items()})
                   if spec.is_bakeoff else summary(chosen))
        record_event(session, job, "evaluated", message,
                     chosen if not spec.is_bakeoff else {**board, "candidates": {
                         rows[i].name: short(evaluations[c]) for i, c in selected.items()}})

    ctx.write(write)
    if not selected:
        raise StageFailed("no candidate could be served: " + "; ".join(map(str, failed.values())),
                          code="all_candidates_failed",
                          log_tail=next(iter(failed.values())).log_tail if failed else "")


def short(evaluation: dict[str, Any]) -> str:
    """A candidate's figures in a few words: "×2.81 ±0.12, AL 5.23, lossless"."""
    speed = evaluation.get("speedup")
    parts = [f"×{speed:.2f} ±{evaluation.get('speedup_spread') or 0:.2f}" if speed is not None
             else "speedup not measured"]
    al = evaluation.get("mean_acceptance_length")
    parts.append(f"served AL {al:.2f}" if al is not None else "no drafts made")
    if evaluation.get("lossless") is not None:
        parts.append("lossless" if evaluation["lossless"] else
                     f"outputs differ ({evaluation['outputs_identical_to_baseline']} identical)")
    return ", ".join(parts)


def leaderboard_summary(standing: Standing, figures: dict[str, dict[str, Any]]) -> str:
    """One line for a bake-off's event: the winner, then every place."""
    places = "; ".join(f"{i}. {name} {short(figures[name])}"
                       + (f" (tied with {', '.join(standing.ties[name])})" if standing.ties[name]
                          else "")
                       for i, name in enumerate(standing.ranking, 1))
    head = (f"winner {standing.winner}" if standing.winner
            else "no candidate is both lossless and passes the gate")
    return f"{head}: {places}"


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
        rounds = evaluation.get("rounds") or 1
        spread = (f" (median of {rounds} rounds, spread {evaluation['speedup_spread']:.2f})"
                  if rounds > 1 and evaluation.get("speedup_spread") is not None else "")
        speed_text += (f", {evaluation['speedup']:.2f}x the verifier alone{spread}, outputs "
                       f"identical {evaluation['outputs_identical_to_baseline']}")
    estimate = (f"; the trainer's estimate was eal {evaluation['trainer_eal_estimate']:.2f}"
                if evaluation.get("trainer_eal_estimate") is not None else "")
    warnings = "".join(f". Warning: {w}" for w in evaluation.get("warnings", []))
    return (f"{head} over {evaluation['prompts']} held-out prompts (epoch {evaluation['epoch'] + 1} "
            f"checkpoint, {evaluation['runtime']} runtime{speed_text}){estimate}{warnings}")
