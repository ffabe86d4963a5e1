"""Publish a trained DFlash drafter (speculators format) to the Hugging Face Hub.

Only what a server needs is uploaded: ``config.json``, ``model.safetensors`` and a generated
``README.md`` model card. Optimizer and scheduler state, training state and logs never leave
the machine.

Publishing is idempotent. The head of the repo is read first (``model_info`` with file
metadata: the head commit and, per file, the git blob id or the LFS sha256); a commit is made
only for the files whose content differs, with ``parent_commit`` set to that head so a
concurrent writer makes the commit fail rather than be silently overwritten. Running it again
with nothing changed makes no commit and returns the head commit (``changed=False``).

Uploads use the Git LFS HTTP protocol, not Xet (see ``_lfs_transfer``): a drafter is small, the
Hub accepts LFS uploads, and it is the protocol the test double implements, so the tests exercise
the same path as production.

The token is never written to a message, a log line or argv. The worker runs
``python -m app.services.publishing ...`` with ``HF_TOKEN`` in the child's environment; the CLI
reads it from there only.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.schemas.drafters import KINDS

# The files a server needs, in upload order. Nothing else in a checkpoint is ever published.
SERVED_FILES = ("config.json", "model.safetensors")
CARD_FILE = "README.md"
PUBLISHED_FILES = (*SERVED_FILES, CARD_FILE)

# How a card names each kind.
KIND_NAMES = {"dflash": "DFlash", "dflash2": "DFlash 2", "dspark": "DSpark", "eagle3": "EAGLE-3"}
KIND_LINKS = {"dflash": "[DFlash](https://arxiv.org/abs/2602.06036)", "dflash2": "DFlash 2",
              "dspark": "DSpark", "eagle3": "[EAGLE-3](https://arxiv.org/abs/2503.01840)"}
HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
CARD_TAGS = ("speculative-decoding", "speculators", "draft-model", "specdeck")  # and the kind
LIBRARY_NAME = "speculators"
MIN_VLLM = "0.20"


class PublishError(Exception):
    """A publish failed for a reason worth showing to the user. Never carries the token."""


@dataclass(frozen=True)
class PublishResult:
    repo_url: str
    commit_sha: str
    commit_url: str
    changed: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Model card
# ---------------------------------------------------------------------------------------------

def is_hub_id(reference: str) -> bool:
    """Whether ``reference`` names a Hub repo ('org/name') rather than a local path."""
    return (bool(HUB_REPO_ID.match(reference)) and not reference.startswith((".", "~"))
            and ".." not in reference.split("/"))


def vllm_serve_command(verifier: str, repo_id: str, num_speculative_tokens: int,
                       kind: str = "dflash") -> str:
    """The exact command that serves the published draft with its verifier (vLLM >= 0.20): its
    kind's method (DFlash 2 is served under dflash) and its draft length."""
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be at least 1, got {num_speculative_tokens}")
    spec = json.dumps({"method": KINDS[kind].vllm_method, "model": repo_id,
                       "num_speculative_tokens": num_speculative_tokens})
    return f"vllm serve {shlex.quote(verifier)} --speculative-config {shlex.quote(spec)}"


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float):
        text = f"{value:.4f}".rstrip("0").rstrip(".") if abs(value) >= 1e-4 or value == 0 else f"{value:.3e}"
    elif isinstance(value, (list, tuple)):
        text = json.dumps(list(value))
    elif isinstance(value, dict):
        text = json.dumps(value, sort_keys=True)
    elif value is None:
        text = "—"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _flatten(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            rows.extend(_flatten(value, f"{name}."))
        else:
            rows.append((name, value))
    return rows


def _table(data: Mapping[str, Any], headers: tuple[str, str] = ("", "")) -> str:
    rows = _flatten(data)
    lines = [f"| {headers[0]} | {headers[1]} |", "|---|---|"]
    lines += [f"| {_fmt(key)} | {_fmt(value)} |" for key, value in rows]
    return "\n".join(lines)


def render_model_card(
    *,
    repo_id: str,
    checkpoint_config: dict,
    verifier: str,
    layer_ids,
    block_size: int | None,
    draft_vocab_size: int | None,
    dataset_summary: dict,
    metrics: dict,
    evaluation: dict | None,
    kind: str = "dflash",
    num_speculative_tokens: int | None = None,
    partial_epoch: int | None = None,
) -> str:
    """A Hugging Face model card (README.md) for a drafter of ``kind`` (DFlash unless named).
    ``partial_epoch`` (counted from 1) marks a checkpoint saved when training was stopped during
    that epoch.

    Deterministic: the same inputs give the same bytes (no timestamps), which is what lets a
    second publish with nothing changed make no commit.
    """
    layer_ids = [int(i) for i in layer_ids]
    tokens = num_speculative_tokens or int(block_size or 2) - 1
    command = vllm_serve_command(verifier, repo_id, tokens, kind)
    hub_verifier = is_hub_id(verifier)
    about = KINDS[kind]

    front: dict[str, Any] = {"library_name": LIBRARY_NAME}
    if hub_verifier:
        front["base_model"] = verifier
    front["tags"] = [CARD_TAGS[0], kind, *CARD_TAGS[1:]]
    import yaml  # a declared dependency; imported lazily to keep module import cheap

    yaml_text = yaml.safe_dump(front, sort_keys=False, allow_unicode=True).strip()

    layer_config = checkpoint_config.get("transformer_layer_config") or {}
    spec_config = checkpoint_config.get("speculators_config") or {}
    verifier_archs = (spec_config.get("verifier") or {}).get("architectures") or []
    draft = {
        "Kind": kind,
        "Verifier": f"`{verifier}`",
        "Aux hidden-state layer ids": layer_ids,
        "Block size": block_size,
        "Speculative tokens per step": tokens,
        "Draft vocabulary size": draft_vocab_size,
    }
    draft = {k: v for k, v in draft.items() if v is not None}
    optional = {
        "Verifier architecture": ", ".join(verifier_archs) if verifier_archs else None,
        "Draft layers": layer_config.get("num_hidden_layers"),
        "Hidden size": layer_config.get("hidden_size"),
        "Mask token id": checkpoint_config.get("mask_token_id"),
        "Weights dtype": checkpoint_config.get("dtype") or checkpoint_config.get("torch_dtype"),
        "Checkpoint format": (f"speculators {checkpoint_config['speculators_version']}"
                              if checkpoint_config.get("speculators_version") else None),
    }
    draft.update({k: v for k, v in optional.items() if v is not None})

    name = repo_id.split("/")[-1]
    parts = [
        f"---\n{yaml_text}\n---",
        f"# {name}",
        f"A {KIND_LINKS[kind]} speculative-decoding draft model for `{verifier}` "
        f"({about.summary.split(': ', 1)[1]}), trained with SpecDeck using the "
        f"[speculators](https://github.com/vllm-project/speculators) trainer. The draft proposes "
        f"{tokens} tokens per step, conditioned on hidden states from layers "
        f"{', '.join(map(str, layer_ids))} of the verifier; the verifier checks them, so the "
        f"output is the verifier's own (lossless).",
        *([f"**Partial checkpoint.** Saved when training was stopped during epoch "
           f"{partial_epoch}: it has seen only part of that epoch's data."]
          if partial_epoch is not None else []),
        "## Draft model\n\n" + _table(draft, ("Property", "Value")),
        "## Serve with vLLM\n\n"
        f"Requires vLLM >= {MIN_VLLM}. This serves the verifier with this draft:\n\n"
        f"```bash\n{command}\n```"
        + ("" if hub_verifier else
           "\n\nThe verifier was a local path during training; use the same weights (or their Hub "
           "id) when serving."),
        "## Evaluation: served acceptance\n\n" + (
            "Measured by serving this draft the way vLLM serves it, on held-out prompts the "
            "training never saw; the acceptance length is tokens per verifier pass, the number "
            "that decides the speedup.\n\n" + _table(evaluation, ("Metric", "Value"))
            if evaluation else
            "Not evaluated yet. Acceptance length and speedup measured with vLLM will appear "
            "here once an evaluation has run."),
        "## Training data\n\n" + (_table(dataset_summary, ("Field", "Value")) if dataset_summary
                                  else "No dataset summary was recorded."),
        "## Training metrics (the trainer's estimates)\n\n" + (
            "The trainer's validation `eal` averages over every anchor position and overstates "
            "the served acceptance length above.\n\n" + _table(metrics, ("Metric", "Value"))
            if metrics else "No training metrics were recorded."),
        "## Files\n\n`config.json` (speculators config, names the verifier) and `model.safetensors` "
        "(draft weights). Optimizer and scheduler state are not published.",
    ]
    return "\n\n".join(parts) + "\n"


def evaluation_card_rows(evaluation: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The Evaluation section's rows for a checkpoint's recorded evaluation (the job's
    evaluating stage, ``workers/pipeline/evaluate.py``): how it was measured, then the
    acceptance figures. None when there is no evaluation."""
    if not evaluation:
        return None
    prompts = (f"{evaluation.get('prompts')} ({evaluation.get('prompt_source', 'dataset')}), "
               f"greedy, at most {evaluation.get('max_tokens')} new tokens each")
    rows = {
        "Served mean acceptance length": evaluation.get("mean_acceptance_length"),
        "n-gram (prompt lookup) acceptance length": evaluation.get("ngram_mean_acceptance_length"),
        "Speedup vs. no speculation": evaluation.get("speedup"),
        "n-gram speedup vs. no speculation": evaluation.get("ngram_speedup"),
        "Beats n-gram drafting": ({True: "yes", False: "no"}.get(evaluation["beats_ngram"])
                                  if "beats_ngram" in evaluation else None),
        "Acceptance rate per position": evaluation.get("acceptance_rate_per_position") or None,
        "Drafted tokens accepted": evaluation.get("draft_acceptance_rate"),
        "Runtime": (f"{evaluation.get('runtime')} ({evaluation['engine']})" if evaluation.get("engine")
                    else evaluation.get("runtime")),
        "Prompts": prompts,
        "Speculative tokens per step": evaluation.get("num_speculative_tokens"),
        "Completion tokens": evaluation.get("completion_tokens"),
        "Output tokens/s": evaluation.get("output_tokens_per_s"),
        "Output tokens/s, verifier alone": evaluation.get("baseline_output_tokens_per_s"),
        "Output tokens/s, n-gram": evaluation.get("ngram_output_tokens_per_s"),
        "Outputs identical to the verifier alone": evaluation.get("outputs_identical_to_baseline"),
        "Trainer's eal (an estimate)": evaluation.get("trainer_eal_estimate"),
        "Served / trainer's estimate": evaluation.get("served_vs_trainer_eal"),
    }
    return {k: v for k, v in rows.items() if v is not None}


def checkpoint_card_fields(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The ``render_model_card`` arguments a checkpoint directory provides by itself:
    checkpoint_config, verifier, layer_ids, block_size, draft_vocab_size and metrics (the
    validation metrics plus the training state's epoch and global step)."""
    directory = Path(checkpoint_dir)
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PublishError(f"cannot read {directory / 'config.json'}: {type(exc).__name__}") from exc
    spec = config.get("speculators_config") or {}
    verifier = (spec.get("verifier") or {}).get("name_or_path")
    kind = config.get("speculators_model_type")
    if kind is not None and kind not in KINDS:
        raise PublishError(f"{directory / 'config.json'} is a {kind} speculators config, a kind "
                           f"SpecDeck does not publish ({', '.join(KINDS)})")
    kind = kind or "dflash"  # what a config without its kind is checked as
    methods = spec.get("proposal_methods") or [{}]
    tokens = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    block = kind != "eagle3"  # the DFlash family drafts blocks
    missing = [k for k, v in (("speculators_config.verifier.name_or_path", verifier),
                              ("aux_hidden_state_layer_ids", config.get("aux_hidden_state_layer_ids")),
                              ("block_size", config.get("block_size") if block else 0),
                              # DFlash's draft length is its block's
                              ("speculative_tokens", tokens if kind != "dflash" else 0),
                              ("draft_vocab_size", config.get("draft_vocab_size"))) if v is None]
    if missing:
        raise PublishError(f"{directory / 'config.json'} is not a {KIND_NAMES[kind]} speculators "
                           f"config (missing {', '.join(missing)})")
    metrics: dict[str, Any] = {}
    for name in ("training_state.json", "val_metrics.json"):
        with contextlib.suppress(OSError, json.JSONDecodeError):
            data = json.loads((directory / name).read_text())
            if isinstance(data, dict):
                if name == "training_state.json":
                    data = {k: data[k] for k in ("epoch", "global_step") if k in data}
                metrics.update(data)
    return {"checkpoint_config": config, "verifier": verifier, "kind": kind,
            "layer_ids": list(config["aux_hidden_state_layer_ids"]),
            "block_size": int(config["block_size"]) if block else None,
            "num_speculative_tokens": int(tokens) if tokens else int(config["block_size"]) - 1,
            "draft_vocab_size": int(config["draft_vocab_size"]), "metrics": metrics}


# ---------------------------------------------------------------------------------------------
# Publishing
# ---------------------------------------------------------------------------------------------

def git_blob_sha1(data: bytes) -> str:
    """The git object id of a regular (non-LFS) file, as the Hub reports it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class _Local:
    path_in_repo: str
    source: Path | bytes
    sha256: str
    git_sha1: str | None  # only computed for small files (they may be stored as regular blobs)
    size: int


def _local(path_in_repo: str, source: Path | bytes) -> _Local:
    if isinstance(source, bytes):
        return _Local(path_in_repo, source, hashlib.sha256(source).hexdigest(), git_blob_sha1(source),
                      len(source))
    size = source.stat().st_size
    small = size <= 10 * 1024 * 1024
    return _Local(path_in_repo, source, _file_sha256(source),
                  git_blob_sha1(source.read_bytes()) if small else None, size)


def _unchanged(local: _Local, remote: Any) -> bool:
    """Compare with a remote sibling (``RepoSibling``): LFS files by sha256, others by git sha1."""
    if remote is None:
        return False
    lfs = getattr(remote, "lfs", None)
    if lfs is not None:
        sha = lfs.get("sha256") if isinstance(lfs, Mapping) else getattr(lfs, "sha256", None)
        return sha == local.sha256 and remote.size in (None, local.size)
    return remote.blob_id is not None and remote.blob_id == local.git_sha1


_XET_LOCK = threading.Lock()


@contextlib.contextmanager
def _lfs_transfer() -> Iterator[None]:
    """Upload over the Git LFS HTTP protocol instead of Xet while publishing.

    With ``hf_xet`` installed, huggingface_hub >= 1.0 uploads large files through Xet (a Rust
    client talking to a CAS service). ``HF_HUB_DISABLE_XET`` is read once, at import, into
    ``huggingface_hub.constants``; ``is_xet_available()`` reads that attribute on each call, so it
    is set for the duration of the publish. Process-wide while it lasts: a concurrent download in
    another thread would use plain HTTP, which is harmless.
    """
    from huggingface_hub import constants

    with _XET_LOCK:
        previous = constants.HF_HUB_DISABLE_XET
        constants.HF_HUB_DISABLE_XET = True
        try:
            yield
        finally:
            constants.HF_HUB_DISABLE_XET = previous


def _redact(text: str, token: str | None) -> str:
    if token:
        text = text.replace(token, "***")
    return re.sub(r"hf_[A-Za-z0-9]{20,}", "hf_***", text)


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status of the Hub error behind ``exc`` (the client wraps some, e.g. LFS uploads)."""
    from huggingface_hub.errors import HfHubHTTPError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, HfHubHTTPError) and current.response is not None:
            return current.response.status_code
        current = current.__cause__ or current.__context__
    return None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level errors of the HTTP library the installed client uses."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError"),
                         ("requests", "RequestException")):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(getattr(__import__(module), name))
    return tuple(errors)


def _hub_error(exc: BaseException, *, action: str, endpoint: str, token: str) -> PublishError:
    status = _http_status(exc)
    if status == 401:
        message = (f"the Hugging Face token was rejected (401) by {endpoint} while {action}; "
                   "set a valid token with write access in the project's HF_TOKEN secret")
    elif status == 403:
        message = (f"the Hugging Face token is not allowed to do this (403) while {action}: it needs "
                   "the write role on the repo's namespace")
    elif status == 412:
        message = f"the repo changed while {action} (412); publish again"
    elif status is not None:
        detail = (getattr(exc, "server_message", None) or str(exc)).strip()
        message = f"the Hub answered {status} while {action}: {detail.splitlines()[0] if detail else ''}"
    elif isinstance(exc, ValueError):
        message = f"the Hub refused the upload while {action}: {exc}"
    else:
        message = f"could not reach the Hub at {endpoint} while {action}: {type(exc).__name__}: {exc}"
    return PublishError(_redact(" ".join(message.split()), token))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specdeck")
    except PackageNotFoundError:
        return "dev"


def publish_checkpoint(
    checkpoint_dir: str | Path,
    repo_id: str,
    *,
    token: str,
    card: str,
    private: bool = True,
    endpoint: str | None = None,
) -> PublishResult:
    """Publish ``config.json`` + ``model.safetensors`` from ``checkpoint_dir`` and ``card`` as
    ``README.md`` to the model repo ``repo_id`` (created if missing, private by default).

    Makes a commit only when one of those files differs from the repo's head; otherwise returns
    the head commit with ``changed=False``. Raises ``PublishError`` with a message that never
    contains the token.
    """
    from huggingface_hub import CommitOperationAdd, HfApi, constants

    if not token:
        raise PublishError("no Hugging Face token was given; set the project's HF_TOKEN secret")
    if not HUB_REPO_ID.match(repo_id):
        raise PublishError(f"'{repo_id}' is not a Hugging Face repo id ('namespace/name')")
    directory = Path(checkpoint_dir)
    for name in SERVED_FILES:
        if not (directory / name).is_file():
            raise PublishError(f"{directory} has no {name}; it is not a servable checkpoint")

    hub = (endpoint or constants.ENDPOINT).rstrip("/")
    api = HfApi(endpoint=hub, token=token, library_name="specdeck", library_version=_version())
    local = [_local(name, directory / name) for name in SERVED_FILES]
    local.append(_local(CARD_FILE, card.encode("utf-8")))

    action = f"creating {repo_id}"
    try:
        with _lfs_transfer():
            repo_url = str(api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model"))
            action = f"reading the head of {repo_id}"
            info = api.model_info(repo_id, files_metadata=True)
            head = info.sha
            remote = {s.rfilename: s for s in (info.siblings or [])}
            changed = [f for f in local if not _unchanged(f, remote.get(f.path_in_repo))]
            if not changed and head:
                return PublishResult(repo_url=repo_url, commit_sha=head,
                                     commit_url=f"{repo_url.rstrip('/')}/commit/{head}", changed=False)
            action = f"committing to {repo_id}"
            operations = [CommitOperationAdd(path_in_repo=f.path_in_repo, path_or_fileobj=f.source)
                          for f in changed]
            names = ", ".join(f.path_in_repo for f in changed)
            commit = api.create_commit(
                repo_id, operations, repo_type="model", parent_commit=head or None,
                commit_message=f"Publish DFlash drafter ({names})",
                commit_description="Published by SpecDeck: the files a server needs and the model card.",
            )
    except Exception as exc:
        if _http_status(exc) is None and not isinstance(exc, (ValueError, *_transport_errors())):
            raise
        raise _hub_error(exc, action=action, endpoint=hub, token=token) from None
    return PublishResult(repo_url=repo_url, commit_sha=commit.oid, commit_url=commit.commit_url, changed=True)


# ---------------------------------------------------------------------------------------------
# CLI: python -m app.services.publishing --checkpoint DIR --repo-id ID --card-file PATH ...
# ---------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m app.services.publishing",
        description="Publish a DFlash checkpoint to the Hugging Face Hub. The token is read from "
                    "the HF_TOKEN environment variable only.")
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--repo-id", required=True)
    parser.add_argument("--card-file", required=True, type=Path)
    parser.add_argument("--public", action="store_true", help="create the repo public (default: private)")
    parser.add_argument("--endpoint", default=None, help="Hub endpoint (default: HF_ENDPOINT or the Hub)")
    parser.add_argument("--result-file", required=True, type=Path)
    args = parser.parse_args(argv)

    token = os.environ.pop("HF_TOKEN", "").strip()  # from the environment only; not left lying around
    try:
        if not token:
            raise PublishError("HF_TOKEN is not set in the environment")
        try:
            card = args.card_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise PublishError(f"cannot read the card file {args.card_file}: {exc.strerror}") from None
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
        result = publish_checkpoint(args.checkpoint, args.repo_id, token=token, card=card,
                                    private=not args.public, endpoint=args.endpoint)
        tmp = args.result_file.with_name(args.result_file.name + ".tmp")
        tmp.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        tmp.replace(args.result_file)
    except PublishError as exc:
        print(f"publish failed: {_redact(str(exc), token)}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line, no traceback: a traceback could quote arguments
        reason = " ".join(_redact(f"{type(exc).__name__}: {exc}", token).split())
        print(f"publish failed: {reason}", file=sys.stderr)
        return 1
    print(f"published {args.repo_id}: commit {result.commit_sha} "
          f"({'new commit' if result.changed else 'unchanged'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
