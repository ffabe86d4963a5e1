"""Response models for GET /api/deployments/{id}/metrics: the live acceptance series."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.common import Page


class LiveMetricPoint(BaseModel):
    """One scrape interval of one of the deployment's engines (nothing generated: no point);
    with replicas, each replica's engine has its own points, and sums add them up."""

    object: Literal["specdeck.deployment.metric"] = "specdeck.deployment.metric"
    id: int
    replica: int = Field(description="The replica whose engine it counts (0: the deployment's "
                         "own)")
    created_at: datetime = Field(description="When the interval ended (the scrape)")
    interval_seconds: float
    drafter: str = Field(description="What served it: the drafter's path or Hub id (a "
                         "promotion shows as a change of drafter)")
    checkpoint_id: str | None
    acceptance_length: float | None = Field(description="1 + accepted / drafts; null when "
                                            "nothing was drafted")
    per_position_acceptance: list[float] | None = Field(
        description="Accepted at draft position i / drafts")
    draft_acceptance_rate: float | None = Field(description="accepted / draft tokens")
    tokens_per_second: float = Field(description="Generated tokens / interval_seconds")
    requests: int = Field(description="Requests finished in the interval")
    generation_tokens: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int


class LiveWindow(BaseModel):
    """The last ``seconds`` of the drafter serving now, weighted by drafts: what the drift
    alert compares with ``evaluated_acceptance_length`` (the job's served evaluation of the
    checkpoint; null for a Hub drafter, which gets no alert)."""

    seconds: float
    drafter: str | None
    points: int
    requests: int
    num_drafts: int
    acceptance_length: float | None
    per_position_acceptance: list[float] | None
    draft_acceptance_rate: float | None
    tokens_per_second: float | None
    evaluated_acceptance_length: float | None
    alert_below: float | None = Field(description="The acceptance length under which the drift "
                                      "alert fires (SPECDECK_DRIFT_ALERT_FRACTION x evaluated)")


class LiveMetricsPage(Page[LiveMetricPoint]):
    window: LiveWindow
