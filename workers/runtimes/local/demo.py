"""A tiny local verifier and on-policy demo conversations, built with no downloads.

The local runtime needs a real verifier to exercise the whole pipeline (hidden-states
server, ``speculators prepare-data``, the trainer, serving) on a CPU. This module
creates one from scratch: a random-weight Qwen3 model with a byte-level BPE tokenizer
trained on a built-in corpus and a Qwen-style chat template, and a ShareGPT-style JSONL
whose assistant turns are the verifier's own greedy continuations.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

__all__ = [
    "CHAT_TEMPLATE",
    "MARKER_FILE",
    "create_demo_model",
    "demo_model_is_valid",
    "write_demo_data",
]

MARKER_FILE = "specdeck_demo.json"
MARKER_VERSION = 1

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]

# Tokenizer vocabulary the BPE trainer aims at, and the model's embedding rows.
# The embedding is larger than the tokenizer (as in Qwen3), so the trainer can add
# a <|MASK|> token in an unused slot instead of falling back to pad/eos.
TOKENIZER_VOCAB_SIZE = 1400
MODEL_VOCAB_SIZE = 1536

# Qwen-style ChatML template: system, user, assistant, tool turns, optional tools
# and generation prompt. An assistant turn renders as
# "<|im_start|>assistant\n{content}<|im_end|>\n", so the generation prompt
# "<|im_start|>assistant\n" is a prefix of the closed turn: prepare-data derives the
# loss mask from exactly that boundary (render with add_generation_prompt=True vs the
# full render).
CHAT_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is none -%}"
    "{%- elif content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set has_system = messages and messages[0].role == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if has_system -%}{{- render_content(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools><|im_end|>\\n' -}}"
    "{%- elif has_system -%}"
    "{{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + render_content(message.content)"
    " + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) -}}"
    "{%- if message.tool_calls -%}{%- for call in message.tool_calls -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{- '\\n<tool_call>\\n' -}}"
    "{{- {'name': fn.name, 'arguments': fn.arguments} | tojson -}}"
    "{{- '\\n</tool_call>' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Word lists for the built-in corpus and the demo prompts.
_ADJECTIVES = (
    "small large quiet bright dark warm cold old new quick slow happy calm busy "
    "green blue red golden silver wooden simple strange gentle brave clever early "
    "late heavy light narrow wide deep shallow fresh ancient modern"
).split()
_NOUNS = (
    "river mountain city garden forest engine library market bridge window ocean "
    "teacher doctor farmer painter robot planet village station kitchen museum "
    "island desert castle harbor train letter story song recipe machine computer "
    "network model server question answer problem idea lesson"
).split()
_VERBS = (
    "builds finds explains describes visits watches writes reads carries opens "
    "paints repairs studies measures follows teaches answers plans cooks sings"
).split()
_PLACES = (
    "the north",
    "the south",
    "a small town",
    "the capital",
    "the coast",
    "the valley",
    "the old quarter",
    "the harbor district",
    "the hills",
    "a busy street",
    "the market square",
)
_TOPICS = (
    "weather history music science cooking travel gardening astronomy sports "
    "mathematics poetry chemistry economics geography painting programming"
).split()
_QUESTION_TEMPLATES = (
    "Tell me about the {adj} {noun} in {place}.",
    "Why does the {noun} look so {adj} today?",
    "Write a short story about a {adj} {noun} that {verb} a {noun2}.",
    "Explain {topic} to a {adj} {noun}.",
    "What is the best way to learn {topic}?",
    "Describe a {adj} {noun} near the {noun2}.",
    "How would a {noun} explain {topic} in {place}?",
    "Give me three facts about {topic} and the {noun}.",
    "Can you compare the {adj} {noun} with the {adj2} {noun2}?",
    "Summarize what the {noun} {verb} every morning.",
)
_SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant that answers in plain words.",
    "You are a friendly guide who likes {topic}.",
)


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        adj=rng.choice(_ADJECTIVES),
        adj2=rng.choice(_ADJECTIVES),
        noun=rng.choice(_NOUNS),
        noun2=rng.choice(_NOUNS),
        verb=rng.choice(_VERBS),
        place=rng.choice(_PLACES),
        topic=rng.choice(_TOPICS),
    )


def _corpus(seed: int, num_lines: int = 4000) -> Iterator[str]:
    """Deterministic English-like lines plus chat-formatted samples."""
    rng = random.Random(seed)
    for i in range(num_lines):
        sentence = (
            f"The {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} {rng.choice(_VERBS)} "
            f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} in {rng.choice(_PLACES)}."
        )
        question = _fill(rng.choice(_QUESTION_TEMPLATES), rng)
        if i % 4 == 0:
            yield (
                f"{IM_START}system\n{_fill(rng.choice(_SYSTEM_PROMPTS), rng)}{IM_END}\n"
                f"{IM_START}user\n{question}{IM_END}\n"
                f"{IM_START}assistant\n{sentence}{IM_END}\n"
            )
        else:
            yield f"{question} {sentence} It is {i} steps away, about {i * 7 % 1000} meters."


def _train_tokenizer(seed: int) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        extra_special_tokens=[IM_START, IM_END],
        model_max_length=2048,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _marker(num_layers: int, hidden_size: int, seed: int) -> dict[str, int]:
    return {
        "version": MARKER_VERSION,
        "num_layers": num_layers,
        "hidden_size": hidden_size,
        "seed": seed,
    }


def demo_model_is_valid(
    path: str | os.PathLike[str], *, num_layers: int, hidden_size: int, seed: int
) -> bool:
    """Whether ``path`` holds a complete demo model built with these parameters."""
    path = Path(path)
    required = ("config.json", "model.safetensors", "tokenizer.json", MARKER_FILE)
    if not all((path / name).is_file() for name in required):
        return False
    recorded = json.loads((path / MARKER_FILE).read_text())
    return recorded == _marker(num_layers, hidden_size, seed)


def create_demo_model(
    path: str | os.PathLike[str],
    *,
    num_layers: int = 8,
    hidden_size: int = 128,
    seed: int = 0,
) -> Path:
    """Create a tiny random-weight Qwen3 verifier at ``path`` and return the path.

    Deterministic for a seed. Idempotent: an existing valid model built with the same
    parameters is returned as is; a directory holding anything else is refused. The
    model is built in a temporary sibling directory and renamed into place, so a
    crash never leaves a half-written model at ``path``.
    """
    path = Path(path).absolute()
    if demo_model_is_valid(path, num_layers=num_layers, hidden_size=hidden_size, seed=seed):
        return path
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(
            f"{path} exists and does not hold a demo model with num_layers={num_layers}, "
            f"hidden_size={hidden_size}, seed={seed}"
        )
    if hidden_size % 32 != 0:
        raise ValueError(f"hidden_size must be a multiple of 32, got {hidden_size}")

    tokenizer = _train_tokenizer(seed)
    if len(tokenizer) >= MODEL_VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, more than the model's vocab")
    im_end_id = tokenizer.get_vocab()[IM_END]
    eot_id = tokenizer.get_vocab()[END_OF_TEXT]

    head_dim = 32
    num_heads = hidden_size // head_dim
    config = Qwen3Config(
        vocab_size=MODEL_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 3,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        head_dim=head_dim,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=im_end_id,
        pad_token_id=eot_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end_id, eot_id],
        pad_token_id=eot_id,
        do_sample=False,
    )

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    staging.chmod(0o755)
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / MARKER_FILE).write_text(
            json.dumps(_marker(num_layers, hidden_size, seed), indent=2) + "\n"
        )
        if path.exists():
            path.rmdir()  # empty, checked above
        try:
            staging.rename(path)
        except OSError:
            # Another process finished first: keep its copy if it is the same model.
            if not demo_model_is_valid(
                path, num_layers=num_layers, hidden_size=hidden_size, seed=seed
            ):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return path


def _demo_conversation_prompts(num_conversations: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed + 1)
    conversations = []
    for _ in range(num_conversations):
        messages = []
        if rng.random() < 0.25:
            messages.append({"role": "system", "content": _fill(rng.choice(_SYSTEM_PROMPTS), rng)})
        messages.append({"role": "user", "content": _fill(rng.choice(_QUESTION_TEMPLATES), rng)})
        conversations.append(messages)
    return conversations


_SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt"}


@torch.inference_mode()
def write_demo_data(
    model_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    num_conversations: int = 240,
    max_new_tokens: int = 64,
    seed: int = 0,
    batch_size: int = 48,
) -> Path:
    """Write a ShareGPT-style JSONL of on-policy conversations and return its path.

    Each line is ``{"conversations": [{"from": "human", "value": ...},
    {"from": "gpt", "value": ...}]}`` (a quarter also open with a ``system`` turn),
    the format ``speculators prepare-data`` reads from a local ``.jsonl``. The
    assistant turns are the verifier's greedy continuations, generated in left-padded
    batches. The file is written to a temporary name and renamed.
    """
    model_path = Path(model_path)
    out_path = Path(out_path).absolute()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()

    prompts = _demo_conversation_prompts(num_conversations, seed)
    lines: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        texts = [
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            for messages in batch
        ]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        output = model.generate(
            **encoded,
            max_new_tokens=max_new_tokens,
            min_new_tokens=1,
            do_sample=False,
        )
        new_tokens = output[:, encoded["input_ids"].shape[1] :]
        replies = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        for messages, reply in zip(batch, replies, strict=True):
            turns = [{"from": _SHAREGPT_ROLES[m["role"]], "value": m["content"]} for m in messages]
            turns.append({"from": "gpt", "value": reply})
            lines.append(json.dumps({"conversations": turns}, ensure_ascii=False))

    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out_path.name}.", dir=out_path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp_name, out_path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return out_path
