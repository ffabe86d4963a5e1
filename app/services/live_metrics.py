"""A deployment's live acceptance series (rows written by workers/live_metrics.py): pages of
points, and the summary of a recent window, weighted by drafts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.db.models import Checkpoint, Deployment, DeploymentMetric, utcnow
from app.schemas.live_metrics import LiveWindow
from app.settings import Settings


@dataclass(frozen=True)
class Interval:
    """Counts over a span (one scrape interval, or a window's sum) and the ratios the series
    shows."""

    seconds: float
    drafts: int
    draft_tokens: int
    accepted: int
    generation_tokens: int
    requests: int
    per_position: tuple[int, ...] = ()

    @property
    def idle(self) -> bool:
        return not (self.drafts or self.generation_tokens or self.requests)

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per verifier pass: 1 + accepted / drafts (dflash-facts §4)."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def per_position_acceptance(self) -> list[float] | None:
        return [n / self.drafts for n in self.per_position] if self.drafts else None

    @property
    def draft_acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def tokens_per_second(self) -> float:
        return self.generation_tokens / self.seconds if self.seconds > 0 else 0.0

    @classmethod
    def total(cls, rows: list[DeploymentMetric]) -> "Interval":
        """Stored points summed: their ratios weigh each point by what it drafted. Replicas
        serve side by side: the span is the longest of their sums of intervals, not the sum."""
        width = max((len(r.accepted_per_position) for r in rows), default=0)
        spans: dict[int, float] = {}
        for r in rows:
            spans[r.replica] = spans.get(r.replica, 0.0) + r.interval_seconds
        return cls(seconds=max(spans.values(), default=0.0),
                   drafts=sum(r.num_drafts for r in rows),
                   draft_tokens=sum(r.num_draft_tokens for r in rows),
                   accepted=sum(r.num_accepted_tokens for r in rows),
                   generation_tokens=sum(r.generation_tokens for r in rows),
                   requests=sum(r.requests for r in rows),
                   per_position=tuple(sum(r.accepted_per_position[i] for r in rows
                                          if i < len(r.accepted_per_position))
                                      for i in range(width)))


def list_points(session: Session, deployment: Deployment, *, since: datetime | None,
                after: int | None, limit: int) -> tuple[list[DeploymentMetric], bool]:
    """Oldest first, from ``since`` on, after the id ``after``."""
    query = select(DeploymentMetric).where(DeploymentMetric.deployment_id == deployment.id)
    if since is not None:
        query = query.where(DeploymentMetric.created_at >= since)
    if after is not None:
        query = query.where(DeploymentMetric.id > after)
    rows = list(session.scalars(query.order_by(DeploymentMetric.id).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def evaluated_acceptance_length(session: Session, checkpoint_id: str | None) -> float | None:
    """The served acceptance length the job's evaluation measured for this checkpoint; None for
    a Hub or path drafter, or a checkpoint never evaluated (no drift alert then)."""
    if checkpoint_id is None:
        return None
    checkpoint = session.get(Checkpoint, checkpoint_id)
    return checkpoint.served_acceptance_length if checkpoint is not None else None


def window_summary(session: Session, deployment_id: str, seconds: float, *,
                   now: datetime | None = None, drafter: str | None = None,
                   settings: Settings | None = None) -> LiveWindow:
    """The points of the last ``seconds`` served by ``drafter`` (default: the latest point's),
    summed: ratios of the sums, so an interval counts as much as it drafted. The evaluated AL
    is that of the drafter's latest point, in the window or not: an idle deployment is still
    held to its drafter's evaluation."""
    now = now or utcnow()
    latest_query = select(DeploymentMetric.drafter, DeploymentMetric.checkpoint_id).where(
        DeploymentMetric.deployment_id == deployment_id)
    if drafter is not None:
        latest_query = latest_query.where(DeploymentMetric.drafter == drafter)
    latest = session.execute(latest_query.order_by(DeploymentMetric.id.desc()).limit(1)).first()
    if drafter is None and latest is not None:
        drafter = latest.drafter
    rows = list(session.scalars(select(DeploymentMetric).where(
        DeploymentMetric.deployment_id == deployment_id, DeploymentMetric.drafter == drafter,
        DeploymentMetric.created_at >= now - timedelta(seconds=seconds))))
    total = Interval.total(rows)
    evaluated = evaluated_acceptance_length(session, latest.checkpoint_id if latest else None)
    return LiveWindow(
        seconds=seconds, drafter=drafter, points=len(rows), requests=total.requests,
        num_drafts=total.drafts, acceptance_length=total.acceptance_length,
        per_position_acceptance=total.per_position_acceptance,
        draft_acceptance_rate=total.draft_acceptance_rate,
        tokens_per_second=total.tokens_per_second if rows else None,
        evaluated_acceptance_length=evaluated,
        alert_below=(settings.drift_alert_fraction * evaluated
                     if settings is not None and evaluated is not None else None))


def purge_expired(session: Session, retention_days: int, now: datetime | None = None) -> int:
    """Delete the points older than ``retention_days`` (the series' retention); how many."""
    cutoff = (now or utcnow()) - timedelta(days=retention_days)
    return session.execute(delete(DeploymentMetric)
                           .where(DeploymentMetric.created_at < cutoff)).rowcount
