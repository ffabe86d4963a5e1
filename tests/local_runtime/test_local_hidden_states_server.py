"""The local hidden-states server, through HTTP and through speculators' own clients."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from speculators.data_generation.offline import check_hidden_states
from speculators.data_generation.render_client import render_conversation
from speculators.data_generation.vllm_client import generate_hidden_states
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from tests.local_runtime.conftest import NUM_LAYERS, SERVER_LAYER_IDS, Server
from workers.runtimes.local.hidden_states_server import HiddenStatesExtractor

MESSAGES = [
    {"role": "user", "content": "Describe a small garden near the river."},
    {"role": "assistant", "content": "The garden is green and quiet."},
]


@pytest.fixture(scope="module")
def tokenizer(demo_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(demo_model)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def _complete(server: Server, ids: list[int], **extra: object) -> httpx.Response:
    body = {
        "model": server.served_model_name,
        "prompt": ids,
        "max_tokens": 1,
        "return_token_ids": True,
        **extra,
    }
    return httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)


def test_health_and_models(server: Server) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    models = httpx.get(f"{server.base_url}/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == server.served_model_name


def test_completion_writes_a_vllm_format_file(server: Server, prompt_ids: list[int]) -> None:
    response = _complete(server, prompt_ids)
    assert response.status_code == 200, response.text
    body = response.json()
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == prompt_ids
    assert len(choice["token_ids"]) == 1
    path = Path(body["kv_transfer_params"]["hidden_states_path"])
    assert path.is_absolute() and path.parent == server.hidden_states_dir
    assert not list(server.hidden_states_dir.glob("*.tmp"))

    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == ["hidden_states", "token_ids"]
    tensors = load_file(path)
    path.unlink()
    hidden, token_ids = tensors["hidden_states"], tensors["token_ids"]
    assert hidden.shape == (len(prompt_ids), len(SERVER_LAYER_IDS), 128)
    assert hidden.dtype == torch.float32  # the demo model's dtype
    assert token_ids.dtype == torch.int64
    assert token_ids.tolist() == prompt_ids
    check_hidden_states(tensors, prompt_ids)  # the trainer's own validation


def test_hidden_states_match_a_direct_computation(
    server: Server, demo_model: Path, prompt_ids: list[int]
) -> None:
    body = _complete(server, prompt_ids).json()
    path = Path(body["kv_transfer_params"]["hidden_states_path"])
    served = load_file(path)["hidden_states"]
    path.unlink()

    model = AutoModelForCausalLM.from_pretrained(demo_model).eval()
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.model(ids, output_hidden_states=True)
        next_token = int(model.lm_head(out.last_hidden_state[:, -1]).argmax(-1))
        # transformers 5: the last entry of hidden_states is AFTER the final norm.
        post_norm = out.hidden_states[NUM_LAYERS][0]
        final_norm = model.model.norm
        model.model.norm = torch.nn.Identity()
        pre_norm = model.model(ids).last_hidden_state[0]
        model.model.norm = final_norm

    for slot, layer_id in enumerate(SERVER_LAYER_IDS[:-1]):
        torch.testing.assert_close(served[:, slot], out.hidden_states[layer_id][0])
    last = served[:, -1]
    torch.testing.assert_close(last, pre_norm)
    assert not torch.allclose(last, post_norm, atol=1e-3)
    with torch.inference_mode():
        torch.testing.assert_close(final_norm(last), post_norm)
    assert body["choices"][0]["token_ids"] == [next_token]


def test_speculators_clients_accept_the_server(server: Server, demo_model: Path) -> None:
    ids = render_conversation(server.base_url, MESSAGES, add_generation_prompt=False)
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="EMPTY", max_retries=0)
    assert client.models.list().data[0].id == str(demo_model)
    handle, params = generate_hidden_states(client, server.served_model_name, {"input_ids": ids})
    assert params == {"hidden_states_path": handle}
    check_hidden_states(load_file(handle), ids)
    Path(handle).unlink()


def test_render_matches_the_chat_template(
    server: Server, tokenizer: PreTrainedTokenizerBase
) -> None:
    url = f"{server.base_url}/v1/chat/completions/render"
    full = httpx.post(url, json={"messages": MESSAGES, "add_generation_prompt": False}).json()
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    assert full == {"token_ids": tokenizer.encode(text, add_special_tokens=False)}

    prompt = httpx.post(url, json={"messages": MESSAGES[:1], "add_generation_prompt": True}).json()
    assert full["token_ids"][: len(prompt["token_ids"])] == prompt["token_ids"]
    assert tokenizer.decode(prompt["token_ids"]).endswith("<|im_start|>assistant\n")

    n = len(full["token_ids"])
    right = httpx.post(
        url,
        json={
            "messages": MESSAGES,
            "add_generation_prompt": False,
            "truncate_prompt_tokens": 5,
            "truncation_side": "right",
        },
    ).json()
    assert right["token_ids"] == full["token_ids"][:5]
    left = httpx.post(
        url,
        json={"messages": MESSAGES, "add_generation_prompt": False, "truncate_prompt_tokens": 5},
    ).json()
    assert left["token_ids"] == full["token_ids"][n - 5 :]

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    with_tools = httpx.post(
        url,
        json={
            "messages": MESSAGES[:1],
            "add_generation_prompt": True,
            "tools": tools,
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ).json()
    assert '"name": "lookup"' in tokenizer.decode(with_tools["token_ids"])


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"prompt": [], "max_tokens": 1}, 400, "non-empty"),
        ({"prompt": [1, 2, 10**6], "max_tokens": 1}, 400, "outside the vocabulary"),
        ({"prompt": [1, 2], "max_tokens": 2}, 400, "max_tokens"),
        ({"prompt": [True], "max_tokens": 1}, 400, "prompt"),
        ({"prompt": [1, 2], "max_tokens": 1, "model": "someone-else"}, 404, "does not exist"),
        ({"max_tokens": 1}, 400, "prompt"),
    ],
)
def test_completion_rejects_bad_requests(
    server: Server, body: dict[str, object], status: int, fragment: str
) -> None:
    response = httpx.post(f"{server.base_url}/v1/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert fragment in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_render_rejects_bad_requests(server: Server) -> None:
    url = f"{server.base_url}/v1/chat/completions/render"
    assert httpx.post(url, json={"messages": []}).status_code == 400
    assert httpx.post(url, json={"add_generation_prompt": True}).status_code == 400
    bad_json = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400
    continue_and_prompt = {
        "messages": MESSAGES,
        "add_generation_prompt": True,
        "continue_final_message": True,
    }
    assert httpx.post(url, json=continue_and_prompt).status_code == 400


def test_concurrent_requests(server: Server, prompt_ids: list[int]) -> None:
    prompts = [prompt_ids[: 8 + 3 * i] for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(lambda ids: _complete(server, ids), prompts))
    paths = set()
    for ids, response in zip(prompts, responses, strict=True):
        assert response.status_code == 200, response.text
        path = Path(response.json()["kv_transfer_params"]["hidden_states_path"])
        tensors = load_file(path)
        assert tensors["token_ids"].tolist() == ids
        assert tensors["hidden_states"].shape[0] == len(ids)
        paths.add(path)
        path.unlink()
    assert len(paths) == len(prompts)


def test_one_log_line_per_request(server: Server) -> None:
    marker = [7, 8, 9, 10, 11]
    assert _complete(server, marker).status_code == 200
    log = server.log_path.read_text()
    lines = [line for line in log.splitlines() if "POST /v1/completions 200" in line]
    assert any("tokens=5 " in line for line in lines)
    for leftover in server.hidden_states_dir.glob("hs_*.safetensors"):
        if load_file(leftover)["token_ids"].tolist() == marker:
            leftover.unlink()


def test_bfloat16_extraction_in_process(demo_model: Path, tmp_path: Path) -> None:
    extractor = HiddenStatesExtractor(demo_model, [NUM_LAYERS, 0, 4], tmp_path / "hs",
                                      dtype=torch.bfloat16)
    assert extractor.layer_ids == [0, 4, NUM_LAYERS]  # stacked in ascending id order
    ids = [5, 6, 7, 8, 9]
    hidden, _next_token = extractor.extract(ids)
    path = extractor.write(ids, hidden)
    tensors = load_file(path)
    assert tensors["hidden_states"].dtype == torch.bfloat16
    assert tensors["hidden_states"].shape == (5, 3, 128)
    check_hidden_states(tensors, ids)
    embeddings = extractor.model.get_input_embeddings()(torch.tensor(ids))
    torch.testing.assert_close(tensors["hidden_states"][:, 0], embeddings.detach())


@pytest.mark.parametrize("layer_ids", [[2, 2], [NUM_LAYERS + 1], [-1], []])
def test_invalid_layer_ids_are_refused(
    demo_model: Path, tmp_path: Path, layer_ids: list[int]
) -> None:
    with pytest.raises(ValueError, match="layer id"):
        HiddenStatesExtractor(demo_model, layer_ids, tmp_path)
