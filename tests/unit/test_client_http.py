"""The client's HTTP layer against a real HTTP server on localhost that fails a given number
of times, then answers: retries, Retry-After, what is safe to send again, and the exit codes."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.client import exits
from app.client.exits import CLIError
from app.client.http import Api, backoff, describe_error


class Flaky(BaseHTTPRequestHandler):
    """Answers ``failures`` times with ``status`` (and its Retry-After), then 200 with the
    request's method, path and Idempotency-Key."""

    failures = 0
    status = 503
    retry_after: str | None = None
    seen: list[tuple[str, str, str | None]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        self.rfile.read(length)
        type(self).seen.append((self.command, self.path, self.headers.get("idempotency-key")))
        if type(self).failures > 0:
            type(self).failures -= 1
            body = json.dumps({"error": {"message": "busy", "type": "service_unavailable_error",
                                         "param": None, "code": "service_unavailable"}}).encode()
            self.send_response(type(self).status)
            if type(self).retry_after:
                self.send_header("Retry-After", type(self).retry_after)
        else:
            body = json.dumps({"method": self.command, "path": self.path}).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Flaky.failures, Flaky.status, Flaky.retry_after, Flaky.seen = 0, 503, None, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def api(url: str, retries: int = 3) -> Api:
    return Api(url, "sdk-test", retries=retries, backoff=0.01)


def test_retries_503_then_answers_honouring_retry_after(server: str) -> None:
    Flaky.failures, Flaky.retry_after = 2, "0.3"
    started = time.monotonic()
    assert api(server).json("GET", "/api/jobs") == {"method": "GET", "path": "/api/jobs"}
    assert len(Flaky.seen) == 3
    assert time.monotonic() - started >= 0.6  # waited what Retry-After asked, twice


def test_gives_up_after_the_retries_with_exit_5(server: str) -> None:
    Flaky.failures, Flaky.status = 10, 502
    with pytest.raises(CLIError) as raised:
        api(server, retries=2).json("GET", "/api/jobs")
    assert raised.value.code == exits.UNREACHABLE and "busy (HTTP 502" in raised.value.message
    assert len(Flaky.seen) == 3


def test_a_create_is_retried_with_the_same_idempotency_key(server: str) -> None:
    Flaky.failures, Flaky.status = 2, 504
    api(server).request("POST", "/api/jobs", json={}, headers={"Idempotency-Key": "k1"},
                        repeatable=True)
    assert [key for _, _, key in Flaky.seen] == ["k1", "k1", "k1"]


def test_a_post_that_may_have_done_something_is_not_sent_again(server: str) -> None:
    Flaky.failures, Flaky.status = 1, 502  # a proxy's 502: the API may have created it
    with pytest.raises(CLIError) as raised:
        api(server).request("POST", "/api/keys", json={})
    assert raised.value.code == exits.UNREACHABLE and len(Flaky.seen) == 1
    Flaky.failures, Flaky.status, Flaky.seen = 1, 503, []  # the API rolls back before a 503
    api(server).request("POST", "/api/keys", json={})
    assert len(Flaky.seen) == 2


def test_4xx_is_exit_2_at_once_with_the_apis_message(server: str) -> None:
    Flaky.failures, Flaky.status = 1, 404
    with pytest.raises(CLIError) as raised:
        api(server).json("GET", "/api/jobs/job_x")
    assert raised.value.code == exits.USAGE and len(Flaky.seen) == 1
    assert raised.value.message == "busy (HTTP 404, code service_unavailable)"


def test_nothing_listening_is_exit_5_after_the_retries() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(CLIError) as raised:
        api(f"http://127.0.0.1:{port}", retries=1).json("GET", "/api/jobs")
    assert raised.value.code == exits.UNREACHABLE and "cannot reach" in raised.value.message


def test_exit_codes_and_backoff() -> None:
    assert exits.exit_code_for_status(401) == exits.exit_code_for_status(422) == exits.USAGE
    assert exits.exit_code_for_status(500) == exits.UNREACHABLE
    assert 0.4 <= backoff(0, 0.5) <= 0.6 and 3.2 <= backoff(3, 0.5) <= 4.8
    assert backoff(0, 0.5, "7") == 7 and backoff(0, 0.5, "3600") == 30  # capped
    assert 0.4 <= backoff(0, 0.5, "soon") <= 0.6


def test_describe_error_without_the_error_shape() -> None:
    import httpx

    assert describe_error(httpx.Response(502, text="<html>Bad gateway</html>")) == \
        "HTTP 502: <html>Bad gateway</html>"
