"""/api/webhooks: endpoints that the project's events are sent to, signed the Standard Webhooks
way, and the log of their deliveries. A webhook's secret is shown once, when it is created."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from app.api.deps import AdminKey, SessionDep, SettingsDep
from app.api.links import links
from app.errors import error_responses
from app.schemas.common import Page
from app.schemas.webhooks import WebhookCreate, WebhookCreated, WebhookDeliveryOut, WebhookOut
from app.services import webhooks as service

router = APIRouter(prefix="/api/webhooks", tags=["webhooks"],
                   responses=error_responses(401, 403, 422, 503))

WEBHOOK_ID = r"^wh_[0-9a-f]{24}$"
DELIVERY_ID = r"^msg_[0-9a-f]{24}$"
WebhookId = Annotated[str, Path(pattern=WEBHOOK_ID)]
Limit = Annotated[int, Query(ge=1, le=100)]
_LINKS = links("webhook_id", ("get", "/api/webhooks/{webhook_id}"),
               ("delete", "/api/webhooks/{webhook_id}"),
               ("get", "/api/webhooks/{webhook_id}/deliveries"),
               ("post", "/api/webhooks/{webhook_id}/test"))


@router.post("", status_code=201, response_model=WebhookCreated, responses={
    201: _LINKS, **error_responses(400, 413, 429)})
def create_webhook(body: WebhookCreate, key: AdminKey, session: SessionDep,
                   settings: SettingsDep, response: Response) -> WebhookCreated:
    """A new endpoint for the caller's project. Its URL must resolve to public addresses only
    (checked now, and again before every delivery). Its signing ``secret`` is in this answer
    only: store it now, it cannot be shown again."""
    webhook, secret = service.create_webhook(session, key.project_id, body, settings)
    response.headers["Cache-Control"] = "no-store"
    return WebhookCreated(**service.webhook_out(webhook).model_dump(), secret=secret)


@router.get("", response_model=Page[WebhookOut])
def list_webhooks(key: AdminKey, session: SessionDep, limit: Limit = 20,
                  after: Annotated[str | None, Query(pattern=WEBHOOK_ID)] = None
                  ) -> Page[WebhookOut]:
    """The project's webhooks, newest first; pass ``last_id`` back as ``after``."""
    webhooks, has_more = service.list_webhooks(session, key.project_id, limit=limit, after=after)
    return Page(data=[service.webhook_out(w) for w in webhooks], has_more=has_more,
                last_id=webhooks[-1].id if webhooks else None)


@router.get("/{webhook_id}", response_model=WebhookOut, responses=error_responses(404))
def get_webhook(webhook_id: WebhookId, key: AdminKey, session: SessionDep) -> WebhookOut:
    return service.webhook_out(service.get_webhook(session, key.project_id, webhook_id))


@router.delete("/{webhook_id}", status_code=204, response_class=Response,
               responses=error_responses(404))
def delete_webhook(webhook_id: WebhookId, key: AdminKey, session: SessionDep) -> Response:
    """Delete the endpoint and its deliveries: those still pending are never sent."""
    service.delete_webhook(session, key.project_id, webhook_id)
    return Response(status_code=204)


@router.get("/{webhook_id}/deliveries", response_model=Page[WebhookDeliveryOut],
            responses=error_responses(404))
def list_deliveries(webhook_id: WebhookId, key: AdminKey, session: SessionDep,
                    limit: Limit = 20,
                    after: Annotated[str | None, Query(pattern=DELIVERY_ID)] = None
                    ) -> Page[WebhookDeliveryOut]:
    """The endpoint's deliveries, newest first, each with its attempts; pass ``last_id`` back
    as ``after``."""
    webhook = service.get_webhook(session, key.project_id, webhook_id)
    deliveries, has_more = service.list_deliveries(session, webhook, limit=limit, after=after)
    return Page(data=service.delivery_outs(session, deliveries), has_more=has_more,
                last_id=deliveries[-1].id if deliveries else None)


@router.post("/{webhook_id}/test", status_code=202, response_model=WebhookDeliveryOut,
             responses=error_responses(404))
def send_test(webhook_id: WebhookId, key: AdminKey, session: SessionDep) -> WebhookDeliveryOut:
    """Send a ``webhook.test`` event to the endpoint, through the same outbox as the others:
    it is delivered (and retried) by the workers; follow it in the deliveries log."""
    delivery = service.send_test(session, key.project_id, webhook_id)
    return service.delivery_outs(session, [delivery])[0]
