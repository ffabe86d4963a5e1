"""vLLM's OpenAI API server on a CPU, with its engine core forked rather than spawned.

Usage (the arguments are exactly those of ``python -m vllm.entrypoints.openai.api_server``)::

    python -m workers.runtimes.local.serve --model VERIFIER --enforce-eager ...

This module does not re-implement any part of vLLM. It changes one choice and then runs vLLM's
API server module unchanged: vLLM's CPU platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn``
unconditionally (``CpuPlatform.check_and_update_config``), so the engine core starts as a fresh
Python that imports vLLM, torch and transformers all over again: about 8 s on 2 cores, half of
the server's start (docs/benchmarks.md, ``benchmarks/vllm_start.py``). Here the engine core is
forked from the API server, which has imported all of it already.

Forking is safe at that point: the API server has parsed its config and run no torch
computation, so there is no OpenMP pool or CUDA context to inherit (the local runtime hides
every GPU), and the engine core binds its own threads afterwards as it does when spawned. The
local runtime's e2e tests serve, extract hidden states and evaluate through this launcher, and
compare its outputs with vLLM's.

Within a job or a deployment, the worker starts it through the preloader's launcher (preload.py):
the preloader, which imported all of this once, forks it; the worker sees no difference.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys

API_SERVER = "vllm.entrypoints.openai.api_server"


def fork_the_engine_core() -> None:
    from vllm.platforms import cpu

    if getattr(cpu.CpuPlatform, "forks_its_engine_core", False):  # done already (a preloader)
        return
    check_and_update_config = cpu.CpuPlatform.check_and_update_config.__func__

    def forking(cls: type[cpu.CpuPlatform], vllm_config: object) -> None:
        check_and_update_config(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    cpu.CpuPlatform.check_and_update_config = classmethod(forking)  # type: ignore[method-assign]
    cpu.CpuPlatform.forks_its_engine_core = True  # type: ignore[attr-defined]


def prepare() -> None:
    """What a preloader imports for the servers it forks: vLLM's API server, forking."""
    fork_the_engine_core()
    importlib.import_module(API_SERVER)


def main() -> None:
    fork_the_engine_core()
    sys.argv[0] = API_SERVER
    runpy.run_module(API_SERVER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
