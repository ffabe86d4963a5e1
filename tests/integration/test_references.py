"""What users name, resolved safely (issue 9, points 6 and 7): a verifier's or drafter's
config.json is read under the models root and must be a JSON object (422, never 500), and an
upload is referenced by its dataset id only, never by its file in the shared upload store."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pytest

from tests.conftest import Api, Stack, write_verifier
from tests.integration.test_jobs_api import count_jobs
from tests.support.errors import assert_error

CHAT = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'


def model_dir(stack: Stack, config: bytes) -> str:
    name = f"m-{uuid.uuid4().hex[:8]}"
    (stack.models_root / name).mkdir()
    (stack.models_root / name / "config.json").write_bytes(config)
    return name


@pytest.mark.parametrize("config", [b"{not json", b"[1, 2]", b"\xff\xfe\x00", b'"text"'])
def test_a_broken_config_is_a_client_error(api: Api, job_body, stack: Stack,
                                           config: bytes) -> None:
    broken = model_dir(stack, config)
    before = count_jobs(stack)
    assert_error(api.post("/api/jobs", json=job_body(verifier=broken)), 422,
                 "invalid_verifier_config", "verifier")
    assert count_jobs(stack) == before
    deployments = stack.scalar("SELECT count(*) FROM deployments")
    for body, param in (({"drafter": broken, "verifier": "tiny"}, "drafter"),
                        ({"drafter": model_dir(stack, json.dumps({
                            "speculators_model_type": "dflash", "block_size": 8}).encode()),
                          "verifier": broken}, "verifier")):
        assert_error(api.post("/api/deployments", json={"name": f"d-{param}", **body}), 422,
                     f"invalid_{param}_config", param)
    assert stack.scalar("SELECT count(*) FROM deployments") == deployments


def test_a_drafter_block_size_that_is_not_an_integer_is_refused(api: Api, stack: Stack) -> None:
    drafter = model_dir(stack, json.dumps({"speculators_model_type": "dflash",
                                           "block_size": "eight"}).encode())
    assert_error(api.post("/api/deployments", json={"name": "d", "drafter": drafter,
                                                    "verifier": "tiny"}),
                 422, "invalid_drafter", "drafter")


def test_a_config_linked_out_of_the_models_root_is_refused(api: Api, job_body, stack: Stack,
                                                           tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    write_verifier(outside, "real")  # a valid config, but not under the models root
    linked = f"linked-{uuid.uuid4().hex[:8]}"
    (stack.models_root / linked).mkdir()
    (stack.models_root / linked / "config.json").symlink_to(outside / "real" / "config.json")
    before = count_jobs(stack)
    assert_error(api.post("/api/jobs", json=job_body(verifier=linked)), 422,
                 "path_outside_root", "verifier")
    assert count_jobs(stack) == before


def test_another_projects_upload_cannot_be_named_by_its_file(api: Api, make_api, job_body,
                                                             stack: Stack) -> None:
    other = make_api(api)
    theirs = other.post("/api/datasets", files={"file": ("chat.jsonl", io.BytesIO(CHAT))})
    assert theirs.status_code in (200, 201), theirs.text
    stored = Path(stack.scalar("SELECT path FROM datasets WHERE id = :id", id=theirs.json()["id"]))
    relative = str(stored.relative_to(stored.parents[1]))  # "datasets/<sha256>.jsonl"
    missing = str(Path(relative).with_name("0" * 64 + ".jsonl"))
    before = count_jobs(stack)
    answers = [api.post("/api/jobs", json=job_body(dataset=ref)) for ref in (relative, missing,
                                                                             str(stored))]
    for response in answers:
        assert_error(response, 422, "invalid_path", "dataset")
    # The same answer whether the file exists or not: no project learns of another's content.
    assert len({r.json()["error"]["message"].replace(ref, "") for r, ref in
                zip(answers, (relative, missing, str(stored)), strict=True)}) == 1
    assert count_jobs(stack) == before
    # By its id, it is the other project's: not found.
    assert_error(api.post("/api/jobs", json=job_body(dataset=theirs.json()["id"])), 422,
                 "dataset_not_found", "dataset")


def test_a_file_placed_under_the_data_root_is_the_installs_every_project_can_name(
        api: Api, make_api, job_body, stack: Stack) -> None:
    """What README.md and JobCreate.dataset say: the data root is shared by every project
    (uploads, above, are not)."""
    name = f"placed-{uuid.uuid4().hex[:8]}.jsonl"
    (stack.data_root / name).write_bytes(CHAT)
    for client in (api, make_api(api)):
        plan = client.post("/api/jobs/plan", json=job_body(dataset=name))
        assert plan.status_code == 200, plan.text
    # and whether a name exists is an answer any project gets
    assert_error(make_api(api).post("/api/jobs/plan", json=job_body(dataset="nope.jsonl")), 422,
                 "dataset_not_found", "dataset")
