"""HiState's Prometheus metrics, published through vLLM's offloading-connector stats.

The spec declares them (`definitions`, via `HiStateSpec.build_metric_definitions`), the
manager fills an `OffloadingConnectorStats` each step (`to_stats`), and vLLM's
`OffloadPromMetrics` exposes them on `/metrics` with its model/engine labels
(`seam.metrics.HiStatePromMetrics`). Counters show
up with a `_total` suffix (prometheus_client adds it).
"""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    OffloadingMetricMetadata,
)

PREFIX = "histate_"

_TIER = ("tier",)
_C, _G, _H = OffloadingCounterMetadata, OffloadingGaugeMetadata, OffloadingHistogramMetadata
# name (without PREFIX) -> metadata. Label values come from bookkeeping/telemetry.py.
_DEFS: dict[str, OffloadingMetricMetadata] = {
    "restored_tokens": _C(documentation="Prompt tokens restored by HiState, by the tier "
                                        "their block was read from.", labelnames=_TIER),
    "restored_bytes": _C(documentation="Bytes restores read (KV and states), by the tier "
                                       "they were read from.", labelnames=_TIER),
    "restores": _C(documentation="Requests restored, by the slowest tier read.",
                   labelnames=_TIER),
    "lookups": _C(documentation="Requests HiState looked up (once per request)."),
    "misses": _C(documentation="Requests that resumed short of what was cached, by cause "
                               "(no_checkpoint, gpu_full, evicted, corrupt, write_failed, "
                               "load_failed, incompatible, writing).", labelnames=("cause",)),
    "missed_tokens": _C(documentation="Tokens recomputed that a cache entry could have "
                                      "served, by cause.", labelnames=("cause",)),
    "evictions": _C(documentation="Copies the policy evicted, by tier and reason.",
                    labelnames=("tier", "reason")),
    "demotions": _C(documentation="Copies dropped from a tier because a slower tier holds "
                                  "them (or they moved there), by tier and reason.",
                    labelnames=("tier", "reason")),
    "ssd_writes": _C(documentation="SSD writes issued to the worker."),
    "ssd_states_ahead": _C(documentation="Of those, checkpoint states written ahead of the "
                                         "KV chunks before them (held in DRAM): restorable "
                                         "while this server runs, not after a restart."),
    "ssd_states_ahead_read": _C(documentation="State pages restores read from copies "
                                              "written ahead of their KV chunks."),
    "ssd_writes_dropped": _C(documentation="SSD writes that did not land (queue full or "
                                           "I/O error); the data stays in DRAM or is lost."),
    "slot_shortfalls": _C(documentation="Keys a step stored with the DRAM slots all taken "
                                        "(by copies moving to SSD), by what gave way: "
                                        "freed_copy (a DRAM copy SSD also holds), shed (what "
                                        "the policy values least, deleted) or refused (the "
                                        "key: the prompt's KV chain ends there).",
                          labelnames=("outcome",)),
    "promoted_chunks": _C(documentation="KV chunks a restore read from SSD and kept a DRAM "
                                        "copy of (the SSD copy stays), so the next turn of "
                                        "the session reads them from DRAM."),
    "fleet_ops": _C(documentation="The fleet tier's operations by outcome: fetch (a request "
                                  "asking it: pulled, none, not_worth, failed, unavailable, "
                                  "deadline, skipped), pull (ok or a miss cause), admit (ok, "
                                  "conflict), publish and restore (per rank's shard: ok or "
                                  "a failure cause).", labelnames=("op", "outcome")),
    "fleet_bytes": _C(documentation="Bytes moved to and from the fleet tier.",
                      labelnames=("direction",)),
    "ssd_write_queue": _G(documentation="SSD copies waiting to be issued or issued and not "
                                         "yet reported back."),
    "bytes": _G(documentation="Bytes held per tier (payload).", labelnames=_TIER),
    "entries": _G(documentation="Entries held per tier and kind (kv, state).",
                  labelnames=("tier", "kind")),
    "restore_seconds": _H(
        documentation="Restore latency, from the load being issued to its completion "
                      "reaching the scheduler, by the slowest tier read.",
        labelnames=_TIER,
        buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    ),
}


def definitions() -> dict[str, OffloadingMetricMetadata]:
    return {PREFIX + name: md for name, md in _DEFS.items()}


def to_stats(delta: dict, samples: dict, gauges: dict) -> OffloadingConnectorStats | None:
    """Telemetry deltas and gauge snapshots ({(name, labels): value}) as vLLM stats."""
    if not (delta or samples or gauges):
        return None
    stats = OffloadingConnectorStats()
    for (name, labels), value in delta.items():
        stats.increase_counter(PREFIX + name, value, labels)
    for (name, labels), values in samples.items():
        for v in values:
            stats.observe_histogram(PREFIX + name, v, labels)
    for (name, labels), value in gauges.items():
        stats.set_gauge(PREFIX + name, value, labels)
    return stats
