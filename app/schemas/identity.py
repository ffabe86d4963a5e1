"""Response models for /api/me: who the caller is."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from app.schemas.keys import KeyOut


class ProjectRef(BaseModel):
    id: str
    name: str


class IdentityOut(BaseModel):
    object: Literal["specdeck.identity"] = "specdeck.identity"
    project: ProjectRef
    key: KeyOut
