"""The connector's contacts with vLLM's insides, as operations HiState names.

`ConnectorSeam` is vLLM's `OffloadingConnector` built around HiState's spec: vLLM's
constructor makes its spec from a factory that hands a spec only the `OffloadingConfig`,
while HiState's needs the model's identity (weights, layout, rank), so the seam runs the
connector base's constructor and the subclass builds the rest. docs/vllm-seam.md lists each
contact with the public hook that would replace it.
"""

from __future__ import annotations

import dataclasses

from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorBase_V1
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)

from histate_vllm.vllm_glue.seam import capabilities


class ConnectorSeam(OffloadingConnector):
    def __init__(self, vllm_config, role, kv_cache_config):
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
        self.connector_scheduler = None
        self.connector_worker = None

    if not capabilities.FAILED_JOBS:  # vLLM 0.34's connector reports failed loads itself
        def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
            _, finished_recving = self.get_finished(finished_req_ids)
            return KVConnectorTransferResults(
                finished_recving=finished_recving,
                failed_recving=self.connector_worker.take_failed_loads(),
            )


def recompute_failed_loads(transfer_config) -> None:
    """A restore that fails verification falls back to recomputation, not a failed request
    (vLLM's default `kv_load_failure_policy` is "fail")."""
    if transfer_config.kv_load_failure_policy != "recompute":
        transfer_config.kv_load_failure_policy = "recompute"


def offloading_config(vllm_config, kv_cache_config):
    """vLLM's offloading config for HiState: multi-turn continuations reuse decoded tokens
    too (`offload_prompt_only` off), and KV events, when vLLM publishes them, carry each
    block's tokens and parent hash, which a router needs to match a prompt (vLLM's tracker
    records them only when asked). Both are the offloading connector's documented keys."""
    offloading = build_offloading_config(vllm_config, kv_cache_config)
    return dataclasses.replace(offloading, extra_config={
        "offload_prompt_only": False, "self_describing_kv_events": True})
