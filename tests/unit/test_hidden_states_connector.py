"""The CPU hidden-states connector's write path (workers/runtimes/local/hidden_states_connector.py):
a finished request's slots copied out of a KV cache laid out as vLLM's, written by the connector's
own writer thread under its lock file, and read back with vLLM's own reader. vLLM's engine is not
started here (tests/integration/test_vllm_hidden_states.py runs the real server)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    PendingSave,
    load_hidden_states,
)

from workers.runtimes.local.hidden_states_connector import CPUHiddenStatesConnector

BLOCK_SIZE, LAYERS, HIDDEN = 4, 3, 8


def connector(cache: torch.Tensor) -> CPUHiddenStatesConnector:
    """The worker-side state that ``register_kv_caches`` and ``__init__`` set, without an engine."""
    made = CPUHiddenStatesConnector.__new__(CPUHiddenStatesConnector)
    made._is_tp_rank_zero, made._kv_cache, made._block_size = True, cache, BLOCK_SIZE
    made.use_lock, made._lock_fds = True, {}
    made._executor = ThreadPoolExecutor(max_workers=1)
    made._req_copy_events, made._req_futures = {}, {}
    return made


def test_the_file_holds_the_requests_slots_in_order_copied_before_the_cache_moves_on(
        tmp_path: Path) -> None:
    # [num_blocks, num_layers, block_size, hidden]: the layout extract_from_kv_cache indexes.
    cache = torch.randn(6, LAYERS, BLOCK_SIZE, HIDDEN)
    expected = torch.cat([cache[5].transpose(0, 1), cache[2].transpose(0, 1)[:2]])  # 6 tokens
    token_ids = torch.tensor([11, 12, 13, 14, 15, 16])
    path = tmp_path / "hidden_states" / "req-1.safetensors"
    writer = connector(cache)

    writer._submit_async_write(PendingSave("req-1", str(path), token_ids, block_ids=[5, 2]))
    cache.zero_()  # the blocks go to the next request; the file must not see it

    written = load_hidden_states(str(path))  # waits on the lock file until the writer is done
    assert written["hidden_states"].shape == (6, LAYERS, HIDDEN)
    assert torch.equal(written["hidden_states"], expected)
    assert torch.equal(written["token_ids"], token_ids)
    assert writer._req_copy_events["req-1"].query()  # get_finished reports it at once
    writer._req_futures.get("req-1") is None or writer._req_futures["req-1"].result(timeout=10)
    writer._executor.shutdown(wait=True)
    assert writer._req_futures == {}  # the connector's own done-callback ran


def test_another_tensor_parallel_rank_writes_nothing(tmp_path: Path) -> None:
    writer = connector(torch.randn(2, LAYERS, BLOCK_SIZE, HIDDEN))
    writer._is_tp_rank_zero = False
    path = tmp_path / "req-2.safetensors"
    writer._submit_async_write(PendingSave("req-2", str(path), torch.tensor([1]), block_ids=[0]))
    writer._executor.shutdown(wait=True)
    assert not path.exists() and writer._req_copy_events == {}
