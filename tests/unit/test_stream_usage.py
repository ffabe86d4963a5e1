"""How the gateway reads usage out of a stream it relays (``SSEProxy.take_usage`` in
app/api/openai.py): only the events with a usage object are touched; each is recorded once; the
usage-only chunk the gateway asked for is dropped, a usage object riding on a content chunk is
removed from it, and what the client asked for itself passes through byte for byte."""

from __future__ import annotations

import json

from app.api.openai import SSEProxy
from app.services.gateway import Caller, Route, UsageRecorder

USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


class Gateway:
    def __init__(self) -> None:
        self.usage = UsageRecorder(interval=60)


def proxy(client_usage: bool) -> SSEProxy:
    proxy = SSEProxy.__new__(SSEProxy)  # only what take_usage reads
    proxy.gateway, proxy.client_usage = Gateway(), client_usage
    proxy.caller = Caller(key_id="key", project_id="project")
    proxy.route = Route(deployment_id="dep", name="model", status="ready", created=0)
    return proxy


def event(payload: object, sep: bytes = b"\n\n") -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + sep


def content(text: str, **extra: object) -> dict:
    return {"id": "c", "choices": [{"index": 0, "delta": {"content": text}}], **extra}


def recorded(p: SSEProxy) -> list[tuple[int, int]]:
    return [(row["prompt_tokens"], row["completion_tokens"]) for row in p.gateway.usage.pending]


def test_events_without_usage_pass_untouched() -> None:
    p = proxy(client_usage=False)
    out = event(content("a")) + event(content("b"), b"\r\n\r\n") + b"data: [DONE]\n\n"
    assert p.take_usage(out) is out
    assert recorded(p) == []


def test_the_usage_only_chunk_is_recorded_and_dropped_when_the_client_did_not_ask() -> None:
    p = proxy(client_usage=False)
    head, tail = event(content("a")) + event(content("b")), b"data: [DONE]\n\n"
    usage = event({"id": "c", "choices": [], "usage": USAGE})
    assert p.take_usage(head + usage + tail) == head + tail
    assert recorded(p) == [(5, 3)]


def test_what_the_client_asked_for_passes_byte_for_byte() -> None:
    p = proxy(client_usage=True)
    out = event(content("a")) + b'data: {"choices": [], "usage": {"prompt_tokens": 5, ' \
        b'"completion_tokens": 3}}\r\n\r\n' + b"data: [DONE]\r\n\r\n"
    assert p.take_usage(out) == out
    assert recorded(p) == [(5, 3)]


def test_usage_on_a_content_chunk_is_removed_from_it_and_the_content_kept() -> None:
    p = proxy(client_usage=False)
    first, last = event(content("a")), event(content("b", usage=USAGE), b"\r\n\r\n")
    out = p.take_usage(first + last + b"data: [DONE]\n\n")
    assert out == first + event(content("b"), b"\r\n\r\n") + b"data: [DONE]\n\n"
    assert recorded(p) == [(5, 3)]


def test_each_usage_event_is_recorded_once() -> None:
    """Continuous usage (vLLM's ``continuous_usage_stats``, asked by the client): one row per
    event that carries usage, as before."""
    p = proxy(client_usage=True)
    out = event(content("a", usage=USAGE)) + event(content("b", usage={**USAGE, "completion_tokens": 4}))
    assert p.take_usage(out) == out
    assert recorded(p) == [(5, 3), (5, 4)]


def test_a_usage_event_that_is_not_json_passes_unrecorded() -> None:
    p = proxy(client_usage=False)
    out = b'data: {"usage":{"prompt_tokens": oops}\n\n'
    assert p.take_usage(out) == out
    assert recorded(p) == []
