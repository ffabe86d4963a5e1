"""A stop that reaches speculators' trainer while it waits on the hidden-states server: the
trainer's own signal handler and retrying client (speculators 0.9.0), a real SIGTERM to this
process, with and without ``stops_escape_retries`` (workers/runtimes/local/train.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import speculators.data_generation.vllm_client as vllm_client
import speculators.train.graceful_shutdown as shutdown

from workers.runtimes.local.train import stops_escape_retries


def train_through_a_stop(tmp_path: Path) -> tuple[int, list[str]]:
    """A training whose one hidden-states request is stopped by SIGTERM the first time it is
    tried: how many times it was tried, and the checkpoints the trainer saved."""
    tries = []

    @vllm_client.with_retries
    def fetch_hidden_states() -> None:
        tries.append(1)
        if len(tries) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # waiting on the server: the handler raises here

    class Trainer:
        checkpointer = SimpleNamespace(path=tmp_path)

        def __init__(self) -> None:
            self.saved: list[str] = []

        def maybe_save_checkpoint(self, label: str) -> None:
            self.saved.append(label)

        @shutdown.with_graceful_shutdown()
        def run_training(self) -> None:
            fetch_hidden_states()

    trainer = Trainer()
    trainer.run_training()
    return len(tries), trainer.saved


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_client, "RETRY_BACKOFF_BASE", 0)
    # stops_escape_retries replaces the class in speculators' module: put it back afterwards.
    monkeypatch.setattr(shutdown, "TrainingInterruptedError", shutdown.TrainingInterruptedError)


def test_speculators_alone_takes_the_stop_for_a_failed_request_and_trains_on(
        tmp_path: Path, quick_retries: None) -> None:
    assert train_through_a_stop(tmp_path) == (2, [])


def test_the_stop_escapes_the_retries_and_the_trainer_saves(tmp_path: Path,
                                                              quick_retries: None) -> None:
    stops_escape_retries()
    assert train_through_a_stop(tmp_path) == (1, ["interrupted"])
