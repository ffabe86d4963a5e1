"""The local runtime's hidden-states server: real vLLM (the CPU wheel) as the worker starts it
(``verifier_server_argv(..., cpu=True)``, the session's ``server``), through HTTP and through
speculators' own clients. The connector's write path alone: tests/unit/test_hidden_states_connector.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch
from speculators.data_generation.offline import check_hidden_states
from speculators.data_generation.render_client import render_conversation
from speculators.data_generation.vllm_client import generate_hidden_states
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    load_hidden_states,
)

from tests.local_runtime.conftest import NUM_LAYERS, SERVER_LAYER_IDS, Server

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


def complete(server: Server, ids: list[int]) -> dict:
    """The trainer's request (dflash-facts.md section 2): the prompt as token ids, one token."""
    response = httpx.post(f"{server.base_url}/v1/completions", timeout=120, json={
        "model": server.served_model_name, "prompt": ids, "max_tokens": 1,
        "return_token_ids": True})
    assert response.status_code == 200, response.text
    return response.json()


def read(body: dict) -> dict[str, torch.Tensor]:
    """The file the response names, once its writer released the lock; removed after."""
    path = Path(body["kv_transfer_params"]["hidden_states_path"])
    tensors = load_hidden_states(str(path))
    path.unlink()
    return tensors


def test_health_and_models(server: Server) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    models = httpx.get(f"{server.base_url}/v1/models").json()
    assert models["data"][0]["id"] == server.served_model_name


def test_a_completion_writes_the_prompts_hidden_states_in_vllms_format(
        server: Server, prompt_ids: list[int]) -> None:
    body = complete(server, prompt_ids)
    assert body["choices"][0]["prompt_token_ids"] == prompt_ids
    path = Path(body["kv_transfer_params"]["hidden_states_path"])
    assert path.is_absolute() and path.parent == server.hidden_states_dir
    tensors = read(body)
    assert sorted(tensors) == ["hidden_states", "token_ids"]
    assert tensors["hidden_states"].shape == (len(prompt_ids), len(SERVER_LAYER_IDS), 128)
    assert tensors["hidden_states"].dtype == torch.float32  # --dtype float32, the trainer's
    assert tensors["token_ids"].tolist() == prompt_ids
    check_hidden_states(tensors, prompt_ids)  # the trainer's own validation


def test_the_layers_are_the_verifiers_own(server: Server, demo_model: Path,
                                         prompt_ids: list[int]) -> None:
    served = read(complete(server, prompt_ids))["hidden_states"]
    model = AutoModelForCausalLM.from_pretrained(demo_model, dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.model(ids, output_hidden_states=True)
        # transformers 5: the last entry of hidden_states is AFTER the final norm; vLLM's last
        # slot (id n) is before it (dflash-facts.md section 2).
        final_norm, model.model.norm = model.model.norm, torch.nn.Identity()
        pre_norm = model.model(ids).last_hidden_state[0]
        model.model.norm = final_norm
    for slot, layer_id in enumerate(SERVER_LAYER_IDS[:-1]):
        torch.testing.assert_close(served[:, slot], out.hidden_states[layer_id][0],
                                   atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(served[:, -1], pre_norm, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(served[:, -1], out.hidden_states[NUM_LAYERS][0], atol=1e-3)


def test_speculators_clients_accept_the_server(server: Server, demo_model: Path) -> None:
    ids = render_conversation(server.base_url, MESSAGES, add_generation_prompt=False)
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="EMPTY", max_retries=0)
    assert client.models.list().data[0].id == str(demo_model)
    handle, params = generate_hidden_states(client, server.served_model_name, {"input_ids": ids})
    assert params == {"hidden_states_path": handle}
    check_hidden_states(read({"kv_transfer_params": params}), ids)


def test_the_renderer_is_the_chat_template(server: Server,
                                           tokenizer: PreTrainedTokenizerBase) -> None:
    """prepare-data's route (403 without --enable-scale-out)."""
    url = f"{server.base_url}/v1/chat/completions/render"
    full = httpx.post(url, json={"messages": MESSAGES, "add_generation_prompt": False})
    assert full.status_code == 200, full.text
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False)
    assert full.json()["token_ids"] == tokenizer.encode(text, add_special_tokens=False)
    prompt = httpx.post(url, json={"messages": MESSAGES[:1], "add_generation_prompt": True}).json()
    assert full.json()["token_ids"][:len(prompt["token_ids"])] == prompt["token_ids"]
    assert tokenizer.decode(prompt["token_ids"]).endswith("<|im_start|>assistant\n")


def test_concurrent_requests_get_their_own_files(server: Server, prompt_ids: list[int]) -> None:
    prompts = [prompt_ids[: 8 + 3 * i] for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        bodies = list(pool.map(lambda ids: complete(server, ids), prompts))
    paths = {body["kv_transfer_params"]["hidden_states_path"] for body in bodies}
    assert len(paths) == len(prompts)
    for ids, body in zip(prompts, bodies, strict=True):
        assert read(body)["token_ids"].tolist() == ids
