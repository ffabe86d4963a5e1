"""vLLM's and speculators' own parsers on every command line SpecDeck builds; run by
scripts/check-vllm-cli.sh in its throwaway venv, which has the pinned vLLM (docs/gpu.md).

With no GPU and no download: a tiny local verifier (the local runtime's demo model, untrained)
and an untrained DFlash checkpoint of it (speculators' own constructor) stand in for a real
pair. For each runtime's representative job (app/doctor/flags.py), each command line is parsed
by its program's own code:

- ``vllm serve``: vLLM's CLI parser with its ``serve`` subcommand and that subcommand's
  validation, then ``AsyncEngineArgs.from_cli_args`` and ``create_engine_config``, which
  builds vLLM's whole config: the ``SpeculativeConfig`` (for DFlash it loads the checkpoint's
  config.json through vLLM's speculators config parser), the ``KVTransferConfig``. vLLM runs on
  its CPU platform here (``VLLM_TARGET_DEVICE=cpu``): with no GPU it finds none otherwise.
- speculators' trainer: ``TrainConfig.resolve`` (its argparse parser and its config validation);
  its data commands: their typer commands' ``make_context`` (parsing, types, callbacks).

Any rejection stops the script. The result (versions, the argument sets, what each command
parsed to, the layer ids vLLM derives) is written as JSON to ``--out``/vllm-VERSION.json, with
the temporary directory and this interpreter written as ``$WORK`` and ``python``.
"""

from __future__ import annotations

import os

# Before vLLM is imported: everything is local, and vLLM's platform is chosen at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from app.doctor.flags import (  # noqa: E402
    SPECULATORS_TRAIN,
    VLLM_SERVE,
    program_of,
    representative_job,
    speculators_argument_sets,
    speculators_commands,
    specdeck_commands,
    vllm_argument_set,
    vllm_serve_parser,
)
from app.schemas.job_spec import JobSpec  # noqa: E402

PACKAGES = ("vllm", "torch", "transformers", "speculators", "hs-connectors")


def jsonable(value: Any) -> Any:
    """A parsed value as JSON: enums by value, paths and other objects as strings."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if hasattr(value, "value") and hasattr(value, "name"):  # an Enum
        return jsonable(value.value)
    return str(value)


def unmet_requirements(package: str) -> list[str]:
    """``package``'s declared requirements that the venv does not meet (the install relaxes
    one floor the index cannot meet; this records which and by how much)."""
    from packaging.requirements import Requirement

    unmet = []
    for text in importlib.metadata.requires(package) or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            installed = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            unmet.append(f"{req} (not installed)")
            continue
        if not req.specifier.contains(installed, prereleases=True):
            unmet.append(f"{req} ({installed} installed)")
    return unmet


def option_dests(parser: argparse.ArgumentParser) -> dict[str, str]:
    return {o: action.dest for action in parser._actions for o in action.option_strings}


def given_options(args: Sequence[str]) -> dict[str, str | None]:
    """The options in ``args``, each with the token after it (its value, if it takes one)."""
    return {t: (args[i + 1] if i + 1 < len(args) else None)
            for i, t in enumerate(args) if t.startswith("--")}


def parse_vllm_serve(argv: Sequence[str]) -> dict[str, Any]:
    """``vllm serve`` as vLLM runs it, up to the engine's config (no model is loaded)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
        get_eagle3_aux_layers_from_config,
    )

    _, args = program_of(argv)
    parser = vllm_serve_parser()
    namespace = parser.parse_args(["serve", argv[2], *args])
    ServeSubcommand().validate(namespace)
    namespace.model = namespace.model_tag  # what ServeSubcommand.cmd does first
    config = AsyncEngineArgs.from_cli_args(namespace).create_engine_config()

    serve = parser._subparsers._group_actions[0].choices["serve"]
    dests = option_dests(serve)
    spec = config.speculative_config
    kv = config.kv_transfer_config
    engine: dict[str, Any] = {
        "model": config.model_config.model,
        "served_model_name": config.model_config.served_model_name,
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "data_parallel_size": config.parallel_config.data_parallel_size,
        "gpu_memory_utilization": config.cache_config.gpu_memory_utilization,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "attention_backend": jsonable(config.attention_config.backend),
        "speculative_config": None,
        "kv_transfer_config": None,
    }
    if spec is not None:
        draft = spec.draft_model_config.hf_config
        engine["speculative_config"] = {
            "method": spec.method,
            "model": spec.model,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "prompt_lookup_min": spec.prompt_lookup_min,
            "prompt_lookup_max": spec.prompt_lookup_max,
            "draft_architectures": jsonable(getattr(draft, "architectures", None)),
            "draft_eagle_aux_hidden_state_layer_ids":
                jsonable(getattr(draft, "eagle_aux_hidden_state_layer_ids", None)),
            "draft_dflash_config": jsonable(getattr(draft, "dflash_config", None)),
            # What the model runner captures from the verifier (vLLM's own function).
            "aux_layers_captured": jsonable(get_eagle3_aux_layers_from_config(spec)),
        }
    if kv is not None:
        engine["kv_transfer_config"] = {"kv_connector": kv.kv_connector, "kv_role": kv.kv_role,
                                        "kv_connector_extra_config": kv.kv_connector_extra_config}
    return {"parsed": {o: parsed_value(getattr(namespace, dests[o]), raw)
                       for o, raw in given_options(args).items()},
            "engine": engine}


def parsed_value(value: Any, raw: str | None) -> Any:
    """A namespace value as JSON; a config object (vLLM parses ``--kv-transfer-config`` into
    one, with a fresh engine id) by the fields our JSON set."""
    if not dataclasses.is_dataclass(value):
        return jsonable(value)
    return {k: jsonable(getattr(value, k)) for k in json.loads(raw or "{}")}


def parse_speculators(argv: Sequence[str]) -> dict[str, Any]:
    """A speculators command as speculators parses and validates it (nothing runs)."""
    program, args = program_of(argv)
    if program == SPECULATORS_TRAIN:
        from speculators.train.config import TrainConfig
        from speculators.train.config.resolution import build_parser

        flat = TrainConfig.resolve(list(args)).flatten()
        dests = option_dests(build_parser())
        return {"parsed": {o: jsonable(flat[dests[o]]) for o in given_options(args)}}
    name = program.split()[1]
    command = speculators_commands()[name]
    context = command.make_context(name, list(args))
    names = {o: p.name for p in command.params for o in (*p.opts, *p.secondary_opts)}
    return {"parsed": {o: jsonable(context.params[names[o]]) for o in given_options(args)}}


def record(work: Path) -> dict[str, Any]:
    from transformers import AutoConfig

    from tests.support.drafters import write_untrained_drafter
    from workers.runtimes.local.demo import create_demo_model

    verifier = create_demo_model(work / "verifier", train_steps=0)
    layers = AutoConfig.from_pretrained(verifier).num_hidden_layers
    dataset = work / "chat.jsonl"  # regenerate-responses checks that its dataset exists
    dataset.write_text("")
    jobs = {runtime: {**representative_job(runtime, verifier=str(verifier),
                                           num_hidden_layers=layers),
                      "dataset_path": str(dataset)}
            for runtime in ("vllm", "local")}
    block_size = jobs["vllm"]["speculator"]["block_size"]
    drafter = write_untrained_drafter(verifier, work / "drafter", block_size=block_size)
    checkpoint = json.loads((drafter / "config.json").read_text())

    commands: dict[str, dict[str, Any]] = {}
    for runtime, job in jobs.items():
        commands[runtime] = {}
        for name, argv in specdeck_commands(job, drafter=str(drafter),
                                            root=work / "job").items():
            found = program_of(argv)
            if found is None:
                continue  # SpecDeck's own program
            parse = parse_vllm_serve if found[0] == VLLM_SERVE else parse_speculators
            commands[runtime][name] = {"program": found[0], "argv": list(argv), **parse(argv)}

    def speculative(command: dict[str, Any]) -> dict[str, Any]:
        return (command.get("engine") or {}).get("speculative_config") or {}

    vllm_commands = commands["vllm"].values()
    server = next(speculative(c) for c in vllm_commands
                  if speculative(c).get("method") == "extract_hidden_states")
    dflash = next(speculative(c) for c in vllm_commands if speculative(c).get("method") == "dflash")
    trainer = next(c for c in vllm_commands if c["program"] == SPECULATORS_TRAIN)
    job = jobs["vllm"]
    layer_ids = {
        "verifier_num_hidden_layers": layers,
        "specdeck_server_layer_ids": JobSpec.load(job).server_layer_ids,
        "specdeck_trainer_layer_ids": job["speculator"]["target_layer_ids"],
        "trainer_parsed_target_layer_ids": trainer["parsed"]["--target-layer-ids"],
        "checkpoint_aux_hidden_state_layer_ids": checkpoint["aux_hidden_state_layer_ids"],
        "hidden_states_server_captures": server["aux_layers_captured"],
        "dflash_serving_captures": dflash["aux_layers_captured"],
        "dflash_config_target_layer_ids": dflash["draft_dflash_config"]["target_layer_ids"],
    }
    if layer_ids["checkpoint_aux_hidden_state_layer_ids"] != layer_ids[
            "trainer_parsed_target_layer_ids"]:
        raise SystemExit("the stand-in checkpoint's layer ids are not the job's: "
                         f"{layer_ids}")

    argument_sets = {VLLM_SERVE: vllm_argument_set(), **speculators_argument_sets()}
    return {
        "generated_by": "scripts/check-vllm-cli.sh",
        "platform": f"vLLM's {os.environ['VLLM_TARGET_DEVICE']} platform, no GPU "
                    f"({platform.machine()}, Python {platform.python_version()})",
        "versions": {p: importlib.metadata.version(p) for p in PACKAGES},
        "unmet_requirements": {"vllm": unmet_requirements("vllm")},
        "argument_sets": {name: s.to_json() for name, s in sorted(argument_sets.items())},
        "jobs": jobs,
        "commands": commands,
        "layer_ids": layer_ids,
    }


def sanitized(data: Any, work: Path) -> Any:
    """The record without this run's temporary directory and interpreter."""
    text = json.dumps(data, indent=2, sort_keys=True)
    for path, name in ((str(work.resolve()), "$WORK"), (str(work), "$WORK"),
                       (sys.executable, "python")):
        text = text.replace(json.dumps(path)[1:-1], name)
    return json.loads(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the record")
    out = parser.parse_args().out
    with tempfile.TemporaryDirectory(prefix="check-vllm-cli-") as tmp:
        work = Path(tmp)
        data = sanitized(record(work), work)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"vllm-{data['versions']['vllm']}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"recorded {path}")


if __name__ == "__main__":
    main()
