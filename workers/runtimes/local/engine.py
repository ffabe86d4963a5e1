"""SpecDeck's CPU serving engine: a verifier, greedy and lossless, optionally with speculative
decoding, behind vLLM's OpenAI-compatible API. It stands in for ``vllm serve VERIFIER
[--speculative-config JSON]`` on machines without a GPU::

    python -m workers.runtimes.local.engine --verifier PATH \\
        [--speculative-config '{"method": "dflash", "model": DRAFTER, "num_speculative_tokens": N}'
         | --speculative-config '{"method": "ngram", "num_speculative_tokens": N,
                                  "prompt_lookup_max": 4, "prompt_lookup_min": 1}'] \\
        [--served-model-name NAME] --host 127.0.0.1 --port P [--api-key-env VAR] \\
        [--per-request-spec-decode-metrics none|summary|detailed] \\
        [--dtype auto|float32|bfloat16|float16] [--num-threads T]

Without ``--speculative-config`` the verifier is served alone and no drafter is loaded. Any
other method or key is refused at start-up.

The engine is three files, one idea each:

- ``model_runner.py``: weights, KV caches and forward passes of the verifier and the DFlash
  drafter (``VerifierRunner``, ``DFlashDrafter``, ``resolve_drafter_dir``);
- ``speculation.py``: the speculative loop, propose / verify / accept, and the in-process API:
  ``LocalEngine(verifier, speculative_config=None, *, dtype=None)`` with ``render(messages)``,
  ``start(prompt_ids, max_tokens, *, ignore_eos=False, num_speculative_tokens=None) ->
  Generation`` (``step() -> DecodeStep`` until ``finished``) and ``generate(...) ->
  (Generation, [DecodeStep])``; ``DFlashEngine(verifier, drafter, *,
  num_speculative_tokens=None)`` for a DFlash config;
- ``api.py``: the HTTP routes (``build_app(engine, served_model_name, *, api_key=None)``) and
  vLLM's Prometheus counters (``SpecDecodeMetrics``).

This module is the command line; it re-exports those names.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from workers.runtimes.local.api import (
    PER_REQUEST_LEVELS,
    IncrementalDetokenizer,
    SpecDecodeMetrics,
    build_app,
)
from workers.runtimes.local.model_runner import resolve_drafter_dir
from workers.runtimes.local.server import ComputeThread, add_server_options, serve, set_up
from workers.runtimes.local.speculation import (
    DecodeStep,
    DFlashEngine,
    Generation,
    LocalEngine,
    SpeculativeConfig,
    SpeculativeConfigError,
)

__all__ = [
    "DFlashEngine",
    "DecodeStep",
    "Generation",
    "IncrementalDetokenizer",
    "LocalEngine",
    "SpecDecodeMetrics",
    "SpeculativeConfig",
    "build_app",
    "main",
    "resolve_drafter_dir",
]

logger = logging.getLogger("specdeck.local.engine")


def _speculative_config(text: str) -> SpeculativeConfig:
    try:
        config = SpeculativeConfig.parse(text)
    except SpeculativeConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    assert config is not None
    return config


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m workers.runtimes.local.engine",
        allow_abbrev=False,  # "--api-key" must not pass for "--api-key-env"
        description="CPU OpenAI-compatible server: a verifier, greedy and lossless, with DFlash "
        "or n-gram speculative decoding or alone.",
    )
    parser.add_argument("--verifier", required=True, help="verifier directory (transformers)")
    parser.add_argument(
        "--speculative-config",
        type=_speculative_config,
        default=None,
        metavar="JSON",
        help='vLLM\'s: {"method": "dflash", "model": DRAFTER, "num_speculative_tokens": N} '
        "(DRAFTER: a speculators checkpoint directory, a trainer save path, a Hub cache "
        'directory or a Hub id; N defaults to block_size - 1) or {"method": "ngram", '
        '"num_speculative_tokens": N, "prompt_lookup_max": 4, "prompt_lookup_min": 1}; '
        "absent: the verifier alone",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="id in /v1/models (default: --verifier)"
    )
    parser.add_argument(
        "--per-request-spec-decode-metrics",
        choices=list(PER_REQUEST_LEVELS),
        default="none",
        help="vLLM's: add each request's acceptance to its response as "
        "metrics.speculative_decoding (a stream: on the final usage chunk); detailed adds the "
        "per-step arrays",
    )
    parser.add_argument(
        "--api-key-env",
        default=None,
        metavar="VAR",
        help="name of an environment variable holding the API key; when it is set, "
        "/v1/* requires 'Authorization: Bearer <key>'",
    )
    add_server_options(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    dtype = set_up(args)
    api_key: str | None = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env) or None
        if api_key is None:
            logger.warning("%s is not set: the API is open to every client", args.api_key_env)
    compute = ComputeThread()  # loads the engine and runs every request's steps
    try:
        engine = compute.call(LocalEngine, args.verifier, args.speculative_config, dtype=dtype)
    except SpeculativeConfigError as e:  # e.g. a drafter that is not there or does not fit
        raise SystemExit(f"error: --speculative-config: {e}") from e
    served_name = args.served_model_name or args.verifier
    logger.info(
        "serving %s as %r with %s; %s forward, dtype %s, API key %s",
        args.verifier,
        served_name,
        engine.describe(),
        "lean" if engine.runner.lean else "transformers",
        str(engine.runner.dtype).removeprefix("torch."),
        "required" if api_key else "off",
    )
    app = build_app(engine, served_name, api_key=api_key, compute=compute,
                    per_request_metrics=args.per_request_spec_decode_metrics)
    serve(app, args)


if __name__ == "__main__":
    main()
