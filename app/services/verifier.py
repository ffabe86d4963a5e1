"""Resolve a verifier reference (Hub id or a path under the models root) and its layer ids."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import APIError, echo
from app.schemas.verifiers import VerifierOut
from app.services.hub import is_hub_reference
from app.services.paths import exists, looks_like_path, resolve_under
from app.settings import Settings


@dataclass(frozen=True)
class VerifierInfo:
    reference: str  # what the trainer and server are given: an absolute path or a Hub id
    source: str  # "local" or "hub"
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    dtype: str | None


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    # Multimodal checkpoints keep the language model's numbers under text_config.
    return config.get("text_config") or config


def parse_config(raw: bytes, reference: str, *, param: str) -> dict[str, Any]:
    """A config.json as a JSON object; anything else is the caller's error (422), not ours."""
    try:
        config = json.loads(raw)
    except ValueError as exc:  # not JSON, not UTF-8
        raise APIError(422, f"config.json of {param} '{reference}' is not valid JSON",
                       code=f"invalid_{param}_config", param=param) from exc
    if not isinstance(config, dict):
        raise APIError(422, f"config.json of {param} '{reference}' is not a JSON object",
                       code=f"invalid_{param}_config", param=param)
    return config


def load_config(path: Path, reference: str, *, param: str) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise APIError(422, f"config.json of {param} '{reference}' cannot be read",
                       code=f"invalid_{param}_config", param=param) from exc
    return parse_config(raw, reference, param=param)


def read_config(reference: str, *, settings: Settings, hub: Mapping[str, bytes],
                param: str = "verifier") -> tuple[str, str, dict[str, Any]]:
    """A model's config.json: from a directory under the models root, or from the Hub (read
    beforehand, off the unit of work, by ``app.services.hub.fetch_configs``: ``hub``).
    Returns (what to hand to servers and trainers, "local" or "hub", the config)."""
    if is_hub_reference(reference, settings):
        return reference, "hub", parse_config(hub[reference], reference, param=param)
    if not looks_like_path(reference) and not exists(settings.models_root / reference):
        # A name that could be a directory there, but is not: say that, not what it should be.
        raise APIError(422, f"No model '{echo(reference)}' under the models root: name a "
                       "directory there, or a Hugging Face id ('org/name')",
                       code=f"invalid_{param}", param=param)
    models_root = settings.models_root
    path = resolve_under(models_root, reference, param=param, what="models")
    # The file too: a config.json linked to a file out of the root is refused.
    config_file = resolve_under(models_root, str(path / "config.json"), param=param, what="models")
    if not config_file.is_file():
        raise APIError(422, f"{param} '{reference}' has no config.json under the models root",
                       code=f"{param}_not_found", param=param)
    return str(path), "local", load_config(config_file, reference, param=param)


def resolve_verifier(reference: str, *, settings: Settings, hub: Mapping[str, bytes]) -> VerifierInfo:
    resolved, source, config = read_config(reference, settings=settings, hub=hub)
    text = _text_config(config)
    try:
        info = VerifierInfo(reference=resolved, source=source,
                            num_hidden_layers=int(text["num_hidden_layers"]),
                            hidden_size=int(text["hidden_size"]), vocab_size=int(text["vocab_size"]),
                            dtype=text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype"))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise APIError(422, f"verifier config.json lacks {exc}", code="invalid_verifier_config",
                       param="verifier") from exc
    if info.dtype is not None and not isinstance(info.dtype, str):
        raise APIError(422, "verifier config.json's torch_dtype is not a string",
                       code="invalid_verifier_config", param="verifier")
    return info


def default_layer_ids(num_hidden_layers: int) -> list[int] | None:
    """The target layer ids a job gets unless it names its own: ``[2, n // 2, n - 3]``, or None
    where the verifier is too shallow for them (they would not be distinct and inside it)."""
    n = num_hidden_layers
    layer_ids = [2, n // 2, n - 3]
    try:
        return check_layer_ids(layer_ids, n, param="speculator.target_layer_ids")
    except APIError:
        return None


def check_layer_ids(layer_ids: list[int], num_hidden_layers: int, *, param: str) -> list[int]:
    n = num_hidden_layers
    if len(set(layer_ids)) != len(layer_ids):
        raise APIError(422, f"{param} must be unique", code="invalid_layer_ids", param=param)
    if layer_ids != sorted(layer_ids):
        raise APIError(422, f"{param} must be sorted ascending", code="invalid_layer_ids", param=param)
    if not all(0 < i < n for i in layer_ids):
        raise APIError(422, f"{param} must lie in 0 < id < {n} (the verifier has {n} layers)",
                       code="invalid_layer_ids", param=param)
    return layer_ids


def inspect_verifier(reference: str, *, settings: Settings,
                     hub: Mapping[str, bytes]) -> VerifierOut:
    """What a job created with this verifier would record of it, and its default layer ids."""
    verifier = resolve_verifier(reference, settings=settings, hub=hub)
    return VerifierOut(verifier=reference, source=verifier.source,
                       num_hidden_layers=verifier.num_hidden_layers,
                       hidden_size=verifier.hidden_size, vocab_size=verifier.vocab_size,
                       dtype=verifier.dtype,
                       default_target_layer_ids=default_layer_ids(verifier.num_hidden_layers))


MAX_LISTED = 200  # models under the models root that GET /api/verifiers lists, at most


def local_verifiers(settings: Settings) -> list[VerifierOut]:
    """The models under the models root a job can name: each directory (``name``, or
    ``org/name`` one level down) whose config.json a job would accept, by name. A model whose
    config a job would refuse is left out, as are links out of the root."""
    root = settings.models_root
    if not root.is_dir():
        return []
    candidates = []
    for entry in sorted(root.iterdir()):
        if (entry / "config.json").is_file():
            candidates.append(entry.name)
        elif entry.is_dir():
            candidates += [f"{entry.name}/{inner.name}" for inner in sorted(entry.iterdir())
                           if (inner / "config.json").is_file()]
    found = []
    for name in candidates[:MAX_LISTED]:
        try:
            found.append(inspect_verifier(name, settings=settings, hub={}))
        except APIError:
            continue
    return found
