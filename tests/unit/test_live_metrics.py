"""The live acceptance math on real scraped text: vLLM's own /metrics, recorded from a real
server, and its exposition with several label sets; deltas, counter resets, ratios."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.services.live_metrics import Interval
from workers.live_metrics import interval_between
from workers.pipeline.evaluate import SpecDecodeCounters, parse_counters

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


RECORDED = Path(__file__).parents[1] / "data" / "vllm_metrics"
# Recorded from vLLM 0.32.0 (CPU) serving the demo verifier with n-gram drafting (3 tokens):
# its /metrics once healthy, and again after two chat completions of 32 tokens each.
STARTED = (RECORDED / "ngram-0.32.0-cpu-started.txt").read_text()
AFTER_TWO = (RECORDED / "ngram-0.32.0-cpu-2-requests.txt").read_text()


def scaled(text: str, factor: int) -> str:
    """The same exposition with every counter sample multiplied: the text of an engine that
    had served more before it restarted."""
    def line(sample: str) -> str:
        name, _, value = sample.rpartition(" ")
        return f"{name} {float(value) * factor}" if "_total" in name else sample
    return "\n".join(line(s) if s.startswith("vllm:") else s for s in text.splitlines()) + "\n"


def test_vllms_own_text_gives_the_intervals_acceptance() -> None:
    before, after = parse_counters(STARTED), parse_counters(AFTER_TWO)
    assert before == SpecDecodeCounters(accepted_per_position={0: 0, 1: 0, 2: 0})
    interval = interval_between(before, after, 2.0)
    assert (interval.drafts, interval.draft_tokens, interval.accepted) == (17, 51, 1)
    assert interval.per_position == (1, 0, 0)
    assert interval.acceptance_length == pytest.approx(1 + 1 / 17)
    assert interval.per_position_acceptance == pytest.approx([1 / 17, 0, 0])
    assert interval.draft_acceptance_rate == pytest.approx(1 / 51)
    assert interval.tokens_per_second == pytest.approx(64 / 2.0)
    assert interval.requests == 2 and not interval.idle

    # Nothing since: an idle interval, no ratios.
    quiet = interval_between(after, parse_counters(AFTER_TWO), 5.0)
    assert quiet.idle and quiet.acceptance_length is None and quiet.per_position_acceptance is None


def test_a_counter_that_went_down_is_a_new_engine() -> None:
    before = parse_counters(scaled(AFTER_TWO, 10))
    interval = interval_between(before, parse_counters(AFTER_TWO), 1.0)
    # The restarted engine's counters count from zero: the interval is what it served.
    assert (interval.drafts, interval.accepted, interval.generation_tokens) == (17, 1, 64)
    assert interval.per_position == (1, 0, 0)
    assert interval.requests == 2


def test_requests_without_drafts_count_but_have_no_ratios() -> None:
    # vLLM without speculation exports no spec_decode series at all.
    plain = "\n".join(s for s in AFTER_TWO.splitlines() if "spec_decode" not in s) + "\n"
    interval = interval_between(SpecDecodeCounters(), parse_counters(plain), 4.0)
    assert (interval.requests, interval.generation_tokens, interval.drafts) == (2, 64, 0)
    assert interval.acceptance_length is None and interval.draft_acceptance_rate is None
    assert interval.tokens_per_second == pytest.approx(16.0)


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
