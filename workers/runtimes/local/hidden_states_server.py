"""A CPU hidden-states server that speaks vLLM's extract_hidden_states protocol.

It stands in for ``vllm serve VERIFIER --speculative-config '{"method":
"extract_hidden_states", ...}' --kv-transfer-config '{"kv_connector":
"ExampleHiddenStatesConnector", ...}'`` on machines without a GPU, for the two clients
in speculators 0.9.0:

- ``speculators prepare-data --render-endpoint URL`` posts conversations to
  ``POST /v1/chat/completions/render`` and reads ``token_ids``
  (``speculators.data_generation.render_client``);
- the trainer (``--vllm-endpoint URL/v1 --on-missing generate``) lists ``GET
  /v1/models``, requires ``data[0].id`` to equal its ``--verifier-name-or-path``, then
  posts ``POST /v1/completions`` with ``prompt`` as token ids, ``max_tokens=1`` and
  ``return_token_ids=true``; it requires ``choices[0].prompt_token_ids`` to equal the ids
  it sent and reads the file named by ``kv_transfer_params.hidden_states_path``
  (``speculators.data_generation.vllm_client``, ``hs_connectors.transfer.FileTransfer``).

The file is a safetensors file with exactly ``hidden_states`` ``[T, L, H]`` (model
dtype, layer ids in ascending order) and ``token_ids`` int64 ``[T]``. Layer id ``k`` is
the residual stream after decoder layer ``k - 1``, id 0 the embeddings, and id ``n``
(``num_hidden_layers``) the last layer's output BEFORE the final norm. They are captured
with forward hooks, not ``output_hidden_states`` (whose last entry is after the norm in
transformers 5).

Usage::

    python -m workers.runtimes.local.hidden_states_server --model PATH \\
        --served-model-name NAME --host 127.0.0.1 --port 8000 \\
        --layer-ids 2 4 5 8 --hidden-states-dir DIR [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import jinja2
import torch
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.runtimes.local.server import (
    ComputeThread,
    RequestError,
    add_server_options,
    install_error_handlers,
    model_list,
    serve,
    set_up,
)

__all__ = [
    "HiddenStatesExtractor",
    "RequestError",
    "build_app",
    "main",
]

logger = logging.getLogger("specdeck.hidden_states_server")




class HiddenStatesExtractor:
    """Runs the verifier on CPU and captures the requested layers' hidden states.

    One forward pass at a time: the hooks write into shared state, so ``extract``
    holds a lock for the duration of the forward. File writes happen outside it.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        layer_ids: Sequence[int],
        hidden_states_dir: str | os.PathLike[str],
        *,
        dtype: torch.dtype | None = None,
    ) -> None:
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype or "auto")
        self.model = model.eval().requires_grad_(False)
        self.dtype: torch.dtype = self.model.dtype
        config = self.model.config.get_text_config()
        self.num_hidden_layers: int = config.num_hidden_layers
        self.hidden_size: int = config.hidden_size
        self.vocab_size: int = config.vocab_size
        self.max_model_len: int = config.max_position_embeddings

        ids = [int(i) for i in layer_ids]
        if not ids:
            raise ValueError("at least one layer id is required")
        if len(set(ids)) != len(ids):
            raise ValueError(f"layer ids must be distinct, got {ids}")
        bad = [i for i in ids if not 0 <= i <= self.num_hidden_layers]
        if bad:
            raise ValueError(
                f"layer ids {bad} are outside [0, {self.num_hidden_layers}] for a "
                f"verifier with {self.num_hidden_layers} layers"
            )
        self.layer_ids: list[int] = sorted(ids)

        self.hidden_states_dir = Path(hidden_states_dir).absolute()
        self.hidden_states_dir.mkdir(parents=True, exist_ok=True)

        self._lock = threading.Lock()
        self._captured: dict[int, torch.Tensor] = {}
        self._decoder = self.model.get_decoder()
        self._register_hooks()

    def _register_hooks(self) -> None:
        def capture(layer_id: int) -> Callable[[torch.nn.Module, Any, Any], None]:
            def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
                hidden = output[0] if isinstance(output, tuple) else output
                self._captured[layer_id] = hidden

            return hook

        layers = self._decoder.layers
        for layer_id in self.layer_ids:
            if layer_id == 0:
                self.model.get_input_embeddings().register_forward_hook(capture(0))
            else:
                layers[layer_id - 1].register_forward_hook(capture(layer_id))

    def validate_token_ids(self, token_ids: Any) -> list[int]:
        if not isinstance(token_ids, list) or not token_ids:
            raise RequestError("prompt must be a non-empty list of token ids", param="prompt")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
            raise RequestError("prompt must contain only integer token ids", param="prompt")
        out_of_range = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if out_of_range:
            raise RequestError(
                f"token ids {out_of_range[:5]} are outside the vocabulary [0, {self.vocab_size})",
                param="prompt",
            )
        if len(token_ids) >= self.max_model_len:
            raise RequestError(
                f"prompt has {len(token_ids)} tokens; this model's maximum context length "
                f"is {self.max_model_len} tokens (prompt plus one generated token)",
                param="prompt",
            )
        return token_ids

    @torch.inference_mode()
    def extract(self, token_ids: list[int]) -> tuple[torch.Tensor, int]:
        """Return ``hidden_states`` ``[T, L, H]`` and the greedy next token id."""
        input_ids = torch.tensor([token_ids], dtype=torch.long)
        with self._lock:
            self._captured.clear()
            try:
                output = self._decoder(input_ids=input_ids, use_cache=False)
                last = output.last_hidden_state[:, -1]
                next_token = int(self.model.get_output_embeddings()(last).argmax(-1).item())
                hidden = torch.stack([self._captured[i][0] for i in self.layer_ids], dim=1)
            finally:
                self._captured.clear()
        return hidden.contiguous(), next_token

    def write(self, token_ids: list[int], hidden_states: torch.Tensor) -> Path:
        """Write the safetensors file atomically (temporary name, then rename)."""
        path = self.hidden_states_dir / f"hs_{uuid.uuid4().hex}.safetensors"
        tmp = path.with_name(f".{path.name}.tmp")
        tensors = {
            "hidden_states": hidden_states,
            "token_ids": torch.tensor(token_ids, dtype=torch.int64),
        }
        try:
            save_file(tensors, str(tmp))
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Apply the chat template and tokenize, with no extra special tokens."""
        if add_generation_prompt and continue_final_message:
            raise RequestError(
                "add_generation_prompt and continue_final_message cannot both be true"
            )
        kwargs = dict(chat_template_kwargs or {})
        reserved = {"messages", "conversation", "tools", "tokenize", "add_generation_prompt"}
        clash = reserved & kwargs.keys()
        if clash:
            raise RequestError(
                f"chat_template_kwargs may not set {sorted(clash)}", param="chat_template_kwargs"
            )
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **kwargs,
            )
        except (jinja2.TemplateError, ValueError, TypeError, KeyError) as e:
            raise RequestError(f"chat template failed: {e}", param="messages") from e
        return list(self.tokenizer.encode(text, add_special_tokens=False))


class _Lenient(BaseModel):
    # OpenAI clients send many optional fields (temperature, stream, ...): accept them.
    model_config = ConfigDict(extra="allow")


class CompletionRequest(_Lenient):
    model: str | None = None
    prompt: list[StrictInt] | StrictStr
    max_tokens: int | None = 1
    return_token_ids: bool = False
    stream: bool = False


class RenderRequest(_Lenient):
    model: str | None = None
    messages: list[dict[str, Any]]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    truncate_prompt_tokens: int | None = None
    truncation_side: Literal["left", "right"] | None = None



def _truncate(token_ids: list[int], limit: int | None, side: str | None) -> list[int]:
    """vLLM's truncate_prompt_tokens: keep ``limit`` tokens; left (default) keeps the end."""
    if limit is None or limit == -1:
        return token_ids
    if limit < 1:
        raise RequestError(
            "truncate_prompt_tokens must be -1 or >= 1", param="truncate_prompt_tokens"
        )
    if len(token_ids) <= limit:
        return token_ids
    return token_ids[:limit] if side == "right" else token_ids[-limit:]


def build_app(extractor: HiddenStatesExtractor, served_model_name: str,
              compute: ComputeThread | None = None) -> FastAPI:
    """The HTTP API around ``extractor``; ``served_model_name`` is the id clients use;
    ``compute`` is the thread that loaded it (a new one if not given)."""
    app = FastAPI(title="SpecDeck local hidden-states server")
    created = int(time.time())
    compute = compute or ComputeThread()  # every extraction, on one thread

    def extract_and_write(prompt_ids: list[int]) -> tuple[Path, int]:
        hidden_states, next_token = extractor.extract(prompt_ids)
        return extractor.write(prompt_ids, hidden_states), next_token

    @app.middleware("http")
    async def log_request(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        request.state.detail = ""
        response = await call_next(request)
        elapsed_ms = (time.perf_counter() - start) * 1000
        logger.info(
            "%s %s %d %.1fms%s",
            request.method,
            request.url.path,
            response.status_code,
            elapsed_ms,
            request.state.detail,
        )
        return response

    install_error_handlers(app)

    def check_model(model: str | None) -> None:
        if model is not None and model != served_model_name:
            raise RequestError(f"The model `{model}` does not exist.", param="model", status=404)

    @app.get("/health")
    def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    def list_models() -> dict[str, Any]:
        return model_list(served_model_name, created, extractor.model_path, extractor.max_model_len)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> dict[str, Any]:
        check_model(body.model)
        if body.stream:
            raise RequestError(
                "streaming is not supported by the hidden-states server", param="stream"
            )
        if body.max_tokens != 1:
            raise RequestError(
                "the hidden-states server only generates one token: max_tokens must be 1",
                param="max_tokens",
            )
        if isinstance(body.prompt, str):
            prompt_ids = list(extractor.tokenizer.encode(body.prompt, add_special_tokens=False))
        else:
            prompt_ids = list(body.prompt)
        prompt_ids = extractor.validate_token_ids(prompt_ids)

        path, next_token = await compute.run(extract_and_write, prompt_ids)
        request.state.detail = f" tokens={len(prompt_ids)} file={path.name}"

        choice: dict[str, Any] = {
            "index": 0,
            "text": extractor.tokenizer.decode([next_token]),
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
        if body.return_token_ids:
            choice["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = [next_token]
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": served_model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": 1,
                "total_tokens": len(prompt_ids) + 1,
            },
            "kv_transfer_params": {"hidden_states_path": str(path)},
        }

    @app.post("/v1/chat/completions/render")
    def render(body: RenderRequest, request: Request) -> dict[str, Any]:
        check_model(body.model)
        if not body.messages:
            raise RequestError("messages must not be empty", param="messages")
        token_ids = extractor.render(
            body.messages,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            tools=body.tools,
            chat_template_kwargs=body.chat_template_kwargs,
        )
        token_ids = _truncate(token_ids, body.truncate_prompt_tokens, body.truncation_side)
        request.state.detail = f" tokens={len(token_ids)}"
        return {"token_ids": token_ids}

    return app


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workers.runtimes.local.hidden_states_server",
        description="CPU hidden-states server with vLLM's extract_hidden_states protocol.",
    )
    parser.add_argument("--model", required=True, help="verifier directory (transformers format)")
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="id listed by /v1/models; must equal the trainer's --verifier-name-or-path "
        "(default: --model as given)",
    )
    parser.add_argument(
        "--layer-ids",
        type=int,
        nargs="+",
        required=True,
        help="layer ids to extract: the trainer's --target-layer-ids plus num_hidden_layers",
    )
    parser.add_argument("--hidden-states-dir", required=True, help="where files are written")
    add_server_options(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    dtype = set_up(args)
    compute = ComputeThread()  # loads the model and runs every extraction
    extractor = compute.call(
        HiddenStatesExtractor, args.model, args.layer_ids, args.hidden_states_dir, dtype=dtype
    )
    served_name = args.served_model_name or args.model
    logger.info(
        "serving %s as %r: %d layers, hidden %d, dtype %s, layer ids %s, files in %s",
        args.model,
        served_name,
        extractor.num_hidden_layers,
        extractor.hidden_size,
        str(extractor.dtype).removeprefix("torch."),
        extractor.layer_ids,
        extractor.hidden_states_dir,
    )
    app = build_app(extractor, served_name, compute=compute)
    serve(app, args)


if __name__ == "__main__":
    main()
