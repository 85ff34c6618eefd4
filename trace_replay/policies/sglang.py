"""SGLang-HiCache baseline (SGLang 0.5 Unified Radix Cache with HiCache).

The GPU pool is split half/half between KV and recurrent states (its default partition, HiState
paper §4.1), and so is the host pool (HiCache sizes the host KV and state pools from their
device pools); the disk tier is one LRU pool. Write-through, LRU per pool. States: the prompt
end and the junction where a cached prefix ends (given to it as to the vLLM baselines), as
SGLang 0.5's default `mamba_scheduler_strategy` (no_buffer) keeps them: no state per prefill
chunk. `sglang-hicache-chunks` also keeps the state of every prefill chunk end (the
variant an audit found ambiguous; reported side by side).
"""

from __future__ import annotations

from .base import PolicyContext
from .lru_tiers import TieredLru

STATE_SHARE = 0.5


class SglangHiCache(TieredLru):
    name = "sglang-hicache"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx, dram=True, ssd=True, gpu_state_share=STATE_SHARE,
                         dram_state_share=STATE_SHARE, chunk_states=self.chunk_states)

    chunk_states = False


class SglangHiCacheChunks(SglangHiCache):
    name = "sglang-hicache-chunks"
    chunk_states = True
