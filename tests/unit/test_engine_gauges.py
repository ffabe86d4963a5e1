"""The local engine's vLLM scheduler gauges, which a promotion reads to know when the old
engine has drained: a request counts as waiting until it has the engine, then as running."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from workers.runtimes.local.api import SpecDecodeMetrics


def gauges(metrics: SpecDecodeMetrics) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(metrics.render().decode())
            for s in f.samples if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")}


def test_waiting_then_running_then_nothing() -> None:
    metrics = SpecDecodeMetrics("demo", num_speculative_tokens=7)
    assert gauges(metrics) == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0}
    with metrics.waiting():
        assert gauges(metrics) == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 1}
    with metrics.running():
        with metrics.waiting():  # a second request queues behind the first
            assert gauges(metrics) == {"vllm:num_requests_running": 1,
                                       "vllm:num_requests_waiting": 1}
    try:
        with metrics.running():
            raise RuntimeError("the client left")
    except RuntimeError:
        pass
    assert gauges(metrics) == {"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0}
