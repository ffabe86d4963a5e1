"""Live acceptance of a served deployment: the worker scrapes its engine's Prometheus
``/metrics`` (vLLM's counters, on either runtime), stores each
interval's deltas as one point of the deployment's series, and raises the drift alert.

- The counters of one scrape are read by the evaluation's parser
  (``workers.pipeline.evaluate.parse_counters``: summed over label sets, per draft position).
- ``interval_between``: what happened between two scrapes. A counter that went down means a new
  engine (a restart): its values since it started are the interval's.
- ``LiveMetrics``: one engine's scraper, ticked on every health-check round of
  ``workers.deployments.monitor``; a failure here is logged and never stops the serving. A
  replica's engine writes to its deployment's series, its points marked with its index, so the
  series and the drift alert add the replicas up.
- ``check_drift``: the acceptance length over the drift window against the one the drafter was
  evaluated at; an ``acceptance_dropped`` event and webhook once per episode, and an
  ``acceptance_recovered`` event when it is back, which re-arms the alert.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db import session_scope
from app.db.models import Deployment, DeploymentEvent, DeploymentMetric, utcnow
from app.services.live_metrics import Interval, evaluated_acceptance_length, window_summary
from app.services.state import record_event
from app.services.webhooks import enqueue
from app.settings import Settings
from workers.pipeline.evaluate import SpecDecodeCounters, parse_counters

log = logging.getLogger(__name__)

DROPPED = "acceptance_dropped"
RECOVERED = "acceptance_recovered"
WEBHOOK_EVENT = "deployment.acceptance_dropped"


def interval_between(before: SpecDecodeCounters, after: SpecDecodeCounters,
                     seconds: float) -> Interval:
    """``after - before``; all of ``after`` when a counter went down (a new engine)."""
    delta = after if after.went_down_from(before) else after - before
    width = max(delta.accepted_per_position, default=-1) + 1
    return Interval(seconds=seconds, drafts=round(delta.drafts),
                    draft_tokens=round(delta.draft_tokens), accepted=round(delta.accepted_tokens),
                    generation_tokens=round(delta.generation_tokens),
                    requests=round(delta.requests),
                    per_position=tuple(round(delta.accepted_per_position.get(i, 0.0))
                                       for i in range(width)))


def record_point(session: Session, deployment_id: str, interval: Interval, *, drafter: str,
                 checkpoint_id: str | None, at: datetime, replica: int = 0) -> DeploymentMetric:
    point = DeploymentMetric(
        deployment_id=deployment_id, replica=replica, created_at=at, interval_seconds=interval.seconds,
        drafter=drafter, checkpoint_id=checkpoint_id, num_drafts=interval.drafts,
        num_draft_tokens=interval.draft_tokens, num_accepted_tokens=interval.accepted,
        accepted_per_position=list(interval.per_position),
        generation_tokens=interval.generation_tokens, requests=interval.requests,
        acceptance_length=interval.acceptance_length,
        draft_acceptance_rate=interval.draft_acceptance_rate,
        per_position_acceptance=interval.per_position_acceptance,
        tokens_per_second=interval.tokens_per_second)
    session.add(point)
    session.flush()
    return point


def check_drift(session: Session, deployment_id: str, *, drafter: str, checkpoint_id: str | None,
                settings: Settings, now: datetime) -> str | None:
    """Compare the window's acceptance length with the evaluated one; record the event that a
    change of side calls for. Returns the kind recorded, if any."""
    evaluated = evaluated_acceptance_length(session, checkpoint_id)
    if evaluated is None:
        return None
    window = window_summary(session, deployment_id, settings.drift_window_seconds, now=now,
                            drafter=drafter)
    if window.acceptance_length is None or window.num_drafts < settings.drift_min_drafts:
        return None
    threshold = settings.drift_alert_fraction * evaluated
    last = session.scalars(
        select(DeploymentEvent).where(DeploymentEvent.deployment_id == deployment_id,
                                      DeploymentEvent.kind.in_([DROPPED, RECOVERED]))
        .order_by(DeploymentEvent.id.desc()).limit(1)).first()
    in_episode = (last is not None and last.kind == DROPPED
                  and (last.data or {}).get("drafter") == drafter)
    low = window.acceptance_length < threshold
    if low == in_episode:
        return None
    deployment = session.get(Deployment, deployment_id)
    assert deployment is not None
    numbers = {"drafter": drafter, "checkpoint_id": checkpoint_id,
               "acceptance_length": window.acceptance_length,
               "evaluated_acceptance_length": evaluated, "threshold": threshold,
               "fraction": settings.drift_alert_fraction, "window_seconds": window.seconds,
               "num_drafts": window.num_drafts}
    if low:
        record_event(session, deployment, DROPPED,
                     f"live acceptance length {window.acceptance_length:.2f} over the last "
                     f"{window.seconds:.0f} s is below {settings.drift_alert_fraction:g} x the "
                     f"evaluated {evaluated:.2f}", numbers)
        session.flush()
        enqueue(session, deployment.project_id, WEBHOOK_EVENT, deployment,
                extra={"acceptance": numbers})
        return DROPPED
    record_event(session, deployment, RECOVERED,
                 f"live acceptance length {window.acceptance_length:.2f} is back above "
                 f"{threshold:.2f}", numbers)
    return RECOVERED


class LiveMetrics:
    """Scrapes one engine every ``live_metrics_seconds``: its counters started at zero with it."""

    def __init__(self, deployment_id: str, replica: int, spec: dict[str, Any], base_url: str,
                 settings: Settings) -> None:
        self.deployment_id, self.replica = deployment_id, replica
        self.drafter = spec.get("drafter") or spec.get("method") or "none"
        self.checkpoint_id = (spec.get("source") or {}).get("checkpoint_id")
        self.url = f"{base_url}/metrics"
        self.settings = settings
        self.previous = SpecDecodeCounters()
        self.previous_at = time.monotonic()
        self.due = self.previous_at + settings.live_metrics_seconds

    def tick(self, client: httpx.Client) -> None:
        """Scrape if the interval is over; store the point and check drift. Never raises."""
        now = time.monotonic()
        if now < self.due:
            return
        self.due = now + self.settings.live_metrics_seconds
        try:
            response = client.get(self.url)
            response.raise_for_status()
            counters = parse_counters(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("deployment %s: could not scrape %s: %s", self.deployment_id, self.url, exc)
            return
        interval = interval_between(self.previous, counters, now - self.previous_at)
        if not interval.idle:
            try:
                self.store(interval)
            except Exception:  # the database is away: keep the counters, the next point has both
                log.exception("deployment %s: could not store live metrics", self.deployment_id)
                return
        self.previous, self.previous_at = counters, now

    def store(self, interval: Interval) -> None:
        at = utcnow()
        with session_scope() as session:
            record_point(session, self.deployment_id, interval, drafter=self.drafter,
                         checkpoint_id=self.checkpoint_id, at=at, replica=self.replica)
            check_drift(session, self.deployment_id, drafter=self.drafter,
                        checkpoint_id=self.checkpoint_id, settings=self.settings, now=at)
