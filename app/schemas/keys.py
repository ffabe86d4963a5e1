"""Request and response models for /api/keys. A key's hash is never returned; its plaintext
only once, in the answer to the request that created it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.common import Strict


Role = Literal["inference", "member", "admin"]  # app.roles.ROLES, spelled for the schema
ROLE_HELP = ("What the key may do: admin (everything), member (train, deploy and chat; not API "
             "keys, secrets or webhooks), inference (the OpenAI-compatible /v1 alone)")


class KeyCreate(Strict):
    name: str = Field("", max_length=100, description="A label, to tell keys apart")
    role: Role | None = Field(None, description=ROLE_HELP + ". Default: the role of the key "
                              "that creates it, and never more than that")


class KeyOut(BaseModel):
    object: Literal["specdeck.api_key"] = "specdeck.api_key"
    id: str
    name: str
    role: Role = Field(description=ROLE_HELP)
    prefix: str = Field(description="The key's first characters, to recognise it by; too few "
                        "to use it")
    created_at: datetime
    last_used_at: datetime | None = Field(description="The last request with this key, to the "
                                          "minute: /api, or /v1 as recorded with its usage")
    revoked_at: datetime | None


class KeyCreated(KeyOut):
    key: str = Field(description="The key itself: in this answer only, never shown again")
