"""The doctor's services rows: the database and the broker this host is configured for
(SPECDECK_DATABASE_URL, SPECDECK_BROKER_URL), asked as readiness asks them, and the Hugging
Face Hub endpoint (HF_ENDPOINT, SPECDECK_HF_ENDPOINT) that vLLM downloads verifiers from and
publishing uploads to.

Each is given at most ``TIMEOUT`` seconds: an address that drops packets would otherwise hold
the doctor (and a compose healthcheck) for minutes."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
from huggingface_hub import constants
from sqlalchemy.engine import make_url

from app.doctor.report import Check
from app.services.reachability import ping_broker, ping_database
from app.settings import get_settings

TIMEOUT = 5.0


def within(seconds: float, probe: Callable[[], None]) -> str | None:
    """Run ``probe``; None when it returned in time, else why not. A probe that hangs is left
    behind in a daemon thread (the doctor exits without it)."""
    outcome: list[str | None] = []

    def run() -> None:
        try:
            probe()
            outcome.append(None)
        except Exception as exc:  # the answer this row reports
            lines = str(exc).strip().splitlines()
            outcome.append(f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)

    thread = threading.Thread(target=run, daemon=True, name="doctor-probe")
    thread.start()
    thread.join(seconds)
    return outcome[0] if outcome else f"no answer within {seconds:g} s"


def _row(name: str, target: str, error: str | None, *, required: bool = True) -> Check:
    return Check("services", name, error is None, target if error is None else f"{target}: {error}",
                 required)


def service_checks(runtime: str) -> list[Check]:
    """The database and the broker: every worker needs both."""
    settings = get_settings()
    return [
        _row("database", make_url(settings.database_url).render_as_string(hide_password=True),
             within(TIMEOUT, ping_database)),
        _row("broker", make_url(settings.broker_url).render_as_string(hide_password=True),
             within(TIMEOUT, ping_broker)),
    ]


def hub_endpoint() -> str:
    return get_settings().hf_endpoint or constants.ENDPOINT


def ping_hub(endpoint: str) -> None:
    """Any HTTP answer below 500 means the endpoint is there (no token is sent)."""
    response = httpx.get(endpoint, timeout=TIMEOUT, follow_redirects=True)
    if response.status_code >= 500:
        raise RuntimeError(f"HTTP {response.status_code}")


def hub_checks(runtime: str) -> list[Check]:
    """The Hub: the vllm runtime downloads verifiers from it; the local runtime's verifiers are
    usually local, so there it is reported, not required. HF_HUB_OFFLINE skips it."""
    endpoint, required = hub_endpoint(), runtime == "vllm"
    if constants.HF_HUB_OFFLINE:
        return [Check("services", "Hub", None, f"{endpoint}: not checked, HF_HUB_OFFLINE is set",
                      required)]
    return [_row("Hub", endpoint, within(TIMEOUT, lambda: ping_hub(endpoint)), required=required)]
