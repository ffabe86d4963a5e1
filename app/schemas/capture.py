"""Traffic capture: the ``capture`` option of ``POST /api/deployments`` and the summary shown on
the deployment and on its dataset."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from app.schemas.common import Strict

GIB = 1024**3


class CaptureOptions(Strict):
    """Record a sample of the deployment's requests (messages and final reply) into a project
    dataset, encrypted at rest. Every field has a default: ``"capture": {}`` captures 10 % of
    requests, up to 100,000 rows or 1 GiB, each kept 30 days."""

    sample_rate: float = Field(0.1, gt=0, le=1, description="The share of requests recorded, "
                               "decided per request")
    max_rows: int = Field(100_000, ge=1, le=10_000_000,
                          description="Rows kept at most; once full, sampled requests are "
                          "counted as dropped")
    max_bytes: int = Field(GIB, ge=1024, le=64 * GIB,
                           description="Bytes of rows (their JSON, before encryption) at most")
    retention_days: int = Field(30, ge=1, le=3650,
                                description="Rows older than this are deleted")


class CaptureDropped(BaseModel):
    queue_full: int = Field(description="Sampled while the API process's capture queue was "
                            "full (the request went on unrecorded)")
    limit_reached: int = Field(description="Sampled while the dataset was at max_rows or "
                               "max_bytes")


class CaptureOut(BaseModel):
    """The capture's settings and what it holds. ``dataset_id`` is null once its dataset was
    deleted (capture stops)."""

    dataset_id: str | None
    sample_rate: float
    max_rows: int
    max_bytes: int
    retention_days: int
    rows: int
    bytes: int
    dropped: CaptureDropped
    first_at: datetime | None = Field(description="The oldest row kept")
    last_at: datetime | None = Field(description="The newest row")
