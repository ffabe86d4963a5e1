from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, field_validator

T = TypeVar("T")

NUL = "\x00"
NO_NUL = "must not contain NUL (\\u0000) characters"


def nul_in(value: Any) -> bool:
    """Whether a NUL character is anywhere in ``value``: a string, or the keys and values of
    nested dicts and lists."""
    if isinstance(value, str):
        return NUL in value
    if isinstance(value, dict):
        return any(nul_in(k) or nul_in(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(nul_in(v) for v in value)
    return False


class Strict(BaseModel):
    """A request body: unknown fields are refused, and so is a NUL character in any text of it
    (Postgres cannot store one, and no name, path or value needs one)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if nul_in(value):
            raise ValueError(NO_NUL)
        return value


class Page(BaseModel, Generic[T]):
    """OpenAI-style list: pass ``last_id`` back as ``after`` for the next page."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool
    last_id: str | int | None
