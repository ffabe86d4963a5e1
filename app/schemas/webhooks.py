"""Request and response models for /api/webhooks. A webhook's signing secret is returned once,
in the answer to the request that created it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, get_args

from pydantic import BaseModel, Field

from app.schemas.common import Strict


WebhookEvent = Literal["job.succeeded", "job.failed", "job.cancelled", "checkpoint.published",
                      "deployment.ready", "deployment.failed", "deployment.acceptance_dropped",
                      "deployment.promotion_succeeded", "deployment.promotion_failed"]
EVENTS: tuple[str, ...] = get_args(WebhookEvent)

# Sent by POST /api/webhooks/{id}/test only, whatever the webhook subscribes to.
TEST_EVENT = "webhook.test"


class WebhookCreate(Strict):
    url: str = Field(max_length=2048, description="Where events are POSTed: http(s), a public "
                     "address (SPECDECK_WEBHOOK_ALLOWED_HOSTS allows others by name)")
    events: list[WebhookEvent] = Field(min_length=1, max_length=len(EVENTS),
                                       description="The event types to send")
    description: str = Field("", max_length=500)


class WebhookOut(BaseModel):
    object: Literal["specdeck.webhook"] = "specdeck.webhook"
    id: str
    url: str
    events: list[WebhookEvent]
    description: str
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret (whsec_...), for verifying the "
                        "webhook-signature header: in this answer only, never shown again")


class WebhookAttemptOut(BaseModel):
    started_at: datetime
    status_code: int | None = Field(description="The receiver's HTTP status; null when it "
                                    "did not answer (see error)")
    error: str | None = Field(description="Why the attempt got no answer (network error, "
                              "timeout, refused address), or null")
    duration_ms: int | None


class WebhookDeliveryOut(BaseModel):
    object: Literal["specdeck.webhook_delivery"] = "specdeck.webhook_delivery"
    id: str = Field(description="The webhook-id header of every attempt")
    webhook_id: str
    event_type: str
    status: Literal["pending", "delivering", "succeeded", "failed"]
    attempt_count: int
    next_attempt_at: datetime | None = Field(description="When a pending delivery is sent next")
    created_at: datetime
    attempts: list[WebhookAttemptOut] = Field(description="Oldest first")
