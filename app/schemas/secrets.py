from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.common import Strict


class SecretPut(Strict):
    value: str = Field(min_length=1, max_length=8192)


class SecretOut(BaseModel):
    """Names and dates only: a value is never returned."""

    object: Literal["specdeck.secret"] = "specdeck.secret"
    name: str
    created_at: datetime
    updated_at: datetime
