"""What must match for bytes on SSD to be valid in this engine, and where the store lives.

Each process (scheduler, every worker) computes both from its own copy of the vLLM
config. The identity covers everything that changes the bytes of a KV page or a state
(weights, dtypes, quantization, config overrides, block layout, the rank's shard) or the
keys (the prefix hash function); its digest names the store's directory, so entries of
any other identity are never even looked at.

The weights are pinned by their bytes: a content digest of `config.json` and every weight
file (`store.weights_digest`; each file hashed once, then cached on what no rewrite of it
can keep), so new weights start on an empty store whatever their file sizes and times.
Weights that cannot be pinned (a callable hf_overrides, dummy weights, a hub model not
found in the local cache), and keys that cannot match after a restart (a non-cryptographic
prefix hash with a random per-process seed: PYTHONHASHSEED unset) get
`weights="unpinned: ..."`: the store then serves within one run and is wiped at the next
start (see `store.startup`, which logs why).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from histate_vllm.store import StoreIdentity
from histate_vllm.store.weights_digest import files_digest
from histate_vllm.vllm_glue.layout import CacheLayout

UNPINNED = "unpinned"
logger = logging.getLogger(f"vllm.{__name__}")  # under vllm: its log level and format apply


def store_identity(vllm_config, layout: CacheLayout, kv_cache_config=None, *,
                   weights_cache_dir: str | None = None,
                   hash_weights: bool = True) -> StoreIdentity:
    """Everything that must match for bytes on disk to be valid for this engine.

    kv_cache_config: vLLM's, whose `kv_cache_layout` (resolved once by the engine core,
    adopted by every worker: so scheduler and workers agree) orders the KV page's dims.
    weights_cache_dir: where the weights' per-file digests are cached (the store root).
    hash_weights: False for an engine without an SSD store, whose identity names nothing
    on disk: its weights are not read."""
    import vllm

    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    parallel = vllm_config.parallel_config
    dtype = cache_config.cache_dtype
    if dtype == "auto":
        dtype = str(model_config.dtype).removeprefix("torch.")
    extra = {
        "model_dtype": str(model_config.dtype).removeprefix("torch."),
        "mamba_dtype": str(getattr(cache_config, "mamba_cache_dtype", "auto")),
        "mamba_ssm_dtype": str(getattr(cache_config, "mamba_ssm_cache_dtype", "auto")),
        "quantization": str(model_config.quantization),
        "quantization_config": _canonical(getattr(model_config, "quantization_config", None)),
        "hash": str(cache_config.prefix_caching_hash_algo),
        "dcp": int(getattr(parallel, "decode_context_parallel_size", 1)),
        # The page's dimension order (NHD, HND, ...): another layout restores transposed
        # KV whose checksums pass. And the backend asked for, which chooses it.
        "kv_cache_layout": str(
            getattr(kv_cache_config, "kv_cache_layout", None)
            or getattr(cache_config, "kv_cache_layout", None)
        ),
        "attention_backend": str(
            getattr(getattr(vllm_config, "attention_config", None), "backend", None)
        ),
    }
    return StoreIdentity(
        model=str(model_config.model),
        weights=(weights_id(vllm_config, weights_cache_dir) if hash_weights
                 else f"{UNPINNED}: no SSD store"),
        dtype=str(dtype),
        kv_layout=json.dumps(
            {"groups": layout.group_ids, "state_groups": sorted(layout.state_group_ids)}
        ),
        block_size=layout.block_tokens,
        # Each tensor-parallel rank keeps its own shard of every page in its own store.
        tp_rank=parallel.rank,
        tp_size=parallel.tensor_parallel_size,
        page_bytes=layout.key_bytes,
        vllm_version=vllm.__version__,
        extra=json.dumps(extra, sort_keys=True),
    )


def weights_id(vllm_config, cache_dir: str | None = None) -> str:
    """The weights, as far as they can be pinned: revision, a digest of the files' bytes,
    config overrides and the load format. `unpinned: why` where they cannot be."""
    model_config = vllm_config.model_config
    overrides = model_config.hf_overrides
    if callable(overrides):
        return f"{UNPINNED}: hf_overrides is a function"
    load_config = getattr(vllm_config, "load_config", None)
    load_format = str(getattr(load_config, "load_format", "auto"))
    if load_format == "dummy":
        return f"{UNPINNED}: dummy weights"
    seed = unpinned_hash_seed(vllm_config)
    if seed is not None:
        return f"{UNPINNED}: {seed}"
    path = _local_model_dir(str(model_config.model), model_config.revision,
                            getattr(load_config, "download_dir", None))
    if path is None:
        return f"{UNPINNED}: {model_config.model} not found on local disk"
    fingerprint = weights_fingerprint(path, cache_dir)
    parts = [model_config.revision or "", path.name, fingerprint, load_format]
    if overrides:
        parts.append("overrides=" + _canonical(overrides))
    return "#".join(parts)


def unpinned_hash_seed(vllm_config) -> str | None:
    """Why no key can match after a restart, or None. vLLM seeds its non-cryptographic
    prefix hashes (xxhash, xxhash_cbor) randomly per process unless PYTHONHASHSEED is set
    (`kv_cache_utils.resolve_none_hash_seed`): entries of an earlier run are then dead."""
    algo = str(getattr(vllm_config.cache_config, "prefix_caching_hash_algo", ""))
    if algo.startswith("xxhash") and os.environ.get("PYTHONHASHSEED") is None:
        return (f"prefix hash {algo} has a random per-process seed; set PYTHONHASHSEED "
                "to keep entries across restarts")
    return None


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


def weights_fingerprint(path: Path, cache_dir: str | None = None) -> str:
    """A digest of a model directory's `config.json` and weight files, by their bytes
    (symlinks into the hub cache followed): other weights never match old states, even
    with the same file sizes and times."""
    files = [path / "config.json"] if (path / "config.json").exists() else []
    for pattern in WEIGHT_FILES:
        files += sorted(path.glob(pattern))
    digest, report = files_digest(files, cache_dir)
    if report.bytes_hashed:
        logger.info("HiState: weights digest of %s: %d files, %.2f GB read in %.1f s "
                    "(%.2f GB unchanged since last hashed)", path, report.files,
                    report.bytes_hashed / 1e9, report.seconds, report.bytes_cached / 1e9)
    return digest[:16]


def _local_model_dir(model: str, revision: str | None,
                     download_dir: str | None = None) -> Path | None:
    """The directory holding the model's files: the path itself, or the hub model's
    snapshot in the local cache (vLLM downloaded it before the connector starts; into
    `download_dir` with --download-dir)."""
    path = Path(model)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        where = {"cache_dir": download_dir} if download_dir else {}
        local = snapshot_download(model, revision=revision, local_files_only=True, **where)
    except Exception:  # not a hub id, not cached, no huggingface_hub: cannot pin
        return None
    return Path(local) if os.path.isdir(local) else None


def _canonical(value) -> str:
    if value is None:
        return ""
    if hasattr(value, "to_dict"):
        value = value.to_dict()
    return json.dumps(value, sort_keys=True, default=repr)


def store_root(ssd_dir: str | None, vllm_config) -> str | None:
    """Where this engine's stores live: `ssd_dir`, or `ssd_dir/dp<rank>` for each engine
    of vLLM's data parallelism (engines of one host never share a store directory)."""
    if ssd_dir is None:
        return None
    parallel = vllm_config.parallel_config
    if parallel.data_parallel_size > 1:
        return os.path.join(ssd_dir, f"dp{parallel.data_parallel_rank}")
    return ssd_dir


def check_parallelism(vllm_config) -> None:
    """Refuse layouts whose shards the connector does not track (one store per rank
    assumes every rank holds the same keys)."""
    parallel = vllm_config.parallel_config
    for name in ("pipeline_parallel_size", "prefill_context_parallel_size"):
        n = getattr(parallel, name, 1)
        if n != 1:
            raise ValueError(
                f"HiStateConnector does not support {name}={n}; tensor and data "
                "parallelism are supported"
            )
