"""``speculators prepare-data --render-endpoint`` against the local server."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from datasets import load_from_disk
from transformers import AutoTokenizer


def test_prepare_data_builds_the_training_dataset(
    prepared_data: Path, demo_data: Path, demo_model: Path
) -> None:
    dataset = load_from_disk(str(prepared_data))
    assert {"input_ids", "loss_mask", "seq_len"} <= set(dataset.column_names)
    num_conversations = len(demo_data.read_text().splitlines())
    assert len(dataset) > 0.9 * num_conversations  # one row per assistant turn

    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for row in dataset.select(range(20)):
        ids, mask = row["input_ids"].tolist(), row["loss_mask"].tolist()
        assert len(ids) == len(mask) == int(row["seq_len"]) <= 512
        # Context is masked, then the whole assistant turn (with <|im_end|>) is supervised.
        boundary = mask.index(1)
        assert mask == [0] * boundary + [1] * (len(mask) - boundary)
        assert ids[boundary - len(header) : boundary] == header
        assert im_end in ids[boundary:]

    token_freq = torch.load(prepared_data / "token_freq.pt", weights_only=True)
    assert isinstance(token_freq, dict) and token_freq
    assert all(isinstance(k, int) and v > 0 for k, v in token_freq.items())
    supervised = sum(int(row["loss_mask"].sum()) for row in dataset)
    assert sum(token_freq.values()) == supervised

    info = json.loads((prepared_data / "dataset_info.json").read_text())
    assert "input_ids" in info["features"]
