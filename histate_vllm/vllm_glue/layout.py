"""What the connector needs to know about vLLM's KV cache, computed once from its config.

Both processes (scheduler and worker) compute the same `CacheLayout` from their copies of
the vLLM config, so nothing has to be sent between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    get_offloading_group_ids,
)
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    KVCacheConfig,
    MambaSpec,
    UniformTypeKVCacheSpecs,
    group_kernel_blocks,
)

from histate_vllm.datapath.pages import LayoutError, check_block_pages


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


def check_kv_cache_pages(kv_caches: dict, kv_cache_config: KVCacheConfig) -> None:
    """LayoutError unless each offloaded attention layer's cache (as vLLM's worker hands it
    to the connector, before it views it as bytes) has every block's page contiguous and
    at least the layer's page long. State (Mamba) layers are views vLLM lays out itself,
    page by page, whatever the attention layout."""
    num_blocks = kv_cache_config.num_blocks
    for g in get_offloading_group_ids(kv_cache_config):
        group = kv_cache_config.kv_cache_groups[g]
        spec = group.kv_cache_spec
        per_layer = spec.kv_cache_specs if isinstance(spec, UniformTypeKVCacheSpecs) else {}
        for name in group.layer_names:
            layer_spec = per_layer.get(name, spec)
            if not isinstance(layer_spec, AttentionSpec):
                continue
            cache = kv_caches[name]
            if cache.shape[0] % num_blocks:
                raise LayoutError(f"layer {name}: {cache.shape[0]} kernel blocks is not a "
                                  f"multiple of the {num_blocks} blocks of the KV cache")
            blocks = group_kernel_blocks(cache, num_blocks)
            check_block_pages(blocks, f"layer {name}")
            have = blocks[0].numel() * blocks.element_size()
            if have < layer_spec.unpadded_page_size_bytes:
                raise LayoutError(f"layer {name}: a block holds {have} bytes, its page is "
                                  f"{layer_spec.unpadded_page_size_bytes}")


def _group_bytes_per_block(group) -> int:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.page_size_bytes
    return spec.page_size_bytes * len(group.layer_names)


# Disk the store keeps for its own files (identity, directories) before any entry.
SSD_RESERVED_BYTES = 64 << 10


def _overhead_per_key(layout: CacheLayout, max_model_len: int) -> int:
    """Disk bytes beside one key's payload, at worst: its file header and a manifest
    (up to one reference per KV chunk of a full context)."""
    from histate_vllm.store import HEADER_BYTES

    max_refs = max_model_len // layout.block_tokens * len(layout.kv_group_ids)
    return HEADER_BYTES + 256 + 80 * max_refs


def ssd_payload_budget(ssd_bytes: int, layout: CacheLayout, max_model_len: int) -> int:
    """The policy counts payload bytes; the disk also holds a header per file, a
    manifest per checkpoint and the identity file. Scale the budget so the worst case
    still fits in ssd_bytes."""
    usable = max(ssd_bytes - SSD_RESERVED_BYTES, 0)
    key = layout.key_bytes
    return usable * key // (key + _overhead_per_key(layout, max_model_len))


def min_ssd_bytes(layout: CacheLayout, max_model_len: int) -> int:
    """The smallest ssd_bytes whose payload budget holds one entry of this model:
    usable * key // (key + overhead) >= key exactly when usable >= key + overhead."""
    return SSD_RESERVED_BYTES + layout.key_bytes + _overhead_per_key(layout, max_model_len)


def check_ssd_bytes(config, layout: CacheLayout, max_model_len: int) -> None:
    """ConfigError unless `ssd_bytes` holds one entry of this model (with an SSD tier)."""
    from histate_vllm.config import ConfigError

    if config.ssd_dir is None:
        return
    need = min_ssd_bytes(layout, max_model_len)
    if config.ssd_bytes < need:
        raise ConfigError(
            f"HiStateConnector: 'ssd_bytes' must be at least {need} bytes for this model "
            f"(one {layout.key_bytes}-byte entry, its file header and manifest, and the "
            f"store's own files), got {config.ssd_bytes}"
        )


def dram_slots(dram_bytes: int, key_bytes: int, ranks: int) -> int:
    """DRAM slots per worker. `dram_bytes` is the engine's total: every worker (tensor
    parallel rank) pins a pool of this many slots, each holding its shard of a key, so
    TP=4 with dram_bytes=64 GiB pins 16 GiB per rank, as vLLM's cpu_bytes_to_use does."""
    return dram_bytes // (key_bytes * ranks)
