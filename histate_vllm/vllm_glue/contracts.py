"""The vLLM contracts HiState relies on that differ across the supported versions, in one place.

Supported: vLLM 0.32, 0.33 and 0.34 (`SUPPORTED`). What changed, and where HiState meets it:

| contract | 0.32 | 0.33 | 0.34 | handled in |
| --- | --- | --- | --- | --- |
| `KVCacheManager.get_computed_blocks(_for_connector)` | `(request)` | `(request, max_cache_hit_length)` | same as 0.33 | `connector.bind_local_lookup` passes the bound on |
| worker copies receive | `GPULoadStoreSpec` | `GPULoadStoreSpec`, `submit_load(..., expedited)` | `DevicePointers`, `expedited` | `HiStateWorker._parts` (`datapath.pages.blocks_from_pointers`) |
| failed transfer jobs | `failed_recving` only | same as 0.32 | also `OffloadingWorkerMetadata.failed_jobs`, `mark_completed(job, success)` | `mark_completed` |
| stats payload | counters, gauges, histograms | adds `set_info(...)`; `OffloadPromMetrics` reads `_info_keys` | same as 0.33 | `prom_metrics.HiStatePromMetrics`, `STATS_INFO` |
| offload lookup sets `request.shared_prefix_boundary` | no | no | yes, on a hit a recurrent group cut | `OFFLOAD_JUNCTION`; the connector keeps it as the first chunk end |
| EAGLE/MTP drafter's last block on a hit | dropped | dropped (lookahead block hashes, but not with a connector) | kept: block hashes include the next token (`use_lookahead_block_hashes`) | `HiStateConnectorScheduler._lookup_complete_chunks` keeps it where vLLM would drop it |

Each row is detected from what the installed vLLM offers, not from its version string, so a
patch release that backports a change is met too. A version outside `SUPPORTED` gets one
warning at start-up (`check_version`); the contract tests (`tests/contracts`) run vLLM's real
scheduler and the worker's copy contract of 0.32, 0.33 and 0.34 on a CPU.
"""

from __future__ import annotations

import dataclasses

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.v1.kv_offload import base as _offload_base

SUPPORTED = ((0, 32), (0, 34))  # first and last minor version tested, both included
VLLM_VERSION = vllm.__version__

# Worker copies get DevicePointers (0.34+): pointers resolved from the GPU spec.
DevicePointers = getattr(_offload_base, "DevicePointers", None)
# Failed jobs travel in the worker metadata (0.34+), beside failed_recving.
FAILED_JOBS = "failed_jobs" in {f.name for f in dataclasses.fields(OffloadingWorkerMetadata)}
# The stats payload carries the manager's config info (0.33+).
STATS_INFO = hasattr(OffloadingConnectorStats, "set_info")
# vLLM's offload lookup itself pins a shared-prefix junction (0.34+).
OFFLOAD_JUNCTION = hasattr(OffloadingConnectorScheduler,
                           "_maybe_register_shared_prefix_junction")


def minor_version(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def is_supported(version: str | None = None) -> bool:
    minor = minor_version(VLLM_VERSION if version is None else version)
    return minor is not None and SUPPORTED[0] <= minor <= SUPPORTED[1]


def supported_range() -> str:
    lo, hi = (".".join(map(str, v)) for v in SUPPORTED)
    return f"{lo} to {hi}"


def check_version(logger) -> None:
    """Warn once when the installed vLLM is outside the tested range (it may still work)."""
    if not is_supported():
        logger.warning("HiState is tested with vLLM %s; this is vLLM %s", supported_range(),
                       VLLM_VERSION)


def require_supported() -> None:
    """Stop (a container build, say) on a vLLM outside the tested range."""
    if not is_supported():
        raise SystemExit(f"histate-vllm supports vLLM {supported_range()}; this is vLLM "
                         f"{VLLM_VERSION}")


def mark_completed(meta: OffloadingWorkerMetadata, job_id: int, success: bool) -> None:
    """Report a finished job the way this vLLM's own worker does (a failure as such where
    the scheduler reads failures from the metadata)."""
    if FAILED_JOBS:
        meta.mark_completed(job_id, success)
    else:
        meta.mark_completed(job_id)


def base_fields(meta: OffloadingWorkerMetadata) -> dict:
    """The fields of vLLM's worker metadata, whatever this version has (for subclasses that
    rebuild it when aggregating ranks)."""
    return {f.name: getattr(meta, f.name) for f in dataclasses.fields(OffloadingWorkerMetadata)}


def is_device_pointers(spec) -> bool:
    return DevicePointers is not None and isinstance(spec, DevicePointers)
