"""The OpenAI-compatible gateway's wire shapes (for the OpenAPI document and /v1/models).

The chat completion body is not parsed into ``ChatCompletionRequest`` on the request path: the
gateway reads the few fields it enforces from the JSON and forwards the body unchanged (plus
``stream_options.include_usage`` when streaming), so every field the upstream accepts (vLLM's
sampling extensions too) passes through.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    id: str = Field(description="The served model name (a ready deployment of the caller's "
                    "project).")
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """What the gateway checks; any other field is forwarded to the deployment as is."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1,
                       description="The name of a ready deployment of the caller's project.")
    messages: list[dict[str, Any]]
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = Field(None, description="Only 1 is supported.")
    max_tokens: int | None = Field(None, ge=1, description="At most SPECDECK_GATEWAY_MAX_TOKENS "
                                   "(4096 by default); when omitted, the engine decides.")
    max_completion_tokens: int | None = Field(None, ge=1, description="As max_tokens.")
