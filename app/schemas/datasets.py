"""Request and response models for /api/datasets."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, get_args

from pydantic import BaseModel, Field

from app.schemas.capture import CaptureOut
from app.schemas.common import Strict

# The presets of speculators 0.9.0's dataset registry
# (speculators.data_generation.configs.DATASET_CONFIGS) that `speculators regenerate-responses
# --dataset NAME` accepts (its REGEN_DATASETS). "sharegpt4v_coco" is left out: it is multimodal
# and needs the COCO images on the host. Kept literal here because the API host does not
# necessarily have speculators installed; tests/integration/test_datasets_api.py checks the
# list against the installed package.
PublicName = Literal["sharegpt", "ultrachat", "gsm8k", "magpie", "nemotron", "open-perfectblend",
                     "hermes-fc"]
PUBLIC_DATASETS: tuple[str, ...] = get_args(PublicName)

DatasetFormat = Literal["messages", "conversations"]
DatasetKind = Literal["upload", "public", "capture"]

NAME_MAX = 255


class PublicDatasetCreate(Strict):
    """``POST /api/datasets`` with ``Content-Type: application/json``."""

    public: PublicName
    name: str | None = Field(None, min_length=1, max_length=NAME_MAX)


class DatasetOut(BaseModel):
    object: Literal["specdeck.dataset"] = "specdeck.dataset"
    id: str
    name: str
    kind: DatasetKind
    # Uploads: the chat format, content hash, size and number of conversations (captures: the
    # rows captured so far and their bytes).
    format: DatasetFormat | None
    sha256: str | None
    num_conversations: int | None
    num_bytes: int | None
    # Public datasets: the speculators preset name.
    public_name: str | None
    created_at: datetime
    # Capture datasets (traffic recorded by a deployment's gateway route): settings, counters.
    capture: CaptureOut | None = None


class PreviewTurn(BaseModel):
    role: str = Field(description="system, user, assistant or tool (ShareGPT's human and gpt "
                      "are shown as user and assistant)")
    text: str = Field(description="The turn's text (a list of content parts: its text parts "
                      "joined), cut to a readable length")
    cut: bool = Field(description="The text was longer and is cut")


class PreviewRow(BaseModel):
    object: Literal["specdeck.dataset.row"] = "specdeck.dataset.row"
    index: int = Field(description="The row's place in the dataset, from 0 (uploads: blank "
                       "lines not counted; captures: oldest first)")
    turns: list[PreviewTurn]


class DatasetPreview(BaseModel):
    """A page of a dataset's rows, as a reader sees them: pass ``offset + len(data)`` back as
    ``offset`` for the next page."""

    object: Literal["list"] = "list"
    data: list[PreviewRow]
    offset: int
    has_more: bool
