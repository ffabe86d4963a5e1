"""The demo verifier and its on-policy conversations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.local_runtime.conftest import NUM_LAYERS
from workers.runtimes.local.demo import (
    MARKER_FILE,
    _PLACE_SENTENCES,
    _TOPIC_PASSAGES,
    DEMO_NUM_LAYERS,
    create_demo_model,
    demo_prompts,
    write_demo_data,
)

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me about the quiet river."},
    {"role": "assistant", "content": "The river is quiet."},
]


def test_demo_model_is_deterministic_and_idempotent(tmp_path: Path) -> None:
    short = {"num_layers": 2, "train_steps": 3}  # the same code path as the demo's, shorter
    first = create_demo_model(tmp_path / "first", **short)
    again = create_demo_model(tmp_path / "copy", **short)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (first / name).read_bytes(), name

    mtime = (again / "model.safetensors").stat().st_mtime_ns
    assert create_demo_model(again, **short) == again
    assert (again / "model.safetensors").stat().st_mtime_ns == mtime
    # A demo model of other parameters (an older version, say) is ours: it is replaced.
    assert create_demo_model(again, num_layers=2, train_steps=4) == again
    assert json.loads((again / MARKER_FILE).read_text())["train_steps"] == 4
    assert not [p for p in again.parent.iterdir() if p.name.startswith(".copy")]

    untrained = create_demo_model(tmp_path / "untrained", num_layers=2, train_steps=0)
    other = create_demo_model(tmp_path / "other_seed", **short, seed=1)
    a = load_file(first / "model.safetensors")
    for different in (untrained, other):
        b = load_file(different / "model.safetensors")
        assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"],
                               b["model.layers.0.mlp.up_proj.weight"])


def test_demo_model_refuses_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileExistsError):
        create_demo_model(tmp_path)


def test_demo_model_loads_back(demo_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(demo_model)
    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    config = model.config
    assert config.model_type == "qwen3"
    assert config.num_hidden_layers == NUM_LAYERS == DEMO_NUM_LAYERS
    assert config.hidden_size == 128
    assert 1000 <= len(tokenizer) < config.vocab_size <= 2048  # spare rows for <|MASK|>
    assert config.tie_word_embeddings is False

    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.encode("hello world", add_special_tokens=True) == tokenizer.encode(
        "hello world", add_special_tokens=False
    )  # no BOS: rendered ids go to the server unchanged

    text = "Tell me about the quiet river near the old bridge."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text

    with torch.inference_mode():
        logits = model(torch.tensor([tokenizer.encode(text)])).logits
    assert logits.shape[-1] == config.vocab_size
    assert torch.isfinite(logits).all()


def test_chat_template_marks_assistant_boundaries(demo_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    full = tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    assert full == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nTell me about the quiet river.<|im_end|>\n"
        "<|im_start|>assistant\nThe river is quiet.<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(MESSAGES[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")

    # prepare-data derives the loss mask where the full render extends the prompt render.
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    full_ids = tokenizer.encode(full, add_special_tokens=False)
    assert full_ids[: len(prompt_ids)] == prompt_ids
    supervised = tokenizer.decode(full_ids[len(prompt_ids) :])
    assert supervised == "The river is quiet.<|im_end|>\n"

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    with_tools = tokenizer.apply_chat_template(MESSAGES[1:2], tools=tools, tokenize=False)
    assert '"name": "lookup"' in with_tools and with_tools.startswith("<|im_start|>system\n")


def test_demo_data_is_sharegpt_on_policy(demo_model: Path, demo_data: Path, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in demo_data.read_text().splitlines()]
    assert len(rows) >= 100
    for row in rows:
        turns = row["conversations"]
        assert [t["from"] for t in turns][-2:] == ["human", "gpt"]
        assert turns[0]["from"] in ("system", "human")
    replies = [row["conversations"][-1]["value"] for row in rows]
    assert sum(bool(r.strip()) for r in replies) > 0.9 * len(replies)

    # Deterministic, and the replies are the verifier's own greedy continuations.
    small = write_demo_data(demo_model, tmp_path / "small.jsonl", num_conversations=4)
    again = write_demo_data(demo_model, tmp_path / "again.jsonl", num_conversations=4)
    assert small.read_bytes() == again.read_bytes()
    first = json.loads(small.read_text().splitlines()[0])["conversations"]
    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    model = AutoModelForCausalLM.from_pretrained(demo_model)
    messages = [
        {"role": {"human": "user", "system": "system"}[t["from"]], "content": t["value"]}
        for t in first[:-1]
    ]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    expected_start = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert first[-1]["value"].startswith(expected_start)


def greedy(model, tokenizer, messages: list[dict[str, str]], max_new_tokens: int) -> list[int]:
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_the_demo_verifier_answers_held_out_questions_in_structure(demo_model: Path) -> None:
    """Trained, it answers with the topic's passage and the place's sentence, in prompts that
    are not in the demo dataset; its text does not loop (so prompt lookup gains little)."""
    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    model = AutoModelForCausalLM.from_pretrained(demo_model).eval()
    prompts = demo_prompts(12)
    structured = 0
    for messages in prompts:
        question = messages[-1]["content"]
        words = question.rstrip("?.").split()
        [topic] = [t for t in _TOPIC_PASSAGES if t in words]
        [place] = [p for p in _PLACE_SENTENCES if p in question]
        ids = greedy(model, tokenizer, messages, 64)
        assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")  # it ends its turn
        answer = tokenizer.decode(ids, skip_special_tokens=True)
        structured += answer.startswith(_TOPIC_PASSAGES[topic]) and _PLACE_SENTENCES[place] in answer
        repeats = sum(a == b for a, b in zip(ids, ids[1:]))
        assert len(set(ids)) > 0.6 * len(ids) and repeats <= 1, answer
    assert structured >= 10, structured


def test_demo_prompts_are_held_out_from_the_demo_data(demo_data: Path) -> None:
    rows = [json.loads(line)["conversations"] for line in demo_data.read_text().splitlines()]
    in_data = {tuple(t["value"] for t in turns[:-1]) for turns in rows}
    held_out = {tuple(m["content"] for m in messages) for messages in demo_prompts(16)}
    assert len(held_out) == 16 and not held_out & in_data


def test_demo_data_replies_are_the_verifiers_exact_ids(demo_model: Path, demo_data: Path) -> None:
    """Re-rendering a reply through the chat template gives exactly the ids the verifier
    generated: prepare-data supervises the verifier's own tokens."""
    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    model = AutoModelForCausalLM.from_pretrained(demo_model).eval()
    rows = [json.loads(line)["conversations"] for line in demo_data.read_text().splitlines()]
    assert len(rows) >= 0.95 * 240  # replies that would not re-tokenize exactly are dropped
    roles = {"human": "user", "system": "system", "gpt": "assistant"}
    for turns in rows[:6]:
        messages = [{"role": roles[t["from"]], "content": t["value"]} for t in turns]
        prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False,
                                               add_generation_prompt=True)
        full = tokenizer.apply_chat_template(messages, tokenize=False)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        full_ids = tokenizer.encode(full, add_special_tokens=False)
        supervised = full_ids[len(prompt_ids):-1]  # the reply and <|im_end|>, without the "\n"
        assert greedy(model, tokenizer, messages[:-1], 64)[: len(supervised)] == supervised
