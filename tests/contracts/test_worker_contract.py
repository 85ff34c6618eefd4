"""The worker's store and load paths on CPU tensors, through this vLLM's copy contract.

On vLLM 0.34 vLLM's own `OffloadingConnectorWorker` resolves each job's GPU blocks to
`DevicePointers` (`resolve_device_pointers`) before HiState's worker sees it; before, the
worker gets the `GPULoadStoreSpec`. Either way every byte must land where the torch
reference puts it: a slot holds the key's pages of every layer of its group, end to end.
Layouts: every layer its own tensor, and an attention layer aliasing a state layer's
tensor (as vLLM allocates hybrid models).
"""

from __future__ import annotations

import pytest
import torch
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.v1.kv_offload.base import GPULoadStoreSpec

from histate_vllm.connector import HiStateConnector
from histate_vllm.datapath.pages import LayoutError
from tests.contracts.test_capabilities import expect
from histate_vllm.vllm_glue.transfer_specs import HiStateLoadSpec, HiStateStoreSpec
from tests.contracts.harness import ATTN, kv_cache_config, layer_tensors, vllm_config

BLOCKS = 16
# (attention blocks, state blocks) of one job: unsorted, both groups, one group empty.
JOBS = [([3, 7, 1], [5, 2]), ([9], [11, 4, 12]), ([0, 13, 6], []), ([], [8])]


@pytest.fixture(params=["per_layer", "aliased"])
def worker(request, tiny_model):
    aliased = request.param == "aliased"
    config = vllm_config(tiny_model, {"dram_bytes": 1 << 24}, block_size=256,
                         num_blocks=BLOCKS, step_tokens=1024)
    kv_config = kv_cache_config(256, BLOCKS, aliased=aliased)
    tensors = layer_tensors(kv_config, aliased)
    for t in tensors.values():
        t.random_(-128, 128)
    connector = HiStateConnector(config, KVConnectorRole.WORKER, kv_config)
    connector.register_kv_caches(tensors)
    yield connector, tensors, kv_config
    connector.shutdown()


def device_side(connector, attn: list[int], state: list[int]):
    """The job's GPU side as this vLLM hands it to the worker."""
    spec = GPULoadStoreSpec(attn + state, group_sizes=[len(attn), len(state)],
                            block_indices=[0, 0])
    if not expect("DEVICE_POINTERS"):
        return spec
    from vllm.v1.kv_offload.pointer_utils import resolve_device_pointers

    ptrs = resolve_device_pointers(spec, connector.connector_worker._kv_caches)
    assert type(ptrs).__name__ == "DevicePointers"
    return ptrs


def reference_rows(tensors, kv_config, attn, state) -> list[torch.Tensor]:
    """Torch reference: per key, its group's pages of every layer, end to end."""
    rows = []
    for group, blocks in zip(kv_config.kv_cache_groups, (attn, state)):
        spec = group.kv_cache_spec
        size = (spec.page_size_bytes if group.layer_names == [ATTN]
                else spec.state_content_size_bytes)
        for b in blocks:
            rows.append(torch.cat([tensors[name][b, :size] for name in group.layer_names]))
    return rows


def finish(hw, job_id: int) -> None:
    results = hw.get_finished()
    assert [(r.job_id, r.success) for r in results] == [(job_id, True)]


def test_store_then_load_byte_for_byte(worker):
    connector, tensors, kv_config = worker
    hw = connector.connector_worker.worker
    job = 0
    for attn, state in JOBS:
        n = len(attn) + len(state)
        slots = list(range(job * 4, job * 4 + n))
        want = reference_rows(tensors, kv_config, attn, state)
        assert hw.submit_store(job, device_side(connector, attn, state),
                               HiStateStoreSpec(slots=slots))
        finish(hw, job)
        for slot, row in zip(slots, want):
            assert torch.equal(hw.dram[slot, :row.numel()], row), f"slot {slot}"
        # Scramble the blocks, then load the slots back into them.
        for name, t in tensors.items():
            for b in attn if name == ATTN else state:
                t[b] = torch.randint(-128, 128, t[b].shape, dtype=torch.int8)
        job += 1
        load = HiStateLoadSpec(slots=slots, keys=[bytes([i]) * 8 for i in range(n)],
                               is_state=[False] * len(attn) + [True] * len(state))
        assert hw.submit_load(job, load, device_side(connector, attn, state))
        finish(hw, job)
        assert [torch.equal(g, w) for g, w in
                zip(reference_rows(tensors, kv_config, attn, state), want)] == [True] * n
        job += 1


@pytest.mark.skipif(not expect("DEVICE_POINTERS"),
                    reason="this vLLM hands workers block ids, not pointers (0.34+ does)")
def test_pointers_outside_this_workers_cache_are_refused(worker):
    """An address that is not one of this worker's pages is an error, never a copy."""
    connector, tensors, kv_config = worker
    hw = connector.connector_worker.worker
    ptrs = device_side(connector, [3, 4], [5])
    ptrs.ptrs[1] += 1  # mid-page
    with pytest.raises(LayoutError):
        hw.submit_store(0, ptrs, HiStateStoreSpec(slots=[0, 1, 2]))
    ptrs = device_side(connector, [3, 4], [5])
    ptrs.sizes[-1] -= 1  # a short page
    with pytest.raises(LayoutError):
        hw.submit_store(0, ptrs, HiStateStoreSpec(slots=[0, 1, 2]))
