"""Command builders for the two runtimes. The orchestration is shared; only the commands differ.

``build_plan`` is what the worker runs and what ``GET /api/jobs/{id}/plan`` shows.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app.settings import Settings

SPECULATORS_VERSION = "0.9.0"
REDACTED = "***"
# The serving engines' internal key: vLLM reads VLLM_API_KEY, the local engine the variable
# named by --api-key-env. Keys and tokens travel in the environment, never in argv.
UPSTREAM_KEY_ENV = {"vllm": "VLLM_API_KEY", "local": "SPECDECK_UPSTREAM_KEY"}
SECRET_ENV = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", *UPSTREAM_KEY_ENV.values()})


@dataclass(frozen=True)
class JobPaths:
    root: Path
    hidden_states: Path
    data: Path
    checkpoints: Path
    log: Path

    @classmethod
    def for_job(cls, settings: Settings, job_id: str) -> "JobPaths":
        root = (settings.work_root / job_id).resolve()
        return cls(root=root, hidden_states=root / "hidden_states", data=root / "data",
                   checkpoints=root / "checkpoints",
                   log=(settings.logs_root / f"{job_id}.log").resolve())


@dataclass(frozen=True)
class StageCommand:
    stage: str
    description: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)

    def redacted_env(self) -> dict[str, str]:
        return {k: (REDACTED if k in SECRET_ENV else v) for k, v in self.env.items()}


@dataclass(frozen=True)
class Plan:
    runtime: str
    server_layer_ids: list[int]
    trainer_layer_ids: list[int]
    verifier_gpus: list[int]
    trainer_gpus: list[int]
    stages: list[StageCommand]

    def stage(self, name: str) -> StageCommand:
        return next(s for s in self.stages if s.stage == name)


def server_layer_ids(spec: dict[str, Any]) -> list[int]:
    """The hidden-states server gets the trainer's ids plus the last layer ``n`` appended."""
    return [*spec["speculator"]["target_layer_ids"], spec["verifier_info"]["num_hidden_layers"]]


def cuda_env(gpus: list[int]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}


def default_gpus(spec: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Verifier GPUs first, then trainer GPUs: disjoint by construction."""
    res = spec["resources"]
    n_verifier = res["verifier"]["tensor_parallel_size"] * res["verifier"]["data_parallel_size"]
    return list(range(n_verifier)), list(range(n_verifier, n_verifier + res["trainer_gpus"]))


def training_data(spec: dict[str, Any], paths: JobPaths) -> str:
    """The JSONL prepare-data reads. speculators 0.9.0 reads only a ``conversations`` column, so
    an OpenAI ``messages`` file is handed over through a copy with the key renamed."""
    if spec.get("dataset_format") == "messages":
        return str(paths.root / "conversations.jsonl")
    return spec["dataset_path"]


def prepare_data_argv(spec: dict[str, Any], paths: JobPaths, endpoint: str) -> list[str]:
    return [
        sys.executable, "-m", "speculators", "prepare-data",
        "--model", spec["verifier_info"]["reference"],
        "--data", training_data(spec, paths),
        "--output", str(paths.data),
        "--seq-length", str(spec["speculator"]["total_seq_len"]),
        "--render-endpoint", endpoint,
        "--no-skip-token-freq",
    ]


def generate_offline_argv(spec: dict[str, Any], paths: JobPaths, endpoint: str) -> list[str]:
    return [
        sys.executable, "-m", "speculators", "generate-offline-data",
        "--model", spec["verifier_info"]["reference"],
        "--endpoint", f"{endpoint}/v1",
        "--preprocessed-data", str(paths.data),
        "--output", str(paths.data / "hidden_states"),
        "--validate-outputs",
    ]


def trainer_args(spec: dict[str, Any], paths: JobPaths, endpoint: str) -> list[str]:
    """The speculators trainer's flags, shared by both runtimes."""
    sp = spec["speculator"]
    mode = spec["mode"]
    # speculators 0.9.0: --on-generate is deprecated (generated files are always deleted after
    # loading). online generates everything on demand; offline trains only on the cache made by
    # generate-offline-data; hybrid uses that cache and generates what is missing.
    on_missing = {"online": "generate", "offline": "raise", "hybrid": "generate"}[mode]
    args = [
        "--verifier-name-or-path", spec["verifier_info"]["reference"],
        "--speculator-type", "dflash",
        "--data-path", str(paths.data),
        "--vllm-endpoint", f"{endpoint}/v1",
        "--on-missing", on_missing,
        "--save-path", str(paths.checkpoints),
        "--num-layers", str(sp["num_layers"]),
        "--block-size", str(sp["block_size"]),
        "--max-anchors", str(sp["max_anchors"]),
        "--target-layer-ids", *[str(i) for i in sp["target_layer_ids"]],
        "--total-seq-len", str(sp["total_seq_len"]),
        "--epochs", str(sp["epochs"]),
        "--lr", str(sp["lr"]),
        "--scheduler-type", sp["scheduler"],
        "--seed", str(sp["seed"]),
    ]
    if sp.get("draft_vocab_size"):
        args += ["--draft-vocab-size", str(sp["draft_vocab_size"])]
    return args


def build_plan(spec: dict[str, Any], paths: JobPaths, *, port: int | None = None,
               gpus: tuple[list[int], list[int]] | None = None) -> Plan:
    """The exact stages a job runs. ``port`` is fixed when the worker starts the server."""
    from workers.runtimes import vllm
    from workers.runtimes.local import commands as local

    runtime = {"vllm": vllm, "local": local}[spec["runtime"]]
    plan = runtime.build(spec, paths, port=port, gpus=gpus)
    if evaluation_settings(spec) is not None:  # the drafter is known once training ends
        plan.stages.append(evaluation_command(spec, "<best checkpoint>", port="<port>",
                                              gpus=plan.verifier_gpus, api_key=""))
    return plan


def build_serve(spec: dict[str, Any], name: str, *, port: int | str, host: str,
                gpus: list[int] | None, api_key: str) -> StageCommand:
    """The serving command of a deployment: the verifier with its DFlash drafter."""
    from workers.runtimes import vllm
    from workers.runtimes.local import commands as local

    runtime = {"vllm": vllm, "local": local}[spec["runtime"]]
    return runtime.serve_command(spec, name, port=port, host=host, gpus=gpus or [],
                                 api_key=api_key)


EVALUATION_MODEL = "specdeck-evaluation"  # the name the evaluation engine serves


def evaluation_settings(spec: dict[str, Any]) -> dict[str, int] | None:
    """The job's evaluation settings (prompts, max_tokens), or None when it skips it. A job
    created before the evaluation existed gets the defaults."""
    from app.schemas.jobs import EvaluateSpec

    value = spec.get("evaluate", {})
    if value is False or value is None:
        return None
    return EvaluateSpec(**value).model_dump()


def evaluation_serve_spec(spec: dict[str, Any], drafter: str,
                          speculative: bool = True) -> dict[str, Any]:
    """A job's best checkpoint as a deployment of it would be specified: its verifier,
    block_size - 1 speculative tokens (0 for the baseline: the verifier alone), the verifier's
    tensor parallelism, the job's runtime."""
    return {"verifier": spec["verifier_info"]["reference"], "drafter": drafter,
            "num_speculative_tokens": spec["speculator"]["block_size"] - 1 if speculative else 0,
            "runtime": spec["runtime"],
            "resources": {"tensor_parallel_size":
                          spec["resources"]["verifier"]["tensor_parallel_size"]}}


def evaluation_command(spec: dict[str, Any], drafter: str, *, port: int | str,
                       gpus: list[int], api_key: str, speculative: bool = True) -> StageCommand:
    """The evaluating stage's engine: exactly a deployment's serving command (``build_serve``)
    for ``drafter``, on the first tensor-parallel-size of the verifier's GPUs; with
    ``speculative=False``, the same server with speculative decoding off (the baseline)."""
    serve_spec = evaluation_serve_spec(spec, drafter, speculative)
    tp = serve_spec["resources"]["tensor_parallel_size"]
    command = build_serve(serve_spec, EVALUATION_MODEL, port=port, host="127.0.0.1",
                          gpus=gpus[:tp], api_key=api_key)
    what = "evaluating the best checkpoint" if speculative else "the no-speculation baseline"
    return replace(command, stage="evaluating", description=f"{command.description}, {what}")


def spec_summary(spec: dict[str, Any]) -> str:
    return json.dumps({k: spec[k] for k in ("verifier", "runtime", "mode")}, sort_keys=True)
