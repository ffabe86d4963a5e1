"""A bake-off's candidates share one hidden-states server that extracts the union of their
layers; a candidate that learns from fewer reads its own through SpecDeck's hidden-states
backend, registered with hs-connectors' own plugin interface. Here: the real file backend's
samples, written as vLLM's connector writes them, and the trainer's configuration as speculators
resolves it from the flags the builder gives."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from app.runtimes import LAYER_SELECTION_BACKEND, SLOTS_FLAG, layer_slots
from tests.conftest import ROOT


def test_a_candidates_slots_are_its_layers_among_the_servers_and_the_last() -> None:
    assert layer_slots([2, 4, 5, 6, 8], [2, 5]) == [0, 2, 4]
    assert layer_slots([2, 4, 5, 8], [2, 4, 5]) == [0, 1, 2, 3]


def test_the_backend_hands_the_trainer_only_the_candidates_layers(tmp_path) -> None:
    from hs_connectors import HiddenStatesBackend

    import workers.runtimes.layer_selection  # noqa: F401 (registers the backend)

    backend = HiddenStatesBackend.registry[LAYER_SELECTION_BACKEND]
    # A sample as the server writes it: [tokens, layers, hidden], layers in ascending id order.
    states = torch.arange(5 * 4 * 3, dtype=torch.float32).reshape(5, 4, 3)
    cached = tmp_path / "hidden_states"
    cached.mkdir()
    save_file({"hidden_states": states, "token_ids": torch.arange(5)}, cached / "hs_0.safetensors")
    generated = tmp_path / "generated.safetensors"
    save_file({"hidden_states": states, "token_ids": torch.arange(5)}, generated)

    parser = argparse.ArgumentParser()
    backend.add_train_args(parser)
    args = parser.parse_args([SLOTS_FLAG, "0,2,3"])
    transfer = backend.from_train_args(args, str(tmp_path))
    transfer.setup()
    for sample in (transfer.get_cached(0),
                   transfer.get_generated({"hidden_states_path": str(generated)})):
        assert torch.equal(sample["hidden_states"], states[:, [0, 2, 3]])
        assert torch.equal(sample["token_ids"], torch.arange(5))
    assert transfer.get_cached(1) is None  # not extracted yet
    transfer.delete(str(generated))
    assert not generated.exists()
    with pytest.raises(ValueError, match=SLOTS_FLAG):
        backend.from_train_args(parser.parse_args([]), str(tmp_path))


def test_speculators_takes_the_backend_and_its_flag_from_the_trainers_command_line() -> None:
    """What the trainer wrapper runs, in a process of its own (speculators lists the backends
    once, when its configuration is first imported): the backend registered first, so its flag
    is among the trainer's own (speculators 0.9.0)."""
    code = ("import json, workers.runtimes.local.train\n"
            "from speculators.train.config import TrainConfig\n"
            "flat = TrainConfig.resolve(json.loads(input())).flatten()\n"
            "print(json.dumps([flat['hidden_states_backend'], flat['hidden_states_slots']]))")
    argv = ["--verifier-name-or-path", "v", "--speculator-type", "eagle3",
            "--hidden-states-backend", LAYER_SELECTION_BACKEND, SLOTS_FLAG, "0,2,3"]
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(argv), text=True,
                          capture_output=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [LAYER_SELECTION_BACKEND, "0,2,3"]
