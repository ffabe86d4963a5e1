"""An untrained DFlash drafter for a verifier, made in seconds: speculators' own constructor
(``DFlashDraftModel.from_training_args``, what the trainer builds before its first step) with
one draft layer, saved as a speculators checkpoint. Served, it accepts almost nothing: AL ~ 1."""

from __future__ import annotations

from pathlib import Path


def write_untrained_drafter(verifier: Path, out: Path, *, block_size: int = 4, seed: int = 0) -> Path:
    import torch
    from speculators.models.dflash import DFlashDraftModel
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(verifier)
    layers = config.num_hidden_layers
    config.num_hidden_layers = 1  # the draft's layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:1]
    torch.manual_seed(seed)
    model = DFlashDraftModel.from_training_args(
        config, verifier_name_or_path=str(verifier), target_layer_ids=[2, layers // 2, layers - 3],
        draft_vocab_size=config.vocab_size, block_size=block_size,
        mask_token_id=config.vocab_size - 1, draft_attn_impl="sdpa")
    model.save_pretrained(out)
    return out
