"""The datasets API on both backends: JSONL uploads (OpenAI ``messages``, ShareGPT
``conversations``) stored once per content, public presets, list/get/delete, project isolation,
delete protection while a job uses a dataset, the lookup job creation uses, and bad uploads
rejected with line numbers, leaving no row and no file behind."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import Api, Stack, configure, new_key
from tests.support.errors import assert_error as assert_shape

MIB = 1024 * 1024
DATASET_LIMIT = 3 * MIB
BODY_LIMIT = 5 * MIB

USER = {"role": "user", "content": "What is 2 + 2?"}
ASSISTANT = {"role": "assistant", "content": "4."}
MESSAGES = {"messages": [{"role": "system", "content": "Be brief."}, USER, ASSISTANT]}
CONVERSATIONS = {"conversations": [{"from": "human", "value": "Hi"},
                                   {"from": "gpt", "value": "Hello!"}]}


def jsonl(*records: Any) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def upload(api: Api, content: bytes, filename: str = "chat.jsonl", **data: str) -> Any:
    return api.post("/api/datasets", files={"file": (filename, content, "application/jsonl")},
                    data=data)


def created(response: Any, status: int = 201) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return response.json()


def assert_error(response: Any, status: int, code: str, param: str | None = None) -> dict:
    """An upload's error may list its problems line by line (``errors``)."""
    return assert_shape(response, status, code, param, errors=True)


def count_datasets(stack: Stack) -> int:
    return stack.scalar("SELECT count(*) FROM datasets")


def stored(stack: Stack) -> set[str]:
    """Every file under the data root's datasets directory (temporary ones included)."""
    directory = stack.data_root / "datasets"
    return {p.name for p in directory.iterdir()} if directory.exists() else set()


def project_of(stack: Stack, api: Api) -> str:
    return stack.scalar("SELECT project_id FROM api_keys WHERE key_hash = :h",
                        h=hashlib.sha256(api.key.encode()).hexdigest())


def add_job(project_id: str, spec: dict[str, Any]) -> str:
    """A job row made directly (job creation does not take dataset ids yet)."""
    from app.db import session_scope
    from app.db.models import Job
    from app.services import state

    with session_scope() as session:
        job = Job(project_id=project_id, spec=spec)
        state.initialize(session, job)
        return job.id


@pytest.fixture
def big_api(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The app with a 5 MiB body limit (instead of 1 MiB) and a 3 MiB dataset limit."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.services import datasets as service

    monkeypatch.setattr(service, "DEFAULT_MAX_DATASET_BYTES", DATASET_LIMIT)  # until the setting
    monkeypatch.setenv("SPECDECK_MAX_DATASET_BYTES", str(DATASET_LIMIT))   # exists
    monkeypatch.setenv("SPECDECK_MAX_BODY_BYTES", str(BODY_LIMIT))
    configure({})
    try:
        with TestClient(create_app()) as client:
            yield Api(client, new_key())
    finally:
        monkeypatch.undo()
        configure(stack.env)


# Uploads ----------------------------------------------------------------------------------

def test_upload_openai_messages(api: Api, stack: Stack) -> None:
    # json.dumps spells the emoji as an escaped surrogate pair: a pair is text.
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi \U0001f600"}]},
                          {"role": "assistant", "content": None,
                           "tool_calls": [{"id": "c1", "type": "function",
                                           "function": {"name": "f", "arguments": "{}"}}]},
                          {"role": "tool", "content": "42"},
                          {"role": "assistant", "content": [{"type": "text", "text": "42."}]}],
             "tools": []}
    content = jsonl(MESSAGES) + b"\n   \n" + json.dumps(parts).encode() + b"\r\n"
    dataset = created(upload(api, content))
    digest = hashlib.sha256(content).hexdigest()
    assert dataset["id"].startswith("ds_") and dataset["object"] == "specdeck.dataset"
    assert dataset["kind"] == "upload" and dataset["format"] == "messages"
    assert dataset["name"] == "chat.jsonl" and dataset["public_name"] is None
    assert dataset["sha256"] == digest and dataset["num_bytes"] == len(content)
    assert dataset["num_conversations"] == 2
    path = stack.data_root.resolve() / "datasets" / f"{digest}.jsonl"
    assert path.read_bytes() == content
    assert stack.scalar("SELECT path FROM datasets WHERE id = :id", id=dataset["id"]) == str(path)
    assert created(api.get(f"/api/datasets/{dataset['id']}"), 200) == dataset
    assert not [n for n in stored(stack) if n.startswith(".")]  # no temporary file left


def test_upload_sharegpt_conversations(api: Api, stack: Stack) -> None:
    # speculators also reads {role, content} turns under "conversations".
    role_content = {"conversations": [USER, ASSISTANT]}
    content = jsonl(CONVERSATIONS, role_content, CONVERSATIONS)
    dataset = created(upload(api, content, name="sharegpt sample"))
    assert dataset["format"] == "conversations" and dataset["name"] == "sharegpt sample"
    assert dataset["num_conversations"] == 3
    assert (stack.data_root / "datasets" / f"{dataset['sha256']}.jsonl").read_bytes() == content


def test_same_content_twice_returns_the_same_dataset(api: Api, make_api, stack: Stack) -> None:
    content = jsonl(MESSAGES, MESSAGES)
    digest = hashlib.sha256(content).hexdigest()
    before = count_datasets(stack)
    first = created(upload(api, content, filename="a.jsonl"))
    again = created(upload(api, content, filename="b.jsonl", name="other"), 200)
    assert again == first
    assert count_datasets(stack) == before + 1
    assert f"{digest}.jsonl" in stored(stack)

    # Another project gets its own dataset on the same stored file.
    other = make_api(api)
    theirs = created(upload(other, content))
    assert theirs["id"] != first["id"] and theirs["sha256"] == digest
    assert count_datasets(stack) == before + 2
    assert api.delete(f"/api/datasets/{first['id']}").status_code == 204
    assert f"{digest}.jsonl" in stored(stack)  # still used by the other project
    assert other.delete(f"/api/datasets/{theirs['id']}").status_code == 204
    assert f"{digest}.jsonl" not in stored(stack)


def test_reupload_restores_a_missing_file(api: Api, stack: Stack) -> None:
    content = jsonl(CONVERSATIONS)
    dataset = created(upload(api, content))
    path = stack.data_root / "datasets" / f"{dataset['sha256']}.jsonl"
    path.unlink()
    assert created(upload(api, content), 200)["id"] == dataset["id"]
    assert path.read_bytes() == content


# Public datasets --------------------------------------------------------------------------

def test_public_dataset(api: Api, stack: Stack) -> None:
    before = count_datasets(stack)
    dataset = created(api.post("/api/datasets", json={"public": "sharegpt"}))
    assert dataset["kind"] == "public" and dataset["public_name"] == "sharegpt"
    assert dataset["name"] == "sharegpt"
    assert dataset["sha256"] is None and dataset["num_bytes"] is None and dataset["format"] is None
    assert created(api.post("/api/datasets", json={"public": "sharegpt"}), 200) == dataset
    named = created(api.post("/api/datasets", json={"public": "ultrachat", "name": "chat mix"}))
    assert named["name"] == "chat mix" and named["public_name"] == "ultrachat"
    assert count_datasets(stack) == before + 2

    assert_error(api.post("/api/datasets", json={"public": "imagenet"}), 422, "invalid_value",
                 "public")
    assert_error(api.post("/api/datasets", json={"public": "gsm8k", "extra": 1}), 422,
                 "unknown_field", "extra")
    assert_error(api.post("/api/datasets", json={"name": "x"}), 422, "missing_field", "public")
    assert_error(api.post("/api/datasets", content=b"{nope",
                          headers={"Content-Type": "application/json"}), 422, "invalid_json")
    assert_error(api.post("/api/datasets", content=b"x",
                          headers={"Content-Type": "text/plain"}), 415, "unsupported_media_type")
    assert count_datasets(stack) == before + 2


def test_public_names_are_speculators_presets() -> None:
    configs = pytest.importorskip("speculators.data_generation.configs")
    from app.schemas.datasets import PUBLIC_DATASETS

    assert set(PUBLIC_DATASETS) == set(configs.DATASET_CONFIGS) - {"sharegpt4v_coco"}


# List, get, delete, isolation ---------------------------------------------------------------

def test_list_get_delete(api: Api, stack: Stack) -> None:
    ids = [created(upload(api, jsonl({"messages": [USER, {"role": "assistant",
                                                          "content": str(i)}]})))["id"]
           for i in range(3)]
    ids.append(created(api.post("/api/datasets", json={"public": "gsm8k"}))["id"])
    page = created(api.get("/api/datasets", params={"limit": 2}), 200)
    assert [d["id"] for d in page["data"]] == ids[::-1][:2] and page["has_more"]
    rest = created(api.get("/api/datasets", params={"after": page["last_id"]}), 200)
    assert [d["id"] for d in rest["data"]] == ids[::-1][2:] and not rest["has_more"]
    assert_error(api.get("/api/datasets", params={"limit": 0}), 422, "invalid_value", "limit")
    assert_error(api.get("/api/datasets", params={"after": "job_x"}), 422, "invalid_value", "after")

    victim = created(api.get(f"/api/datasets/{ids[0]}"), 200)
    path = stack.data_root / "datasets" / f"{victim['sha256']}.jsonl"
    assert path.is_file()
    response = api.delete(f"/api/datasets/{ids[0]}")
    assert response.status_code == 204 and response.content == b""
    assert not path.exists()
    assert_error(api.get(f"/api/datasets/{ids[0]}"), 404, "not_found")
    assert_error(api.delete(f"/api/datasets/{ids[0]}"), 404, "not_found")
    assert api.delete(f"/api/datasets/{ids[3]}").status_code == 204  # a public one
    remaining = created(api.get("/api/datasets"), 200)["data"]
    assert [d["id"] for d in remaining] == [ids[2], ids[1]]


def test_another_projects_dataset_is_404_on_every_route(api: Api, make_api, stack: Stack) -> None:
    dataset = created(upload(api, jsonl(MESSAGES)))
    public = created(api.post("/api/datasets", json={"public": "magpie"}))
    other = make_api(api)
    for ident in (dataset["id"], public["id"]):
        assert_error(other.get(f"/api/datasets/{ident}"), 404, "not_found")
        assert_error(other.delete(f"/api/datasets/{ident}"), 404, "not_found")
    assert created(other.get("/api/datasets"), 200)["data"] == []
    for ident in (dataset["id"], public["id"]):  # the other project's delete did nothing
        assert created(api.get(f"/api/datasets/{ident}"), 200)["id"] == ident
    assert (stack.data_root / "datasets" / f"{dataset['sha256']}.jsonl").is_file()


def test_missing_or_invalid_key_is_401(api: Api, stack: Stack) -> None:
    before = count_datasets(stack)
    for headers in ({}, {"Authorization": "Bearer sdk-not-a-real-key"}):
        response = api.client.post("/api/datasets", headers=headers,
                                   files={"file": ("a.jsonl", jsonl(MESSAGES))})
        assert response.status_code == 401, response.text
        assert api.client.get("/api/datasets", headers=headers).status_code == 401
    assert count_datasets(stack) == before


def test_dataset_used_by_a_job_cannot_be_deleted(api: Api, stack: Stack) -> None:
    from app.db import session_scope
    from app.db.models import Job

    dataset = created(upload(api, jsonl(CONVERSATIONS, CONVERSATIONS)))
    unused = created(api.post("/api/datasets", json={"public": "nemotron"}))
    project = project_of(stack, api)
    job_id = add_job(project, {"dataset_id": dataset["id"], "dataset": dataset["id"]})
    add_job(project, {"dataset": "chat.jsonl"})  # a job that names a file, not a dataset

    error = assert_error(api.delete(f"/api/datasets/{dataset['id']}"), 409, "dataset_in_use")
    assert job_id in error["message"]
    assert created(api.get(f"/api/datasets/{dataset['id']}"), 200)["id"] == dataset["id"]
    assert f"{dataset['sha256']}.jsonl" in stored(stack)
    assert api.delete(f"/api/datasets/{unused['id']}").status_code == 204

    with session_scope() as session:
        session.delete(session.get(Job, job_id))
    assert api.delete(f"/api/datasets/{dataset['id']}").status_code == 204
    assert f"{dataset['sha256']}.jsonl" not in stored(stack)


def test_resolve_for_job(api: Api, make_api, stack: Stack) -> None:
    from app.db import session_scope
    from app.errors import APIError
    from app.services.datasets import resolve_for_job
    from app.settings import get_settings

    settings = get_settings()
    dataset = created(upload(api, jsonl(MESSAGES)))
    public = created(api.post("/api/datasets", json={"public": "ultrachat"}))
    theirs = created(upload(make_api(api), jsonl(CONVERSATIONS)))
    (stack.data_root / "legacy.jsonl").write_bytes(jsonl(MESSAGES))
    project = project_of(stack, api)
    with session_scope() as session:
        assert resolve_for_job(session, project, dataset["id"], settings) == {
            "dataset_id": dataset["id"], "dataset_kind": "upload", "dataset_format": "messages",
            "dataset_path": str(stack.data_root.resolve() / "datasets"
                                / f"{dataset['sha256']}.jsonl")}
        assert resolve_for_job(session, project, public["id"], settings) == {
            "dataset_id": public["id"], "dataset_path": "ultrachat", "dataset_kind": "public"}
        assert resolve_for_job(session, project, "legacy.jsonl", settings) == {
            "dataset_id": None, "dataset_kind": "path", "dataset_format": "messages",
            "dataset_path": str(stack.data_root.resolve() / "legacy.jsonl")}
        for ref, code in [(theirs["id"], "dataset_not_found"),
                          ("ds_" + "0" * 24, "dataset_not_found"),
                          ("missing.jsonl", "dataset_not_found"), ("../etc/passwd", "invalid_path"),
                          ("/etc/passwd", "path_outside_root")]:
            with pytest.raises(APIError) as caught:
                resolve_for_job(session, project, ref, settings)
            assert (caught.value.status_code, caught.value.code, caught.value.param) == (
                422, code, "dataset"), ref


# Bad uploads: 422 with line numbers, nothing stored ------------------------------------------

NO_REPLY = {"messages": [USER]}
EMPTY_REPLY = {"messages": [USER, {"role": "assistant", "content": "  "}]}


@pytest.mark.parametrize("content, lines, fragment", [
    (jsonl(MESSAGES) + b'{"messages": [{"role": "user",\n', [2], "invalid JSON"),
    (jsonl(MESSAGES, MESSAGES, NO_REPLY), [3], "no assistant turn"),
    (jsonl(EMPTY_REPLY), [1], "no assistant turn"),
    (jsonl({"conversations": [{"from": "human", "value": "Hi"}]}), [1], "no assistant turn"),
    (jsonl({"prompt": "Hi", "completion": "Hello"}), [1], "expected a 'messages'"),
    (jsonl({"messages": "Hi"}), [1], "non-empty list"),
    (jsonl({"messages": []}), [1], "non-empty list"),
    (jsonl({"messages": [{"role": "bot", "content": "x"}, ASSISTANT]}), [1], "role must be one of"),
    (jsonl({"messages": [USER, {"role": "assistant"}]}), [1], "has no 'content'"),
    (jsonl({"messages": [USER, {"role": "assistant", "content": 7}]}), [1], "must be a string"),
    (jsonl({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": 1}]}),
     [1], "must be a string"),
    (jsonl({"conversations": [{"from": "robot", "value": "Hi"}]}), [1], "from must be one of"),
    (jsonl({**MESSAGES, **CONVERSATIONS}), [1], "both"),
    (jsonl([MESSAGES]), [1], "expected a JSON object"),
    (jsonl(MESSAGES, MESSAGES, CONVERSATIONS), [3], "one format"),
    (jsonl(CONVERSATIONS) + b"\n" + jsonl(MESSAGES), [3], "one format"),
    (jsonl(MESSAGES) + b'{"messages": "\xff\xfe"}\n', [2], "UTF-8"),
    (jsonl(NO_REPLY, MESSAGES, {"x": 1}, MESSAGES) + b"[", [1, 3, 5], "no assistant turn"),
    (jsonl(MESSAGES) + b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n", [2],
     "nested too deep"),
    (jsonl(MESSAGES) + b'{"messages": [{"role": "user", "content": "a\\ud800"}, '
     b'{"role": "assistant", "content": "\\ud83d\\ude00"}]}\n', [2], "lone surrogate"),
    # An integer past Python's digit limit (4,300): JSON allows it, json.loads cannot take it.
    (jsonl(MESSAGES) + b'{"messages": [], "n": ' + b"7" * 5000 + b"}\n", [2],
     "Exceeds the limit (4300 digits)"),
], ids=["broken-json", "no-assistant", "empty-assistant", "sharegpt-no-assistant", "wrong-schema",
        "turns-not-a-list", "no-turns", "bad-role", "no-content", "bad-content", "bad-value",
        "bad-from", "both-formats", "not-an-object", "mixed-formats", "mixed-after-blank",
        "not-utf8", "several-errors", "nested-too-deep", "lone-surrogate", "huge-integer"])
def test_bad_dataset_is_rejected_with_line_numbers(api: Api, stack: Stack, content: bytes,
                                                   lines: list[int], fragment: str) -> None:
    rows, files = count_datasets(stack), stored(stack)
    error = assert_error(upload(api, content), 422, "invalid_dataset", "file")
    assert error["message"].startswith(f"line {lines[0]}: ") and fragment in error["message"]
    assert [e["line"] for e in error["errors"]] == lines
    assert fragment in error["errors"][0]["message"]
    assert count_datasets(stack) == rows and stored(stack) == files


def test_at_most_20_errors_are_listed(api: Api, stack: Stack) -> None:
    rows, files = count_datasets(stack), stored(stack)
    error = assert_error(upload(api, jsonl(*[NO_REPLY] * 50)), 422, "invalid_dataset", "file")
    assert [e["line"] for e in error["errors"]] == list(range(1, 21))
    assert "stopped reading" in error["message"]
    assert count_datasets(stack) == rows and stored(stack) == files


@pytest.mark.parametrize("content", [b"", b"\n\n   \n"], ids=["empty", "blank-lines"])
def test_empty_dataset_is_rejected(api: Api, stack: Stack, content: bytes) -> None:
    rows, files = count_datasets(stack), stored(stack)
    error = assert_error(upload(api, content), 422, "invalid_dataset", "file")
    assert error["errors"] == [{"line": None, "message": "the file contains no conversations"}]
    assert count_datasets(stack) == rows and stored(stack) == files


def test_too_long_line_is_rejected(big_api: Api, stack: Stack) -> None:
    rows, files = count_datasets(stack), stored(stack)
    long_reply = {"messages": [USER, {"role": "assistant", "content": "x" * MIB}]}
    content = jsonl(MESSAGES, long_reply, MESSAGES, long_reply)
    error = assert_error(upload(big_api, content), 422, "invalid_dataset", "file")
    assert [e["line"] for e in error["errors"]] == [2, 4]
    assert error["message"].startswith("line 2: line too long")
    assert count_datasets(stack) == rows and stored(stack) == files
    # Just under the per-line limit is fine.
    fits = {"messages": [USER, {"role": "assistant", "content": "x" * (MIB - 200)}]}
    assert created(upload(big_api, jsonl(fits, MESSAGES)))["num_conversations"] == 2


def test_dataset_over_the_size_limit_is_413(big_api: Api, stack: Stack) -> None:
    rows, files = count_datasets(stack), stored(stack)
    line = jsonl({"messages": [USER, {"role": "assistant", "content": "y" * 1000}]})
    over = line * (DATASET_LIMIT // len(line) + 1)
    assert DATASET_LIMIT < len(over) < BODY_LIMIT  # under the body limit: the dataset limit answers
    assert_error(upload(big_api, over), 413, "dataset_too_large", "file")
    assert count_datasets(stack) == rows and stored(stack) == files
    under = line * (DATASET_LIMIT // len(line))
    assert created(upload(big_api, under))["num_bytes"] == len(under)


@pytest.mark.parametrize("files, status, code, param", [
    ([("name", (None, "x"))], 422, "missing_field", "file"),
    ([("file", ("a.jsonl", jsonl(MESSAGES))), ("bogus", (None, "1"))], 422, "unknown_field",
     "bogus"),
    ([("file", ("a.jsonl", jsonl(MESSAGES))), ("name", (None, "n" * 256))], 422, "invalid_value",
     "name"),
    ([("file", ("a.jsonl", jsonl(MESSAGES))), ("name", (None, "  "))], 422, "invalid_value",
     "name"),
    ([("file", (None, jsonl(MESSAGES).decode()))], 422, "invalid_value", "file"),
    ([("file", ("a.jsonl", jsonl(MESSAGES))), ("file", ("b.jsonl", jsonl(MESSAGES)))], 400, None,
     None),
], ids=["no-file", "unknown-field", "long-name", "blank-name", "file-not-a-file", "two-files"])
def test_bad_upload_form(api: Api, stack: Stack, files, status, code, param) -> None:
    before = count_datasets(stack)
    response = api.post("/api/datasets", files=files)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == param and error["message"]
    assert count_datasets(stack) == before


def test_preview_pages_through_an_uploads_rows(api: Api, make_api) -> None:
    long_reply = {"role": "assistant", "content": [{"type": "text", "text": "x" * 2500}]}
    content = jsonl(MESSAGES, {"messages": [USER, ASSISTANT]},
                    {"messages": [USER, long_reply]}) + b"\n"
    dataset = created(upload(api, content))
    rows_url = f"/api/datasets/{dataset['id']}/rows"

    first = api.get(rows_url, params={"limit": 2}).json()
    assert (first["object"], first["offset"], first["has_more"]) == ("list", 0, True)
    assert [row["index"] for row in first["data"]] == [0, 1]
    assert first["data"][0]["turns"] == [
        {"role": "system", "text": "Be brief.", "cut": False},
        {"role": "user", "text": "What is 2 + 2?", "cut": False},
        {"role": "assistant", "text": "4.", "cut": False}]
    assert [(t["role"], t["text"]) for t in first["data"][1]["turns"]] == [
        ("user", "What is 2 + 2?"), ("assistant", "4.")]

    rest = api.get(rows_url, params={"offset": 2, "limit": 2}).json()
    assert (rest["offset"], rest["has_more"]) == (2, False)
    [row] = rest["data"]  # the blank last line is no row
    assert row["index"] == 2 and row["turns"][1] == {"role": "assistant", "text": "x" * 2000,
                                                     "cut": True}
    assert api.get(rows_url, params={"offset": 3}).json()["data"] == []

    assert_error(api.get(rows_url, params={"limit": 51}), 422, "invalid_value", "limit")
    assert_error(api.get(rows_url, params={"offset": -1}), 422, "invalid_value", "offset")
    assert_error(make_api(api).get(rows_url), 404, "not_found")  # another project's

    # ShareGPT's human and gpt read as user and assistant.
    sharegpt = created(upload(api, jsonl(CONVERSATIONS)))
    [row] = api.get(f"/api/datasets/{sharegpt['id']}/rows").json()["data"]
    assert [(t["role"], t["text"]) for t in row["turns"]] == [("user", "Hi"),
                                                              ("assistant", "Hello!")]


def test_preview_of_a_public_preset_or_a_lost_file_is_409(api: Api, stack: Stack) -> None:
    public = created(api.post("/api/datasets", json={"public": "sharegpt"}))
    error = assert_error(api.get(f"/api/datasets/{public['id']}/rows"), 409, "no_preview")
    assert "downloads it" in error["message"]

    dataset = created(upload(api, jsonl(MESSAGES)))
    (stack.data_root / "datasets" / f"{dataset['sha256']}.jsonl").unlink()
    assert_error(api.get(f"/api/datasets/{dataset['id']}/rows"), 409, "dataset_file_missing")
