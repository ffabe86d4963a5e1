"""GET /api/deployments/{id}/metrics on both backends: the series' paging, the window summary
(weighted by drafts, the drafter serving now, the evaluated AL it is held to), project scoping
and bad parameters. Points are written by the worker's own function (workers/live_metrics.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.services.live_metrics import Interval
from tests.conftest import Api, Stack
from tests.integration.test_deployments_api import body  # noqa: F401 (fixture)
from tests.support.errors import assert_error


def add_points(deployment_id: str, *points: tuple[str, Interval, datetime]) -> None:
    from app.db import session_scope
    from workers.live_metrics import record_point

    with session_scope() as session:
        for drafter, interval, at in points:
            record_point(session, deployment_id, interval, drafter=drafter, checkpoint_id=None,
                         at=at)


def interval(drafts: int, accepted: int, per_position: tuple[int, ...]) -> Interval:
    return Interval(seconds=10.0, drafts=drafts, draft_tokens=drafts * 3, accepted=accepted,
                    generation_tokens=drafts + accepted, requests=2, per_position=per_position)


def test_series_pages_and_window(api: Api, body, stack: Stack) -> None:
    deployment = api.post("/api/deployments", json=body()).json()
    url = f"/api/deployments/{deployment['id']}/metrics"
    empty = api.get(url).json()
    assert empty["data"] == [] and empty["has_more"] is False and empty["last_id"] is None
    assert empty["window"]["points"] == 0 and empty["window"]["acceptance_length"] is None

    # Far apart, so that the windows below (counted from the server's clock at each request)
    # hold the same points however long the requests take: the short window (100 s) holds the
    # newest point (10 s old) only, the default one (600 s) all of the new drafter's.
    now = datetime.now(UTC)
    add_points(deployment["id"],
               ("old-drafter", interval(50, 50, (30, 20, 0)), now - timedelta(seconds=300)),
               ("new-drafter", interval(100, 200, (90, 70, 40)), now - timedelta(seconds=200)),
               ("new-drafter", interval(0, 0, (0, 0, 0)), now - timedelta(seconds=150)),
               ("new-drafter", interval(10, 0, (0, 0, 0)), now - timedelta(seconds=10)))
    page = api.get(url, params={"limit": 2}).json()
    assert [p["drafter"] for p in page["data"]] == ["old-drafter", "new-drafter"]
    assert page["has_more"] is True
    point = page["data"][1]
    assert point["acceptance_length"] == pytest.approx(3.0)
    assert point["per_position_acceptance"] == pytest.approx([0.9, 0.7, 0.4])
    assert point["draft_acceptance_rate"] == pytest.approx(200 / 300)
    assert point["tokens_per_second"] == pytest.approx(30.0) and point["requests"] == 2
    rest = api.get(url, params={"after": page["last_id"]}).json()
    assert rest["has_more"] is False and len(rest["data"]) == 2
    assert rest["data"][0]["acceptance_length"] is None  # no drafts: no ratios

    window = page["window"]  # the drafter serving now, weighted by drafts
    assert window["drafter"] == "new-drafter" and window["points"] == 3
    assert window["num_drafts"] == 110 and window["requests"] == 6
    assert window["acceptance_length"] == pytest.approx(1 + 200 / 110)
    assert window["evaluated_acceptance_length"] is None and window["alert_below"] is None
    short = api.get(url, params={"window_seconds": 100}).json()["window"]
    assert short["points"] == 1 and short["acceptance_length"] == pytest.approx(1.0)
    since = api.get(url, params={"since": (now - timedelta(seconds=100)).isoformat()}).json()
    assert [p["num_drafts"] for p in since["data"]] == [10]


def test_an_idle_deployment_is_still_held_to_its_drafters_evaluation(api: Api, body, job_body,
                                                                   stack: Stack) -> None:
    """No point in the window (nothing served for a while): no live numbers, but the evaluated
    AL and the alert's threshold of the drafter it serves are still there."""
    from app.db import session_scope
    from app.db.models import Checkpoint
    from workers.live_metrics import record_point

    job_id = api.post("/api/jobs", json=job_body()).json()["id"]
    deployment = api.post("/api/deployments", json=body()).json()
    with session_scope() as session:
        checkpoint = Checkpoint(job_id=job_id, epoch=0, path="/w/0", is_best=True,
                                evaluation={"mean_acceptance_length": 2.5})
        session.add(checkpoint)
        session.flush()
        record_point(session, deployment["id"], interval(40, 60, (30, 20, 10)), drafter="/w/0",
                     checkpoint_id=checkpoint.id, at=datetime.now(UTC) - timedelta(hours=1))
    window = api.get(f"/api/deployments/{deployment['id']}/metrics").json()["window"]
    assert window["points"] == 0 and window["acceptance_length"] is None
    assert window["drafter"] == "/w/0"
    assert window["evaluated_acceptance_length"] == 2.5
    assert window["alert_below"] == pytest.approx(0.8 * 2.5)


def test_another_projects_deployment_is_404(api: Api, body, make_api, stack: Stack) -> None:
    deployment = api.post("/api/deployments", json=body()).json()
    other = make_api(api)
    assert_error(other.get(f"/api/deployments/{deployment['id']}/metrics"), 404, "not_found", None)
    assert_error(api.get("/api/deployments/dep_" + "0" * 24 + "/metrics"), 404, "not_found", None)


@pytest.mark.parametrize("params", [
    {"limit": 0}, {"limit": 1001}, {"after": -1}, {"after": "x"}, {"window_seconds": 0},
    {"since": "2026-11-27T10:00:00"}, {"since": "yesterday"}])
def test_bad_parameters_are_422(api: Api, body, stack: Stack, params) -> None:
    deployment = api.post("/api/deployments", json=body()).json()
    response = api.get(f"/api/deployments/{deployment['id']}/metrics", params=params)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == next(iter(params))


def test_retention_purges_old_points(api: Api, body, stack: Stack) -> None:  # noqa: F811
    from app.db import session_scope
    from app.services.live_metrics import purge_expired

    deployment = api.post("/api/deployments", json=body()).json()
    now = datetime.now(UTC)
    add_points(deployment["id"],
               ("drafter", interval(10, 10, (6, 4, 0)), now - timedelta(days=31)),
               ("drafter", interval(10, 10, (6, 4, 0)), now - timedelta(days=29)),
               ("drafter", interval(10, 10, (6, 4, 0)), now))
    with session_scope() as session:
        assert purge_expired(session, 30) == 1
    with session_scope() as session:
        assert purge_expired(session, 30) == 0
    left = api.get(f"/api/deployments/{deployment['id']}/metrics").json()["data"]
    kept = sorted(datetime.fromisoformat(p["created_at"]) for p in left)
    assert len(kept) == 2 and kept[0] > now - timedelta(days=30)
