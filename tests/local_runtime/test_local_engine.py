"""The local serving engine: real server subprocesses (the verifier with a DFlash drafter, with
n-gram drafting, and alone), the ``openai`` SDK and ``speculators regenerate-responses`` as
clients, and outputs compared with the demo verifier's plain greedy decoding.

The trained drafter comes from a one-epoch CPU training run against the session's
hidden-states server (the command of test_local_training.py, with a 2-layer draft).
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from safetensors.torch import load_file
from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.local_runtime.conftest import TRAINER_LAYER_IDS, Server
from tests.local_runtime.procs import (
    PYTHON,
    background,
    child_env,
    free_port,
    run_logged,
    wait_until_ready,
)
from app.runtimes import NGRAM_LOOKUP
from app.runtimes.local import serve_command
from workers.runtimes.local.engine import (
    DFlashEngine,
    LocalEngine,
    _parse_args,
    build_app,
    resolve_drafter_dir,
)
from workers.runtimes.local.speculation import NgramProposer, SpeculativeConfig

pytestmark = pytest.mark.slow

MAX_TOKENS = 48
PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Tell me about the quiet river in the north."}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Explain weather to a cold mountain."},
    ],
    [{"role": "user", "content": "Write a short story about a brave robot that paints a castle."}],
    [{"role": "user", "content": "Give me three facts about music and the teacher."}],
]
API_KEY_ENV = "SPECDECK_TEST_ENGINE_KEY"
API_KEY = "sk-local-test-key"
SERVED_NAME = "demo-dflash"
NGRAM_TOKENS = 7
NGRAM_CONFIG = {"method": "ngram", "num_speculative_tokens": NGRAM_TOKENS, **NGRAM_LOOKUP}

TRAIN_ARGS = [
    "--speculator-type", "dflash",
    "--on-missing", "generate",
    "--on-generate", "delete",
    "--target-layer-ids", *map(str, TRAINER_LAYER_IDS),
    "--epochs", "1",
    "--scheduler-type", "cosine",
    "--seed", "42",
    "--draft-attn-impl", "sdpa",
    "--loss-implementation", "eager",
    "--num-workers", "0",
    "--total-seq-len", "512",
    "--max-anchors", "32",
    "--block-size", "8",
    "--num-layers", "2",
]  # fmt: skip


# Fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_save_path(
    demo_model: Path, prepared_data: Path, server: Server, workspace: Path
) -> Path:
    """The trainer's save path after one epoch; ``0/`` holds the checkpoint."""
    save = workspace / "engine_drafter"
    argv = [
        PYTHON, "-m", "workers.runtimes.local.train",
        "--verifier-name-or-path", str(demo_model),
        "--data-path", str(prepared_data),
        "--vllm-endpoint", f"{server.base_url}/v1",
        "--save-path", str(save),
        *TRAIN_ARGS,
    ]  # fmt: skip
    rc, log = run_logged(argv, workspace / "engine_train.log", timeout_s=420)
    assert rc == 0, log[-5000:]
    assert (save / "0" / "model.safetensors").is_file()
    return save


@pytest.fixture(scope="module")
def random_drafter(trained_save_path: Path, workspace: Path) -> Path:
    """An untrained drafter (random layers) in a Hugging Face Hub cache layout."""
    plain = workspace / "random_drafter"
    torch.manual_seed(0)
    config = DFlashSpeculatorConfig.from_pretrained(trained_save_path / "0")
    DFlashDraftModel(config).save_pretrained(plain)
    return _as_hub_snapshot(plain, workspace / "hub", "specdeck/random-dflash")


@pytest.fixture(scope="module")
def reduced_vocab_drafter(
    trained_save_path: Path, prepared_data: Path, demo_model: Path, workspace: Path
) -> Path:
    """The trained drafter with a 512-token draft vocabulary (``d2t``/``t2d``) built the
    trainer's way from the data's token frequencies; its head is the verifier's rows."""
    out = workspace / "reduced_vocab_drafter"
    trained = trained_save_path / "0"
    config = DFlashSpeculatorConfig.from_pretrained(trained)
    config.draft_vocab_size = 512
    model = DFlashDraftModel(config)
    missing, _ = model.load_state_dict(_safetensors(trained / "model.safetensors"), strict=False)
    assert {"fc.weight", "layers.0.self_attn.q_proj.weight"}.isdisjoint(missing)
    d2t, t2d = build_vocab_mappings_from_distribution(
        torch.load(prepared_data / "token_freq.pt"), 512, config.target_vocab_size
    )
    assert d2t.any(), "the mapping must not be the identity for this test to mean anything"
    model.load_vocab_mappings(t2d, d2t)
    verifier_head = _safetensors(demo_model / "model.safetensors")["lm_head.weight"]
    model.lm_head.weight.data.copy_(verifier_head[t2d])
    model.save_pretrained(out)
    return out


@dataclass(frozen=True)
class Reference:
    prompt_ids: list[int]
    output_ids: list[int]
    text: str


@pytest.fixture(scope="module")
def verifier(demo_model: Path) -> AutoModelForCausalLM:
    return AutoModelForCausalLM.from_pretrained(demo_model).eval()


@pytest.fixture(scope="module")
def references(demo_model: Path, verifier: AutoModelForCausalLM) -> list[Reference]:
    """Plain greedy decoding of the verifier for PROMPTS: what the engine must match."""
    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    refs = []
    for messages in PROMPTS:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        output = _greedy(verifier, ids, MAX_TOKENS)
        refs.append(Reference(ids, output, tokenizer.decode(output, skip_special_tokens=True)))
    return refs


@dataclass(frozen=True)
class EngineServer:
    base_url: str
    log_path: Path
    api_key: str
    served_name: str = SERVED_NAME

    def client(self, api_key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=api_key or self.api_key, max_retries=0
        )


@pytest.fixture(scope="module")
def servers(
    demo_model: Path, trained_save_path: Path, random_drafter: Path, workspace: Path
) -> Iterator[tuple[EngineServer, EngineServer]]:
    """(trained drafter with an API key, random drafter without one), started together."""
    trained_port, random_port = free_port(), free_port()
    common = [PYTHON, "-m", "workers.runtimes.local.engine", "--verifier", str(demo_model)]
    trained_config = {"method": "dflash", "model": str(trained_save_path)}  # checkpoint_best
    random_config = {"method": "dflash", "model": str(random_drafter), "num_speculative_tokens": 4}
    trained_argv = [
        *common,
        "--speculative-config", json.dumps(trained_config),
        "--served-model-name", SERVED_NAME,
        "--port", str(trained_port),
        "--api-key-env", API_KEY_ENV,
    ]  # fmt: skip
    random_argv = [
        *common,
        "--speculative-config", json.dumps(random_config),
        "--port", str(random_port),
        "--api-key-env", API_KEY_ENV,  # not set for this one: no key needed
    ]  # fmt: skip
    trained_log = workspace / "engine_trained.log"
    random_log = workspace / "engine_random.log"
    with (
        background(trained_argv, trained_log, env=child_env(**{API_KEY_ENV: API_KEY})) as a,
        background(random_argv, random_log) as b,
    ):
        trained = EngineServer(f"http://127.0.0.1:{trained_port}", trained_log, API_KEY)
        random = EngineServer(f"http://127.0.0.1:{random_port}", random_log, "unused")
        wait_until_ready(trained.base_url, a, trained_log)
        wait_until_ready(random.base_url, b, random_log)
        yield trained, random


@pytest.fixture(scope="module")
def trained_server(servers: tuple[EngineServer, EngineServer]) -> EngineServer:
    return servers[0]


@pytest.fixture(scope="module")
def random_server(servers: tuple[EngineServer, EngineServer]) -> EngineServer:
    return servers[1]


@pytest.fixture(scope="module")
def baseline_servers(demo_model: Path, workspace: Path) -> Iterator[dict[str, EngineServer]]:
    """The verifier alone and with n-gram drafting, started by the command a deployment (and
    the evaluation's baselines) run: ``serve_command``. No API key (an empty one). Served as
    the verifier's path, as the regenerating_data stage serves it (regenerate-responses loads
    its tokenizer by that name)."""
    started: dict[str, EngineServer] = {}
    with contextlib.ExitStack() as stack:
        procs = {}
        for name, method, tokens in (("plain", None, 0), ("ngram", "ngram", NGRAM_TOKENS)):
            port = free_port()
            spec = {"verifier": str(demo_model), "num_speculative_tokens": tokens,
                    "method": method, "runtime": "local"}  # fmt: skip
            command = serve_command(spec, str(demo_model), port=port, host="127.0.0.1",
                                    gpus=[], api_key="")  # fmt: skip
            log = workspace / f"engine_{name}.log"
            procs[name] = stack.enter_context(
                background(command.argv, log, env=child_env(**command.env))
            )
            started[name] = EngineServer(f"http://127.0.0.1:{port}", log, "unused", str(demo_model))
        for name, server in started.items():
            wait_until_ready(server.base_url, procs[name], server.log_path)
        yield started


@pytest.fixture(scope="module")
def plain_server(baseline_servers: dict[str, EngineServer]) -> EngineServer:
    return baseline_servers["plain"]


@pytest.fixture(scope="module")
def ngram_server(baseline_servers: dict[str, EngineServer]) -> EngineServer:
    return baseline_servers["ngram"]


# Helpers -----------------------------------------------------------------------------


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def _as_hub_snapshot(src: Path, cache_root: Path, repo_id: str) -> Path:
    """Lay ``src`` out as ``hub/models--org--name`` with blobs, refs/main and a snapshot
    of symlinks, the way huggingface_hub caches a download; return the repo directory."""
    repo = cache_root / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, file in enumerate(sorted(p for p in src.iterdir() if p.is_file())):
        blob = repo / "blobs" / f"blob{i:02d}"
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return repo


@torch.inference_mode()
def _greedy(
    verifier: AutoModelForCausalLM, prompt_ids: list[int], max_tokens: int, **kwargs: object
) -> list[int]:
    output = verifier.generate(
        torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=False, **kwargs
    )
    return output[0, len(prompt_ids) :].tolist()


def _spec_counters(server: EngineServer) -> dict[str, float]:
    """The vLLM counters from /metrics: drafts, draft_tokens, accepted, pos<i>, generated."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
        "vllm:generation_tokens": "generated",
    }
    counters: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            base = sample.name.removesuffix("_total")
            if base in names:
                counters[names[base]] = sample.value
            elif base == "vllm:spec_decode_num_accepted_tokens_per_pos":
                counters[f"pos{sample.labels['position']}"] = sample.value
    return counters


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in after}


def _acceptance_length(delta: dict[str, float]) -> float:
    assert delta["drafts"] > 0
    return 1 + delta["accepted"] / delta["drafts"]


def _expected_finish(ref: Reference) -> str:
    return "length" if len(ref.output_ids) == MAX_TOKENS else "stop"


# Tests: the HTTP server ----------------------------------------------------------------


def test_models_health_metrics_and_api_key(trained_server: EngineServer) -> None:
    assert httpx.get(f"{trained_server.base_url}/health").status_code == 200
    metrics = httpx.get(f"{trained_server.base_url}/metrics")
    assert metrics.status_code == 200  # open, like vLLM's
    assert "vllm:spec_decode_num_drafts_total" in metrics.text

    models = trained_server.client().models.list()
    assert [m.id for m in models.data] == [SERVED_NAME]

    with pytest.raises(openai.AuthenticationError) as wrong:
        trained_server.client(api_key="sk-wrong").models.list()
    assert wrong.value.status_code == 401
    response = httpx.post(
        f"{trained_server.base_url}/v1/chat/completions",
        json={"model": SERVED_NAME, "messages": PROMPTS[0], "max_tokens": 2},
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == 401


def test_chat_completions_match_greedy_and_accept_drafts(
    trained_server: EngineServer, references: list[Reference]
) -> None:
    client = trained_server.client()
    before = _spec_counters(trained_server)
    for messages, ref in zip(PROMPTS, references, strict=True):
        completion = client.chat.completions.create(
            model=SERVED_NAME, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        choice = completion.choices[0]
        assert choice.message.content == ref.text
        assert choice.message.role == "assistant"
        assert choice.finish_reason == _expected_finish(ref)
        assert completion.usage is not None
        assert completion.usage.prompt_tokens == len(ref.prompt_ids)
        assert completion.usage.completion_tokens == len(ref.output_ids)
        assert completion.model == SERVED_NAME
    delta = _delta(_spec_counters(trained_server), before)

    assert delta["generated"] == sum(len(r.output_ids) for r in references)
    assert delta["draft_tokens"] <= 7 * delta["drafts"]
    per_pos = [delta[f"pos{i}"] for i in range(7)]
    assert sum(per_pos) == delta["accepted"]
    assert per_pos == sorted(per_pos, reverse=True)  # position i needs positions < i
    assert _acceptance_length(delta) > 1.0, delta


def test_streaming_matches_greedy(
    trained_server: EngineServer, references: list[Reference]
) -> None:
    client = trained_server.client()
    for messages, ref in zip(PROMPTS, references, strict=True):
        stream = client.chat.completions.create(
            model=SERVED_NAME,
            messages=messages,
            max_completion_tokens=MAX_TOKENS,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == ref.text
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] == _expected_finish(ref)
        assert not any(finishes[:-1])
        usage = chunks[-1].usage
        assert not chunks[-1].choices and usage is not None
        assert usage.completion_tokens == len(ref.output_ids)
        assert usage.prompt_tokens == len(ref.prompt_ids)


def test_raw_sse_stream_ends_with_done(trained_server: EngineServer) -> None:
    with httpx.stream(
        "POST",
        f"{trained_server.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"messages": PROMPTS[0], "max_tokens": 5, "stream": True},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "length"
    assert "usage" not in last  # no stream_options.include_usage


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_is_refused(trained_server: EngineServer, temperature: float) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        trained_server.client().chat.completions.create(
            model=SERVED_NAME, messages=PROMPTS[0], max_tokens=4, temperature=temperature
        )
    assert refused.value.status_code == 400
    error = refused.value.response.json()["error"]
    assert error["param"] == "temperature" and error["type"] == "BadRequestError"


def test_unknown_model_and_bad_max_tokens(trained_server: EngineServer) -> None:
    client = trained_server.client()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=PROMPTS[0], max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=SERVED_NAME, messages=PROMPTS[0], max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=SERVED_NAME, messages=PROMPTS[0], max_tokens=10**6)


def test_client_disconnect_stops_generation(trained_server: EngineServer) -> None:
    budget = 1500  # ignore_eos: far more than is generated before the client leaves
    before = _spec_counters(trained_server)
    with httpx.stream(
        "POST",
        f"{trained_server.base_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"messages": PROMPTS[1], "max_tokens": budget, "ignore_eos": True, "stream": True},
        timeout=60,
    ) as response:
        for line in response.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # the first text: leave
    # Requests are served one at a time: this one runs once the abandoned one stopped.
    completion = trained_server.client().chat.completions.create(
        model=SERVED_NAME, messages=PROMPTS[0], max_tokens=8
    )
    assert completion.usage is not None
    generated = _delta(_spec_counters(trained_server), before)["generated"]
    abandoned = generated - completion.usage.completion_tokens
    assert 0 < abandoned < budget
    assert "client disconnected" in trained_server.log_path.read_text()


def test_untrained_drafter_is_lossless(
    random_server: EngineServer, references: list[Reference]
) -> None:
    """Hub-snapshot layout, 4 speculative tokens, nothing accepted: still exact."""
    client = random_server.client()
    served_name = client.models.list().data[0].id  # defaults to --verifier
    before = _spec_counters(random_server)
    for messages, ref in zip(PROMPTS, references, strict=True):
        completion = client.chat.completions.create(
            model=served_name, messages=messages, max_tokens=MAX_TOKENS
        )
        assert completion.choices[0].message.content == ref.text
        assert completion.usage is not None
        assert completion.usage.completion_tokens == len(ref.output_ids)
    delta = _delta(_spec_counters(random_server), before)
    assert delta["draft_tokens"] <= 4 * delta["drafts"]
    assert {key for key in delta if key.startswith("pos")} == {"pos0", "pos1", "pos2", "pos3"}
    assert 1.0 <= _acceptance_length(delta) < 1.5


# Tests: the engine in-process ------------------------------------------------------------


def test_drafter_dir_layouts(trained_save_path: Path, random_drafter: Path) -> None:
    assert resolve_drafter_dir(trained_save_path / "0") == trained_save_path / "0"
    assert resolve_drafter_dir(trained_save_path) == trained_save_path / "checkpoint_best"
    snapshot = resolve_drafter_dir(random_drafter)
    assert snapshot.parent.name == "snapshots" and (snapshot / "config.json").is_symlink()
    with pytest.raises(FileNotFoundError):
        resolve_drafter_dir(trained_save_path.parent / "nothing-here")


@pytest.mark.parametrize("num_speculative_tokens", [None, 1, 3])
def test_engine_token_ids_equal_generate(
    demo_model: Path,
    trained_save_path: Path,
    references: list[Reference],
    num_speculative_tokens: int | None,
) -> None:
    engine = DFlashEngine(
        demo_model, trained_save_path / "0", num_speculative_tokens=num_speculative_tokens
    )
    assert engine.num_speculative_tokens == (num_speculative_tokens or engine.block_size - 1)
    for ref in references:
        generation, steps = engine.generate(ref.prompt_ids, MAX_TOKENS)
        assert generation.output_ids == ref.output_ids
        assert all(s.num_draft_tokens <= engine.num_speculative_tokens for s in steps)
        assert sum(len(s.token_ids) for s in steps) == len(ref.output_ids)


def test_engine_stops_inside_an_accepted_block(
    demo_model: Path,
    trained_save_path: Path,
    references: list[Reference],
    verifier: AutoModelForCausalLM,
) -> None:
    """A stop token emitted mid-block ends the output there, as in ``generate``."""
    engine = DFlashEngine(demo_model, trained_save_path / "0")
    ref = references[0]
    stop = ref.output_ids[MAX_TOKENS // 2]
    engine.stop_token_ids = frozenset({stop})
    expected = _greedy(verifier, ref.prompt_ids, MAX_TOKENS, eos_token_id=stop)
    assert expected[-1] == stop and len(expected) < MAX_TOKENS
    generation, _ = engine.generate(ref.prompt_ids, MAX_TOKENS)
    assert generation.output_ids == expected
    assert generation.finish_reason == "stop"
    generation, _ = engine.generate(ref.prompt_ids, MAX_TOKENS, ignore_eos=True)
    assert generation.output_ids == _greedy(verifier, ref.prompt_ids, MAX_TOKENS, eos_token_id=None)
    assert generation.finish_reason == "length"


def test_reduced_draft_vocab_maps_back_with_d2t(
    demo_model: Path,
    trained_save_path: Path,
    reduced_vocab_drafter: Path,
    references: list[Reference],
) -> None:
    """Lossless, and accepts about as much as the full-vocab drafter it was cut from:
    a wrong draft-to-target mapping would propose the wrong ids and accept nothing."""

    def acceptance_length(drafter: Path) -> float:
        engine = DFlashEngine(demo_model, drafter)
        drafts = accepted = 0
        for ref in references:
            generation, steps = engine.generate(ref.prompt_ids, MAX_TOKENS)
            assert generation.output_ids == ref.output_ids
            drafts += sum(1 for s in steps if s.num_draft_tokens)
            accepted += sum(s.num_accepted_tokens for s in steps)
        return 1 + accepted / drafts

    full = acceptance_length(trained_save_path / "0")
    reduced = acceptance_length(reduced_vocab_drafter)
    assert full > 1.0
    assert reduced > 1.0 + 0.5 * (full - 1.0), (reduced, full)


def test_api_key_is_not_accepted_on_argv() -> None:
    """Only the variable's name is an argument; no prefix of it passes for a key flag."""
    args = _parse_args(["--verifier", "v", "--api-key-env", API_KEY_ENV])
    assert args.api_key_env == API_KEY_ENV
    assert args.speculative_config is None
    with pytest.raises(SystemExit):
        _parse_args(["--verifier", "v", "--api-key", "secret"])


# Tests: n-gram drafting, the verifier alone, token ids, /v1/completions ------------------------


def _vllm_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """vLLM's prompt-lookup rule, by brute force: the longest match (at most ``max_n``) of the
    context's suffix that starts earlier in the context, at its earliest start; what follows."""
    total = len(tokens)
    best_n, best_start = 0, -1
    for start in range(total - 1):
        n = 0  # the longest length <= max_n with tokens[start:start + n] == tokens[-n:]
        for length in range(1, max_n + 1):
            if start + length >= total:  # the occurrence must start before the suffix
                break
            if tokens[start : start + length] == tokens[total - length :]:
                n = length
        if n > best_n:
            best_n, best_start = n, start
    if best_n < min_n:
        return []
    return tokens[best_start + best_n : best_start + best_n + k]


def test_ngram_proposer_follows_vllm() -> None:
    """vLLM's own example, then random contexts against the brute-force rule, as the context
    grows token by token (the proposer is incremental)."""
    proposer = NgramProposer(2, 3)
    proposer.extend([1, 2, 3, 4, 2, 3])
    assert proposer.propose(4) == [4, 2, 3]  # [4,2,3] never occurred; [2,3] did, at 1
    rng = random.Random(0)
    for trial in range(200):
        min_n, max_n = rng.choice([(1, 4), (2, 3), (1, 1), (3, 5)])
        k = rng.randint(1, 7)
        tokens = [rng.randint(0, 3 if trial % 2 else 8) for _ in range(rng.randint(1, 40))]
        proposer = NgramProposer(min_n, max_n)
        proposer.extend(tokens[:1])
        for end in range(2, len(tokens) + 1):
            proposer.extend(tokens[end - 1 : end])
            expected = _vllm_ngram(tokens[:end], min_n, max_n, k)
            assert proposer.propose(k) == expected, (tokens[:end], min_n, max_n, k)


def _check_counters(delta: dict[str, float], num_speculative_tokens: int) -> None:
    """vLLM's invariants: per-position counts add up to the accepted tokens and never grow
    with the position; at most N tokens per draft; AL >= 1."""
    assert delta["draft_tokens"] <= num_speculative_tokens * delta["drafts"]
    per_pos = [delta[f"pos{i}"] for i in range(num_speculative_tokens)]
    assert sum(per_pos) == delta["accepted"]
    assert per_pos == sorted(per_pos, reverse=True)
    assert 0 <= delta["accepted"] <= delta["draft_tokens"]
    assert _acceptance_length(delta) >= 1.0


def test_ngram_server_matches_greedy_and_counts_drafts(
    ngram_server: EngineServer, references: list[Reference]
) -> None:
    client = ngram_server.client()
    before = _spec_counters(ngram_server)
    for messages, ref in zip(PROMPTS, references, strict=True):
        completion = client.chat.completions.create(
            model=ngram_server.served_name, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        assert completion.choices[0].message.content == ref.text
        assert completion.choices[0].finish_reason == _expected_finish(ref)
    delta = _delta(_spec_counters(ngram_server), before)
    assert delta["generated"] == sum(len(r.output_ids) for r in references)
    _check_counters(delta, NGRAM_TOKENS)
    # The demo verifier repeats itself: prompt lookup finds matches and some are right.
    assert delta["drafts"] > 0 and delta["accepted"] > 0, delta
    # A step without a match is a plain step, not a draft: fewer drafts than decode steps.
    assert delta["drafts"] + delta["accepted"] <= delta["generated"]


def test_ngram_engine_token_ids_equal_generate(
    demo_model: Path, references: list[Reference]
) -> None:
    engine = LocalEngine(demo_model, NGRAM_CONFIG)
    assert engine.drafter is None and engine.num_speculative_tokens == NGRAM_TOKENS
    drafts = accepted = 0
    for ref in references:
        generation, steps = engine.generate(ref.prompt_ids, MAX_TOKENS)
        assert generation.output_ids == ref.output_ids
        assert all(s.num_draft_tokens <= NGRAM_TOKENS for s in steps)
        drafts += sum(1 for s in steps if s.num_draft_tokens)
        accepted += sum(s.num_accepted_tokens for s in steps)
    assert drafts > 0 and accepted > 0


def test_verifier_alone_loads_no_drafter_and_matches_generate(
    demo_model: Path, references: list[Reference]
) -> None:
    engine = LocalEngine(demo_model)
    assert engine.drafter is None and engine.method is None
    assert engine.num_speculative_tokens == 0 and engine.runner.capture_layer_ids == []
    for ref in references:
        generation, steps = engine.generate(ref.prompt_ids, MAX_TOKENS)
        assert generation.output_ids == ref.output_ids
        assert [len(s.token_ids) for s in steps] == [1] * len(ref.output_ids)
        assert all(s.num_draft_tokens == 0 for s in steps)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        engine.start(references[0].prompt_ids, 4, num_speculative_tokens=2)


def test_plain_server_reports_no_drafts(
    plain_server: EngineServer, references: list[Reference]
) -> None:
    client = plain_server.client()
    before = _spec_counters(plain_server)
    for messages, ref in zip(PROMPTS, references, strict=True):
        completion = client.chat.completions.create(
            model=plain_server.served_name, messages=messages, max_tokens=MAX_TOKENS
        )
        assert completion.choices[0].message.content == ref.text
    delta = _delta(_spec_counters(plain_server), before)
    assert delta["generated"] == sum(len(r.output_ids) for r in references)
    assert delta["drafts"] == delta["draft_tokens"] == delta["accepted"] == 0
    assert not any(key.startswith("pos") for key in delta)
    assert "no speculative decoding" in plain_server.log_path.read_text()


@pytest.mark.parametrize("server_name", ["plain", "ngram"])
def test_return_token_ids(
    baseline_servers: dict[str, EngineServer],
    demo_model: Path,
    references: list[Reference],
    server_name: str,
) -> None:
    """prompt_token_ids is the chat template's render; token_ids the generated ids, with a
    generated stop token; without the flag neither is there."""
    server = baseline_servers[server_name]
    tokenizer = AutoTokenizer.from_pretrained(demo_model)
    stops = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    for messages, ref in zip(PROMPTS, references, strict=True):
        response = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            json={"model": server.served_name, "messages": messages, "max_tokens": MAX_TOKENS,
                  "temperature": 0, "top_p": 1.0, "return_token_ids": True},
            timeout=120,
        )  # fmt: skip
        assert response.status_code == 200, response.text
        body = response.json()
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        assert body["prompt_token_ids"] == list(rendered["input_ids"]) == ref.prompt_ids
        assert body["choices"][0]["token_ids"] == ref.output_ids
        if body["choices"][0]["finish_reason"] == "stop":
            assert ref.output_ids[-1] in stops
    plain = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"messages": PROMPTS[0], "max_tokens": 4},
        timeout=60,
    ).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]


def test_a_generated_stop_token_is_in_token_ids(
    demo_model: Path, references: list[Reference]
) -> None:
    """A reply that ends with a stop token returns it in token_ids, as vLLM does (the demo
    verifier seldom stops by itself: a token it does generate is made a stop token)."""
    engine = LocalEngine(demo_model)
    ref = references[0]
    stop = ref.output_ids[MAX_TOKENS // 2]
    engine.stop_token_ids = frozenset({stop})
    expected = ref.output_ids[: ref.output_ids.index(stop) + 1]
    with TestClient(build_app(engine, "m")) as client:
        body = client.post(
            "/v1/chat/completions",
            json={"messages": PROMPTS[0], "max_tokens": MAX_TOKENS, "return_token_ids": True},
        ).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["token_ids"] == expected and expected[-1] == stop
    assert body["usage"]["completion_tokens"] == len(expected)


def test_completions_with_token_id_prompts_match_generate(
    baseline_servers: dict[str, EngineServer], references: list[Reference]
) -> None:
    for server in baseline_servers.values():
        client = server.client()
        for ref in references:
            response = httpx.post(
                f"{server.base_url}/v1/completions",
                json={"model": server.served_name, "prompt": ref.prompt_ids,
                      "max_tokens": MAX_TOKENS, "temperature": 0, "stream": False,
                      "return_token_ids": True},
                timeout=120,
            ).json()  # fmt: skip
            choice = response["choices"][0]
            assert response["object"] == "text_completion"
            assert choice["text"] == ref.text
            assert choice["token_ids"] == ref.output_ids
            assert choice["prompt_token_ids"] == ref.prompt_ids
            assert choice["finish_reason"] == _expected_finish(ref)
            assert response["usage"] == {
                "prompt_tokens": len(ref.prompt_ids),
                "completion_tokens": len(ref.output_ids),
                "total_tokens": len(ref.prompt_ids) + len(ref.output_ids),
            }
        # The SDK's own call, a text prompt: the same text as the chat route gives for the
        # template's rendering of it.
        text_prompt = client.completions.create(
            model=server.served_name, prompt="the quiet river", max_tokens=5
        )
        assert text_prompt.choices[0].finish_reason in ("length", "stop")
        assert text_prompt.usage is not None and text_prompt.usage.completion_tokens <= 5
    bad = httpx.post(
        f"{baseline_servers['plain'].base_url}/v1/completions",
        json={"prompt": [1, 10**9], "max_tokens": 2},
        timeout=30,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_regenerate_responses_against_the_plain_server(
    plain_server: EngineServer, demo_model: Path, demo_data: Path, workspace: Path
) -> None:
    """speculators' own client, concurrent requests: every row is the template's prompt ids
    followed by the verifier's greedy reply ids."""
    out = workspace / "regenerated.jsonl"
    argv = [
        PYTHON, "-m", "speculators", "regenerate-responses",
        "--endpoint", f"{plain_server.base_url}/v1/chat/completions",
        "--model", str(demo_model),
        "--dataset", str(demo_data),
        "--outfile", str(out),
        "--limit", "4",
        "--concurrency", "4",
        "--max-tokens", "24",
        "--sampling-params", json.dumps({"temperature": 0}),
    ]  # fmt: skip
    rc, log = run_logged(argv, workspace / "regenerate.log", timeout_s=300)
    assert rc == 0, log[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert len(rows) == 4, log[-3000:]
    verifier = AutoModelForCausalLM.from_pretrained(demo_model).eval()
    for row in rows:
        ids, mask = row["input_ids"], row["loss_mask"]
        prompt_len = mask.index(1)
        assert all(mask[prompt_len:]) and not any(mask[:prompt_len])
        assert ids[prompt_len:] == _greedy(verifier, ids[:prompt_len], 24)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"method": "eagle3", "model": "x"}', "method 'eagle3' is not served"),
        ('{"method": "dflash"}', "needs \"model\""),
        ('{"method": "dflash", "model": "d", "draft_tensor_parallel_size": 1}', "unsupported key"),
        ('{"method": "ngram", "prompt_lookup_max": 4}', "needs num_speculative_tokens"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, '
         '"prompt_lookup_max": 2}', "must not exceed"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "positive integer"),
        ("dflash", "not valid JSON"),
        ("NO_DRAFTER", "no drafter at"),
    ],
)
def test_bad_speculative_config_exits_with_a_clear_message(
    demo_model: Path, workspace: Path, config: str, message: str
) -> None:
    if config == "NO_DRAFTER":
        config = json.dumps({"method": "dflash", "model": str(workspace / "no-such-drafter")})
    argv = [
        PYTHON, "-m", "workers.runtimes.local.engine", "--verifier", str(demo_model),
        "--speculative-config", config, "--port", str(free_port()),
    ]  # fmt: skip
    result = subprocess.run(
        argv, env=child_env(), capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode != 0
    assert "--speculative-config" in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_speculative_config_defaults_follow_vllm() -> None:
    one = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3,
                                   "prompt_lookup_max": 4})  # fmt: skip
    assert one is not None and (one.prompt_lookup_min, one.prompt_lookup_max) == (4, 4)
    neither = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert neither is not None and (neither.prompt_lookup_min, neither.prompt_lookup_max) == (5, 5)
    assert SpeculativeConfig.parse(None) is None


def test_transformers_forward_path_equals_the_lean_one(
    demo_model: Path, trained_save_path: Path, references: list[Reference]
) -> None:
    """The generic path (transformers' forward, hooks for the aux states) stays lossless and
    drafts exactly what the lean path drafts."""
    lean = DFlashEngine(demo_model, trained_save_path / "0")
    generic = DFlashEngine(demo_model, trained_save_path / "0", lean=False)
    assert lean.runner.lean and not generic.runner.lean
    for ref in references[:2]:
        a, a_steps = lean.generate(ref.prompt_ids, MAX_TOKENS)
        b, b_steps = generic.generate(ref.prompt_ids, MAX_TOKENS)
        assert a.output_ids == b.output_ids == ref.output_ids
        assert [s.num_accepted_tokens for s in a_steps] == [s.num_accepted_tokens for s in b_steps]


def test_plain_decoding_is_bit_identical_to_generate(demo_model: Path) -> None:
    """The lean forward's prefill and single-token steps give generate()'s logits bit for bit
    (same ops in the same order), so the verifier alone is generate() itself, faster."""
    engine = LocalEngine(demo_model)
    assert engine.runner.lean
    ids = engine.render(PROMPTS[1])
    with torch.inference_mode():
        out = engine.verifier.generate(
            torch.tensor([ids]),
            max_new_tokens=24,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        cache = engine.runner.new_cache(len(ids) + 24)
        logits, _ = engine.runner.forward(ids, cache)
        mine = [logits[-1]]
        for token in out.sequences[0, len(ids) : -1].tolist():
            logits, _ = engine.runner.forward([token], cache)
            mine.append(logits[-1])
    assert len(mine) == len(out.logits) == 24
    assert all(torch.equal(a, b[0]) for a, b in zip(mine, out.logits, strict=True))
