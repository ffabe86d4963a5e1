"""Command builders for the two runtimes. The orchestration is shared; only the commands differ.

``build_plan`` is what the worker runs and what ``GET /api/jobs/{id}/plan`` shows. Every builder
takes the job's typed spec (``app.schemas.job_spec.JobSpec``) or a serving spec (``ServeSpec``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from app.schemas.drafters import KINDS
from app.schemas.job_spec import Candidate, JobSpec
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

    def checkpoints_of(self, spec: JobSpec, candidate: Candidate) -> Path:
        """Where a candidate's trainer saves: the job's checkpoints directory, or in a bake-off
        one directory per candidate."""
        if not spec.is_bakeoff:
            return self.checkpoints
        return self.root / "candidates" / candidate.name / "checkpoints"

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
    candidate: str | None = None  # the bake-off candidate it trains or serves

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

    def training(self, candidate: Candidate) -> StageCommand:
        """A candidate's trainer (a plain job's: its one training stage)."""
        return [s for s in self.stages if s.stage == "training"][candidate.index]


def cuda_env(gpus: list[int]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}


def trainer_gpu_count(spec: JobSpec) -> int:
    """The GPUs the job's trainers take of their own: none when they share the verifier's,
    one set per candidate when a bake-off trains them side by side."""
    res = spec.resources
    if res.share_verifier_gpus:
        return 0
    return res.trainer_gpus * (len(spec.candidates) if res.candidates_in_parallel else 1)


def default_gpus(spec: JobSpec) -> tuple[list[int], list[int]]:
    """Verifier GPUs first, then trainer GPUs: disjoint by construction (the scheduler
    allocates them the same way)."""
    n_verifier = spec.verifier_gpu_count
    return list(range(n_verifier)), list(range(n_verifier, n_verifier + trainer_gpu_count(spec)))


def trainer_gpus(spec: JobSpec, verifier: list[int], trainer: list[int],
                 candidate: Candidate | None = None) -> list[int]:
    """A trainer's GPUs: its own, or with ``share_verifier_gpus`` the first ``trainer_gpus`` of
    the verifier's (the scheduler allocated it none); in a bake-off trained side by side, the
    candidate's share of the trainers' GPUs."""
    res = spec.resources
    if res.share_verifier_gpus:
        return verifier[:res.trainer_gpus]
    if res.candidates_in_parallel and candidate is not None:
        start = candidate.index * res.trainer_gpus
        return trainer[start:start + res.trainer_gpus]
    return trainer


def dataset_file(spec: JobSpec, paths: JobPaths) -> Path:
    """The job's JSONL: the upload (or file under the data root), or a capture's rows as the
    data stage writes them out."""
    if spec.dataset_kind == "capture":
        return paths.captured
    return Path(spec.dataset_path or "")


def regeneration_source(spec: JobSpec, paths: JobPaths) -> str:
    """What regenerate-responses reads: the uploaded JSONL (it reads OpenAI ``messages`` and
    ShareGPT ``conversations``), or a public preset by name (speculators downloads it), or the
    preset's local copy under the mirror directory when there is one."""
    if spec.dataset_kind != "public":
        return str(dataset_file(spec, paths))
    preset = spec.dataset_path or ""
    if paths.mirror is not None and (paths.mirror / f"{preset}.jsonl").is_file():
        return str((paths.mirror / f"{preset}.jsonl").resolve())
    return preset


def training_data(spec: JobSpec, paths: JobPaths) -> str:
    """The JSONL prepare-data reads: the regenerated rows (pre-tokenized ``input_ids`` and
    ``loss_mask``, the verifier's exact ids), or the conversations. speculators 0.9.0 reads only
    a ``conversations`` column, so an OpenAI ``messages`` file is handed over through a copy with
    the key renamed."""
    if spec.data.regenerate:
        return str(paths.regenerated)
    if spec.dataset_format == "messages":
        return str(paths.root / "conversations.jsonl")
    return str(dataset_file(spec, paths))


def prepare_data_argv(spec: JobSpec, paths: JobPaths, endpoint: str) -> list[str]:
    return [
        sys.executable, "-m", "speculators", "prepare-data",
        "--model", spec.verifier_info.reference,
        "--data", training_data(spec, paths),
        "--output", str(paths.data),
        "--seq-length", str(spec.total_seq_len),
        "--render-endpoint", endpoint,
        "--no-skip-token-freq",
    ]


def generate_offline_argv(spec: JobSpec, paths: JobPaths, endpoint: str) -> list[str]:
    return [
        sys.executable, "-m", "speculators", "generate-offline-data",
        "--model", spec.verifier_info.reference,
        "--endpoint", f"{endpoint}/v1",
        "--preprocessed-data", str(paths.data),
        "--output", str(paths.data / "hidden_states"),
        "--validate-outputs",
    ]


# speculators' trainer, through SpecDeck's wrapper: it registers the hidden-states backend that
# reads a candidate's layers out of the server's union (workers/runtimes/layer_selection.py) and,
# without an accelerator, patches the trainer's device choices.
TRAINER_WRAPPER = "workers.runtimes.local.train"
LAYER_SELECTION_BACKEND = "specdeck-layers"  # its --hidden-states-backend name
SLOTS_FLAG = "--hidden-states-slots"  # and its one flag: the slots to keep, comma-separated


def layer_slots(server_layer_ids: list[int], target_layer_ids: list[int]) -> list[int]:
    """Where a candidate's layers are among the server's (its ids in ascending order, as the
    server stacks them), and the last slot: the verifier's final layer, which the trainer
    always takes last."""
    return ([server_layer_ids.index(i) for i in sorted(target_layer_ids)]
            + [len(server_layer_ids) - 1])


def selects_layers(spec: JobSpec, candidate: Candidate) -> bool:
    """Whether the server extracts layers this candidate does not learn from (a bake-off whose
    candidates' layer ids differ): its trainer reads its own through the layer-selection
    backend."""
    return list(candidate.drafter.target_layer_ids or []) != spec.server_layer_ids[:-1]


def trainer_args(spec: JobSpec, candidate: Candidate, paths: JobPaths, endpoint: str
                 ) -> list[str]:
    """The speculators trainer's flags, shared by both runtimes: the data and server, then the
    candidate's own (its kind's, ``DrafterBase.trainer_flags``). A warm start (``init_from``)
    loads the checkpoint with ``--from-pretrained``; its architecture comes with it, and
    speculators refuses the decoder-shaping flags (``--num-layers``) beside it."""
    warm = spec.init_from_info
    # speculators 0.9.0: --on-generate is deprecated (generated files are always deleted after
    # loading). online generates everything on demand; offline trains only on the cache made by
    # generate-offline-data; hybrid uses that cache and generates what is missing.
    on_missing = {"online": "generate", "offline": "raise", "hybrid": "generate"}[spec.mode]
    args = [
        "--verifier-name-or-path", spec.verifier_info.reference,
        "--data-path", str(paths.data),
        "--vllm-endpoint", f"{endpoint}/v1",
        "--on-missing", on_missing,
        "--save-path", str(paths.checkpoints_of(spec, candidate)),
        *(["--from-pretrained", warm.path] if warm else []),
        *candidate.drafter.trainer_flags(warm=warm is not None),
    ]
    if selects_layers(spec, candidate):
        chosen = layer_slots(spec.server_layer_ids, list(candidate.drafter.target_layer_ids or []))
        args += ["--hidden-states-backend", LAYER_SELECTION_BACKEND,
                 SLOTS_FLAG, ",".join(str(s) for s in chosen)]
    return args


def regenerate_argv(spec: JobSpec, paths: JobPaths, endpoint: str, done: int = 0) -> list[str]:
    """speculators regenerate-responses against the verifier served without speculation:
    every reply written anew by the verifier, with its exact prompt and completion ids. It
    resumes from its output file (rows are appended per finished conversation); its --limit
    counts only the conversations of this run, so a resume asks for those not ``done`` yet."""
    data = spec.data
    argv = [
        sys.executable, "-m", "speculators", "regenerate-responses",
        "--endpoint", f"{endpoint}/v1/chat/completions",
        "--model", spec.verifier_info.reference,
        "--dataset", regeneration_source(spec, paths),
        "--outfile", str(paths.regenerated),
        "--resume",
        "--max-tokens", str(data.max_tokens),
        "--concurrency", str(data.concurrency),
        "--sampling-params", json.dumps({"temperature": data.temperature}),
    ]
    if data.max_samples is not None:
        argv += ["--limit", str(max(0, data.max_samples - done))]
    return argv


REGENERATION_KEY = ""  # regenerate-responses sends no API key: the server listens on loopback


class ServeSpec(BaseModel):
    """What a serving command serves: the verifier with a drafter of some kind, n-gram drafting
    (``method`` "ngram"), or the verifier alone (0 speculative tokens). A deployment's, an
    evaluation engine's, data regeneration's."""

    model_config = ConfigDict(frozen=True)

    verifier: str
    drafter: str | None = None
    method: Literal["dflash", "eagle3", "dspark", "ngram"] = "dflash"
    num_speculative_tokens: int
    runtime: Literal["vllm", "local"]
    tensor_parallel_size: int = 1
    # vllm runtime: the share of each GPU's memory, when several engines share the GPUs.
    gpu_memory_utilization: float | None = None

    @classmethod
    def of_deployment(cls, spec: dict[str, Any]) -> "ServeSpec":
        """A deployment row's spec: its drafter's kind (DFlash before kinds were recorded), or a
        serving method it names itself (n-gram drafting)."""
        method = spec.get("method") or KINDS[spec.get("kind", "dflash")].vllm_method
        return cls(verifier=spec["verifier"], drafter=spec.get("drafter"),
                   method=method, num_speculative_tokens=spec["num_speculative_tokens"],
                   runtime=spec["runtime"],
                   tensor_parallel_size=spec["resources"]["tensor_parallel_size"])


def regeneration_commands(spec: JobSpec, paths: JobPaths, *, port: int | str,
                          verifier_gpus: list[int], done: int = 0) -> list[StageCommand]:
    """The regenerating_data stage: the verifier served alone (a deployment's command with 0
    speculative tokens, named as the verifier so regenerate-responses loads its tokenizer),
    then regenerate-responses against it."""
    reference = spec.verifier_info.reference
    tp = spec.resources.verifier.tensor_parallel_size
    serve = ServeSpec(verifier=reference, num_speculative_tokens=0, runtime=spec.runtime,
                      tensor_parallel_size=tp)
    server = build_serve(serve, reference, port=port, host="127.0.0.1", gpus=verifier_gpus[:tp],
                         api_key=REGENERATION_KEY)
    server = replace(server, stage="regenerating_data",
                     description=f"{server.description}, generating the verifier's own replies",
                     env={k: v for k, v in server.env.items() if k not in SECRET_ENV})
    client = StageCommand("regenerating_data", "speculators regenerate-responses",
                          regenerate_argv(spec, paths, f"http://127.0.0.1:{port}", done),
                          {**cuda_env([]), "TQDM_MININTERVAL": "10"})
    return [server, client]


def build_plan(spec: JobSpec, paths: JobPaths, *, port: int | None = None,
               gpus: tuple[list[int], list[int]] | None = None,
               regeneration_port: int | None = None) -> Plan:
    """The exact stages a job runs. Ports are fixed when the worker starts the servers."""
    from app.runtimes import local, vllm

    runtime = {"vllm": vllm, "local": local}[spec.runtime]
    plan = runtime.build(spec, paths, port=port, gpus=gpus)
    if spec.data.regenerate:
        plan.stages[:0] = regeneration_commands(spec, paths, port=regeneration_port or "<port>",
                                                verifier_gpus=plan.verifier_gpus)
    evaluation = spec.evaluate
    if evaluation is not None:  # the drafters are known once training ends
        engines = evaluation_engines(spec)
        for candidate in spec.candidates:
            drafter = f"<best checkpoint of {candidate.name}>" if spec.is_bakeoff \
                else "<best checkpoint>"
            plan.stages.append(replace(evaluation_command(
                spec, EngineKind.of(spec, candidate), drafter, port="<port>",
                gpus=plan.verifier_gpus, api_key="", engines=engines),
                candidate=candidate.name if spec.is_bakeoff else None))
        for method, on in (("ngram", evaluation.ngram), (None, evaluation.baseline)):
            if on:
                plan.stages.append(evaluation_command(spec, EngineKind.baseline(method), None,
                                                      port="<port>", gpus=plan.verifier_gpus,
                                                      api_key="", engines=engines))
    return plan


# vLLM's prompt-lookup drafter, as the evaluation's n-gram baseline runs it (and the local
# runtime's too): match the last 1-4 tokens earlier in the context, propose what followed.
NGRAM_LOOKUP = {"prompt_lookup_max": 4, "prompt_lookup_min": 1}


def speculative_config(serve: ServeSpec) -> dict[str, Any] | None:
    """The ``--speculative-config`` of a serving spec, the same JSON on both runtimes:
    ``{"method": KIND'S METHOD, "model": DRAFTER, "num_speculative_tokens": N}``, ``{"method":
    "ngram", ...}`` (prompt lookup, no drafter), or None for the verifier alone (0 tokens)."""
    tokens = serve.num_speculative_tokens
    if tokens == 0:
        return None
    if serve.method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": tokens, **NGRAM_LOOKUP}
    return {"method": serve.method, "model": serve.drafter, "num_speculative_tokens": tokens}


# vLLM 0.33's per-request acceptance (``metrics.speculative_decoding`` in each response, the
# final usage chunk of a stream); vLLM 0.32's CPU wheel has it too. Only with speculation.
PER_REQUEST_METRICS = ["--per-request-spec-decode-metrics", "summary"]


def build_serve(serve: ServeSpec, name: str, *, port: int | str, host: str,
                gpus: list[int] | None, api_key: str) -> StageCommand:
    """The serving command of a deployment: the verifier with its drafter (or, for the
    evaluation's baselines and data regeneration, n-gram drafting or the verifier alone)."""
    from app.runtimes import local, vllm

    runtime = {"vllm": vllm, "local": local}[serve.runtime]
    return runtime.serve_command(serve, name, port=port, host=host, gpus=gpus or [],
                                 api_key=api_key)


EVALUATION_MODEL = "specdeck-evaluation"  # the name the evaluation engine serves


@dataclass(frozen=True)
class EngineKind:
    """What an evaluation engine serves: a candidate's drafter (its kind's method and draft
    length), n-gram drafting, or the verifier alone (``method`` None)."""

    method: str | None
    num_speculative_tokens: int
    what: str  # for its description

    @classmethod
    def of(cls, spec: JobSpec, candidate: Candidate) -> "EngineKind":
        drafter = candidate.drafter
        return cls(type(drafter).vllm_method, drafter.num_speculative_tokens(),
                   f"evaluating candidate {candidate.name}" if spec.is_bakeoff
                   else "evaluating the trained drafter")

    @classmethod
    def baseline(cls, method: str | None) -> "EngineKind":
        return cls(method, 0, {"ngram": "the n-gram (prompt lookup) baseline",
                               None: "the no-speculation baseline"}[method])


def evaluation_engines(spec: JobSpec) -> int:
    """How many engines the evaluation serves at once: every candidate's, n-gram's and the
    verifier alone's, so that they answer the same prompts in turns."""
    evaluation = spec.evaluate
    assert evaluation is not None
    return len(spec.candidates) + evaluation.ngram + evaluation.baseline


def evaluation_command(spec: JobSpec, engine: EngineKind, drafter: str | None, *,
                       port: int | str, gpus: list[int], api_key: str, engines: int = 1,
                       ) -> StageCommand:
    """An evaluating engine: exactly a deployment's serving command (``build_serve``) for
    ``drafter``, on the first tensor-parallel-size of the verifier's GPUs; or the same server
    with n-gram drafting (as many tokens as the first candidate drafts), or with speculative
    decoding off (the baselines). ``engines`` share the GPUs: each gets its share of their
    memory."""
    tp = spec.resources.verifier.tensor_parallel_size
    if engine.method == "ngram":
        tokens = spec.candidates[0].drafter.num_speculative_tokens()
    else:
        tokens = engine.num_speculative_tokens
    serve = ServeSpec(verifier=spec.verifier_info.reference, drafter=drafter,
                      method=engine.method or "dflash", num_speculative_tokens=tokens,
                      runtime=spec.runtime, tensor_parallel_size=tp,
                      gpu_memory_utilization=round(0.85 / engines, 3) if engines > 1 else None)
    command = build_serve(serve, EVALUATION_MODEL, port=port, host="127.0.0.1", gpus=gpus[:tp],
                          api_key=api_key)
    return replace(command, stage="evaluating", description=f"{command.description}, {engine.what}")


def spec_summary(spec: JobSpec) -> str:
    return json.dumps({"verifier": spec.verifier, "runtime": spec.runtime, "mode": spec.mode},
                      sort_keys=True)
