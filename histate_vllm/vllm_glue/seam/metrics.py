"""HiState's `/metrics`, through vLLM's offloading Prometheus metrics and their public inputs.

vLLM's `OffloadPromMetrics` finds the spec that declares the metrics through the offloading
connector's `spec_name` / `spec_module_path` keys, which HiState's users do not set: it is
handed a view of the config that names HiState's spec (so its metrics, its config-info labels
on 0.33+, and no CPU-spec gauges). vLLM also registers its legacy per-direction counters,
which nothing fills for a spec other than its CPU one: the metric classes it is handed leave
every metric HiState's spec and vLLM's transfer metrics do not declare unregistered.
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.offloading import metrics as vllm_metrics
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadPromMetrics

SPEC_NAME = "HiStateSpec"
SPEC_MODULE = "histate_vllm.vllm_glue.offloading_spec"


class ConfigView:
    """`obj` with some attributes replaced, read-only (vLLM reads configs, never writes)."""

    def __init__(self, obj, **replaced):
        self._obj = obj
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(self._obj, name)


def naming_histate_spec(vllm_config):
    """`vllm_config` as vLLM's offloading metrics read it, with HiState's spec named."""
    transfer = vllm_config.kv_transfer_config
    extra = {**(transfer.kv_connector_extra_config or {}),
             "spec_name": SPEC_NAME, "spec_module_path": SPEC_MODULE}
    return ConfigView(vllm_config, kv_transfer_config=ConfigView(
        transfer, kv_connector_extra_config=extra))


def declared_metric_names() -> set[str]:
    from histate_vllm.vllm_glue.prom_metrics import definitions

    names = set(definitions()) | set(vllm_metrics.get_connector_metric_definitions())
    info = getattr(vllm_metrics, "KV_OFFLOAD_CONFIG_INFO", None)  # 0.33+
    return names | ({info} if info else set())


def registering_only(metric_types: dict, names: set[str]) -> dict:
    """vLLM's metric classes, except that a metric not in `names` is made unregistered."""

    def only(kind, make):
        def create(*args, **kwargs):
            name = kwargs.get("name", args[0] if args else None)
            if name in names:
                return make(*args, **kwargs)
            return kind(*args, registry=None, **kwargs)

        return create

    return {kind: only(kind, make) for kind, make in metric_types.items()}


class HiStatePromMetrics(OffloadPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]):
        super().__init__(naming_histate_spec(vllm_config),
                         registering_only(metric_types, declared_metric_names()),
                         labelnames, per_engine_labelvalues)
