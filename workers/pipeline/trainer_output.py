"""Parse the progress lines printed by the speculators trainer (0.9.0).

The trainer logs through rich (``RichHandler``) on rank 0. A metric record is one
line of ``key=value`` pairs joined by ``", "``; the values are formatted with 3
decimals, or ``%.2e`` below 0.001 and above 999, integers plainly::

    [21:26:23] INFO     train/loss=2.046, train/full_acc=0.00e+00, ..., train/eal=1.000,
                        profile/tokens_per_s=2.35e+03, epoch=0, lr/Muon=7.44e-04,
                        lr/AdamW=7.44e-04, global_step=20                 trainer.py:587
               INFO     val/loss_epoch=1.656, ..., val/eal_epoch=3.210, epoch=1
                                                                          trainer.py:671

(each record is a single physical line when the trainer runs with ``COLUMNS=1000``;
shown wrapped here). Under the AdamW optimizer the learning rate is ``lr=...``; under
Muon it is one ``lr/<optimizer class>=...`` per optimizer.

Lifecycle lines::

    Training epoch 1/2 started | completed      (1-based in the text)
    Validation epoch 1/2 started | completed
    Checkpoint saved to /out/0                  (or /out/interrupted after a signal)
    Updated checkpoint_best -> 0 (loss_epoch=1.879012)
    Resuming training on epoch 1.
    Resuming mid-epoch from epoch=0 local_step=16 global_step=16.
    Received SIGTERM — interrupting training to save checkpoint. ...

``parse_line`` is pure: one line in, a list of records out (empty for anything else:
HTTP request logs, progress bars, the run-configuration dump, warnings). A metric line
gives one ``Metric`` per value (``epoch`` and ``global_step`` become fields, not
metrics). Every ``epoch`` field is 0-based, as in the metric lines and the checkpoint
directory names. A metric line must carry rich's level column (``INFO``), so a record
that rich wrapped over several physical lines (a terminal narrower than the record) is
dropped rather than misread: run the trainer with ``COLUMNS=1000`` or wider (a block-16
record with Muon is about 900 characters).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BestCheckpointUpdated",
    "CheckpointSaved",
    "EpochEvent",
    "Metric",
    "Record",
    "TrainingInterrupted",
    "TrainingResumed",
    "parse_line",
    "strip_ansi",
]


@dataclass(frozen=True, slots=True)
class Metric:
    """One value of a metric line, e.g. ``train/loss``, ``lr/Muon``, ``val/eal_epoch``."""

    name: str
    value: float
    epoch: int
    step: int | None  # global_step of a training line; None for validation lines
    split: Literal["train", "val"]


@dataclass(frozen=True, slots=True)
class EpochEvent:
    phase: Literal["train", "validation"]
    status: Literal["started", "completed"]
    epoch: int  # 0-based
    num_epochs: int


@dataclass(frozen=True, slots=True)
class CheckpointSaved:
    path: str
    label: str  # the directory name: an epoch number, or "interrupted"

    @property
    def epoch(self) -> int | None:
        return int(self.label) if self.label.isdigit() else None


@dataclass(frozen=True, slots=True)
class BestCheckpointUpdated:
    epoch: int
    val_loss: float


@dataclass(frozen=True, slots=True)
class TrainingResumed:
    epoch: int  # the epoch training continues with
    local_step: int | None = None  # set for a mid-epoch resume
    global_step: int | None = None


@dataclass(frozen=True, slots=True)
class TrainingInterrupted:
    signal: str


Record = (
    Metric
    | EpochEvent
    | CheckpointSaved
    | BestCheckpointUpdated
    | TrainingResumed
    | TrainingInterrupted
)

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
# rich's columns: optional "[HH:MM:SS]", the level, the message, then "file.py:LINE".
_PREFIX = re.compile(r"^\s*(?:\[\d{1,2}:\d{2}:\d{2}\]\s+)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+")
_SOURCE = re.compile(r"\s+[\w.-]+\.py:\d+\s*$")

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf)"
_PAIR = re.compile(rf"([A-Za-z_][\w./-]*)=({_NUMBER})")
_METRIC_LINE = re.compile(rf"^[A-Za-z_][\w./-]*={_NUMBER}(?:, [A-Za-z_][\w./-]*={_NUMBER})*$")

_EPOCH = re.compile(r"^(Training|Validation) epoch (\d+)/(\d+) (started|completed)$")
_SAVED = re.compile(r"^Checkpoint saved to (.+)$")
_BEST = re.compile(rf"^Updated checkpoint_best -> (\d+) \(loss_epoch=({_NUMBER})\)$")
_RESUMED = re.compile(r"^Resuming training on epoch (\d+)\.$")
_RESUMED_MID = re.compile(
    r"^Resuming mid-epoch from epoch=(\d+) local_step=(\d+) global_step=(\d+)\.$"
)
_INTERRUPTED = re.compile(r"^Received (SIG[A-Z0-9]+) .*interrupting training")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def _message(line: str) -> tuple[bool, str]:
    """The log message without rich's columns, and whether the line had a level.

    A rich continuation line (a record wrapped over several lines) has no level.
    """
    text = strip_ansi(line).rstrip("\r\n")
    prefix = _PREFIX.match(text)
    if prefix:
        text = text[prefix.end() :]
    return prefix is not None, _SOURCE.sub("", text).strip()


def _metrics(message: str) -> list[Record]:
    if not _METRIC_LINE.match(message):
        return []
    values = {key: float(raw) for key, raw in _PAIR.findall(message)}
    epoch = values.pop("epoch", None)
    if epoch is None or not math.isfinite(epoch):
        return []
    step = values.pop("global_step", None)
    if step is not None:
        split: Literal["train", "val"] = "train"
    elif values and all(key.startswith("val/") for key in values):
        split = "val"
    else:
        return []
    return [
        Metric(
            name=name,
            value=value,
            epoch=int(epoch),
            step=None if step is None else int(step),
            split=split,
        )
        for name, value in values.items()
    ]


def parse_line(line: str) -> list[Record]:
    """Records in one line of trainer output (``[]`` when it holds none)."""
    has_level, message = _message(line)
    if not message:
        return []
    if has_level and "=" in message and (found := _metrics(message)):
        return found
    if m := _EPOCH.match(message):
        return [
            EpochEvent(
                phase="train" if m[1] == "Training" else "validation",
                status="started" if m[4] == "started" else "completed",
                epoch=int(m[2]) - 1,
                num_epochs=int(m[3]),
            )
        ]
    if m := _SAVED.match(message):
        path = m[1].strip()
        return [CheckpointSaved(path=path, label=path.rstrip("/").rsplit("/", 1)[-1])]
    if m := _BEST.match(message):
        return [BestCheckpointUpdated(epoch=int(m[1]), val_loss=float(m[2]))]
    if m := _RESUMED.match(message):
        return [TrainingResumed(epoch=int(m[1]))]
    if m := _RESUMED_MID.match(message):
        return [TrainingResumed(epoch=int(m[1]), local_step=int(m[2]), global_step=int(m[3]))]
    if m := _INTERRUPTED.match(message):
        return [TrainingInterrupted(signal=m[1])]
    return []
