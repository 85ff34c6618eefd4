"""vLLM baselines (HiState paper §4.1), all in align mode with turn-boundary checkpoints.

* vllm-marconi: vLLM's GPU prefix cache only; states at the prompt end and at shared-prefix
  junctions (vLLM 0.32's default `prefix_cache_retention_interval=0` keeps "the latest replay
  boundary and shared-prefix junctions, Marconi-style").
* vllm-cpu:  + write-through LRU offload of every KV block and checkpoint to DRAM.
* vllm-disk: + write-through LRU offload to DRAM and to disk (LRU per tier).
* vllm-disk-align: vllm-disk keeping, as align mode can, the state at every prefill chunk
  end as well (the ambiguous variant; reported side by side).
* vllm034-{lru,arc}[-r{N}] (N: 4 to 64 blocks): vLLM 0.34's own hybrid offloading as a user configures it: every
  group, Mamba included, written through to a CPU tier and on to a file tier, evicted by
  `lru` or `arc`; a checkpoint at each prompt end and junction (its offload lookup pins
  one too), plus one every N blocks with `prefix_cache_retention_interval` = N blocks (0,
  the default: none). `vllm034-lru` is vllm-disk. Left out of the model: vLLM's file tier
  has no size limit or eviction of its own (here it gets the SSD budget, evicted as its CPU
  tier is), and its ARC counts one-page chunks where these keys carry their own bytes.
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


# prefix_cache_retention_interval, in blocks, swept by the native baseline (0: vLLM's default).
RETENTION_BLOCKS = (0, 4, 8, 16, 32, 64)


def _native(eviction: str, blocks: int) -> type[TieredLru]:
    suffix = f"-r{blocks}" if blocks else ""

    class VllmNative(TieredLru):
        name = f"vllm034-{eviction}{suffix}"

        def __init__(self, ctx: PolicyContext):
            super().__init__(ctx, dram=True, ssd=True, eviction=eviction,
                             retention_tokens=blocks * ctx.block_tokens)

    VllmNative.__name__ = VllmNative.__qualname__ = f"VllmNative_{eviction}{suffix}"
    return VllmNative


NATIVE = tuple(_native(e, r) for r in RETENTION_BLOCKS for e in ("lru", "arc"))
