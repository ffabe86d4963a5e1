"""The acceptance gate: what the served evaluation must show before a drafter is published.

Checked at the end of the evaluating stage against the job's evaluation (the checkpoint it
chose). A missed gate fails the job with ``acceptance_gate_failed`` and the numbers in the
message; the checkpoint and its evaluation are kept, so it can still be published by hand.
"""

from __future__ import annotations

from typing import Any

from app.db import session_scope
from app.db.models import Job
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


def check_gate(ctx: JobContext) -> None:
    gate = ctx.spec.get("gate")
    if not gate:
        return
    with session_scope() as session:
        evaluation = dict(ctx.lease.load(session).evaluation or {})
    failures = gate_failures(gate, evaluation)
    verdict = {"passed": not failures, "required": gate, "failures": failures}

    def write(session: Any) -> None:
        job = session.get(Job, ctx.job_id)
        job.evaluation = {**(job.evaluation or {}), "gate": verdict}

    ctx.write(write)
    if failures:
        raise StageFailed("acceptance gate failed: " + "; ".join(failures)
                          + " (the checkpoint is kept and can be published by hand)",
                          code="acceptance_gate_failed")
    ctx.event("gate_passed", "acceptance gate passed", verdict)
