from __future__ import annotations

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
    refused, and so is a NUL character in any text of it (Postgres cannot store one, and no
    name, path or value needs one). The JSON schema says all three."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        if nul_in(value):
            raise ValueError(NO_NUL)
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
