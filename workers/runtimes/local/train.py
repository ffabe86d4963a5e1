"""Run the speculators trainer on a machine with no accelerator.

Usage (the arguments are exactly those of ``python -m speculators.train``)::

    python -m workers.runtimes.local.train --speculator-type dflash ...
    torchrun --standalone --nproc_per_node=2 -m workers.runtimes.local.train ...

This module does not re-implement any part of the trainer. When
``torch.accelerator.is_available()`` is False it patches the trainer's device choices
(speculators 0.9.0 assumes an accelerator) and then calls the trainer's own entry point,
``speculators.train.cli.main(TrainConfig.resolve(argv))``. With an accelerator it calls
the entry point unchanged.

The CPU patches:

1. ``Trainer`` moves the model and batches with ``.to(get_local_rank())``, and an int
   means an accelerator index: ``get_local_rank`` gives ``torch.device("cpu")`` in the
   trainer module.
2. ``Trainer.device_type`` (autocast) falls back to ``"cuda"`` without an accelerator
   (a CPU build) or is ``"cuda"`` on a CUDA build with no GPU: it is pinned to ``"cpu"``.
3. ``torch.accelerator.synchronize()`` (the step timer) raises without an accelerator:
   it becomes a no-op.
4. Under torchrun: ``torch.accelerator.set_device_index`` becomes a no-op, the
   process group is created with ``gloo`` and no ``device_id``, and the accelerator
   check in ``maybe_setup_distributed`` sees the CPU device.
5. Resuming loads checkpoints onto ``get_current_device()``, which answers ``"cuda:0"``
   without an accelerator: it answers ``"cpu"`` in the checkpointer module.

With or without an accelerator, a stop (SIGTERM) that arrives while the trainer waits on the
hidden-states server is not taken for a failed request (``stops_escape_retries``), and a warm
start (``--from-pretrained``) loads the checkpoint in
the dtype it was saved in (the trainer saves bfloat16), while this runtime feeds the draft
float32 hidden states (``--hidden-states-dtype float32``) and a fresh draft is float32: the
loaded draft is cast to the hidden states' dtype, as a fresh one would compute.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version
from typing import Any

import torch
import torch.distributed

# Before speculators' trainer configuration is imported: it lists the hidden-states backends
# once, when it is imported, and a bake-off's candidates read theirs through this one.
import workers.runtimes.layer_selection  # noqa: F401
from workers.runtimes.cpu_time import cpu_seconds_line

__all__ = ["TESTED_SPECULATORS_VERSION", "apply_cpu_patches", "cast_warm_start_to_hidden_states_dtype",
           "main", "needs_cpu_patches", "stops_escape_retries"]

TESTED_SPECULATORS_VERSION = "0.9.0"

logger = logging.getLogger("specdeck.local_train")

CPU = torch.device("cpu")


def needs_cpu_patches() -> bool:
    return not torch.accelerator.is_available()


def _require(module: Any, name: str) -> Any:
    if not hasattr(module, name):
        raise RuntimeError(
            f"{module.__name__}.{name} not found: the CPU patches were written for "
            f"speculators {TESTED_SPECULATORS_VERSION}, installed is "
            f"{version('speculators')}"
        )
    return getattr(module, name)


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def _cpu_reported_as_accelerator() -> Iterator[None]:
    """Make ``torch.accelerator.current_accelerator()`` answer the CPU device, briefly."""
    original = torch.accelerator.current_accelerator
    torch.accelerator.current_accelerator = lambda *_args, **_kwargs: CPU
    try:
        yield
    finally:
        torch.accelerator.current_accelerator = original


def _gloo_init_process_group(original: Callable[..., None]) -> Callable[..., None]:
    def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("device_id", None)
        if backend not in (None, "gloo"):
            logger.info("no accelerator: using the gloo backend instead of %s", backend)
        original("gloo", *args, **kwargs)

    return init_process_group


def apply_cpu_patches() -> None:
    """Patch the trainer's device choices for a machine without an accelerator."""
    import speculators.train.checkpointer as checkpointer_module  # noqa: PLC0415
    import speculators.train.cli as cli_module  # noqa: PLC0415
    import speculators.train.trainer as trainer_module  # noqa: PLC0415

    if version("speculators") != TESTED_SPECULATORS_VERSION:
        logger.warning(
            "CPU patches were written for speculators %s, installed is %s",
            TESTED_SPECULATORS_VERSION,
            version("speculators"),
        )

    # 1. Model and batches go to the CPU.
    _require(trainer_module, "get_local_rank")
    trainer_module.get_local_rank = lambda: CPU  # type: ignore[assignment,return-value]

    # 2. Autocast on the CPU. The trainer assigns device_type in __init__; the
    # property keeps "cpu" whatever it assigns.
    trainer_class = _require(trainer_module, "Trainer")
    trainer_class.device_type = property(lambda _self: "cpu", lambda _self, _value: None)

    # 3. The step timer's synchronize; 4. torchrun's device selection.
    torch.accelerator.synchronize = _noop
    torch.accelerator.set_device_index = _noop
    torch.distributed.init_process_group = _gloo_init_process_group(
        torch.distributed.init_process_group
    )
    setup_distributed = _require(cli_module, "maybe_setup_distributed")

    def maybe_setup_distributed(*args: Any, **kwargs: Any) -> None:
        with _cpu_reported_as_accelerator():
            setup_distributed(*args, **kwargs)

    cli_module.maybe_setup_distributed = maybe_setup_distributed

    # 5. Checkpoints are loaded onto the CPU when resuming.
    _require(checkpointer_module, "get_current_device")
    checkpointer_module.get_current_device = lambda: "cpu"


def cast_warm_start_to_hidden_states_dtype() -> None:
    """A draft loaded with ``--from-pretrained`` computes in the hidden states' dtype."""
    import speculators.train.cli as cli_module  # noqa: PLC0415

    build = _require(cli_module, "build_draft_model")

    def build_draft_model(args: Any, *rest: Any, **kwargs: Any) -> Any:
        model = build(args, *rest, **kwargs)
        if getattr(args, "from_pretrained", None):
            model = model.to(getattr(torch, args.hidden_states_dtype))
        return model

    cli_module.build_draft_model = build_draft_model


def stops_escape_retries() -> None:
    """A trainer stopped while it waits on the hidden-states server saves its checkpoint.

    speculators' signal handler (``graceful_shutdown``) raises ``TrainingInterruptedError``, an
    ``Exception``, in the main thread, and its hidden-states client's retry loop
    (``data_generation.vllm_client.with_retries``) catches every ``Exception``: it takes the stop
    for a failed request and retries. The trainer then trains on, deaf to further signals (the
    handler acts once), until the grace period ends in SIGKILL, and nothing is saved. Most of a
    step waits on that request on the CPU. As a ``BaseException``, as ``KeyboardInterrupt`` is,
    the stop passes every ``except Exception`` on its way up, and the trainer's own handler,
    which names the class in its module when it runs, catches it and saves as it would."""
    import speculators.train.graceful_shutdown as shutdown_module  # noqa: PLC0415

    original = _require(shutdown_module, "TrainingInterruptedError")

    class TrainingInterruptedError(BaseException):
        __doc__ = original.__doc__

    shutdown_module.TrainingInterruptedError = TrainingInterruptedError


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if needs_cpu_patches():
        apply_cpu_patches()
    cast_warm_start_to_hidden_states_dtype()
    stops_escape_retries()
    from speculators.train.cli import main as train_main  # noqa: PLC0415
    from speculators.train.config import TrainConfig  # noqa: PLC0415

    try:
        train_main(TrainConfig.resolve(args))
    finally:  # the training cost a bake-off ranks by (workers/runtimes/cpu_time.py)
        print(cpu_seconds_line(), flush=True)


if __name__ == "__main__":
    main()
