"""Webhooks: a project's endpoints, and the outbox of their deliveries.

An event is written to the outbox (``webhook_deliveries``) by ``enqueue``, in the transaction
of the change it tells of (app.services.state.transition for jobs and deployments,
workers.publish.record for checkpoints): it exists if and only if the change committed. The
workers send it (workers/webhooks.py), signed the Standard Webhooks way with the endpoint's
secret, which is Fernet-encrypted at rest like the project's secrets.
"""

from __future__ import annotations

import base64
import json
import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.db.models import (Checkpoint, Deployment, Job, Webhook, WebhookAttempt, WebhookDelivery,
                           utcnow)
from app.errors import APIError, not_found
from app.schemas.jobs import CheckpointOut
from app.schemas.webhooks import (TEST_EVENT, WebhookAttemptOut, WebhookCreate,
                                  WebhookDeliveryOut, WebhookOut)
from app.services import quotas
from app.services.paging import newest_first
from app.services.secrets import cipher, decrypt
from app.services.webhook_urls import UnsafeURL, resolve
from app.settings import Settings

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def check_url(url: str, settings: Settings) -> str:
    try:
        resolve(url, settings)
    except UnsafeURL as exc:
        raise APIError(422, str(exc), code="invalid_url", param="url") from None
    return url


def create_webhook(session: Session, project_id: str, body: WebhookCreate,
                   settings: Settings) -> tuple[Webhook, str]:
    """A new endpoint and its secret (the plaintext, to show once)."""
    check_url(body.url, settings)
    quotas.check_webhooks(session, project_id, settings)
    secret = new_secret()
    webhook = Webhook(project_id=project_id, url=body.url, description=body.description,
                      events=list(dict.fromkeys(body.events)),
                      secret_ciphertext=cipher(settings).encrypt(secret.encode()).decode())
    session.add(webhook)
    session.flush()
    return webhook, secret


def signing_secret(webhook_id: str, ciphertext: str, settings: Settings) -> str:
    """The plaintext secret, for signing. Never log or return it."""
    return decrypt(ciphertext, settings, f"the secret of webhook {webhook_id}")


def list_webhooks(session: Session, project_id: str, *, limit: int,
                  after: str | None) -> tuple[list[Webhook], bool]:
    """Newest first."""
    return newest_first(session, select(Webhook).where(Webhook.project_id == project_id),
                        Webhook.id, limit=limit, after=after)


def get_webhook(session: Session, project_id: str, webhook_id: str) -> Webhook:
    webhook = session.scalars(select(Webhook).where(Webhook.id == webhook_id,
                                                    Webhook.project_id == project_id)).first()
    if webhook is None:
        raise not_found("webhook", webhook_id, param="webhook_id")
    return webhook


def delete_webhook(session: Session, project_id: str, webhook_id: str) -> None:
    """The endpoint and its deliveries: what was pending is never sent (an attempt in flight
    finds its delivery gone and records nothing)."""
    webhook = get_webhook(session, project_id, webhook_id)
    deliveries = select(WebhookDelivery.id).where(WebhookDelivery.webhook_id == webhook.id)
    session.execute(delete(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(deliveries)))
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook.id))
    session.delete(webhook)


def webhook_out(webhook: Webhook) -> WebhookOut:
    return WebhookOut.model_validate(webhook, from_attributes=True)


# ---------------------------------------------------------------------------------------------
# The outbox
# ---------------------------------------------------------------------------------------------

def _resource(session: Session, resource: Job | Deployment | Checkpoint) -> dict[str, Any]:
    """The resource as its GET shows it, in JSON."""
    # Imported here: app.services.state (which jobs and deployments import) calls enqueue.
    from app.services.deployments import deployment_out
    from app.services.jobs import job_outs

    if isinstance(resource, Job):
        out: Any = job_outs(session, [resource])[0]
    elif isinstance(resource, Deployment):
        out = deployment_out(resource)
    else:
        out = CheckpointOut.model_validate(resource, from_attributes=True)
    return out.model_dump(mode="json")


def _body(event_type: str, data: dict[str, Any], at: datetime) -> str:
    """The Standard Webhooks payload: the event's type and time, and its data."""
    return json.dumps({"type": event_type, "timestamp": at.isoformat().replace("+00:00", "Z"),
                       "data": data}, separators=(",", ":"))


def _add(session: Session, webhook_id: str, event_type: str, body: str,
         at: datetime) -> WebhookDelivery:
    delivery = WebhookDelivery(webhook_id=webhook_id, event_type=event_type, body=body,
                               status="pending", attempts=0, next_attempt_at=at, created_at=at,
                               updated_at=at)
    session.add(delivery)
    return delivery


def enqueue(session: Session, project_id: str, event_type: str,
            resource: Job | Deployment | Checkpoint, extra: dict[str, Any] | None = None) -> int:
    """Write ``event_type`` for ``resource`` to the outbox of each of the project's endpoints
    that subscribe to it, in the caller's transaction. ``extra``: fields added beside the
    resource's (the numbers of an acceptance drop). Returns how many were written."""
    subscribed = [w.id for w in session.scalars(select(Webhook).where(
        Webhook.project_id == project_id).order_by(Webhook.id)) if event_type in w.events]
    if not subscribed:
        return 0
    at = utcnow()
    body = _body(event_type, {**_resource(session, resource), **(extra or {})}, at)
    for webhook_id in subscribed:
        _add(session, webhook_id, event_type, body, at)
    session.flush()
    return len(subscribed)


def send_test(session: Session, project_id: str, webhook_id: str) -> WebhookDelivery:
    """A sample event (``webhook.test``) for this endpoint, through the same outbox."""
    webhook = get_webhook(session, project_id, webhook_id)
    at = utcnow()
    data = {"webhook_id": webhook.id, "message": "a test event sent from SpecDeck"}
    delivery = _add(session, webhook.id, TEST_EVENT, _body(TEST_EVENT, data, at), at)
    session.flush()
    return delivery


def list_deliveries(session: Session, webhook: Webhook, *, limit: int,
                    after: str | None) -> tuple[list[WebhookDelivery], bool]:
    """Newest first."""
    return newest_first(session, select(WebhookDelivery).where(
        WebhookDelivery.webhook_id == webhook.id), WebhookDelivery.id, limit=limit, after=after)


def delivery_outs(session: Session, deliveries: list[WebhookDelivery]) -> list[WebhookDeliveryOut]:
    """The answers for a page of deliveries, their attempts read in one query."""
    attempts: dict[str, list[WebhookAttemptOut]] = {d.id: [] for d in deliveries}
    for attempt in session.scalars(select(WebhookAttempt).where(
            WebhookAttempt.delivery_id.in_(list(attempts))).order_by(WebhookAttempt.id)):
        attempts[attempt.delivery_id].append(
            WebhookAttemptOut.model_validate(attempt, from_attributes=True))
    return [WebhookDeliveryOut(
        id=d.id, webhook_id=d.webhook_id, event_type=d.event_type, status=d.status,
        attempt_count=d.attempts, created_at=d.created_at, attempts=attempts[d.id],
        next_attempt_at=d.next_attempt_at if d.status == "pending" else None)
        for d in deliveries]
