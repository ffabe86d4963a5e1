"""Traffic capture through /api: the deployment's ``capture`` option, its dataset (listed,
deleted, used by jobs), retention, and what a job's data stage writes out of it."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Api, Stack
from tests.integration.test_deployments_api import body  # noqa: F401 (a fixture)
from tests.support.errors import assert_error

MESSAGES = [{"role": "user", "content": "what is two plus two"}]


def record(dataset_id: str, n: int, reply: str = "four") -> int:
    """``n`` completed requests through ``app.services.capture.store``, as the gateway's
    writer stores them."""
    from app.db import session_scope
    from app.services import capture
    from app.services.secrets import cipher
    from app.settings import get_settings

    body = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": reply}}]})
    batch = [capture.Sampled(dataset_id, time.time(), MESSAGES, body.encode(), False)
             for _ in range(n)]
    with session_scope() as session:
        return capture.store(session, batch, {}, cipher(get_settings()))


def test_capture_option_makes_a_capture_dataset(api: Api, body) -> None:  # noqa: F811
    response = api.post("/api/deployments", json=body(capture={"sample_rate": 0.5}))
    assert response.status_code == 201, response.text
    deployment = response.json()
    captured = deployment["capture"]
    assert captured == {"dataset_id": captured["dataset_id"], "sample_rate": 0.5,
                        "max_rows": 100_000, "max_bytes": 1024**3, "retention_days": 30,
                        "rows": 0, "bytes": 0, "dropped": {"queue_full": 0, "limit_reached": 0},
                        "first_at": None, "last_at": None}
    assert record(captured["dataset_id"], 2) == 2
    listed = api.get("/api/datasets").json()["data"]
    assert [(d["id"], d["kind"], d["format"], d["num_conversations"]) for d in listed] == [
        (captured["dataset_id"], "capture", "messages", 2)]
    assert listed[0]["capture"]["rows"] == 2 and listed[0]["capture"]["first_at"]
    shown = api.get(f"/api/deployments/{deployment['id']}").json()["capture"]
    assert shown["rows"] == 2 and shown["bytes"] == listed[0]["num_bytes"] > 0

    # A redeploy of the same name carries on filling the same dataset, with its new settings.
    assert api.delete(f"/api/deployments/{deployment['id']}").status_code == 200
    again = api.post("/api/deployments", json=body(capture={"max_rows": 3})).json()["capture"]
    assert again["dataset_id"] == captured["dataset_id"] and again["rows"] == 2
    assert (again["sample_rate"], again["max_rows"]) == (0.1, 3)
    # Without the option: no capture.
    other = api.post("/api/deployments", json=body(name="uncaptured")).json()
    assert other["capture"] is None


@pytest.mark.parametrize("capture, code, param", [
    ({"sample_rate": 0}, "invalid_value", "capture.sample_rate"),
    ({"sample_rate": 1.5}, "invalid_value", "capture.sample_rate"),
    ({"max_rows": 0}, "invalid_value", "capture.max_rows"),
    ({"max_bytes": 10}, "invalid_value", "capture.max_bytes"),
    ({"retention_days": 0}, "invalid_value", "capture.retention_days"),
    ({"retention_days": 100_000}, "invalid_value", "capture.retention_days"),
    ({"everything": True}, "unknown_field", "capture.everything"),
])
def test_bad_capture_options_are_422(api: Api, body, stack: Stack, capture, code,  # noqa: F811
                                     param) -> None:
    error = assert_error(api.post("/api/deployments", json=body(capture=capture)), 422, code,
                         param)
    assert error["message"]
    assert stack.scalar("SELECT count(*) FROM datasets") == 0


def test_jobs_train_on_a_capture_and_keep_it_from_deletion(api: Api, body, job_body) -> None:  # noqa: F811
    dataset_id = api.post("/api/deployments", json=body(capture={})).json()["capture"]["dataset_id"]
    assert_error(api.post("/api/jobs", json=job_body(dataset=dataset_id)), 422, "dataset_empty",
                 "dataset")
    record(dataset_id, 3)
    response = api.post("/api/jobs", json=job_body(dataset=dataset_id))
    assert response.status_code == 201, response.text
    assert_error(api.delete(f"/api/datasets/{dataset_id}"), 409, "dataset_in_use")


def test_deleting_a_capture_dataset_deletes_its_rows(api: Api, body, stack: Stack) -> None:  # noqa: F811
    deployment = api.post("/api/deployments", json=body(capture={})).json()
    dataset_id = deployment["capture"]["dataset_id"]
    record(dataset_id, 2)
    assert api.delete(f"/api/datasets/{dataset_id}").status_code == 204
    assert stack.scalar("SELECT count(*) FROM captured_rows") == 0
    assert stack.scalar("SELECT count(*) FROM captures") == 0
    shown = api.get(f"/api/deployments/{deployment['id']}").json()["capture"]
    assert shown["dataset_id"] is None and shown["rows"] == 0 and shown["retention_days"] == 30
    assert record(dataset_id, 1) == 0  # what the gateway still had queued goes nowhere


def test_retention_purges_old_rows(api: Api, body, stack: Stack) -> None:  # noqa: F811
    from app.db import session_scope
    from app.db.models import CapturedRow, Dataset, utcnow
    from app.services import capture

    dataset_id = api.post("/api/deployments", json=body(capture={"retention_days": 7})).json()[
        "capture"]["dataset_id"]
    record(dataset_id, 3)
    with session_scope() as session:  # two of them captured 8 days ago
        old = session.query(CapturedRow).filter_by(dataset_id=dataset_id).order_by(
            CapturedRow.id).limit(2).all()
        for row in old:
            row.created_at = utcnow() - timedelta(days=8)
        session.get(Dataset, dataset_id).capture.first_at = utcnow() - timedelta(days=8)
    with session_scope() as session:
        assert capture.purge_expired(session) == 2
    with session_scope() as session:
        assert capture.purge_expired(session) == 0
    left = api.get(f"/api/datasets/{dataset_id}").json()
    assert left["num_conversations"] == 1 and left["capture"]["rows"] == 1
    assert left["num_bytes"] == stack.scalar("SELECT sum(num_bytes) FROM captured_rows")
    assert left["capture"]["first_at"] == left["capture"]["last_at"]


def test_the_data_stage_writes_the_rows_out_for_the_pipeline(api: Api, body, tmp_path: Path) -> None:  # noqa: F811
    from app.db import session_scope
    from app.services import capture
    from app.services.datasets import check_record
    from app.services.secrets import cipher
    from app.settings import get_settings
    from workers.pipeline.data import as_conversations

    dataset_id = api.post("/api/deployments", json=body(capture={})).json()["capture"]["dataset_id"]
    record(dataset_id, 2, reply="four")
    record(dataset_id, 1, reply="4")
    target = tmp_path / "captured.jsonl"
    with session_scope() as session:
        assert capture.export_jsonl(session, dataset_id, target, cipher(get_settings())) == 3
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    assert [line["messages"][-1]["content"] for line in lines] == ["four", "four", "4"]
    assert all(line["messages"][:-1] == MESSAGES and check_record(line) == "messages"
               for line in lines)
    assert target.stat().st_mode & 0o077 == 0  # user data: the owner's only
    as_conversations(target, tmp_path / "conversations.jsonl")  # what prepare-data reads
    first = json.loads((tmp_path / "conversations.jsonl").read_text().splitlines()[0])
    assert first["conversations"][-1] == {"role": "assistant", "content": "four"}


CAPTURE_PIPELINE_STAGE = "tests.integration.test_capture_api:PIPELINE"


def _data_stage(ctx: Any) -> None:
    from workers.pipeline.data import write_captured

    write_captured(ctx)
    lines = ctx.paths.captured.read_text().splitlines()
    ctx.event("test_captured", "what the data stage wrote", {"lines": len(lines),
                                                              "path": str(ctx.paths.captured)})


def _pipeline() -> list[Any]:
    from app.services.state import Stage
    from workers.runner import PipelineStage

    return [PipelineStage(Stage.PREPARING_DATA, _data_stage)]


PIPELINE = _pipeline()


def test_a_job_on_a_capture_gets_its_rows_and_they_go_at_its_end(pg_api: Api, pg_stack: Stack,
                                                                  pg_job_body) -> None:
    from tests.integration.test_deployments_api import write_drafter
    from tests.conftest import write_verifier

    verifier = write_verifier(pg_stack.models_root)
    drafter = write_drafter(pg_stack.models_root)
    deployment = pg_api.post("/api/deployments", json={
        "name": "live", "drafter": drafter, "verifier": verifier, "runtime": "local",
        "capture": {}}).json()
    dataset_id = deployment["capture"]["dataset_id"]
    record(dataset_id, 4)
    pg_stack.start_worker(SPECDECK_PIPELINE=CAPTURE_PIPELINE_STAGE)
    job = pg_api.post("/api/jobs", json=pg_job_body(dataset=dataset_id)).json()
    done = pg_api.wait_status(job["id"], {"succeeded", "failed"})
    events = pg_api.events(job["id"])
    assert done["status"] == "succeeded", events
    written = next(e for e in events if e["kind"] == "test_captured")["data"]
    assert written["lines"] == 4
    assert any(e["kind"] == "captured_data" for e in events)
    assert not Path(written["path"]).exists()  # removed with the job's work files


def test_secrets_rotate_re_encrypts_captured_rows(api: Api, body, tmp_path: Path) -> None:  # noqa: F811
    from app.db import session_scope
    from app.services import capture
    from app.services.secrets import cipher, rotate
    from app.settings import Settings

    dataset_id = api.post("/api/deployments", json=body(capture={})).json()["capture"]["dataset_id"]
    record(dataset_id, 3)
    old = Settings()
    new = Settings(secret_key="a-new-key-" + "y" * 32, secret_key_previous=old.secret_key)
    with session_scope() as session:
        assert rotate(session, new) == 3
    target = tmp_path / "rows.jsonl"
    with session_scope() as session:  # readable with the new key alone, no longer the old one
        assert capture.export_jsonl(session, dataset_id, target,
                                    cipher(Settings(secret_key=new.secret_key))) == 3
        with pytest.raises(RuntimeError, match="cannot be decrypted"):
            capture.export_jsonl(session, dataset_id, target, cipher(old))
    assert not (tmp_path / "rows.jsonl.partial").exists()


def test_preview_shows_captured_rows_decrypted_oldest_first(api: Api, body) -> None:  # noqa: F811
    dataset_id = api.post("/api/deployments", json=body(capture={})).json()["capture"]["dataset_id"]
    record(dataset_id, 1, reply="four")
    record(dataset_id, 2, reply="4")
    page = api.get(f"/api/datasets/{dataset_id}/rows", params={"limit": 2}).json()
    assert page["has_more"] is True
    assert [[(t["role"], t["text"]) for t in row["turns"]] for row in page["data"]] == [
        [("user", "what is two plus two"), ("assistant", "four")],
        [("user", "what is two plus two"), ("assistant", "4")]]
