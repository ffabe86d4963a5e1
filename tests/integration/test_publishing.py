"""Publishing a checkpoint to the Hugging Face Hub.

The Hub cannot be reached from here, so these tests run the real ``huggingface_hub`` client
against ``HubDouble`` (tests/support/hub_double.py), a TEST DOUBLE of the Hub's HTTP endpoints,
selected with the client's endpoint setting (``HfApi(endpoint=...)`` in-process, ``HF_ENDPOINT``
or ``--endpoint`` for the CLI subprocess). The double is named ``hub_double`` everywhere below so
nobody mistakes what these tests talk to for the real Hub.
"""

from __future__ import annotations

import json
import os
import secrets
import string
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import HfApi, ModelCard
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import RepositoryNotFoundError

from app.services.publishing import (
    PublishError,
    PublishResult,
    checkpoint_card_fields,
    publish_checkpoint,
    render_model_card,
)
from tests.support.hub_double import HubDouble, git_blob_sha1

ROOT = Path(__file__).resolve().parents[2]
REPO_ID = "specdeck/qwen3-8b-dflash"
VERIFIER = "Qwen/Qwen3-8B"
LAYER_IDS = [1, 17, 33]
BLOCK_SIZE = 16
DRAFT_VOCAB = 32000
DATASET = {"name": "sharegpt-mini", "samples": 1200, "tokens": 524288, "source": "hub:org/sharegpt"}
EVALUATION = {"acceptance_length": 3.45, "speedup": 2.31, "prompts": 80, "benchmark": "gsm8k"}


def make_token() -> str:
    return "hf_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(34))


@pytest.fixture()
def token() -> str:
    return make_token()


@pytest.fixture()
def make_hub_double(token: str, monkeypatch: pytest.MonkeyPatch):
    """Start Hub doubles. The client's default endpoint is pointed at the double too: besides the
    calls made with ``endpoint=``, huggingface_hub fetches ``{ENDPOINT}/api/agent-harnesses`` when
    it builds its user-agent, and that must not go to huggingface.co."""
    doubles: list[HubDouble] = []

    def make(**kwargs) -> HubDouble:
        double = HubDouble(**{"token": token, **kwargs}).start()
        doubles.append(double)
        monkeypatch.setattr(hf_constants, "ENDPOINT", double.url)
        return double

    yield make
    for double in doubles:
        double.stop()


@pytest.fixture()
def hub_double(make_hub_double) -> HubDouble:
    return make_hub_double()


def write_safetensors(path: Path, payload: bytes) -> None:
    """A valid safetensors file holding one uint8 tensor (no torch needed)."""
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "fc.weight": {"dtype": "U8", "shape": [len(payload)],
                                       "data_offsets": [0, len(payload)]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + payload)


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    """A speculators-format DFlash checkpoint directory, shaped like the trainer's output."""
    directory = tmp_path / "checkpoints" / "0"
    directory.mkdir(parents=True)
    config = {
        "architectures": ["DFlashDraftModel"],
        "aux_hidden_state_layer_ids": LAYER_IDS,
        "block_size": BLOCK_SIZE,
        "draft_vocab_size": DRAFT_VOCAB,
        "dtype": "bfloat16",
        "mask_token_id": 151669,
        "speculators_config": {
            "algorithm": "dflash",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                  "speculative_tokens": BLOCK_SIZE - 1, "verifier_accept_k": 1}],
            "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": VERIFIER},
        },
        "speculators_model_type": "dflash",
        "speculators_version": "0.9.0",
        "transformer_layer_config": {"hidden_size": 4096, "num_hidden_layers": 5, "model_type": "qwen3",
                                     "vocab_size": 151936},
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(directory / "model.safetensors", os.urandom(3 * 1024 * 1024))
    # Never published: each holds a marker that must not appear in anything sent to the Hub.
    (directory / "optimizer_state_dict.pt").write_bytes(b"OPTIMIZER-STATE-" + os.urandom(4096))
    (directory / "scheduler_state_dict.pt").write_bytes(b"SCHEDULER-STATE-" + os.urandom(256))
    (directory / "training_state.json").write_text(json.dumps({"epoch": 2, "local_step": 0,
                                                               "global_step": 540}))
    (directory / "val_metrics.json").write_text(json.dumps({"loss_epoch": 1.2345678,
                                                            "full_acc_epoch": 0.61,
                                                            "eal_epoch": 3.42}))
    (directory / "train_command.txt").write_text("# TRAIN-COMMAND-MARKER\npython train.py ...\n")
    return directory


def build_card(checkpoint: Path, *, evaluation: dict | None = None, dataset: dict | None = None) -> str:
    return render_model_card(repo_id=REPO_ID, dataset_summary=DATASET if dataset is None else dataset,
                             evaluation=evaluation, **checkpoint_card_fields(checkpoint))


def expected_command(repo_id: str = REPO_ID, verifier: str = VERIFIER, block: int = BLOCK_SIZE) -> str:
    return (f"vllm serve {verifier} --speculative-config "
            f"'{{\"method\": \"dflash\", \"model\": \"{repo_id}\", \"num_speculative_tokens\": {block - 1}}}'")


def publish(hub_double: HubDouble, checkpoint: Path, token: str, card: str, **kwargs) -> PublishResult:
    return publish_checkpoint(checkpoint, REPO_ID, token=token, card=card, endpoint=hub_double.url, **kwargs)


# ---------------------------------------------------------------------------------------------
# Model card
# ---------------------------------------------------------------------------------------------

def test_card_names_the_drafter_and_the_exact_serve_command(checkpoint: Path) -> None:
    card = build_card(checkpoint)
    parsed = ModelCard(card)  # the client's own front-matter parser
    assert parsed.data.base_model == VERIFIER
    assert parsed.data.library_name == "speculators"
    assert {"speculative-decoding", "dflash", "speculators"} <= set(parsed.data.tags)

    assert VERIFIER in card
    assert "| Aux hidden-state layer ids | [1, 17, 33] |" in card
    assert "| Block size | 16 |" in card
    assert "| Draft vocabulary size | 32000 |" in card
    assert expected_command() in card
    # dataset summary and training metrics (validation metrics + training state)
    assert "| name | sharegpt-mini |" in card and "| samples | 1200 |" in card
    assert "| eal_epoch | 3.42 |" in card and "| loss_epoch | 1.2346 |" in card
    assert "| global_step | 540 |" in card
    # no evaluation yet, then the numbers once they exist
    assert "Not evaluated yet" in card
    evaluated = build_card(checkpoint, evaluation=EVALUATION)
    assert "Not evaluated yet" not in evaluated
    assert "| acceptance_length | 3.45 |" in evaluated and "| speedup | 2.31 |" in evaluated
    # deterministic: the same inputs give the same bytes (idempotent publishing depends on it)
    assert build_card(checkpoint) == card


def test_card_of_a_checkpoint_shows_its_recorded_evaluation(checkpoint: Path) -> None:
    """workers/publish.py card(): what the publishing stage uploads, from the database rows."""
    from app.db.models import Checkpoint, Job
    from tests.unit.test_evaluate import EVALUATION as RECORDED
    from tests.unit.test_runtimes import ROW
    from workers.publish import card

    job = Job(spec={**ROW, "verifier": VERIFIER, "dataset": "ds_1",
                    "dataset_format": "conversations", "mode": "online"})
    unevaluated = card(Checkpoint(path=str(checkpoint), metrics=None, evaluation=None), job, REPO_ID)
    assert "Not evaluated yet" in unevaluated
    text = card(Checkpoint(path=str(checkpoint), metrics=None, evaluation=RECORDED), job, REPO_ID)
    assert "Not evaluated yet" not in text
    evaluation = text.split("## Evaluation: served acceptance", 1)[1].split("## Training data", 1)[0]
    assert "| Served mean acceptance length | 2.3125 |" in evaluation
    # The served number leads the card; the trainer's numbers follow, labelled as estimates.
    assert text.index("## Evaluation: served acceptance") < text.index(
        "## Training metrics (the trainer's estimates)")
    assert "| Acceptance rate per position | [0.75, 0.4375, 0.125] |" in evaluation
    assert "| Prompts | 8 (validation split), greedy, at most 64 new tokens each |" in evaluation
    assert "| Runtime | local (vLLM with the DFlash drafter (CPU), evaluating the trained drafter) |" in evaluation
    assert "| Output tokens/s | 14.8 |" in evaluation
    assert "ckpt_1" not in text  # internal ids stay out of the card
    assert card(Checkpoint(path=str(checkpoint), metrics=None, evaluation=RECORDED), job, REPO_ID) == text
    assert "Partial checkpoint" not in text
    partial = card(Checkpoint(path=str(checkpoint), epoch=2, partial=True), job, REPO_ID)
    assert ("**Partial checkpoint.** Saved when training was stopped during epoch 3: it has seen "
            "only part of that epoch's data.") in partial


def test_card_for_a_local_verifier_has_no_base_model() -> None:
    card = render_model_card(repo_id="me/draft", checkpoint_config={}, verifier="/models/demo",
                             layer_ids=(2, 4, 5), block_size=8, draft_vocab_size=1536,
                             dataset_summary={}, metrics={}, evaluation=None)
    assert ModelCard(card).data.base_model is None
    assert expected_command("me/draft", "/models/demo", 8) in card


# ---------------------------------------------------------------------------------------------
# Publishing through the real client against the Hub double
# ---------------------------------------------------------------------------------------------

def test_publish_uploads_only_what_a_server_needs(hub_double: HubDouble, checkpoint: Path,
                                                  token: str) -> None:
    card = build_card(checkpoint)
    result = publish(hub_double, checkpoint, token, card)

    assert result.changed is True
    assert result.repo_url == f"{hub_double.url}/{REPO_ID}"
    commits = hub_double.commits(REPO_ID)
    assert [c["message"] for c in commits][0] == "initial commit"  # the Hub's own first commit
    assert len(commits) == 2
    published = commits[-1]
    assert published["sha"] == result.commit_sha
    assert result.commit_url == f"{hub_double.url}/{REPO_ID}/commit/{result.commit_sha}"
    assert sorted(published["files"]) == ["README.md", "config.json", "model.safetensors"]

    files = hub_double.files(REPO_ID)
    assert set(files) == {".gitattributes", "README.md", "config.json", "model.safetensors"}
    assert files["config.json"] == (checkpoint / "config.json").read_bytes()
    assert files["model.safetensors"] == (checkpoint / "model.safetensors").read_bytes()
    assert files["README.md"] == card.encode()

    # the weights went through the LFS protocol, the small text files as regular git blobs
    entries = hub_double.file_entries(REPO_ID)
    assert entries["model.safetensors"].lfs and not entries["config.json"].lfs
    assert set(hub_double.lfs_objects(REPO_ID)) == {entries["model.safetensors"].sha256}
    storage_puts = hub_double.requests_to(r"^PUT /lfs-storage/")
    assert storage_puts and all(r.header("authorization") is None for r in storage_puts)

    # optimizer/scheduler state and the training command never reached the Hub in any form
    for request in hub_double.requests:
        for marker in (b"OPTIMIZER-STATE-", b"SCHEDULER-STATE-", b"TRAIN-COMMAND-MARKER",
                       b"optimizer_state_dict", b"scheduler_state_dict"):
            assert marker not in request.body
    assert hub_double.unhandled == []

    # the client reads back what the Hub would report
    api = HfApi(endpoint=hub_double.url, token=token)
    assert sorted(api.list_repo_files(REPO_ID)) == [".gitattributes", "README.md", "config.json",
                                                    "model.safetensors"]
    (weights,) = api.get_paths_info(REPO_ID, ["model.safetensors"], expand=True)
    assert weights.lfs.sha256 == entries["model.safetensors"].sha256
    assert weights.last_commit.oid == result.commit_sha
    (config,) = api.get_paths_info(REPO_ID, ["config.json"])
    assert config.blob_id == git_blob_sha1((checkpoint / "config.json").read_bytes())


def test_repo_is_private_by_default(hub_double: HubDouble, checkpoint: Path, token: str) -> None:
    publish(hub_double, checkpoint, token, build_card(checkpoint))
    assert hub_double.repo(REPO_ID)["private"] is True
    assert HfApi(endpoint=hub_double.url, token=token).model_info(REPO_ID).private is True
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub_double.url, token=False).model_info(REPO_ID)

    publish_checkpoint(checkpoint, "specdeck/public-draft", token=token, card=build_card(checkpoint),
                       private=False, endpoint=hub_double.url)
    assert hub_double.repo("specdeck/public-draft")["private"] is False


def test_publishing_again_unchanged_makes_no_commit(hub_double: HubDouble, checkpoint: Path,
                                                    token: str) -> None:
    card = build_card(checkpoint)
    first = publish(hub_double, checkpoint, token, card)
    seen = len(hub_double.requests)

    again = publish(hub_double, checkpoint, token, card)

    assert again.changed is False
    assert again.commit_sha == first.commit_sha
    assert again.commit_url == first.commit_url
    assert len(hub_double.commits(REPO_ID)) == 2
    later = [f"{r.method} {r.path}" for r in hub_double.requests[seen:]]
    assert not [r for r in later if "/commit/" in r or "/preupload/" in r or "lfs" in r], later


def test_a_changed_card_or_weights_makes_a_new_commit_of_only_that_file(
        hub_double: HubDouble, checkpoint: Path, token: str) -> None:
    first = publish(hub_double, checkpoint, token, build_card(checkpoint))
    seen = len(hub_double.requests)

    evaluated = build_card(checkpoint, evaluation=EVALUATION)
    second = publish(hub_double, checkpoint, token, evaluated)

    assert second.changed is True and second.commit_sha != first.commit_sha
    head = hub_double.commits(REPO_ID)[-1]
    assert head["sha"] == second.commit_sha and head["parent"] == first.commit_sha
    assert head["files"] == ["README.md"]
    assert hub_double.files(REPO_ID)["README.md"] == evaluated.encode()
    assert not hub_double.requests_to(r"^PUT /lfs-storage/")[1:], "the weights were uploaded again"
    assert all("lfs" not in r.path for r in hub_double.requests[seen:])

    write_safetensors(checkpoint / "model.safetensors", os.urandom(1024 * 1024))
    third = publish(hub_double, checkpoint, token, evaluated)
    assert third.changed is True
    assert hub_double.commits(REPO_ID)[-1]["files"] == ["model.safetensors"]
    assert hub_double.files(REPO_ID)["model.safetensors"] == (checkpoint / "model.safetensors").read_bytes()


def test_large_weights_use_the_multipart_lfs_transfer(make_hub_double, token: str, checkpoint: Path) -> None:
    hub_double = make_hub_double(multipart_chunk_size=1024 * 1024)
    publish(hub_double, checkpoint, token, build_card(checkpoint))
    assert len(hub_double.requests_to(r"^PUT /lfs-storage/\w+/part/")) == 4  # 3 MiB + header
    assert hub_double.requests_to(r"^POST /lfs-storage/\w+/complete")
    assert hub_double.files(REPO_ID)["model.safetensors"] == (checkpoint / "model.safetensors").read_bytes()
    assert hub_double.unhandled == []


def test_a_bad_token_fails_clearly_without_showing_the_token(hub_double: HubDouble, checkpoint: Path) -> None:
    bad = make_token()
    with pytest.raises(PublishError) as caught:
        publish(hub_double, checkpoint, bad, build_card(checkpoint))
    message = str(caught.value)
    assert "token was rejected (401)" in message
    assert bad not in message and bad not in repr(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert hub_double.repo_ids() == []
    rejected = [r for r in hub_double.requests if r.status == 401]
    assert rejected and all(r.response_headers.get("X-Error-Message") ==
                            "Invalid credentials in Authorization header" for r in rejected)


def test_a_read_only_token_fails_clearly(make_hub_double, checkpoint: Path) -> None:
    reader = make_token()
    hub_double = make_hub_double(read_only_tokens=(reader,))
    with pytest.raises(PublishError, match=r"not allowed to do this \(403\)") as caught:
        publish(hub_double, checkpoint, reader, build_card(checkpoint))
    assert reader not in str(caught.value)
    assert hub_double.repo_ids() == []


# ---------------------------------------------------------------------------------------------
# The CLI the worker runs: HF_TOKEN reaches it through its environment only
# ---------------------------------------------------------------------------------------------

class CmdlineWatch:
    """Reads every /proc/*/cmdline over and over while a publish runs."""

    def __init__(self, needle: str) -> None:
        self.needle = needle.encode()
        self.leaks: list[str] = []
        self.publisher_seen = 0
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if self.needle in cmdline:
                    self.leaks.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
                if b"app.services.publishing" in cmdline:
                    self.publisher_seen += 1
            self.scans += 1

    def __enter__(self) -> CmdlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_the_cmdline_watch_does_catch_a_token_in_argv(token: str) -> None:
    """Control for the tests below: a child with the token in its argv is caught. The child
    lives until the watch has seen it (a fixed lifetime could end before a scan on a busy
    machine)."""
    with CmdlineWatch(token) as watch:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", token])
        try:
            deadline = time.monotonic() + 60
            while not watch.leaks and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            child.kill()
            child.wait(timeout=30)
    assert watch.leaks and token in watch.leaks[0]


def run_cli(args: list[str], env: dict[str, str], tmp_path: Path, watch_for: str) -> tuple[
        subprocess.CompletedProcess, CmdlineWatch]:
    with CmdlineWatch(watch_for) as watch:
        proc = subprocess.run([sys.executable, "-m", "app.services.publishing", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
    return proc, watch


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf-home"), PYTHONPATH=str(ROOT), **extra)
    return env


def test_cli_publishes_with_the_token_only_in_its_environment(make_hub_double, checkpoint: Path,
                                                              token: str, tmp_path: Path) -> None:
    card_file = tmp_path / "README.md"
    card_file.write_text(build_card(checkpoint))
    result_file = tmp_path / "publish-result.json"
    args = ["--checkpoint", str(checkpoint), "--repo-id", REPO_ID, "--card-file", str(card_file),
            "--result-file", str(result_file)]
    # a little latency on every Hub call keeps the child alive long enough to be watched
    hub_double = make_hub_double(response_delay=0.05)
    env = cli_env(tmp_path, HF_TOKEN=token, HF_ENDPOINT=hub_double.url)
    proc, watch = run_cli(args, env, tmp_path, token)

    assert proc.returncode == 0, proc.stderr
    assert watch.publisher_seen > 0 and watch.scans > 5  # the watch really saw the child run
    assert watch.leaks == []
    assert token not in proc.stdout and token not in proc.stderr

    result = json.loads(result_file.read_text())
    assert token not in result_file.read_text()
    head = hub_double.commits(REPO_ID)[-1]
    assert result == {"repo_url": f"{hub_double.url}/{REPO_ID}", "commit_sha": head["sha"],
                      "commit_url": f"{hub_double.url}/{REPO_ID}/commit/{head['sha']}",
                      "changed": True}
    assert hub_double.repo(REPO_ID)["private"] is True
    assert hub_double.files(REPO_ID)["README.md"] == card_file.read_bytes()

    # the token reached the Hub double only as the Authorization header
    authorized = [r for r in hub_double.requests if r.header("authorization")]
    assert authorized and {r.header("authorization") for r in authorized} == {f"Bearer {token}"}
    for request in hub_double.requests:
        assert token not in request.transcript(), f"{request.method} {request.path}"
    assert all(r.header("authorization") is None for r in hub_double.requests_to("agent-harnesses"))
    assert hub_double.unhandled == []

    # again, nothing changed: same commit; --endpoint takes precedence over HF_ENDPOINT
    env = cli_env(tmp_path, HF_TOKEN=token, HF_ENDPOINT="http://127.0.0.1:9")
    proc, watch = run_cli([*args, "--endpoint", hub_double.url], env, tmp_path, token)
    assert proc.returncode == 0, proc.stderr
    assert watch.leaks == []
    again = json.loads(result_file.read_text())
    assert again == {**result, "changed": False}
    assert len(hub_double.commits(REPO_ID)) == 2


def test_cli_fails_in_one_line_on_a_bad_token(hub_double: HubDouble, checkpoint: Path,
                                              tmp_path: Path) -> None:
    bad = make_token()
    card_file = tmp_path / "README.md"
    card_file.write_text(build_card(checkpoint))
    result_file = tmp_path / "publish-result.json"
    env = cli_env(tmp_path, HF_TOKEN=bad, HF_ENDPOINT=hub_double.url)
    proc, watch = run_cli(["--checkpoint", str(checkpoint), "--repo-id", REPO_ID, "--card-file",
                           str(card_file), "--result-file", str(result_file)], env, tmp_path, bad)

    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert proc.stderr.startswith("publish failed: the Hugging Face token was rejected (401)")
    assert bad not in proc.stdout + proc.stderr
    assert watch.leaks == []
    assert not result_file.exists()
    for request in hub_double.requests:
        assert bad not in request.transcript()


def test_cli_takes_the_token_from_the_environment_only(checkpoint: Path, tmp_path: Path) -> None:
    card_file = tmp_path / "README.md"
    card_file.write_text("card\n")
    args = ["--checkpoint", str(checkpoint), "--repo-id", REPO_ID, "--card-file", str(card_file),
            "--result-file", str(tmp_path / "r.json"), "--endpoint", "http://127.0.0.1:9"]
    proc = subprocess.run([sys.executable, "-m", "app.services.publishing", *args], cwd=ROOT,
                          env=cli_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "publish failed: HF_TOKEN is not set in the environment"

    proc = subprocess.run([sys.executable, "-m", "app.services.publishing", *args, "--token", "x"],
                          cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unrecognized arguments: --token" in proc.stderr
