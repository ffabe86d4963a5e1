"""The held-out prompts a drafter is served on: prompts the trainer never trained on.

The trainer validates on the last 10% of the prepared rows (speculators' ``train_data_ratio``),
so the prompts are the first user turns of conversations whose first reply lies in that split
(found by decoding the rows' prompt tokens); for regenerated data, the validation rows' own
prompt ids. When none can be found, the last conversations of the dataset are used instead, and
the evaluation says so.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.runtimes import JobPaths, training_data
from app.schemas.job_spec import JobSpec
from workers.runner import StageFailed

log = logging.getLogger(__name__)

TRAIN_DATA_RATIO = 0.9  # speculators 0.9.0's default: the rest of the prepared rows validate
CANDIDATES_PER_PROMPT = 8  # validation rows decoded per prompt wanted (later turns don't count)
VALIDATION_SPLIT = "validation split"
LAST_CONVERSATIONS = "last conversations of the dataset"
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "tool": "tool"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict)
                        and p.get("type") == "text" and isinstance(p.get("text"), str))
    return ""


def _normalized(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class FirstTurn:
    messages: list[dict[str, Any]]  # the turns before the first user turn (system) and it
    reply: str  # the first assistant reply's text ("" when there is none)


def first_turn(record: dict[str, Any]) -> FirstTurn | None:
    """The chat messages up to and including a conversation's first user turn, in OpenAI
    form, and the reply that followed; None when it has no user turn with text. Reads OpenAI
    ``messages`` and ShareGPT ``conversations`` ({from, value} or {role, content})."""
    turns = record.get("messages") or record.get("conversations") or []
    messages: list[dict[str, Any]] = []
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return None
        if "from" in turn:
            role, content = SHAREGPT_ROLES.get(turn["from"]), turn.get("value")
        else:
            role, content = SHAREGPT_ROLES.get(turn.get("role", "")), turn.get("content")
        if role == "system":
            messages.append({"role": "system", "content": content})
        elif role == "user":
            if not _text(content).strip():
                return None
            messages.append({"role": "user", "content": content})
            reply = next((t for t in turns[index + 1:] if isinstance(t, dict)), {})
            reply_text = _text(reply.get("value", reply.get("content")))
            return FirstTurn(messages, reply_text)
        else:
            return None  # the conversation opens with an assistant or tool turn
    return None


def conversations(path: Path) -> Iterator[FirstTurn]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                turn = first_turn(json.loads(line))
                if turn is not None:
                    yield turn


def last_conversations(path: Path, n: int) -> list[list[dict[str, Any]]]:
    return [turn.messages for turn in deque(conversations(path), maxlen=n)]


def match_prompts(prompt_texts: list[str], turns: Iterator[FirstTurn]) -> list[list[dict[str, Any]]]:
    """For each decoded validation prompt, the conversation whose first turn it is: every
    message's text appears in it and the first reply does not (that would be a later turn's
    row). The most specific (longest) match wins. Whitespace is normalized on both sides."""
    texts = [_normalized(t) for t in prompt_texts]
    best: dict[int, tuple[int, list[dict[str, Any]]]] = {}
    for turn in turns:
        parts = [_normalized(_text(m["content"])) for m in turn.messages]
        reply = _normalized(turn.reply)
        score = sum(len(p) for p in parts)
        for k, text in enumerate(texts):
            if (all(p in text for p in parts) and not (reply and reply in text)
                    and score > best.get(k, (0, []))[0]):
                best[k] = (score, turn.messages)
    return [best[k][1] for k in sorted(best)]


def validation_prompt_texts(spec: JobSpec, data_dir: Path, n: int) -> list[str]:
    """Decode the prompt part (the tokens before the supervised reply) of the last validation
    rows of the prepared dataset."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    data = load_from_disk(str(data_dir)).with_format(None)
    start = int(len(data) * TRAIN_DATA_RATIO)
    if start >= len(data):
        return []
    rows = data.select(range(max(start, len(data) - CANDIDATES_PER_PROMPT * n), len(data)))
    tokenizer = AutoTokenizer.from_pretrained(spec.verifier_info.reference)
    texts = []
    for ids, mask in zip(rows["input_ids"], rows["loss_mask"], strict=True):
        first = next((i for i, m in enumerate(mask) if m), 0)
        if first:
            texts.append(tokenizer.decode(ids[:first]))
    return texts


def validation_token_prompts(data_dir: Path, n: int) -> list[list[int]]:
    """The prompt ids (every token before the first supervised one) of the last ``n``
    validation rows of the prepared dataset: for regenerated data, the exact ids the verifier
    was prompted with, and the training never saw these rows."""
    from datasets import load_from_disk

    data = load_from_disk(str(data_dir)).with_format(None)
    start = int(len(data) * TRAIN_DATA_RATIO)
    prompts = []
    for index in range(len(data) - 1, start - 1, -1):
        row = data[index]
        first = next((i for i, m in enumerate(row["loss_mask"]) if m), 0)
        if first:
            prompts.append(list(row["input_ids"][:first]))
        if len(prompts) == n:
            break
    return prompts[::-1]


Prompt = list[dict[str, Any]] | list[int]  # chat messages, or the ids of a rendered prompt


def held_out_prompts(spec: JobSpec, paths: JobPaths,
                     n: int) -> tuple[list[Prompt], str, str | None]:
    """Up to ``n`` prompts, where they come from, and why the validation split could not be
    used (None when it was). Regenerated data gives the validation rows' own prompt ids."""
    why: str | None = None
    if spec.data.regenerate:
        try:
            prompts: list[Prompt] = list(validation_token_prompts(paths.data, n))
        except Exception as exc:
            raise StageFailed(f"the validation split could not be read: {exc}",
                              code="data_error") from exc
        return prompts, VALIDATION_SPLIT, None
    source = Path(training_data(spec, paths))
    try:
        texts = validation_prompt_texts(spec, paths.data, n)
        prompts = list(match_prompts(texts, conversations(source))[-n:])
        if prompts:
            return prompts, VALIDATION_SPLIT, None
        why = "no validation row could be traced back to a conversation's first turn"
    except Exception as exc:  # a best effort: the fallback below still measures the drafter
        log.warning("validation prompts unavailable: %s", exc, exc_info=True)
        why = f"the validation split could not be read: {type(exc).__name__}: {exc}"
    return list(last_conversations(source, n)), LAST_CONVERSATIONS, why
