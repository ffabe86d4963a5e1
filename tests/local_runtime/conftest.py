"""Session fixtures for the local runtime: one demo verifier, its data, one running
hidden-states server (real vLLM on the CPU, started with the worker's own command) and one
prepared dataset, shared by every test in this folder."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.runtimes import JobPaths
from app.runtimes.vllm import CPU_ENV, verifier_server_argv
from app.schemas.job_spec import JobSpec
from app.settings import Settings
from tests.local_runtime.procs import (
    PYTHON,
    background,
    child_env,
    free_port,
    run_logged,
    wait_until_ready,
)
from workers.runtimes.local.demo import DEMO_NUM_LAYERS

# The trainer's default ids for the demo verifier's n layers are [2, n // 2, n - 3], and the
# server also gets n.
NUM_LAYERS = DEMO_NUM_LAYERS
TRAINER_LAYER_IDS = [2, NUM_LAYERS // 2, NUM_LAYERS - 3]
SERVER_LAYER_IDS = [*TRAINER_LAYER_IDS, NUM_LAYERS]


@dataclass(frozen=True)
class Server:
    base_url: str
    served_model_name: str
    hidden_states_dir: Path
    log_path: Path


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("local_runtime")


@pytest.fixture(scope="session")
def demo_model(demo_assets: tuple[Path, Path]) -> Path:
    return demo_assets[0]


@pytest.fixture(scope="session")
def demo_data(demo_assets: tuple[Path, Path]) -> Path:
    return demo_assets[1]


@pytest.fixture(scope="session")
def server(demo_model: Path, workspace: Path) -> Iterator[Server]:
    port = free_port()
    log_path = workspace / "server.log"
    paths = JobPaths.for_job(Settings(work_root=workspace, logs_root=workspace), "job")
    spec = JobSpec.load({
        "verifier": "demo", "dataset": "demo.jsonl", "runtime": "local",
        "verifier_info": {"reference": str(demo_model), "source": "local",
                          "num_hidden_layers": NUM_LAYERS, "hidden_size": 128, "vocab_size": 1536},
        "speculator": {"target_layer_ids": TRAINER_LAYER_IDS}})
    argv = verifier_server_argv(spec, paths, port, cpu=True)
    with background(argv, log_path, child_env(**CPU_ENV)) as proc:
        base_url = f"http://127.0.0.1:{port}"
        wait_until_ready(base_url, proc, log_path, timeout_s=600)  # vLLM's imports: a minute
        yield Server(base_url, str(demo_model), paths.hidden_states, log_path)


@pytest.fixture(scope="session")
def prepared_data(demo_model: Path, demo_data: Path, server: Server, workspace: Path) -> Path:
    output = workspace / "prepared"
    argv = [
        PYTHON, "-m", "speculators", "prepare-data",
        "--model", str(demo_model),
        "--data", str(demo_data),
        "--output", str(output),
        "--seq-length", "512",
        "--render-endpoint", server.base_url,
        "--no-skip-token-freq",
    ]  # fmt: skip
    rc, log = run_logged(argv, workspace / "prepare_data.log", timeout_s=300)
    assert rc == 0, log
    return output
