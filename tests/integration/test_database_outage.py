"""Issue 9, point 12: while the database is down the API answers 503 with Retry-After in the
one error shape (a 500 made clients give up, and reset the keep-alive connection), and it
serves again as soon as the database is back. The database is a private cluster, stopped and
started for real; the shared one is untouched."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import configure, new_key, write_dataset, write_verifier
from tests.support.pg_cluster import PrivateCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateCluster]:
    from app.cli import migrate

    cluster = PrivateCluster()
    migrate(cluster.url())
    yield cluster
    cluster.destroy()


@pytest.fixture
def client(cluster: PrivateCluster, roots: dict[str, str], tmp_path: Path) -> Iterator[tuple]:
    from fastapi.testclient import TestClient

    from app.main import create_app

    configure({"SPECDECK_DATABASE_URL": cluster.url(),
               "SPECDECK_BROKER_URL": f"sqla+sqlite:///{tmp_path / 'broker.db'}",
               "SPECDECK_QUEUE": f"specdeck-test-{uuid.uuid4().hex[:8]}", **roots})
    key = new_key()
    with TestClient(create_app()) as test_client:
        yield test_client, {"Authorization": f"Bearer {key}"}
    from app.db import get_engine

    get_engine().dispose()


def _assert_unavailable(response) -> None:  # noqa: ANN001
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "service_unavailable"
    assert error["type"] == "service_unavailable_error"
    assert "database" in error["message"]


def test_database_outage_answers_503_with_retry_after(
        cluster: PrivateCluster, client: tuple, roots: dict[str, str]) -> None:
    test_client, headers = client
    verifier = write_verifier(Path(roots["SPECDECK_MODELS_ROOT"]), "outage-verifier")
    dataset = write_dataset(Path(roots["SPECDECK_DATA_ROOT"]), "outage.jsonl")
    body = {"verifier": verifier, "dataset": dataset, "runtime": "local"}
    assert test_client.get("/api/jobs", headers=headers).status_code == 200
    cluster.stop()
    try:
        _assert_unavailable(test_client.get("/api/jobs", headers=headers))
        _assert_unavailable(test_client.post("/api/jobs", headers=headers, json=body))
        _assert_unavailable(test_client.get("/api/deployments", headers=headers))
        # Liveness does not depend on the database; readiness says it is not ready.
        assert test_client.get("/healthz").status_code == 200
        assert test_client.get("/readyz").status_code == 503
    finally:
        cluster.start()
    # Back: the pool's dead connections are replaced, and nothing was half-written.
    listed = test_client.get("/api/jobs", headers=headers)
    assert listed.status_code == 200, listed.text
    assert listed.json()["data"] == []
    created = test_client.post("/api/jobs", headers=headers, json=body)
    assert created.status_code == 201, created.text
