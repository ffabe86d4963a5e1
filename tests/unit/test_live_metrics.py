"""The live acceptance math on real scraped text: the local engine's own /metrics registry fed
decode steps, and vLLM's exposition (several label sets); deltas, counter resets, ratios."""

from __future__ import annotations

import pytest

from app.services.live_metrics import Interval
from workers.live_metrics import interval_between
from workers.pipeline.evaluate import SpecDecodeCounters, parse_counters
from workers.runtimes.local.api import RequestAcceptance, SpecDecodeMetrics
from workers.runtimes.local.speculation import DecodeStep

# vLLM's finished-request and generated-token counters (the spec-decode ones: test_evaluate.py).
VLLM_TEXT = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
vllm:generation_tokens_total{engine="1",model_name="m"} 250.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 0.0
"""


def test_vllm_requests_and_tokens_are_summed_over_label_sets() -> None:
    counters = parse_counters(VLLM_TEXT)
    assert (counters.generation_tokens, counters.requests, counters.drafts) == (750, 5, 0)


def engine_registry() -> SpecDecodeMetrics:
    return SpecDecodeMetrics("demo", num_speculative_tokens=3)


def step(tokens: int, drafted: int, accepted: int) -> DecodeStep:
    return DecodeStep(token_ids=list(range(tokens)), num_draft_tokens=drafted,
                      num_accepted_tokens=accepted)


def test_local_engine_text_gives_the_intervals_acceptance() -> None:
    metrics = engine_registry()
    before = parse_counters(metrics.render().decode())
    assert before == SpecDecodeCounters(accepted_per_position={0: 0, 1: 0, 2: 0})
    for s in (step(3, 3, 2), step(1, 3, 0), step(4, 3, 3), step(1, 0, 0)):  # the last: no draft
        metrics.observe(s)
    metrics.request_success["stop"].inc()
    after = parse_counters(metrics.render().decode())
    interval = interval_between(before, after, 2.0)
    assert (interval.drafts, interval.draft_tokens, interval.accepted) == (3, 9, 5)
    assert interval.per_position == (2, 2, 1)
    assert interval.acceptance_length == pytest.approx(1 + 5 / 3)
    assert interval.per_position_acceptance == pytest.approx([2 / 3, 2 / 3, 1 / 3])
    assert interval.draft_acceptance_rate == pytest.approx(5 / 9)
    assert interval.tokens_per_second == pytest.approx(9 / 2.0)
    assert interval.requests == 1 and not interval.idle

    # Nothing since: an idle interval, no ratios.
    quiet = interval_between(after, parse_counters(metrics.render().decode()), 5.0)
    assert quiet.idle and quiet.acceptance_length is None and quiet.per_position_acceptance is None


def test_a_counter_that_went_down_is_a_new_engine() -> None:
    old = engine_registry()
    for _ in range(10):
        old.observe(step(3, 3, 2))
    before = parse_counters(old.render().decode())
    restarted = engine_registry()  # a new engine: counters from zero
    restarted.observe(step(2, 3, 1))
    restarted.request_success["length"].inc()
    interval = interval_between(before, parse_counters(restarted.render().decode()), 1.0)
    assert (interval.drafts, interval.accepted, interval.generation_tokens) == (1, 1, 2)
    assert interval.per_position == (1, 0, 0)
    assert interval.requests == 1
    assert min(interval.per_position) >= 0


def test_requests_without_drafts_count_but_have_no_ratios() -> None:
    plain = SpecDecodeMetrics("demo", num_speculative_tokens=0)
    plain.observe(step(1, 0, 0))
    plain.observe(step(1, 0, 0))
    plain.request_success["stop"].inc()
    interval = interval_between(SpecDecodeCounters(), parse_counters(plain.render().decode()), 4.0)
    assert (interval.requests, interval.generation_tokens, interval.drafts) == (1, 2, 0)
    assert interval.acceptance_length is None and interval.draft_acceptance_rate is None
    assert interval.tokens_per_second == pytest.approx(0.5)


def test_a_window_weighs_intervals_by_drafts() -> None:
    from app.db.models import DeploymentMetric

    def row(drafts: int, accepted: int, per_pos: list[int]) -> DeploymentMetric:
        return DeploymentMetric(interval_seconds=10.0, num_drafts=drafts, num_draft_tokens=drafts * 3,
                                num_accepted_tokens=accepted, accepted_per_position=per_pos,
                                generation_tokens=drafts + accepted, requests=1)

    total = Interval.total([row(100, 200, [90, 70, 40]), row(10, 0, [0, 0, 0])])
    # Not the mean of 3.0 and 1.0: the small interval weighs a tenth as much.
    assert total.acceptance_length == pytest.approx(1 + 200 / 110)
    assert total.per_position_acceptance == pytest.approx([90 / 110, 70 / 110, 40 / 110])
    assert total.tokens_per_second == pytest.approx(310 / 20)


def test_request_acceptance_is_vllms_summary() -> None:
    acceptance = RequestAcceptance(3, detailed=True)
    for s in (step(3, 3, 2), step(1, 0, 0), step(1, 3, 0), step(4, 3, 3), step(2, 2, 1)):
        acceptance.observe(s)
    out = acceptance.as_json()
    assert out["num_spec_steps"] == 4 == sum(out["acceptance_histogram"])
    assert out["acceptance_histogram"] == [1, 1, 1, 1]
    assert out["acceptance_histogram_by_draft_length"] == {"2": [0, 1, 0], "3": [1, 0, 1, 1]}
    assert out["num_accepted_draft_tokens"] == 6 and out["num_draft_tokens"] == 11
    assert out["mean_acceptance_length"] == pytest.approx(1 + 6 / 4)
    assert out["draft_acceptance_rate"] == pytest.approx(6 / 11)
    assert out["per_step_accepted"] == [2, 0, 3, 1] and out["per_step_drafted"] == [3, 3, 3, 2]
    assert "per_step_accepted" not in RequestAcceptance(3, detailed=False).as_json()
