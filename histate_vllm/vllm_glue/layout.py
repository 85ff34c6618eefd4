"""What the connector needs to know about vLLM's KV cache, computed once from its config.

Both processes (scheduler and worker) compute the same `CacheLayout` from their copies of
the vLLM config, so nothing has to be sent between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    get_offloading_group_ids,
)
from vllm.v1.kv_cache_interface import KVCacheConfig, MambaSpec, UniformTypeKVCacheSpecs


@dataclass(frozen=True)
class CacheLayout:
    # Offloaded KV cache group ids, in the order vLLM's offloading scheduler uses.
    group_ids: tuple[int, ...]
    # Which of those groups hold recurrent (Mamba/GDN) states rather than attention KV.
    state_group_ids: frozenset[int]
    # Bytes of one offload key (one block of one group, all its layers).
    key_bytes: int
    # Tokens per block (equal for every group of a hybrid model in align mode).
    block_tokens: int

    @property
    def kv_group_ids(self) -> tuple[int, ...]:
        return tuple(g for g in self.group_ids if g not in self.state_group_ids)

    @classmethod
    def from_config(cls, kv_cache_config: KVCacheConfig) -> CacheLayout:
        group_ids = tuple(get_offloading_group_ids(kv_cache_config))
        groups = [kv_cache_config.kv_cache_groups[g] for g in group_ids]
        state = frozenset(
            g for g, grp in zip(group_ids, groups) if isinstance(grp.kv_cache_spec, MambaSpec)
        )
        block_tokens = {grp.kv_cache_spec.block_size for grp in groups}
        if len(block_tokens) != 1:
            raise ValueError(
                "HiStateConnector needs one block size across KV cache groups (vLLM aligns "
                f"them when prefix caching is on); got {sorted(block_tokens)}"
            )
        return cls(
            group_ids=group_ids,
            state_group_ids=state,
            key_bytes=max(_group_bytes_per_block(grp) for grp in groups),
            block_tokens=block_tokens.pop(),
        )


def _group_bytes_per_block(group) -> int:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.page_size_bytes
    return spec.page_size_bytes * len(group.layer_names)


def dram_slots(dram_bytes: int, key_bytes: int, ranks: int) -> int:
    """DRAM slots per worker. `dram_bytes` is the engine's total: every worker (tensor
    parallel rank) pins a pool of this many slots, each holding its shard of a key, so
    TP=4 with dram_bytes=64 GiB pins 16 GiB per rank, as vLLM's cpu_bytes_to_use does."""
    return dram_bytes // (key_bytes * ranks)
