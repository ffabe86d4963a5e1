"""The trainer-output parser, against lines captured from real speculators 0.9.0 runs.

``data/trainer_log_excerpt.txt`` holds unmodified lines (rich padding included, run with
``COLUMNS=1000``) from three runs of ``workers.runtimes.local.train``: one process with
Muon (dflash's default), torchrun with two processes and AdamW, and a resume.
``data/trainer_log_interrupted.txt`` is a run stopped with SIGTERM.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from workers.pipeline.trainer_output import (
    BestCheckpointUpdated,
    CheckpointSaved,
    EpochEvent,
    Metric,
    Record,
    TrainingInterrupted,
    TrainingResumed,
    parse_line,
    strip_ansi,
)

EXCERPT = Path(__file__).parent / "data" / "trainer_log_excerpt.txt"


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return EXCERPT.read_text(encoding="utf-8").splitlines()


def _line_with(lines: list[str], fragment: str) -> str:
    return next(line for line in lines if fragment in line)


def test_excerpt_record_counts(lines: list[str]) -> None:
    records: list[Record] = [r for line in lines for r in parse_line(line)]
    kinds = Counter(type(r).__name__ for r in records)
    assert kinds == {
        # Three Muon train lines of 23 values, one AdamW line of 22, two val lines of 10.
        "Metric": 3 * 23 + 22 + 2 * 10,
        "EpochEvent": 6,
        "CheckpointSaved": 1,
        "BestCheckpointUpdated": 2,
        "TrainingResumed": 1,
    }


def test_train_line_under_muon(lines: list[str]) -> None:
    records = parse_line(_line_with(lines, "global_step=45"))
    metrics = {m.name: m for m in records if isinstance(m, Metric)}
    assert len(metrics) == len(records) == 23
    assert all(m.epoch == 0 and m.step == 45 and m.split == "train" for m in metrics.values())
    assert metrics["train/loss"].value == pytest.approx(1.770)
    assert metrics["train/eal"].value == pytest.approx(2.097)
    assert metrics["train/position_7_acc"].value == pytest.approx(0.276)
    assert metrics["train/error_records"].value == 0.0  # "0.00e+00"
    assert metrics["profile/tokens_per_s"].value == pytest.approx(2320.0)  # "2.32e+03"
    assert metrics["lr/Muon"].value == pytest.approx(1.17e-06)
    assert metrics["lr/AdamW"].value == pytest.approx(1.17e-06)
    assert "epoch" not in metrics and "global_step" not in metrics


def test_train_line_under_adamw(lines: list[str]) -> None:
    records = parse_line(_line_with(lines, "global_step=3 "))
    metrics = {m.name: m for m in records if isinstance(m, Metric)}
    assert metrics["lr"].value == pytest.approx(9.55e-04)
    assert not any(name.startswith("lr/") for name in metrics)
    assert metrics["train/loss"].step == 3


def test_validation_lines(lines: list[str]) -> None:
    first = parse_line(_line_with(lines, "val/loss_epoch=1.751"))
    values = {m.name: m.value for m in first if isinstance(m, Metric)}
    assert values["val/loss_epoch"] == pytest.approx(1.751)
    assert values["val/eal_epoch"] == pytest.approx(2.654)
    assert values["val/position_1_acc_epoch"] == pytest.approx(0.431)
    assert all(isinstance(m, Metric) and m.split == "val" and m.step is None for m in first)
    assert {m.epoch for m in first if isinstance(m, Metric)} == {0}
    second = parse_line(_line_with(lines, "val/loss_epoch=1.379"))
    assert {m.epoch for m in second if isinstance(m, Metric)} == {1}


def test_lifecycle_lines(lines: list[str]) -> None:
    records = [r for line in lines for r in parse_line(line) if not isinstance(r, Metric)]
    assert records == [
        EpochEvent(phase="train", status="started", epoch=0, num_epochs=1),
        EpochEvent(phase="train", status="completed", epoch=0, num_epochs=1),
        CheckpointSaved(path="/tmp/ws/pt/local_runtime0/checkpoints_single/0", label="0"),
        EpochEvent(phase="validation", status="started", epoch=0, num_epochs=1),
        EpochEvent(phase="validation", status="completed", epoch=0, num_epochs=1),
        BestCheckpointUpdated(epoch=0, val_loss=1.750561),
        TrainingResumed(epoch=1),
        EpochEvent(phase="train", status="started", epoch=1, num_epochs=2),
        EpochEvent(phase="train", status="completed", epoch=1, num_epochs=2),
        BestCheckpointUpdated(epoch=1, val_loss=1.379232),
    ]
    saved = next(r for r in records if isinstance(r, CheckpointSaved))
    assert saved.epoch == 0


@pytest.mark.parametrize(
    "fragment",
    [
        "speculator_type='dflash'",  # the run-configuration dump (hparams)
        "generation/vllm_endpoint=",  # its continuation lines
        "HTTP Request: POST",
        "Epoch 0 100%",
        "Writing model shards",
        "Saving checkpoint to",
        "Started distributed with local_rank=0",
        "Restored best_val_loss",
        "FutureWarning",
    ],
)
def test_other_lines_give_no_records(lines: list[str], fragment: str) -> None:
    assert parse_line(_line_with(lines, fragment)) == []


def test_ansi_codes_and_number_formats() -> None:
    # Synthetic: what rich prints with colours forced (FORCE_COLOR=1).
    line = (
        "\x1b[2;36m[12:00:01]\x1b[0m\x1b[2;36m \x1b[0m\x1b[34mINFO    \x1b[0m "
        "train/loss=-1.25e-04, train/eal=nan, profile/tokens_per_s=inf, train/x=7, "
        "epoch=3, lr=1.00e-03, global_step=1200 "
        "\x1b[2mtrainer.py\x1b[0m\x1b[2m:\x1b[0m\x1b[2m587\x1b[0m"
    )
    assert "\x1b" not in strip_ansi(line)
    metrics = {m.name: m for m in parse_line(line) if isinstance(m, Metric)}
    assert metrics["train/loss"].value == pytest.approx(-1.25e-04)
    assert math.isnan(metrics["train/eal"].value)
    assert metrics["profile/tokens_per_s"].value == math.inf
    assert metrics["train/x"].value == 7.0
    assert metrics["lr"] == Metric(name="lr", value=1e-3, epoch=3, step=1200, split="train")


def test_a_wrapped_record_is_not_misread() -> None:
    # rich wraps a record wider than the terminal; neither half is a record.
    first = "[12:00:01] INFO     train/loss=2.046, train/full_acc=0.100,          trainer.py:587"
    rest = "                    epoch=0, lr=0.001, global_step=12"
    assert parse_line(first) == []
    assert parse_line(rest) == []


def test_interrupted_run() -> None:
    # Real lines: SIGTERM sent to a single-process run during its first epoch.
    text = (EXCERPT.parent / "trainer_log_interrupted.txt").read_text(encoding="utf-8")
    records = [r for line in text.splitlines() for r in parse_line(line)]
    lifecycle = [r for r in records if not isinstance(r, Metric)]
    assert lifecycle == [
        EpochEvent(phase="train", status="started", epoch=0, num_epochs=1),
        TrainingInterrupted(signal="SIGTERM"),
        CheckpointSaved(path="/tmp/ws/ck6/interrupted", label="interrupted"),
    ]
    saved = lifecycle[-1]
    assert isinstance(saved, CheckpointSaved) and saved.epoch is None
    assert {m.step for m in records if isinstance(m, Metric)} == {5}


def test_mid_epoch_resume_line() -> None:
    # Wording of speculators 0.9.0 trainer.py (a run checkpointed with --checkpoint-freq < 1).
    mid = parse_line(
        "INFO     Resuming mid-epoch from epoch=2 local_step=16 global_step=96.   trainer.py:283"
    )
    assert mid == [TrainingResumed(epoch=2, local_step=16, global_step=96)]
