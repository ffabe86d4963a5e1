"""A hidden-states backend for the trainer that reads only some of the layers the server wrote.

The candidates of a bake-off share one hidden-states server, which extracts the union of their
layer ids (and the verifier's last layer). speculators' trainer takes every layer of a sample
but the last as its draft's inputs, so a candidate that learns from fewer layers than the
server extracted reads the samples through this backend: the file backend's samples with only
the candidate's slots kept (and the last layer). It plugs in through hs_connectors' own plugin
interface (``HiddenStatesBackend.register``), which speculators' ``--hidden-states-backend``
lists; the slots are its ``--hidden-states-slots`` flag, comma-separated (speculators copies a
backend flag's type, not its ``nargs``). Importing this module registers it,
which must happen before speculators' trainer configuration is imported.
"""

from __future__ import annotations

import argparse
from typing import Any

from hs_connectors import FileBackend, HiddenStatesBackend, HiddenStatesTransfer

from app.runtimes import LAYER_SELECTION_BACKEND as NAME
from app.runtimes import SLOTS_FLAG


class SelectedLayers(HiddenStatesTransfer):
    """The samples of another transfer, each with only ``slots`` of its layers (in order)."""

    def __init__(self, inner: HiddenStatesTransfer, slots: list[int]) -> None:
        self.inner, self.slots = inner, list(slots)

    def setup(self) -> None:
        self.inner.setup()

    def get_cached(self, file_idx: int) -> Any:
        return self._select(self.inner.get_cached(file_idx))

    def get_generated(self, hs_transfer_params: dict[str, Any]) -> Any:
        return self._select(self.inner.get_generated(hs_transfer_params))

    def delete(self, handle: str) -> None:
        self.inner.delete(handle)

    def _select(self, sample: dict[str, Any] | None) -> dict[str, Any] | None:
        if sample is None:
            return None
        return {**sample, "hidden_states": sample["hidden_states"][:, self.slots].contiguous()}


if NAME not in HiddenStatesBackend.registry:
    @HiddenStatesBackend.register(NAME)
    class SelectedLayersBackend(HiddenStatesBackend):
        """The file backend, with only some layers of each sample."""

        @staticmethod
        def add_train_args(parser: argparse.ArgumentParser) -> None:
            FileBackend.add_train_args(parser)
            parser.add_argument(SLOTS_FLAG, dest="hidden_states_slots", type=str, default=None,
                                help="The layer slots of each sample to keep, comma-separated "
                                "(SpecDeck: a bake-off candidate's layers among the server's)")

        @staticmethod
        def add_launch_args(parser: argparse.ArgumentParser) -> None:
            FileBackend.add_launch_args(parser)

        @staticmethod
        def from_train_args(args: argparse.Namespace, data_path: str) -> HiddenStatesTransfer:
            inner = FileBackend.from_train_args(args, data_path)
            if not args.hidden_states_slots:
                raise ValueError(f"{NAME} needs {SLOTS_FLAG}")
            return SelectedLayers(inner, [int(s) for s in args.hidden_states_slots.split(",")])

        @staticmethod
        def build_kv_transfer_config(args: argparse.Namespace) -> dict[str, Any]:
            return FileBackend.build_kv_transfer_config(args)
