"""The evaluating stage's pure parts: reading the engine's speculative-decoding counters, the
acceptance-length math, picking held-out prompts, the serving command it starts, and what the
model card shows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.services.publishing import evaluation_card_rows
from tests.unit.test_runtimes import PATHS, SPEC, spec
from workers.pipeline.counters import SpecDecodeCounters, acceptance, parse_counters
from workers.pipeline.evaluate import summary
from workers.pipeline.held_out import FirstTurn, first_turn, last_conversations, match_prompts
from app.runtimes import (
    EVALUATION_MODEL,
    EngineKind,
    ServeSpec,
    build_plan,
    build_serve,
    evaluation_command,
)

# What vLLM's /metrics looks like: counters with a _total suffix, one series per engine.
VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 10.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 90.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 30.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 45.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 15.0
vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="m"} 1.7e9
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 25.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 15.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 10.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 5.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 1000.0
"""


def test_vllm_counters_are_summed_over_engines() -> None:
    counters = parse_counters(VLLM_METRICS)
    assert counters == SpecDecodeCounters(drafts=40, draft_tokens=120, accepted_tokens=60,
                                          accepted_per_position={0: 35, 1: 20, 2: 5},
                                          generation_tokens=1000)


def test_acceptance_length_is_one_plus_accepted_per_draft_from_the_difference() -> None:
    before = SpecDecodeCounters(drafts=10, draft_tokens=30, accepted_tokens=12,
                                accepted_per_position={0: 8, 1: 4})
    after = parse_counters(VLLM_METRICS)
    figures = acceptance(after - before, num_speculative_tokens=3)
    # 30 drafts, 48 accepted: AL = 1 + 48 / 30
    assert figures["mean_acceptance_length"] == 2.6
    assert figures["acceptance_rate_per_position"] == [0.9, 0.5333, 0.1667]
    assert figures["draft_acceptance_rate"] == round(48 / 90, 4)
    assert (figures["drafts"], figures["draft_tokens"], figures["accepted_tokens"]) == (30, 90, 48)


def test_no_drafts_means_no_acceptance_length() -> None:
    figures = acceptance(SpecDecodeCounters(), num_speculative_tokens=7)
    assert figures["mean_acceptance_length"] is None
    assert figures["acceptance_rate_per_position"] == []
    assert figures["draft_acceptance_rate"] is None


def test_positions_never_seen_count_as_zero() -> None:
    figures = acceptance(SpecDecodeCounters(drafts=4, draft_tokens=12, accepted_tokens=2,
                                            accepted_per_position={0: 2}), num_speculative_tokens=3)
    assert figures["mean_acceptance_length"] == 1.5
    assert figures["acceptance_rate_per_position"] == [0.5, 0.0, 0.0]


def test_vllms_recorded_metrics_read_as_the_acceptance() -> None:
    """vLLM 0.32.0's /metrics (CPU, n-gram drafting, 3 tokens), recorded around two requests."""
    recorded = Path(__file__).parents[1] / "data" / "vllm_metrics"
    before = parse_counters((recorded / "ngram-0.32.0-cpu-started.txt").read_text())
    after = parse_counters((recorded / "ngram-0.32.0-cpu-2-requests.txt").read_text())
    figures = acceptance(after - before, 3)
    assert figures["mean_acceptance_length"] == round(1 + 1 / 17, 4)
    assert figures["acceptance_rate_per_position"] == [round(1 / 17, 4), 0.0, 0.0]
    assert figures["drafts"] == 17 and figures["draft_tokens"] == 51


# --- held-out prompts -----------------------------------------------------------------------

def test_first_turn_of_sharegpt_and_openai_conversations() -> None:
    sharegpt = {"conversations": [{"from": "system", "value": "Be brief."},
                                  {"from": "human", "value": "Why is the sky blue?"},
                                  {"from": "gpt", "value": "Rayleigh scattering."},
                                  {"from": "human", "value": "And sunsets?"}]}
    assert first_turn(sharegpt) == FirstTurn(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}],
        "Rayleigh scattering.")
    openai = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                           {"role": "assistant", "content": "Hello"}]}
    assert first_turn(openai) == FirstTurn([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                                           "Hello")
    assert first_turn({"messages": [{"role": "assistant", "content": "I start"}]}) is None
    assert first_turn({"messages": [{"role": "user", "content": "  "}]}) is None


def chat(user: str, reply: str, system: str | None = None) -> dict:
    turns = ([{"from": "system", "value": system}] if system else []) + [
        {"from": "human", "value": user}, {"from": "gpt", "value": reply}]
    return {"conversations": turns}


def rendered(*parts: str) -> str:
    """A chat template's text around the turns, with its own whitespace."""
    return "".join(f"<|im_start|>{p}\n<|im_end|>\n" for p in parts) + "<|im_start|>assistant\n"


def test_validation_rows_are_traced_back_to_first_turns() -> None:
    records = [chat("Tell me about the old mill.", "It grinds wheat."),
               chat("What does the lantern do?", "It glows.", system="You are a guide."),
               chat("What does the lantern do?", "It glows at night."),  # same question, no system
               chat("Tell me about the river.", "It flows east.")]
    texts = [
        rendered("system You are a guide.", "user What does the lantern   do?"),  # spacing differs
        # a second-turn row: its prompt holds the first reply, so it is no first turn
        rendered("user Tell me about the old mill.", "assistant It grinds wheat.", "user More?"),
        rendered("user Tell me about the river."),
    ]
    turns = (first_turn(r) for r in records)
    prompts = match_prompts(texts, (t for t in turns if t is not None))
    assert prompts == [
        # the most specific conversation wins: the one with the system turn
        [{"role": "system", "content": "You are a guide."},
         {"role": "user", "content": "What does the lantern do?"}],
        [{"role": "user", "content": "Tell me about the river."}],
    ]


def test_last_conversations_fallback(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(chat(f"question {i}", f"answer {i}")) for i in range(10))
                    + "\n\n" + json.dumps({"messages": [{"role": "assistant", "content": "x"}]}) + "\n")
    assert last_conversations(path, 3) == [[{"role": "user", "content": f"question {i}"}]
                                           for i in (7, 8, 9)]
    assert len(last_conversations(path, 50)) == 10


# --- the engine it starts, the event and the card --------------------------------------------

@pytest.mark.parametrize("runtime", ["vllm", "local"])
def test_the_engine_is_a_deployments_serving_command(runtime: str) -> None:
    job = spec(runtime=runtime)
    command = evaluation_command(job, EngineKind.of(job, job.candidates[0]), "/w/job/checkpoints/2",
                                 port=9001, gpus=[0, 1, 2, 3], api_key="secret-key")
    deployment = build_serve(ServeSpec(verifier="Qwen/Qwen3-8B", drafter="/w/job/checkpoints/2",
                                       num_speculative_tokens=15, runtime=runtime,
                                       tensor_parallel_size=2),
                             EVALUATION_MODEL, port=9001, host="127.0.0.1", gpus=[0, 1],
                             api_key="secret-key")
    assert command.argv == deployment.argv and command.env == deployment.env
    assert command.stage == "evaluating"
    assert "secret-key" not in " ".join(command.argv)  # the key travels in the environment
    assert "secret-key" not in json.dumps(command.redacted_env())
    if runtime == "vllm":
        assert command.env["CUDA_VISIBLE_DEVICES"] == "0,1"  # tensor-parallel-size of the verifier's GPUs
        assert json.loads(command.argv[command.argv.index("--speculative-config") + 1]) == {
            "method": "dflash", "model": "/w/job/checkpoints/2", "num_speculative_tokens": 15}


def test_engines_that_share_the_gpus_share_their_memory() -> None:
    """The evaluation's engines run at once: on GPUs each asks for its share of their memory."""
    job = spec()
    alone = evaluation_command(job, EngineKind.baseline(None), None, port=1, gpus=[0, 1],
                               api_key="k", engines=3)
    assert alone.argv[alone.argv.index("--gpu-memory-utilization") + 1] == str(round(0.85 / 3, 3))
    one = evaluation_command(job, EngineKind.baseline(None), None, port=1, gpus=[0], api_key="k")
    assert "--gpu-memory-utilization" not in one.argv


def test_the_plan_shows_the_evaluation_unless_it_is_skipped() -> None:
    plan = build_plan(SPEC, PATHS, port=8123)
    evaluating = plan.stage("evaluating")
    assert "<best checkpoint>" in evaluating.argv[evaluating.argv.index("--speculative-config") + 1]
    assert evaluating.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "evaluating" not in [s.stage for s in build_plan(spec(evaluate=False), PATHS).stages]


EVALUATION = {"checkpoint_id": "ckpt_1", "epoch": 1, "runtime": "local",
              "engine": "vLLM with the DFlash drafter (CPU), evaluating the trained drafter", "prompts": 8,
              "requested_prompts": 8, "prompt_source": "validation split", "max_tokens": 64,
              "temperature": 0, "num_speculative_tokens": 3, "mean_acceptance_length": 2.3125,
              "acceptance_rate_per_position": [0.75, 0.4375, 0.125], "draft_acceptance_rate": 0.4375,
              "drafts": 16, "draft_tokens": 48, "accepted_tokens": 21, "completion_tokens": 37,
              "seconds": 2.5, "output_tokens_per_s": 14.8}
WITH_BASELINE = {**EVALUATION, "baseline_output_tokens_per_s": 10.0, "speedup": 1.48,
                 "outputs_identical_to_baseline": "8/8"}


def test_the_event_reads_as_a_sentence() -> None:
    assert summary(EVALUATION) == ("served mean acceptance length 2.31 over 8 held-out prompts "
                                   "(epoch 2 checkpoint, local runtime, 14.8 output tokens/s)")
    assert summary({**EVALUATION, "mean_acceptance_length": None}).startswith(
        "no speculative drafts were made over 8 held-out prompts")
    assert summary(WITH_BASELINE).endswith(
        "14.8 output tokens/s, 1.48x the verifier alone, outputs identical 8/8)")


def test_the_event_puts_the_served_number_first_and_labels_the_estimate() -> None:
    full = {**WITH_BASELINE, "ngram_mean_acceptance_length": 1.8, "beats_ngram": True,
            "trainer_eal_estimate": 4.4, "warnings": ["the trainer's estimate overstates it"]}
    line = summary(full)
    assert line.startswith("served mean acceptance length 2.31 (n-gram 1.80, no speculation 1.00)")
    assert "; the trainer's estimate was eal 4.40. Warning: the trainer's estimate" in line
    assert line.index("2.31") < line.index("4.40")


def test_ngram_figures_flag_a_drafter_that_does_not_beat_prompt_lookup() -> None:
    from workers.pipeline.evaluate import Measurement, SpecDecodeCounters, ngram_figures

    ngram = Measurement(SpecDecodeCounters(drafts=10, draft_tokens=30, accepted_tokens=12,
                                           accepted_per_position={0: 6, 1: 4, 2: 2}),
                        tokens=[40], seconds=[2.0])
    worse = ngram_figures({"mean_acceptance_length": 1.5}, ngram, 3)
    assert worse["ngram_mean_acceptance_length"] == 2.2 and worse["beats_ngram"] is False
    assert worse["warnings"] == ["the drafter does not beat n-gram drafting: served acceptance "
                                 "length 1.50 vs 2.20 for prompt lookup"]
    better = ngram_figures({"mean_acceptance_length": 3.1}, ngram, 3)
    assert better["beats_ngram"] is True and "warnings" not in better
    # n-gram made no draft at all (nothing in the context repeated): it stands at 1.0
    none = ngram_figures({"mean_acceptance_length": 1.2},
                         Measurement(SpecDecodeCounters(), [40], [2.0]), 3)
    assert none["ngram_mean_acceptance_length"] is None and none["beats_ngram"] is True


def test_estimate_figures_label_the_trainer_eal_and_warn_when_it_overstates() -> None:
    from workers.pipeline.evaluate import estimate_figures

    assert estimate_figures({"mean_acceptance_length": 3.0}, 3.2) == {
        "trainer_eal_estimate": 3.2, "served_vs_trainer_eal": 0.938}
    over = estimate_figures({"mean_acceptance_length": 1.65, "warnings": ["x"]}, 3.16)
    assert over["served_vs_trainer_eal"] == 0.522
    assert over["warnings"] == ["x", "the trainer's estimate (eal 3.16) overstates the served "
                                "acceptance length (1.65) by 1.9x"]
    assert estimate_figures({"mean_acceptance_length": 2.0}, None)["served_vs_trainer_eal"] is None


def test_the_gate_names_each_missed_condition_with_its_numbers() -> None:
    from workers.pipeline.gate import gate_failures

    evaluation = {"mean_acceptance_length": 1.65, "speedup": 0.55, "beats_ngram": False,
                  "ngram_mean_acceptance_length": 2.8}
    gate = {"min_acceptance_length": 3.0, "min_speedup": 1.0, "beat_ngram": True}
    assert gate_failures(gate, evaluation) == [
        "served mean acceptance length 1.65 < 3.00 required",
        "speedup 0.55x over the verifier alone < 1.00x required",
        "served mean acceptance length 1.65 does not beat n-gram drafting (2.80)"]
    passing = {"mean_acceptance_length": 3.4, "speedup": 1.9, "beats_ngram": True}
    assert gate_failures(gate, passing) == []
    assert gate_failures({"min_speedup": 1.0}, {"mean_acceptance_length": 3.0}) == [
        "speedup unknown over the verifier alone < 1.00x required"]


def test_the_baseline_gives_the_median_speedup_of_the_rounds_and_compares_the_outputs() -> None:
    """Each round's output tokens/s over the verifier alone's in that round; the median is the
    speedup, the range its spread. A prompt counts as identical when it is in every round."""
    from workers.pipeline.evaluate import Measurement, SpecDecodeCounters, baseline_figures

    counters = SpecDecodeCounters()
    drafted = Measurement(counters, tokens=[60, 60, 60], seconds=[2.0, 1.5, 3.0],
                          texts=[["a", "b", "c"], ["a", "b", "c"], ["a", "y", "c"]])
    alone = Measurement(counters, tokens=[60, 60, 60], seconds=[3.0, 3.0, 3.0],
                        texts=[["a", "b", "x"], ["a", "b", "x"], ["a", "b", "x"]])
    assert baseline_figures(drafted, alone) == {
        "baseline_output_tokens_per_s": 20.0, "speedup": 1.5, "speedups": [1.5, 2.0, 1.0],
        "speedup_spread": 1.0, "outputs_identical_to_baseline": "1/3", "lossless": False}
    assert drafted.completion_tokens == 60 and drafted.tokens_per_s == round(180 / 6.5, 2)
    nothing = Measurement(counters, tokens=[0], seconds=[0.0], texts=[["", "", ""]])
    assert baseline_figures(drafted, nothing)["speedup"] is None


def test_the_baseline_engine_serves_the_verifier_without_speculation() -> None:
    vllm = evaluation_command(SPEC, EngineKind.baseline(None), None, port=9001, gpus=[0, 1],
                              api_key="k")
    assert "--speculative-config" not in vllm.argv and vllm.argv[:3] == ["vllm", "serve", SPEC.verifier_info.reference]
    assert vllm.description.endswith("the no-speculation baseline")
    local = evaluation_command(spec(runtime="local"), EngineKind.baseline(None), None, port=9001,
                               gpus=[], api_key="k")
    assert "--speculative-config" not in local.argv
    assert local.argv[:5] == [sys.executable, "-m", "workers.runtimes.local.serve",
                              "--model", SPEC.verifier_info.reference]
    assert local.description.startswith("vLLM without speculative decoding (CPU)")


def test_the_ngram_baseline_uses_prompt_lookup_with_as_many_tokens() -> None:
    for runtime in ("vllm", "local"):
        command = evaluation_command(spec(runtime=runtime), EngineKind.baseline("ngram"), None,
                                     port=9001, gpus=[0], api_key="k")
        config = json.loads(command.argv[command.argv.index("--speculative-config") + 1])
        assert config == {"method": "ngram", "num_speculative_tokens": 15,
                          "prompt_lookup_max": 4, "prompt_lookup_min": 1}
        assert command.description.endswith("the n-gram (prompt lookup) baseline")


def test_speculative_config_is_the_same_json_on_both_runtimes() -> None:
    for runtime in ("vllm", "local"):
        job = spec(runtime=runtime)
        command = evaluation_command(job, EngineKind.of(job, job.candidates[0]),
                                     "/w/job/checkpoints/2", port=9001, gpus=[0], api_key="k")
        config = json.loads(command.argv[command.argv.index("--speculative-config") + 1])
        assert config == {"method": "dflash", "model": "/w/job/checkpoints/2",
                          "num_speculative_tokens": SPEC.speculator.block_size - 1}


def test_card_rows_name_how_it_was_measured_and_the_figures() -> None:
    rows = evaluation_card_rows(EVALUATION)
    assert rows == {
        "Served mean acceptance length": 2.3125,
        "Acceptance rate per position": [0.75, 0.4375, 0.125],
        "Drafted tokens accepted": 0.4375,
        "Runtime": "local (vLLM with the DFlash drafter (CPU), evaluating the trained drafter)",
        "Prompts": "8 (validation split), greedy, at most 64 new tokens each",
        "Speculative tokens per step": 3,
        "Completion tokens": 37,
        "Output tokens/s": 14.8,
    }
    assert list(rows)[0] == "Served mean acceptance length"
    full = evaluation_card_rows({**WITH_BASELINE, "ngram_mean_acceptance_length": 1.8,
                                 "beats_ngram": True, "trainer_eal_estimate": 4.4,
                                 "served_vs_trainer_eal": 0.526})
    assert full["n-gram (prompt lookup) acceptance length"] == 1.8
    assert full["Beats n-gram drafting"] == "yes"
    assert full["Trainer's eal (an estimate)"] == 4.4
    rows = evaluation_card_rows(WITH_BASELINE)
    assert rows["Speedup vs. no speculation"] == 1.48
    assert rows["Outputs identical to the verifier alone"] == "8/8"
    assert evaluation_card_rows(None) is None and evaluation_card_rows({}) is None


class FakeCaller:
    """Answers in place of an engine: records the order it was asked in."""

    asked: list[str] = []

    def __init__(self, ctx, engine) -> None:
        self.engine = engine

    def call(self, method: str, path: str, body=None):
        from types import SimpleNamespace

        return SimpleNamespace(text="")

    def complete(self, prompt, max_tokens: int) -> tuple[int, float, str]:
        FakeCaller.asked.append(f"{self.engine.wanted.key}:{prompt[0]['content']}")
        return 10, 0.5, f"reply to {prompt[0]['content']}"

    def close(self) -> None:
        pass


def test_the_engines_answer_each_prompt_in_turns_rotating_and_round_after_round(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from app.schemas.jobs import EvaluateSpec

    stage = sys.modules["workers.pipeline.evaluate"]  # the package exports a function of its name
    monkeypatch.setattr(stage, "Caller", FakeCaller)
    FakeCaller.asked = []
    stopped: list[str] = []
    ctx = SimpleNamespace(spec=spec(runtime="local"), check=lambda: None,
                          stop=lambda proc: stopped.append(proc))
    engines = [stage.Engine(SimpleNamespace(key=key, drafter=None), None, key, "", {}, None)
               for key in ("a", "b", "c")]
    reported: list[str] = []
    steps = SimpleNamespace(report=lambda what: reported.append(what))
    prompts = [[{"role": "user", "content": p}] for p in ("p1", "p2")]
    stage.serve_in_turns(ctx, engines, prompts, EvaluateSpec(rounds=2, max_tokens=8), steps)
    warmup, turns = FakeCaller.asked[:3], FakeCaller.asked[3:]
    assert warmup == ["a:p1", "b:p1", "c:p1"]  # one request each first, not counted
    assert turns == ["a:p1", "b:p1", "c:p1", "b:p2", "c:p2", "a:p2",  # round 1
                     "c:p1", "a:p1", "b:p1", "a:p2", "b:p2", "c:p2"]  # round 2
    assert [e.tokens for e in engines] == [[20, 20]] * 3
    assert engines[0].texts == [["reply to p1", "reply to p2"]] * 2
    assert reported == ["round 1 of 2: prompt 1 of 2 done", "round 1 of 2: prompt 2 of 2 done",
                        "round 2 of 2: prompt 1 of 2 done", "round 2 of 2: prompt 2 of 2 done"]
    assert stopped == ["a", "b", "c"]  # each engine stopped once measured


def test_several_checkpoints_log_to_a_file_each() -> None:
    from app.schemas.jobs import EvaluateSpec
    from workers.pipeline.evaluate import Drafter, engines_wanted

    job = spec()
    [candidate] = job.candidates
    wanted = engines_wanted(job, [Drafter(candidate, "a", 1, "/w/1", None),
                                  Drafter(candidate, "b", 2, "/w/2", None)],
                            EvaluateSpec(ngram=False, baseline=False))
    assert [(w.key, w.label, w.log_name) for w in wanted] == [
        ("a", "the epoch 2 checkpoint", "evaluation-engine-epoch-2.log"),
        ("b", "the epoch 3 checkpoint", "evaluation-engine-epoch-3.log")]
    single = engines_wanted(job, [Drafter(candidate, "a", 1, "/w/1", None)], EvaluateSpec())
    assert [(w.label, w.log_name) for w in single] == [
        ("the trained drafter", "evaluation-engine.log"), ("n-gram drafting", "ngram-engine.log"),
        ("the verifier alone", "baseline-engine.log")]


def test_ports_picked_together_are_distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import readiness

    picks = iter([5000, 5000, 5001])  # the OS may hand out a port again until it is bound
    monkeypatch.setattr(readiness, "free_port", lambda: next(picks))
    assert readiness.free_ports(2) == [5000, 5001]
