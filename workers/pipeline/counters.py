"""vLLM's speculative-decoding counters (Prometheus ``/metrics``) and what they mean: the
difference of two scrapes around some requests gives their mean acceptance length (tokens per
verifier pass, ``1 + accepted / drafts``) and the acceptance rate at each draft position."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:request_success": "requests",  # finished requests, summed over finished_reason
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


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
