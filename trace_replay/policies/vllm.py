"""vLLM baselines (HiState paper §4.1), all in align mode with turn-boundary checkpoints.

* vllm-marconi: vLLM's GPU prefix cache only; states at the prompt end and at shared-prefix
  junctions (vLLM 0.32's default `prefix_cache_retention_interval=0` keeps "the latest replay
  boundary and shared-prefix junctions, Marconi-style").
* vllm-cpu:  + write-through LRU offload of every KV block and checkpoint to DRAM.
* vllm-disk: + write-through LRU offload to DRAM and to disk (LRU per tier).
* vllm-disk-align: vllm-disk keeping, as align mode can, the state at every prefill chunk
  end as well (the ambiguous variant; reported side by side).
"""

from __future__ import annotations

from .base import PolicyContext
from .lru_tiers import TieredLru


class VllmMarconi(TieredLru):
    name = "vllm-marconi"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx, dram=False, ssd=False)


class VllmCpu(TieredLru):
    name = "vllm-cpu"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx, dram=True, ssd=False)


class VllmDisk(TieredLru):
    name = "vllm-disk"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx, dram=True, ssd=True)


class VllmDiskAlign(TieredLru):
    name = "vllm-disk-align"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx, dram=True, ssd=True, chunk_states=True)
