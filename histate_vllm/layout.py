"""What the connector needs to know about vLLM's KV cache, computed once from its config.

Both processes (scheduler and worker) compute the same `CacheLayout` from their copies of
the vLLM config, so nothing has to be sent between them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    get_offloading_group_ids,
)
from vllm.v1.kv_cache_interface import KVCacheConfig, MambaSpec, UniformTypeKVCacheSpecs

from histate_vllm.store import StoreIdentity


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


def store_identity(vllm_config: VllmConfig, layout: CacheLayout) -> StoreIdentity:
    """Everything that must match for bytes on disk to be valid for this engine."""
    import vllm

    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    dtype = cache_config.cache_dtype
    if dtype == "auto":
        dtype = str(model_config.dtype).removeprefix("torch.")
    return StoreIdentity(
        model=str(model_config.model),
        weights=f"{model_config.revision or ''}#{_weights_fingerprint(model_config.model)}",
        dtype=str(dtype),
        kv_layout=json.dumps(
            {"groups": layout.group_ids, "state_groups": sorted(layout.state_group_ids)}
        ),
        block_size=layout.block_tokens,
        # Each tensor-parallel rank keeps its own shard of every page; the scheduler's
        # index is rank 0's, so all ranks must be offered the same keys.
        tp_rank=parallel.rank,
        tp_size=parallel.tensor_parallel_size,
        page_bytes=layout.key_bytes,
        vllm_version=vllm.__version__,
    )


def _weights_fingerprint(model: str) -> str:
    """For a local model directory: its config and the size and mtime of each weight file,
    so rebuilt weights never match old states (a rebuild only costs a cold cache)."""
    path = Path(model)
    if not path.is_dir():
        return ""
    h = hashlib.sha256()
    config = path / "config.json"
    if config.exists():
        h.update(config.read_bytes())
    for f in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]
