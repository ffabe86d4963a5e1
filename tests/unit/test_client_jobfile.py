"""The job file and the Idempotency-Key a create sends (app/client/jobfile.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.client import exits
from app.client.exits import CLIError
from app.client.jobfile import idempotency_key, load_job_file


def files(tmp_path: Path, job: str, data: str) -> tuple[Path, Path]:
    (tmp_path / "job.yaml").write_text(job)
    (tmp_path / "chat.jsonl").write_text(data)
    return tmp_path / "job.yaml", tmp_path / "chat.jsonl"


def test_auto_key_is_derived_from_both_files_content(tmp_path: Path) -> None:
    job, data = files(tmp_path, "verifier: demo\n", '{"messages": []}\n')
    key = idempotency_key("auto", job, data)
    assert key.startswith("auto-") and len(key) < 255
    assert idempotency_key("auto", job, data) == key  # the same content: the same key
    copy = tmp_path / "copy"
    copy.mkdir()
    assert idempotency_key("auto", *files(copy, "verifier: demo\n", '{"messages": []}\n')) == key
    data.write_text('{"messages": [1]}\n')
    assert idempotency_key("auto", job, data) != key  # the dataset changed
    changed = idempotency_key("auto", job, data)
    job.write_text("verifier: demo2\n")
    assert idempotency_key("auto", job, data) not in (key, changed)  # the job file changed
    assert idempotency_key("auto", job, None) != idempotency_key("auto", job, data)


def test_given_key_is_kept_and_none_is_new_per_invocation(tmp_path: Path) -> None:
    job, data = files(tmp_path, "{}", "")
    assert idempotency_key("ci-42", job, data) == "ci-42"
    assert idempotency_key(None, job, data) != idempotency_key(None, job, data)


def test_job_files_in_json_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text('{"verifier": "demo", "speculator": {"epochs": 2}}')
    (tmp_path / "job.yml").write_text("verifier: demo\nspeculator:\n  epochs: 2\n")
    assert load_job_file(tmp_path / "job.json") == load_job_file(tmp_path / "job.yml") == \
        {"verifier": "demo", "speculator": {"epochs": 2}}
    for name, text in (("bad.json", "verifier: demo"), ("list.yaml", "- 1\n"),
                       ("bad.yaml", "a: [1")):
        (tmp_path / name).write_text(text)
        with pytest.raises(CLIError) as raised:
            load_job_file(tmp_path / name)
        assert raised.value.code == exits.USAGE
    with pytest.raises(CLIError):
        load_job_file(tmp_path / "missing.yaml")
