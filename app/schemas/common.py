from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """OpenAI-style list: pass ``last_id`` back as ``after`` for the next page."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool
    last_id: str | int | None
