"""The speculators trainer on the CPU through ``workers.runtimes.local.train``, online
against the session's vLLM hidden-states server (the CPU wheel): one process, then torchrun
with gloo and a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets import load_from_disk

from tests.local_runtime.conftest import TRAINER_LAYER_IDS, Server
from tests.local_runtime.procs import PYTHON, run_logged
from workers.pipeline.trainer_output import (
    BestCheckpointUpdated,
    CheckpointSaved,
    EpochEvent,
    Metric,
    Record,
    TrainingResumed,
    parse_line,
)

pytestmark = pytest.mark.slow

# Sized for 2 cores (dflash-facts.md section 3).
CPU_FLAGS = [
    "--draft-attn-impl", "sdpa",
    "--loss-implementation", "eager",
    "--num-workers", "0",
    "--total-seq-len", "512",
    "--max-anchors", "32",
    "--block-size", "8",
    "--num-layers", "2",
    "--lr", "0.003",  # the demo job's: a 2-layer drafter learns within an epoch
]  # fmt: skip
SINGLE = [PYTHON, "-m", "workers.runtimes.local.train"]
TORCHRUN = [
    PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
    "-m", "workers.runtimes.local.train",
]  # fmt: skip


def _train_args(demo_model: Path, data: Path, server: Server, save: Path, epochs: int) -> list[str]:
    return [
        "--verifier-name-or-path", str(demo_model),
        "--speculator-type", "dflash",
        "--data-path", str(data),
        "--vllm-endpoint", f"{server.base_url}/v1",
        "--on-missing", "generate",
        "--save-path", str(save),
        "--target-layer-ids", *map(str, TRAINER_LAYER_IDS),
        "--epochs", str(epochs),
        "--scheduler-type", "cosine",
        "--seed", "42",
        *CPU_FLAGS,
    ]  # fmt: skip


def _records(log: str) -> list[Record]:
    return [record for line in log.splitlines() for record in parse_line(line)]


def _completions_logged(server: Server) -> int:
    """The trainer's requests, from vLLM's access log."""
    return server.log_path.read_text().count('"POST /v1/completions HTTP/1.1" 200')


def test_single_process_online_epoch(
    demo_model: Path, prepared_data: Path, server: Server, workspace: Path
) -> None:
    save = workspace / "checkpoints_single"
    files_before = set(server.hidden_states_dir.glob("*"))
    requests_before = _completions_logged(server)
    argv = [
        *SINGLE,
        *_train_args(demo_model, prepared_data, server, save, epochs=1),
        "--on-generate",
        "delete",
    ]
    rc, log = run_logged(argv, workspace / "train_single.log", timeout_s=420)
    assert rc == 0, log[-5000:]

    checkpoint = save / "0"
    for name in (
        "config.json",
        "model.safetensors",
        "optimizer_state_dict.pt",
        "scheduler_state_dict.pt",
        "training_state.json",
        "val_metrics.json",
    ):
        assert (checkpoint / name).is_file(), name
    assert (save / "run.yaml").is_file()
    assert (save / "checkpoint_best").resolve() == checkpoint.resolve()
    assert (save / "epoch0_end").resolve() == checkpoint.resolve()

    config = json.loads((checkpoint / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash"
    assert config["aux_hidden_state_layer_ids"] == TRAINER_LAYER_IDS
    assert config["block_size"] == 8
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(demo_model)

    # Online mode: every sample came from the server and no file was left behind.
    rows = len(load_from_disk(str(prepared_data)))
    assert _completions_logged(server) - requests_before >= rows
    assert set(server.hidden_states_dir.glob("*")) == files_before

    records = _records(log)
    events = [r for r in records if isinstance(r, EpochEvent)]
    assert [(e.phase, e.status, e.epoch) for e in events] == [
        ("train", "started", 0),
        ("train", "completed", 0),
        ("validation", "started", 0),
        ("validation", "completed", 0),
    ]
    assert CheckpointSaved(path=str(checkpoint), label="0") in records
    assert any(isinstance(r, BestCheckpointUpdated) and r.epoch == 0 for r in records)
    train = [r for r in records if isinstance(r, Metric) and r.split == "train"]
    names = {m.name for m in train}
    assert {"train/loss", "train/eal", "train/position_1_acc", "profile/tokens_per_s"} <= names
    assert {"lr/Muon", "lr/AdamW"} <= names  # Muon is dflash's default optimizer
    val = {r.name: r.value for r in records if isinstance(r, Metric) and r.split == "val"}
    # The drafter learns within one epoch: more than the bonus token is accepted (an untrained
    # one scores about 1.0; this one 1.375 when measured; the demo job's 6 epochs reach ~6).
    assert val["val/eal_epoch"] > 1.25
    assert val["val/loss_epoch"] == pytest.approx(
        json.loads((checkpoint / "val_metrics.json").read_text())["loss_epoch"], abs=1e-3
    )


def test_torchrun_gloo_then_resume(
    demo_model: Path, prepared_data: Path, server: Server, workspace: Path
) -> None:
    save = workspace / "checkpoints_torchrun"
    argv = [
        *TORCHRUN,
        *_train_args(demo_model, prepared_data, server, save, epochs=1),
        "--draft-vocab-size",
        "512",
        "--optimizer",
        "adamw",
    ]
    rc, log = run_logged(argv, workspace / "train_torchrun.log", timeout_s=420)
    assert rc == 0, log[-5000:]
    assert "Started distributed with local_rank=0, dp_size=2" in log
    assert "Started distributed with local_rank=1, dp_size=2" in log
    config = json.loads((save / "0" / "config.json").read_text())
    assert config["aux_hidden_state_layer_ids"] == TRAINER_LAYER_IDS
    assert config["draft_vocab_size"] == 512
    assert (prepared_data / "d2t-512.npy").is_file()
    lrs = {r.name for r in _records(log) if isinstance(r, Metric) and r.name.startswith("lr")}
    assert lrs == {"lr"}  # a single optimizer logs a plain lr

    # Same save path, one more epoch, one process: resumes from checkpoint 0 on the CPU.
    argv = [
        *SINGLE,
        *_train_args(demo_model, prepared_data, server, save, epochs=2),
        "--draft-vocab-size",
        "512",
        "--optimizer",
        "adamw",
    ]
    rc, log = run_logged(argv, workspace / "train_resume.log", timeout_s=420)
    assert rc == 0, log[-5000:]
    records = _records(log)
    assert TrainingResumed(epoch=1) in records
    assert EpochEvent(phase="train", status="started", epoch=1, num_epochs=2) in records
    assert not any(isinstance(r, EpochEvent) and r.epoch == 0 for r in records)
    assert (save / "1" / "model.safetensors").is_file()
    assert (save / "epoch1_end").resolve() == (save / "1").resolve()
