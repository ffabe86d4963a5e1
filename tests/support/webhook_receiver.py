"""A real webhook receiver for tests: an HTTP server on 127.0.0.1 (a free port) in a thread,
recording every request (headers and the exact body bytes) and answering with the status codes
it is given, in order (then 200). ``on_request`` runs before each answer; returning False drops
the connection without an answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks import Webhook

# Deliveries to the receiver (127.0.0.1, allowed by name), looked for every 0.1 s, retried
# after 0.2 s, and taken over 3 s after a worker died sending one.
WEBHOOK_ENV = {
    "SPECDECK_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
    "SPECDECK_WEBHOOK_POLL_SECONDS": "0.1",
    "SPECDECK_WEBHOOK_RETRY_SECONDS": "0.2,0.2,0.2",
    "SPECDECK_WEBHOOK_TIMEOUT_SECONDS": "10",  # a loaded machine's receiver can be slow
    "SPECDECK_WEBHOOK_LEASE_SECONDS": "15",  # longer than one delivery's timeout
}


@pytest.fixture
def webhook_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """WEBHOOK_ENV for the in-process API and the workers started (they inherit it)."""
    from app.settings import get_settings

    for name, value in WEBHOOK_ENV.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    return WEBHOOK_ENV


@pytest.fixture
def receiver() -> "Iterator[Receiver]":
    with Receiver() as running:
        yield running


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def verify(self, secret: str) -> Any:
        """The payload, once the signature checks out with the standardwebhooks library."""
        return Webhook(secret).verify(self.body, self.headers)


class Receiver:
    def __init__(self, statuses: list[int] | None = None,
                 on_request: Callable[[int, Received], bool | None] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.on_request = on_request
        self.received: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                request = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with receiver.lock:
                    receiver.received.append(request)
                    index = len(receiver.received) - 1
                    status = receiver.statuses[index] if index < len(receiver.statuses) else 200
                if receiver.on_request and receiver.on_request(index, request) is False:
                    self.close_connection = True
                    return
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def of_type(self, event_type: str) -> list[Received]:
        """The requests whose payload has this type (parsed without checking the signature)."""
        import json

        with self.lock:
            return [r for r in self.received if json.loads(r.body).get("type") == event_type]

    def wait(self, event_type: str, count: int = 1, timeout: float = 120) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(found := self.of_type(event_type)) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"the receiver got {len(self.of_type(event_type))} {event_type} "
                             f"request(s), not {count}: {self.received}")
