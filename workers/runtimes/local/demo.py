"""A tiny local verifier and on-policy demo conversations, built with no downloads.

The local runtime needs a real verifier to exercise the whole pipeline (hidden-states
server, ``speculators prepare-data``, the trainer, serving) on a CPU. This module
creates one from scratch: a random-weight Qwen3 model with a byte-level BPE tokenizer
trained on a built-in corpus and a Qwen-style chat template, and a ShareGPT-style JSONL
whose assistant turns are the verifier's own greedy continuations.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
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
    "demo_prompts",
    "demo_model_is_valid",
    "write_demo_data",
]

MARKER_FILE = "specdeck_demo.json"
MARKER_VERSION = 2

# The demo verifier: deep and narrow, trained for about a minute on 2 cores; its dataset size.
DEMO_NUM_LAYERS = 12
DEMO_HIDDEN_SIZE = 128
DEMO_TRAIN_STEPS = 150
DEMO_CONVERSATIONS = 240

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

# The demo verifier's world: questions name a topic and a place (with some filler words), and
# its answer is the topic's passage, a sentence about the place and the question's closing.
# Deterministic and compositional, so its greedy text is structured (a drafter can learn it)
# but differs between questions and does not loop (prompt lookup gains little).
_ADJECTIVES = (
    "small large quiet bright dark warm cold old new quick slow happy calm busy "
    "green blue red golden silver wooden simple strange gentle brave clever early "
    "late heavy light narrow wide deep shallow fresh ancient modern"
).split()
_NOUNS = (
    "teacher doctor farmer painter robot student sailor baker pilot driver "
    "gardener writer singer builder traveler child"
).split()
# Topic passages: what the demo verifier learns to say about each topic.
_TOPIC_PASSAGES = {
    "weather": "Weather is the state of the air around us. Warm air rises, cool air sinks, and the moving air carries clouds, rain and snow across the land.",
    "history": "History is the study of what people did long ago. Old letters, coins and ruins help us tell how kings, farmers and traders lived.",
    "music": "Music is sound arranged in time. A melody is a line of notes, rhythm is the pattern of beats, and harmony is notes played together.",
    "science": "Science is a careful way of asking questions. We make a guess, test it with an experiment, and change our mind when the results disagree.",
    "cooking": "Cooking turns raw food into meals with heat. Boiling, baking and frying change the taste, and salt, herbs and spices add flavor.",
    "travel": "Travel means going from one place to another. A good trip needs a map, a plan for the road, and some time to rest between the stops.",
    "gardening": "Gardening is the work of growing plants. Seeds need good soil, water and sunlight, and weeds must be pulled before they take over.",
    "astronomy": "Astronomy is the study of stars, planets and galaxies. Telescopes gather faint light, and the light tells us how far away a star is.",
    "sports": "Sports are games of skill and effort. Players train their bodies, follow the rules, and learn to win and lose as a team.",
    "mathematics": "Mathematics is the language of numbers and shapes. We add, subtract, multiply and divide, and a proof shows why a rule is always true.",
    "poetry": "Poetry is writing that uses rhythm and sound. A poem can rhyme or not, and each line is chosen to paint a picture or a feeling.",
    "chemistry": "Chemistry is the study of matter and how it changes. Atoms join into molecules, and a reaction breaks bonds and forms new ones.",
    "economics": "Economics is the study of how people use scarce things. Prices rise when many buyers want few goods, and fall when goods are plenty.",
    "geography": "Geography is the study of the earth and its places. Rivers carve valleys, mountains block the wind, and cities grow near water.",
    "painting": "Painting is the art of putting color on a surface. Artists mix pigments, choose brushes, and use light and shadow to show depth.",
    "programming": "Programming is writing instructions for a computer. A program reads input, follows steps in order, and repeats a loop until it is done.",
}
# What the verifier adds about the place named in the question.
_PLACE_SENTENCES = {
    "the north": "In the north, long winters make people plan ahead.",
    "the south": "In the south, warm days invite people outside.",
    "a small town": "In a small town, neighbors share what they know.",
    "the capital": "In the capital, libraries and museums keep records.",
    "the coast": "On the coast, sailors watch the tides and the sky.",
    "the valley": "In the valley, farms follow the seasons closely.",
    "the old quarter": "In the old quarter, narrow streets hide small shops.",
    "the harbor district": "In the harbor district, ships bring news from afar.",
    "the hills": "In the hills, quiet paths lead to wide views.",
    "a busy street": "On a busy street, everyone is in a hurry.",
    "the market square": "In the market square, people trade and talk.",
}
# Question templates, each with the closing the verifier ends its answer with.
_QUESTION_TEMPLATES = (
    ("Tell me about {topic} in {place}.", "I hope this helps."),
    ("What is the best way to learn {topic} in {place}?", "Start small and practice every day."),
    ("Explain {topic} to a {adj} {noun} from {place}.", "That is the simple version."),
    ("Give me three facts about {topic} and {place}.", "Those are the key facts."),
    ("How would a {noun} describe {topic} in {place}?", "Every {noun} would agree."),
    ("Write a short note on {topic} for a {adj} {noun} in {place}.", "Thank you for asking."),
    ("Why should a {noun} in {place} care about {topic}?", "It matters more than it seems."),
    ("Can you summarize {topic} for someone in {place}?", "That is the summary."),
)
_TOPICS = tuple(_TOPIC_PASSAGES)
_PLACES = tuple(_PLACE_SENTENCES)
_SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant that answers in plain words.",
    "You are a friendly guide who likes {topic}.",
)


@dataclass(frozen=True)
class DemoChat:
    """One question of the demo world and the answer the verifier is trained to give."""

    messages: list[dict[str, str]]  # an optional system turn, then the user's question
    answer: str


def _chat(rng: random.Random) -> DemoChat:
    template, closing = rng.choice(_QUESTION_TEMPLATES)
    slots = {"topic": rng.choice(_TOPICS), "place": rng.choice(_PLACES),
             "adj": rng.choice(_ADJECTIVES), "noun": rng.choice(_NOUNS)}
    messages = []
    if rng.random() < 0.25:
        system = rng.choice(_SYSTEM_PROMPTS).format(topic=rng.choice(_TOPICS))
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": template.format(**slots)})
    answer = " ".join([_TOPIC_PASSAGES[slots["topic"]], _PLACE_SENTENCES[slots["place"]],
                       closing.format(**slots)])
    return DemoChat(messages, answer)


def _chats(seed: int, count: int) -> list[DemoChat]:
    rng = random.Random(seed)
    return [_chat(rng) for _ in range(count)]


def _render(messages: list[dict[str, str]]) -> str:
    """The chat template, rendered in Python (the tokenizer's template renders the same)."""
    return "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)


def _corpus(seed: int) -> Iterator[str]:
    """The tokenizer's training text: every passage, sentence and template, and chats."""
    yield from _TOPIC_PASSAGES.values()
    yield from _PLACE_SENTENCES.values()
    yield from (" ".join(pair) for pair in _QUESTION_TEMPLATES)
    yield " ".join(_ADJECTIVES + _NOUNS)
    for chat in _chats(seed, 2000):
        yield _render([*chat.messages, {"role": "assistant", "content": chat.answer}])


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


def _marker(num_layers: int, hidden_size: int, seed: int, train_steps: int) -> dict[str, int]:
    return {
        "version": MARKER_VERSION,
        "num_layers": num_layers,
        "hidden_size": hidden_size,
        "seed": seed,
        "train_steps": train_steps,
    }


def demo_model_is_valid(
    path: str | os.PathLike[str], *, num_layers: int = DEMO_NUM_LAYERS,
    hidden_size: int = DEMO_HIDDEN_SIZE, seed: int = 0, train_steps: int = DEMO_TRAIN_STEPS,
) -> bool:
    """Whether ``path`` holds a complete demo model built with these parameters."""
    path = Path(path)
    required = ("config.json", "model.safetensors", "tokenizer.json", MARKER_FILE)
    if not all((path / name).is_file() for name in required):
        return False
    recorded = json.loads((path / MARKER_FILE).read_text())
    return recorded == _marker(num_layers, hidden_size, seed, train_steps)


def _training_batches(tokenizer: PreTrainedTokenizerFast, seed: int, steps: int,
                      batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Batches of chats, right-padded: input ids, attention mask, and labels on the answer and
    its end-of-turn token only (what the verifier is asked to say)."""
    pad = tokenizer.pad_token_id
    chats = _chats(seed + 7, steps * batch_size)
    for start in range(0, len(chats), batch_size):
        rows = []
        for chat in chats[start:start + batch_size]:
            prompt = tokenizer.encode(_render(chat.messages) + f"{IM_START}assistant\n")
            answer = tokenizer.encode(f"{chat.answer}{IM_END}")
            rows.append((prompt + answer, [-100] * len(prompt) + answer))
        width = max(len(ids) for ids, _ in rows)
        ids = torch.full((len(rows), width), pad)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (row_ids, row_labels) in enumerate(rows):
            ids[i, :len(row_ids)] = torch.tensor(row_ids)
            labels[i, :len(row_labels)] = torch.tensor(row_labels)
            mask[i, :len(row_ids)] = 1
        yield ids, mask, labels


def _train(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, *, seed: int,
           steps: int, batch_size: int = 32, lr: float = 3e-3) -> None:
    """Teach the random-weight model the demo world: AdamW, linear warm-up, cosine decay."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(
        (s + 1) / warmup, 0.1 + 0.45 * (1 + math.cos(math.pi * s / steps))))
    model.train()
    for ids, mask, labels in _training_batches(tokenizer, seed, steps, batch_size):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()


def create_demo_model(
    path: str | os.PathLike[str],
    *,
    num_layers: int = DEMO_NUM_LAYERS,
    hidden_size: int = DEMO_HIDDEN_SIZE,
    seed: int = 0,
    train_steps: int = DEMO_TRAIN_STEPS,
) -> Path:
    """Create the tiny demo verifier at ``path`` and return the path.

    A deep, narrow Qwen3 (as real verifiers are next to their drafters) trained for
    ``train_steps`` steps on the demo world's chats (about a minute on 2 cores); 0 leaves
    random weights. Deterministic for its parameters. Idempotent: an existing valid model built
    with the same parameters is returned as is, another demo model (an older version, other
    parameters) is replaced, and a directory holding anything else is refused. The model is
    built in a temporary sibling directory and renamed into place, so a crash never leaves a
    half-written model at ``path``.
    """
    path = Path(path).absolute()
    params = {"num_layers": num_layers, "hidden_size": hidden_size, "seed": seed,
              "train_steps": train_steps}
    if demo_model_is_valid(path, **params):
        return path
    replacing = (path / MARKER_FILE).is_file()  # a demo model of another version: ours to redo
    if path.exists() and any(path.iterdir()) and not replacing:
        raise FileExistsError(
            f"{path} exists and does not hold a demo model with "
            + ", ".join(f"{k}={v}" for k, v in params.items())
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
    if train_steps:
        _train(model, tokenizer, seed=seed, steps=train_steps)
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
        (staging / MARKER_FILE).write_text(json.dumps(_marker(**params), indent=2) + "\n")
        if replacing:
            old = path.rename(path.with_name(f".{path.name}.old-{os.getpid()}"))
            shutil.rmtree(old)
        elif path.exists():
            path.rmdir()  # empty, checked above
        try:
            staging.rename(path)
        except OSError:
            # Another process finished first: keep its copy if it is the same model.
            if not demo_model_is_valid(path, **params):
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return path


def _demo_conversation_prompts(num_conversations: int, seed: int) -> list[list[dict[str, str]]]:
    return [chat.messages for chat in _chats(seed + 1, num_conversations)]


def demo_prompts(count: int, *, seed: int = 0,
                 num_conversations: int = DEMO_CONVERSATIONS) -> list[list[dict[str, str]]]:
    """``count`` demo questions that are not in the demo dataset (``write_demo_data`` with the
    same seed and size): held-out prompts to measure a drafter trained on it."""
    seen = {json.dumps(m) for m in _demo_conversation_prompts(num_conversations, seed)}
    rng = random.Random(seed + 1_000_003)
    prompts: list[list[dict[str, str]]] = []
    while len(prompts) < count:
        messages = _chat(rng).messages
        key = json.dumps(messages)
        if key not in seen:
            seen.add(key)
            prompts.append(messages)
    return prompts


_SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt"}


@torch.inference_mode()
def write_demo_data(
    model_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    num_conversations: int = DEMO_CONVERSATIONS,
    max_new_tokens: int = 64,
    seed: int = 0,
    batch_size: int = 48,
) -> Path:
    """Write a ShareGPT-style JSONL of on-policy conversations and return its path.

    Each line is ``{"conversations": [{"from": "human", "value": ...},
    {"from": "gpt", "value": ...}]}`` (a quarter also open with a ``system`` turn),
    the format ``speculators prepare-data`` reads from a local ``.jsonl``. The
    assistant turns are the verifier's greedy continuations, generated in left-padded
    batches, and token-exact: a reply is kept only when rendering the conversation through the
    chat template and tokenizing it again gives exactly the ids the verifier generated (ended
    by its end-of-turn token), so prepare-data supervises the verifier's own ids. The file is
    written to a temporary name and renamed.
    """
    model_path = Path(model_path)
    out_path = Path(out_path).absolute()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.eval()
    im_end = tokenizer.convert_tokens_to_ids(IM_END)

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
        for messages, text, row in zip(batch, texts, output[:, encoded["input_ids"].shape[1]:],
                                       strict=True):
            generated = row.tolist()
            ended = im_end in generated
            if ended:  # a whole reply: its ids up to and with the end of turn
                generated = generated[: generated.index(im_end) + 1]
            reply = tokenizer.decode(generated, skip_special_tokens=True)
            rendered = tokenizer.encode(text + reply + (IM_END if ended else ""),
                                        add_special_tokens=False)
            prompt_len = len(tokenizer.encode(text, add_special_tokens=False))
            if rendered[prompt_len:] != generated or not reply:
                continue  # re-tokenizing the text would not give the verifier's own ids
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
