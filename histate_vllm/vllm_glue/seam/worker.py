"""The worker side's contacts with vLLM's insides, as operations HiState names.

`WorkerSeam` is vLLM's `OffloadingConnectorWorker` reporting a failed load as one: vLLM
0.34's own worker does (`failed_jobs`, `take_failed_recving`); on 0.32 and 0.33 it asserts
every job succeeded, so the seam reports the failure beside vLLM's bookkeeping. The
functions below read a copy job's GPU side as this vLLM hands it, and find vLLM's batched
page copy. docs/vllm-seam.md lists each contact.
"""

from __future__ import annotations

import dataclasses

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)

from histate_vllm.vllm_glue.seam import capabilities


class WorkerSeam(OffloadingConnectorWorker):
    """`self.worker` must be a HiState worker: with vLLM 0.32 and 0.33 it hands a failed
    job to vLLM as done and names it (`failures_as_done`, `take_failed_jobs`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._failed_loads: set[str] = set()  # vLLM 0.32, 0.33: requests, until taken

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        if capabilities.FAILED_JOBS:  # vLLM reports failed loads itself
            return super().get_finished(finished_req_ids)
        # vLLM asserts success: it sees a failed job as done (so it frees what the job
        # held and finishes the request's load), and the request is reported failed here,
        # which makes the scheduler recompute it.
        load_jobs = dict(self._load_jobs)  # vLLM's job -> request, which get_finished pops
        self.worker.failures_as_done = True
        sending, recving = super().get_finished(finished_req_ids)
        self._failed_loads.update(load_jobs[j] for j in self.worker.take_failed_jobs()
                                  if j in load_jobs)
        return sending, recving

    def take_failed_loads(self) -> set[str]:
        """Requests whose load failed since the last call, where vLLM does not report them
        itself (0.32, 0.33; see `ConnectorSeam.get_transfer_results`)."""
        failed, self._failed_loads = self._failed_loads, set()
        return failed


def metadata_fields(meta: OffloadingWorkerMetadata | None) -> dict:
    """The fields of vLLM's worker metadata, whatever this version has (for a subclass that
    adds its own); vLLM's defaults where there is no metadata."""
    if meta is None:
        meta = OffloadingWorkerMetadata()
    return {f.name: getattr(meta, f.name) for f in dataclasses.fields(OffloadingWorkerMetadata)}


def job_blocks(spec, from_pointers) -> tuple[list[int], list[int]]:
    """A copy job's GPU side as (blocks per group, block ids). vLLM 0.32 and 0.33 hand
    block ids (`GPULoadStoreSpec`); 0.34 hands `DevicePointers`, which
    `from_pointers(ptrs, sizes, blocks per group, data refs per group)` resolves."""
    if capabilities.DevicePointers is not None and isinstance(spec, capabilities.DevicePointers):
        return from_pointers(spec.ptrs, spec.sizes, spec.group_block_counts,
                             spec.group_data_ref_counts)
    return spec.group_sizes, spec.block_ids


def swap_blocks_batch(device: torch.device):
    """vLLM's batched page copy (`swap_blocks_batch`) where vLLM built it for this GPU;
    None elsewhere."""
    if device.type != "cuda":
        return None
    try:
        from vllm import _custom_ops as ops

        if hasattr(torch.ops._C_cache_ops, "swap_blocks_batch"):
            return ops.swap_blocks_batch
    except (ImportError, AttributeError, RuntimeError):
        pass
    return None
