from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, GetJsonSchemaHandler, field_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

T = TypeVar("T")

NUL = "\x00"
NO_NUL = "must not contain NUL (\\u0000) characters"
NUL_FREE = r"^[^\x00]*$"  # the same rule as a JSON Schema pattern
BIGINT_MAX = 2**63 - 1  # event ids are BIGINT: a cursor past that is a client error, not a 500


SURROGATE = re.compile("[\ud800-\udfff]")
NO_SURROGATE = "must be Unicode text: a lone surrogate (\\ud800-\\udfff) is not"


def text_problem(value: Any) -> str | None:
    """Why ``value`` (a string, or the keys and values of nested dicts and lists) cannot be
    stored and read back as text, or None. A NUL character: Postgres cannot store one. A lone
    surrogate: JSON can spell one ("\\ud800"), but no UTF-8 column or response can hold it."""
    if isinstance(value, str):
        if NUL in value:
            return NO_NUL
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return NO_SURROGATE
        return None
    if isinstance(value, dict):
        parts: Any = (part for item in value.items() for part in item)
    elif isinstance(value, (list, tuple)):
        parts = value
    else:
        return None
    return next(filter(None, map(text_problem, parts)), None)


def readable_text(value: str) -> str:
    """``value`` with each lone surrogate replaced by U+FFFD: for rows stored before requests
    were checked for them, which must still be listed, read and cancelled. (A str holds a
    valid pair as one code point, so any surrogate in it is a lone one.)"""
    return SURROGATE.sub("\ufffd", value)


def _forbid_nul(schema: Any) -> None:
    """Give every free string in a field's JSON schema (values, and the keys of objects) the
    pattern NUL_FREE; nested models are $refs, done by themselves."""
    if not isinstance(schema, dict):
        return
    if schema.get("type") == "string" and not {"pattern", "enum", "const"} & schema.keys():
        schema["pattern"] = NUL_FREE
    if schema.get("type") == "object" and isinstance(schema.get("additionalProperties"), dict):
        schema.setdefault("propertyNames", {}).setdefault("pattern", NUL_FREE)
        _forbid_nul(schema["additionalProperties"])
    for branch in schema.get("anyOf", ()):
        _forbid_nul(branch)
    _forbid_nul(schema.get("items"))


class Strict(BaseModel):
    """A request body: types are not coerced ("16" is not an integer), unknown fields are
    refused, and so is text that cannot be stored (text_problem: a NUL character, which no
    name, path or value needs, or a lone surrogate). The JSON schema says the first three."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _storable_text(cls, value: Any) -> Any:
        problem = text_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core_schema)
        for field in handler.resolve_ref_schema(schema).get("properties", {}).values():
            _forbid_nul(field)
        return schema


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its ``$defs`` written in place: for a schema put into the
    OpenAPI document by hand, where a ``$ref`` to them would not resolve."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, list):
            return [inline(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return inline({**defs[node["$ref"].rsplit("/", 1)[-1]], **rest})
        return {key: inline(value) for key, value in node.items()}

    return inline(schema)


class Page(BaseModel, Generic[T]):
    """OpenAI-style list: pass ``last_id`` back as ``after`` for the next page."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool
    last_id: str | int | None


class EventBase(BaseModel):
    """What happened to a job or a deployment (app.db.models.Event): status changes, stages,
    processes, progress. Ids grow in order: pass ``last_id`` back as ``after``."""

    object: str
    id: int
    created_at: datetime
    kind: str
    attempt: int
    status: str | None
    stage: str | None
    message: str
    data: dict[str, Any] | None
