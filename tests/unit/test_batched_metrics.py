"""The gateway's request metrics, observed in batches (app.middleware.BatchedRequestMetrics):
nothing is lost, and a read of /metrics sees every request answered before it."""

from __future__ import annotations

from prometheus_client import REGISTRY

from app.middleware import BatchedRequestMetrics, flush_batched_metrics

ROUTE = "/test/batched-metrics"


def counted(status: str) -> float:
    value = REGISTRY.get_sample_value("specdeck_http_requests_total",
                                      {"method": "POST", "route": ROUTE, "status": status})
    return value or 0.0


def observed(what: str = "count") -> float:
    value = REGISTRY.get_sample_value(f"specdeck_http_request_seconds_{what}",
                                      {"method": "POST", "route": ROUTE})
    return value or 0.0


def test_requests_reach_the_metrics_when_they_are_read_and_every_batch() -> None:
    metrics = BatchedRequestMetrics("POST", ROUTE)
    before_ok, before_gone, before_seen = counted("200"), counted("499"), observed()
    before_sum = observed("sum")
    metrics.observe(0.0003, 200)
    metrics.observe(0.0004, 200)
    metrics.observe(0.002, 499)
    assert (counted("200"), observed()) == (before_ok, before_seen)  # pending, not lost

    flush_batched_metrics()  # what GET /metrics does first
    assert counted("200") == before_ok + 2
    assert counted("499") == before_gone + 1
    assert observed() == before_seen + 3
    assert abs(observed("sum") - before_sum - 0.0027) < 1e-9

    # A full batch goes in by itself, with no read.
    for _ in range(BatchedRequestMetrics.BATCH):
        metrics.observe(0.001, 200)
    assert counted("200") == before_ok + 2 + BatchedRequestMetrics.BATCH
    assert not metrics.pending


def test_flushes_in_threads_beside_appends_lose_nothing() -> None:
    """/metrics flushes in a thread while the event loop appends (and flushes every batch):
    every observation is counted once."""
    import threading

    metrics = BatchedRequestMetrics("POST", ROUTE)
    before = counted("201")
    stop = threading.Event()

    errors: list[BaseException] = []

    def read_metrics() -> None:
        try:
            while not stop.is_set():
                flush_batched_metrics()
        except BaseException as exc:  # a flush that failed beside another: the test fails
            errors.append(exc)

    readers = [threading.Thread(target=read_metrics) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for _ in range(20_000):
            metrics.observe(0.001, 201)
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    flush_batched_metrics()
    assert errors == []
    assert counted("201") == before + 20_000
