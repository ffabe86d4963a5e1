"""The acceptance gate: what the served evaluation must show before a drafter is published.

Each candidate is held to it in the evaluation (only one that passes can win); checked at the
end of the evaluating stage against the job's evaluation (its winner, or with none the best
ranked). A missed gate fails the job with ``acceptance_gate_failed`` and the numbers in the
message, and a drafter whose outputs differ from the verifier's alone with ``not_lossless``; the
checkpoints and their evaluations are kept, so one can still be published or deployed by hand.
"""

from __future__ import annotations

from typing import Any

from app.db import session_scope
from app.db.models import Job
from app.schemas.job_spec import JobSpec
from workers.runner import JobContext, StageFailed


def gate_failures(gate: dict[str, Any], evaluation: dict[str, Any]) -> list[str]:
    """Each condition the evaluation misses, with its numbers; empty when the gate passes."""
    failures = []
    al = evaluation.get("mean_acceptance_length")
    if gate.get("min_acceptance_length") is not None and (al or 1.0) < gate["min_acceptance_length"]:
        failures.append(f"served mean acceptance length {al or 1.0:.2f} < "
                        f"{gate['min_acceptance_length']:.2f} required")
    speed = evaluation.get("speedup")
    if gate.get("min_speedup") is not None and (speed is None or speed < gate["min_speedup"]):
        failures.append(f"speedup {'unknown' if speed is None else f'{speed:.2f}x'} over the "
                        f"verifier alone < {gate['min_speedup']:.2f}x required")
    if gate.get("beat_ngram") and not evaluation.get("beats_ngram"):
        failures.append(f"served mean acceptance length {al or 1.0:.2f} does not beat n-gram "
                        f"drafting ({evaluation.get('ngram_mean_acceptance_length') or 1.0:.2f})")
    return failures


def check_gate(ctx: JobContext[JobSpec]) -> None:
    with session_scope() as session:
        evaluation = dict(ctx.lease.load(session).evaluation or {})
    if evaluation.get("lossless") is False:
        raise StageFailed(f"{evaluation.get('candidate') or 'the drafter'}'s outputs differ from "
                          f"the verifier's alone ({evaluation.get('outputs_identical_to_baseline')} "
                          "held-out prompts identical): speculative decoding must be lossless",
                          code="not_lossless")
    if ctx.spec.gate is None:
        return
    gate = ctx.spec.gate.model_dump()
    failures = gate_failures(gate, evaluation)
    verdict = {"passed": not failures, "required": gate, "failures": failures}

    def write(session: Any) -> None:
        job = session.get(Job, ctx.job_id)
        job.evaluation = {**(job.evaluation or {}), "gate": verdict}

    ctx.write(write)
    if failures:
        who = (f"no candidate passed; the best, {evaluation['candidate']}: "
               if ctx.spec.is_bakeoff else "")
        raise StageFailed("acceptance gate failed: " + who + "; ".join(failures)
                          + " (the checkpoint is kept and can be published by hand)",
                          code="acceptance_gate_failed")
    ctx.event("gate_passed", "acceptance gate passed", verdict)
