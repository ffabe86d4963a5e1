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
# The serving engine's internal key, which vLLM reads from VLLM_API_KEY. Keys and tokens travel
# in the environment, never in argv.
UPSTREAM_KEY_ENV = "VLLM_API_KEY"
SECRET_ENV = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", UPSTREAM_KEY_ENV})


@dataclass(frozen=True)
class JobPaths:
    root: Path
    hidden_states: Path
    data: Path
    checkpoints: Path
    log: Path
    regenerated: Path  # the verifier's own replies (speculators regenerate-responses)
    mirror: Path | None = None  # local copies of public presets (settings.public_datasets_mirror)

    @property
    def captured(self) -> Path:
        """A capture dataset's rows, decrypted for this job (removed when it ends)."""
        return self.root / "captured.jsonl"

    @classmethod
    def for_job(cls, settings: Settings, job_id: str) -> "JobPaths":
        root = (settings.work_root / job_id).resolve()
        return cls(root=root, hidden_states=root / "hidden_states", data=root / "data",
                   checkpoints=root / "checkpoints",
                   log=(settings.logs_root / f"{job_id}.log").resolve(),
                   regenerated=root / "regenerated.jsonl",
                   mirror=settings.public_datasets_mirror)


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
    """Verifier GPUs first, then trainer GPUs: disjoint by construction (the scheduler
    allocates them the same way)."""
    res = spec["resources"]
    n_verifier = res["verifier"]["tensor_parallel_size"] * res["verifier"]["data_parallel_size"]
    return list(range(n_verifier)), list(range(n_verifier, n_verifier + res["trainer_gpus"]))


def trainer_gpus(spec: dict[str, Any], verifier: list[int], trainer: list[int]) -> list[int]:
    """The trainer's GPUs: its own, or with ``share_verifier_gpus`` the first ``trainer_gpus``
    of the verifier's (the scheduler allocated it none)."""
    res = spec["resources"]
    return verifier[:res["trainer_gpus"]] if res.get("share_verifier_gpus") else trainer


def data_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The job's data settings (``regenerate`` and its limits); a job created before they
    existed was never regenerated."""
    from app.schemas.jobs import DataSpec

    data = {**DataSpec().model_dump(), "regenerate": False, **spec.get("data", {})}
    if data["max_tokens"] is None:
        data["max_tokens"] = max(16, spec["speculator"]["total_seq_len"] // 2)
    return data


def dataset_file(spec: dict[str, Any], paths: JobPaths) -> Path:
    """The job's JSONL: the upload (or file under the data root), or a capture's rows as the
    data stage writes them out."""
    if spec.get("dataset_kind") == "capture":
        return paths.captured
    return Path(spec["dataset_path"])


def regeneration_source(spec: dict[str, Any], paths: JobPaths) -> str:
    """What regenerate-responses reads: the uploaded JSONL (it reads OpenAI ``messages`` and
    ShareGPT ``conversations``), or a public preset by name (speculators downloads it), or the
    preset's local copy under the mirror directory when there is one."""
    if spec["dataset_kind"] != "public":
        return str(dataset_file(spec, paths))
    preset = spec["dataset_path"]
    if paths.mirror is not None and (paths.mirror / f"{preset}.jsonl").is_file():
        return str((paths.mirror / f"{preset}.jsonl").resolve())
    return preset


def training_data(spec: dict[str, Any], paths: JobPaths) -> str:
    """The JSONL prepare-data reads: the regenerated rows (pre-tokenized ``input_ids`` and
    ``loss_mask``, the verifier's exact ids), or the conversations. speculators 0.9.0 reads only
    a ``conversations`` column, so an OpenAI ``messages`` file is handed over through a copy with
    the key renamed."""
    if data_settings(spec)["regenerate"]:
        return str(paths.regenerated)
    if spec.get("dataset_format") == "messages":
        return str(paths.root / "conversations.jsonl")
    return str(dataset_file(spec, paths))


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
    """The speculators trainer's flags, shared by both runtimes. A warm start (``init_from``)
    loads the checkpoint with ``--from-pretrained``; its architecture comes with it, and
    speculators refuses the decoder-shaping flags (``--num-layers``) beside it. The job took the
    checkpoint's block size and layer ids, so the other flags agree with it."""
    sp = spec["speculator"]
    warm = spec.get("init_from_info")
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
        *(["--from-pretrained", warm["path"]] if warm else ["--num-layers", str(sp["num_layers"])]),
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


def regenerate_argv(spec: dict[str, Any], paths: JobPaths, endpoint: str, done: int = 0
                    ) -> list[str]:
    """speculators regenerate-responses against the verifier served without speculation:
    every reply written anew by the verifier, with its exact prompt and completion ids. It
    resumes from its output file (rows are appended per finished conversation); its --limit
    counts only the conversations of this run, so a resume asks for those not ``done`` yet."""
    data = data_settings(spec)
    argv = [
        sys.executable, "-m", "speculators", "regenerate-responses",
        "--endpoint", f"{endpoint}/v1/chat/completions",
        "--model", spec["verifier_info"]["reference"],
        "--dataset", regeneration_source(spec, paths),
        "--outfile", str(paths.regenerated),
        "--resume",
        "--max-tokens", str(data["max_tokens"]),
        "--concurrency", str(data["concurrency"]),
        "--sampling-params", json.dumps({"temperature": data["temperature"]}),
    ]
    if data["max_samples"] is not None:
        argv += ["--limit", str(max(0, data["max_samples"] - done))]
    return argv


REGENERATION_KEY = ""  # regenerate-responses sends no API key: the server listens on loopback


def regeneration_commands(spec: dict[str, Any], paths: JobPaths, *, port: int | str,
                          verifier_gpus: list[int], done: int = 0) -> list[StageCommand]:
    """The regenerating_data stage: the verifier served alone (a deployment's command with 0
    speculative tokens, named as the verifier so regenerate-responses loads its tokenizer),
    then regenerate-responses against it."""
    reference = spec["verifier_info"]["reference"]
    serve_spec = {"verifier": reference, "num_speculative_tokens": 0, "runtime": spec["runtime"],
                  "resources": {"tensor_parallel_size":
                                spec["resources"]["verifier"]["tensor_parallel_size"]}}
    tp = serve_spec["resources"]["tensor_parallel_size"]
    server = build_serve(serve_spec, reference, port=port, host="127.0.0.1",
                         gpus=verifier_gpus[:tp], api_key=REGENERATION_KEY)
    server = replace(server, stage="regenerating_data",
                     description=f"{server.description}, generating the verifier's own replies",
                     env={k: v for k, v in server.env.items() if k not in SECRET_ENV})
    client = StageCommand("regenerating_data", "speculators regenerate-responses",
                          regenerate_argv(spec, paths, f"http://127.0.0.1:{port}", done),
                          {**cuda_env([]), "TQDM_MININTERVAL": "10"})
    return [server, client]


def build_plan(spec: dict[str, Any], paths: JobPaths, *, port: int | None = None,
               gpus: tuple[list[int], list[int]] | None = None,
               regeneration_port: int | None = None) -> Plan:
    """The exact stages a job runs. Ports are fixed when the worker starts the servers."""
    from app.runtimes import vllm
    from app.runtimes import local

    runtime = {"vllm": vllm, "local": local}[spec["runtime"]]
    plan = runtime.build(spec, paths, port=port, gpus=gpus)
    if data_settings(spec)["regenerate"]:
        plan.stages[:0] = regeneration_commands(spec, paths, port=regeneration_port or "<port>",
                                                verifier_gpus=plan.verifier_gpus)
    evaluation = evaluation_settings(spec)
    if evaluation is not None:  # the drafter is known once training ends
        plan.stages.append(evaluation_command(spec, "<best checkpoint>", port="<port>",
                                              gpus=plan.verifier_gpus, api_key=""))
        for method, on in (("ngram", evaluation["ngram"]), (None, evaluation["baseline"])):
            if on:
                plan.stages.append(evaluation_command(spec, None, port="<port>",
                                                      gpus=plan.verifier_gpus, api_key="",
                                                      method=method))
    return plan


# vLLM's prompt-lookup drafter, as the evaluation's n-gram baseline runs it (and the local
# runtime's too): match the last 1-4 tokens earlier in the context, propose what followed.
NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 1}


def speculative_config(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The ``--speculative-config`` of a serve spec, the same JSON on both runtimes:
    ``{"method": "dflash", "model": DRAFTER, "num_speculative_tokens": N}``, ``{"method":
    "ngram", ...}`` (prompt lookup, no drafter), or None for the verifier alone (0 tokens)."""
    tokens = spec["num_speculative_tokens"]
    if tokens == 0:
        return None
    if spec.get("method", "dflash") == "ngram":
        return {"method": "ngram", "num_speculative_tokens": tokens, **NGRAM_LOOKUP}
    return {"method": "dflash", "model": spec["drafter"], "num_speculative_tokens": tokens}


# vLLM 0.33's per-request acceptance (``metrics.speculative_decoding`` in each response, the
# final usage chunk of a stream); vLLM 0.32's CPU wheel has it too. Only with speculation.
PER_REQUEST_METRICS = ["--per-request-spec-decode-metrics", "summary"]


def build_serve(spec: dict[str, Any], name: str, *, port: int | str, host: str,
                gpus: list[int] | None, api_key: str) -> StageCommand:
    """The serving command of a deployment: the verifier with its DFlash drafter (or, for the
    evaluation's baselines and data regeneration, n-gram drafting or the verifier alone)."""
    from app.runtimes import vllm
    from app.runtimes import local

    runtime = {"vllm": vllm, "local": local}[spec["runtime"]]
    return runtime.serve_command(spec, name, port=port, host=host, gpus=gpus or [],
                                 api_key=api_key)


EVALUATION_MODEL = "specdeck-evaluation"  # the name the evaluation engine serves


def evaluation_settings(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The job's evaluation settings (prompts, max_tokens, baselines, checkpoints), or None
    when it skips it. A job created before the evaluation existed gets the defaults."""
    from app.schemas.jobs import EvaluateSpec

    value = spec.get("evaluate", {})
    if value is False or value is None:
        return None
    return EvaluateSpec(**value).model_dump()


def evaluation_serve_spec(spec: dict[str, Any], drafter: str | None,
                          method: str | None = "dflash") -> dict[str, Any]:
    """A job's checkpoint as a deployment of it would be specified: its verifier, block_size - 1
    speculative tokens, the verifier's tensor parallelism, the job's runtime. ``method``
    "ngram" drafts by prompt lookup instead (the same number of tokens), None serves the
    verifier alone: the evaluation's baselines."""
    return {"verifier": spec["verifier_info"]["reference"],
            "drafter": drafter if method == "dflash" else None, "method": method or "dflash",
            "num_speculative_tokens": spec["speculator"]["block_size"] - 1 if method else 0,
            "runtime": spec["runtime"],
            "resources": {"tensor_parallel_size":
                          spec["resources"]["verifier"]["tensor_parallel_size"]}}


EVALUATION_ENGINES = {"dflash": "evaluating the trained drafter",
                      "ngram": "the n-gram (prompt lookup) baseline",
                      None: "the no-speculation baseline"}


def evaluation_command(spec: dict[str, Any], drafter: str | None, *, port: int | str,
                       gpus: list[int], api_key: str, method: str | None = "dflash"
                       ) -> StageCommand:
    """The evaluating stage's engine: exactly a deployment's serving command (``build_serve``)
    for ``drafter``, on the first tensor-parallel-size of the verifier's GPUs; or the same
    server with n-gram drafting, or with speculative decoding off (the baselines)."""
    serve_spec = evaluation_serve_spec(spec, drafter, method)
    tp = serve_spec["resources"]["tensor_parallel_size"]
    command = build_serve(serve_spec, EVALUATION_MODEL, port=port, host="127.0.0.1",
                          gpus=gpus[:tp], api_key=api_key)
    return replace(command, stage="evaluating",
                   description=f"{command.description}, {EVALUATION_ENGINES[method]}")


def spec_summary(spec: dict[str, Any]) -> str:
    return json.dumps({k: spec[k] for k in ("verifier", "runtime", "mode")}, sort_keys=True)
