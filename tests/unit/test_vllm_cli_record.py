"""Our builders against what the pinned vLLM and speculators accept, as their own parsers
recorded it (scripts/check-vllm-cli.sh, tests/data/vllm_cli/): every flag, every
``--speculative-config`` key and method, and the layer ids vLLM derives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.doctor.flags import (
    VLLM_SERVE,
    command_problems,
    program_of,
    representative_job,
    specdeck_commands,
)
from app.runtimes import SPECULATORS_VERSION, JobPaths, build_plan
from app.runtimes import vllm as vllm_runtime
from app.schemas.job_spec import JobSpec
from tests.support.vllm_cli_record import argument_sets, pinned_vllm, record

RUNTIMES = ("vllm", "local")
# The record is of the GPU pin (vllm 0.33). The local runtime's vLLM is the CPU wheel, another
# release, and is installed here: its commands are checked live against it
# (tests/unit/test_doctor_flags.py, test_live_check_reads_the_installed_parsers).
COMMANDS = [(runtime, name, argv) for runtime in RUNTIMES
            for name, argv in specdeck_commands(representative_job(runtime)).items()
            if (found := program_of(argv)) is not None
            and not (runtime == "local" and found[0] == VLLM_SERVE)]


def problems_of(argv: list[str]) -> list[str]:
    program, args = program_of(argv)
    return command_problems(args, argument_sets()[program])


def value_after(argv: list[str], option: str, count: int = 1) -> list[str]:
    i = argv.index(option)
    return argv[i + 1:i + 1 + count]


def test_the_record_is_of_the_pinned_versions() -> None:
    versions = record()["versions"]
    assert versions["vllm"] == pinned_vllm()
    assert versions["speculators"] == versions["hs-connectors"] == SPECULATORS_VERSION


def test_the_record_parsed_every_command_we_build() -> None:
    """A command added to a runtime has to be parsed by vLLM's or speculators' own code once:
    regenerate the record (docs/gpu.md)."""
    for runtime in RUNTIMES:
        built = {name for r, name, _ in COMMANDS if r == runtime}
        assert built == set(record()["commands"][runtime])


@pytest.mark.parametrize(("runtime", "name", "argv"), COMMANDS,
                         ids=[f"{r}: {n}" for r, n, _ in COMMANDS])
def test_the_recorded_programs_take_every_flag_we_build(runtime: str, name: str,
                                                        argv: list[str]) -> None:
    assert problems_of(argv) == []


@pytest.mark.parametrize(("program", "args", "expected"), [
    (VLLM_SERVE, ["--speculative-konfig", "{}"], "--speculative-konfig is not an option"),
    (VLLM_SERVE, ["--speculative-config", '{"method": "dflash", "draft_model": "d"}'],
     "no key 'draft_model'"),
    (VLLM_SERVE, ["--speculative-config", '{"method": "dflash3", "model": "d"}'],
     "method='dflash3'"),
    (VLLM_SERVE, ["--kv-transfer-config", '{"kv_connector": "HiddenStatesConnector"}'],
     "kv_connector='HiddenStatesConnector'"),
    (VLLM_SERVE, ["--kv-transfer-config", '{"kv_role": "producer"}'], "kv_role='producer'"),
    ("speculators train", ["--num-layer", "5"], "--num-layer is not an option"),
    ("speculators prepare-data", ["--skip-token-frequency"], "--skip-token-frequency"),
    ("speculators generate-offline-data", ["--hidden-states-dtype", "float32"],
     "--hidden-states-dtype"),
])
def test_a_flag_the_recorded_program_lacks_is_caught(program: str, args: list[str],
                                                     expected: str) -> None:
    problems = command_problems(args, argument_sets()[program])
    assert problems and expected in problems[0]


def test_a_builder_that_emits_an_unknown_flag_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_runtime, "PER_REQUEST_METRICS",
                        ["--per-request-spec-metrics", "summary"])
    failing = {name for name, argv in specdeck_commands(representative_job("vllm")).items()
               if program_of(argv) and problems_of(argv)}
    assert failing == {"serving: vLLM with the DFlash drafter, evaluating the trained drafter",
                       "serving: vLLM with n-gram (prompt lookup) drafting, "
                       "the n-gram (prompt lookup) baseline"}


# The layer ids, for the job the script recorded (the demo verifier, SpecDeck's default ids;
# its geometry beside them, which the record does not keep).
RECORDED = record()["jobs"]["vllm"]
JOB = JobSpec.load({**RECORDED, "verifier_info": {"hidden_size": 128, "vocab_size": 1536,
                                                  **RECORDED["verifier_info"]}})
LAYERS = record()["layer_ids"]
ROOT = Path("/w/job")
PATHS = JobPaths(root=ROOT, hidden_states=ROOT / "hidden_states", data=ROOT / "data",
                 checkpoints=ROOT / "checkpoints", log=ROOT / "job.log",
                 regenerated=ROOT / "regenerated.jsonl")


def built(stage: str) -> list[str]:
    return build_plan(JOB, PATHS, port=8000).stage(stage).argv


def test_the_hidden_states_server_captures_the_layers_we_ask_for() -> None:
    """vLLM's extract_hidden_states takes our ids as they are: the trainer's ids and the last
    layer ``n`` (the residual stream after the last decoder layer, before the final norm)."""
    config = json.loads(value_after(built("starting_verifier"), "--speculative-config")[0])
    ids = config["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == JOB.server_layer_ids == LAYERS["hidden_states_server_captures"]
    assert ids[-1] == LAYERS["verifier_num_hidden_layers"]


def test_vllm_serves_a_dflash_checkpoint_on_the_layers_the_trainer_learned_from() -> None:
    """The trainer's --target-layer-ids are the checkpoint's aux_hidden_state_layer_ids; served,
    vLLM captures those same ids from the verifier, which are the server's ids without ``n``.
    vLLM's own shift by one is internal: the DFlash model's ``target_layer_ids`` are id - 1."""
    trainer_ids = [int(i) for i in value_after(built("training"), "--target-layer-ids",
                                               len(JOB.speculator.target_layer_ids or []))]
    assert trainer_ids == LAYERS["trainer_parsed_target_layer_ids"]
    assert trainer_ids == LAYERS["checkpoint_aux_hidden_state_layer_ids"]
    assert trainer_ids == LAYERS["dflash_serving_captures"] == JOB.server_layer_ids[:-1]
    assert LAYERS["dflash_config_target_layer_ids"] == [i - 1 for i in trainer_ids]
