"""Webhook delivery, run by every worker next to the reconciler: send what the outbox holds
(app/services/webhooks.py), at least once, with retries and backoff.

Each round claims due deliveries with SKIP LOCKED (pending ones whose time came, and those whose
sender's lease ran out: it died mid-send), marks them delivering with a lease and an attempt row,
and commits before sending; the sends run with no session open, and each outcome is written
back guarded by the lease token. Every attempt of a delivery carries its id as ``webhook-id``
and is signed afresh (Standard Webhooks: ``webhook-timestamp`` is the attempt's time).
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import and_, or_, select, update
from standardwebhooks import Webhook as Signer

from app.db import session_scope
from app.db.models import Webhook, WebhookAttempt, WebhookDelivery, utcnow
from app.services.webhook_urls import Resolver, UnsafeURL, resolve
from app.services.webhooks import signing_secret
from app.settings import Settings

log = logging.getLogger(__name__)
USER_AGENT = "SpecDeck-Webhooks/1"
LOST = "no outcome recorded: the worker sending it stopped (its lease ran out)"


@dataclass(frozen=True)
class Claimed:
    """A delivery this worker holds a lease on, with what sending it takes."""

    id: str
    token: str
    attempt: int  # 1 for the first attempt
    attempt_id: int
    webhook_id: str
    url: str
    secret_ciphertext: str
    body: str


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str | None
    duration_ms: int

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def max_attempts(settings: Settings) -> int:
    return 1 + len(settings.webhook_retry_delays)


def claim_due(settings: Settings, owner: str) -> list[Claimed]:
    """Lease up to ``webhook_batch`` due deliveries, and commit. A delivery whose last send lost
    its worker is sent again, unless that was its last attempt (then it failed)."""
    now = utcnow()
    due = or_(and_(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now),
              and_(WebhookDelivery.status == "delivering", WebhookDelivery.locked_until <= now))
    claimed: list[Claimed] = []
    with session_scope() as session:
        rows = session.execute(
            select(WebhookDelivery, Webhook.url, Webhook.secret_ciphertext)
            .join(Webhook, Webhook.id == WebhookDelivery.webhook_id).where(due)
            .order_by(WebhookDelivery.id).limit(settings.webhook_batch)
            .with_for_update(of=WebhookDelivery, skip_locked=True)).all()
        for delivery, url, ciphertext in rows:
            if delivery.status == "delivering":  # its sender died: that attempt has no outcome
                session.execute(update(WebhookAttempt).where(
                    WebhookAttempt.delivery_id == delivery.id, WebhookAttempt.error.is_(None),
                    WebhookAttempt.status_code.is_(None)).values(error=LOST))
                if delivery.attempts >= max_attempts(settings):
                    delivery.status, delivery.next_attempt_at = "failed", None
                    delivery.locked_until = delivery.lock_token = None
                    continue
            token = secrets.token_hex(16)
            delivery.status, delivery.lock_token = "delivering", token
            delivery.locked_until = now + timedelta(seconds=settings.webhook_lease_seconds)
            delivery.attempts += 1
            attempt = WebhookAttempt(delivery_id=delivery.id, worker_id=owner, started_at=now)
            session.add(attempt)
            session.flush()
            claimed.append(Claimed(delivery.id, token, delivery.attempts, attempt.id,
                                   delivery.webhook_id, url, ciphertext, delivery.body))
    return claimed


def signed_headers(message_id: str, secret: str, body: str, at: datetime) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt."""
    return {"webhook-id": message_id, "webhook-timestamp": str(math.floor(at.timestamp())),
            "webhook-signature": Signer(secret).sign(message_id, at, body),
            "content-type": "application/json", "user-agent": USER_AGENT}


def send(delivery: Claimed, settings: Settings, resolver: Resolver | None = None) -> Outcome:
    """One attempt: check the URL's addresses again, then POST to the address checked. No
    redirects are followed, no proxy is used, and the response body is not read."""
    started = time.monotonic()

    def outcome(status_code: int | None = None, error: str | None = None) -> Outcome:
        return Outcome(status_code, error, round((time.monotonic() - started) * 1000))

    try:
        target = resolve(delivery.url, settings, *([resolver] if resolver else []))
    except UnsafeURL as exc:
        return outcome(error=f"refused: {exc}")
    secret = signing_secret(delivery.webhook_id, delivery.secret_ciphertext, settings)
    headers = {**signed_headers(delivery.id, secret, delivery.body, utcnow()),
               "host": target.host_header}
    extensions: dict[str, Any] = {"sni_hostname": target.sni_hostname} if target.sni_hostname else {}
    try:
        with httpx.Client(timeout=settings.webhook_timeout_seconds, follow_redirects=False,
                          trust_env=False) as client:
            request = client.build_request("POST", target.url, content=delivery.body.encode(),
                                           headers=headers, extensions=extensions)
            response = client.send(request, stream=True)
            response.close()
    except httpx.HTTPError as exc:
        return outcome(error=f"{type(exc).__name__}: {exc}".rstrip(": "))
    return outcome(status_code=response.status_code)


def record(delivery: Claimed, result: Outcome, settings: Settings) -> str:
    """Write the attempt's outcome, and what comes next: done, another attempt after the
    schedule's delay, or failed after the last. Returns the delivery's status (``lost`` when the
    lease is no longer ours: the webhook was deleted, or another worker took over)."""
    now = utcnow()
    if result.succeeded:
        status, next_at = "succeeded", None
    elif delivery.attempt >= max_attempts(settings):
        status, next_at = "failed", None
    else:
        delay = settings.webhook_retry_delays[delivery.attempt - 1]
        status, next_at = "pending", now + timedelta(seconds=delay)
    # (A delivery's status, which app/services/state.py's machines do not cover.)
    columns = {"status": status, "next_attempt_at": next_at, "locked_until": None,
               "lock_token": None, "updated_at": now}
    with session_scope() as session:
        session.execute(update(WebhookAttempt).where(WebhookAttempt.id == delivery.attempt_id)
                        .values(status_code=result.status_code, error=result.error,
                                duration_ms=result.duration_ms))
        matched = session.execute(
            update(WebhookDelivery).where(WebhookDelivery.id == delivery.id,
                                          WebhookDelivery.lock_token == delivery.token)
            .values(**columns)).rowcount
    return status if matched == 1 else "lost"


def deliver(delivery: Claimed, settings: Settings) -> None:
    try:
        result = send(delivery, settings)
        status = record(delivery, result, settings)
    except Exception:  # the lease runs out and another round sends it again
        log.exception("webhook delivery %s failed to send or record", delivery.id)
        return
    # The URL is not logged: receivers put tokens in them.
    log.info("webhook delivery %s (webhook %s) attempt %d: %s -> %s", delivery.id,
             delivery.webhook_id, delivery.attempt, result.status_code or result.error, status)


def deliver_due(settings: Settings, owner: str, pool: ThreadPoolExecutor) -> int:
    """One round: claim, send concurrently, record. How many were claimed."""
    claimed = claim_due(settings, owner)
    list(pool.map(lambda delivery: deliver(delivery, settings), claimed))
    return len(claimed)


class WebhookDispatcher(threading.Thread):
    """Polls the outbox every ``webhook_poll_seconds``; a full batch is followed at once by the
    next."""

    def __init__(self, settings: Settings, worker_id: str) -> None:
        super().__init__(name="webhooks", daemon=True)
        self.settings, self.worker_id = settings, worker_id
        self.stopped = threading.Event()

    def run(self) -> None:
        with ThreadPoolExecutor(self.settings.webhook_batch, thread_name_prefix="webhook") as pool:
            while not self.stopped.wait(self.settings.webhook_poll_seconds):
                try:
                    while (deliver_due(self.settings, self.worker_id, pool)
                           == self.settings.webhook_batch and not self.stopped.is_set()):
                        pass
                except Exception:  # the database may blip; the next round tries again
                    log.exception("webhook delivery round failed")
