"""HiStateSpec: vLLM's offloading-spec contract, building our manager and worker."""

from __future__ import annotations


from vllm.logger import init_logger
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingSpec
from vllm.v1.kv_offload.config import OffloadingConfig

from histate_vllm.config import HiStateConfig
from histate_vllm.layout import CacheLayout
from histate_vllm.store import SSDStore, StoreIdentity

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply


class HiStateSpec(OffloadingSpec):
    def __init__(
        self,
        config: OffloadingConfig,
        histate: HiStateConfig,
        layout: CacheLayout,
        identity: StoreIdentity,
        max_model_len: int,
        step_tokens: int | None = None,
    ):
        super().__init__(config)
        if self.blocks_per_chunk != 1:
            raise ValueError("HiStateConnector offloads one vLLM block per key")
        self.histate = histate
        self.layout = layout
        self.identity = identity
        self.max_model_len = max_model_len
        self.step_tokens = step_tokens
        self._manager = None
        self._worker = None

    @classmethod
    def build_metric_definitions(cls, extra_config):
        from histate_vllm.metrics import definitions

        return definitions()

    def open_store(self) -> SSDStore | None:
        if self.histate.ssd_dir is None:
            return None
        store = SSDStore(self.histate.ssd_dir, self.identity, budget_bytes=self.histate.ssd_bytes)
        if store.unavailable_reason is not None:
            logger.warning(
                "HiState: SSD store %s is not writable (%s); serving with DRAM only",
                self.histate.ssd_dir, store.unavailable_reason,
            )
        return store

    def get_manager(self):
        if self._manager is None:
            from histate_vllm.manager import HiStateManager

            self._manager = HiStateManager(
                self.layout,
                self.histate,
                tokens_per_hash=self.tokens_per_hash,
                max_model_len=self.max_model_len,
                store=self.open_store(),
                enable_events=self.kv_events_config.enable_kv_cache_events,
                step_tokens=self.step_tokens,
            )
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches):
        if self._worker is None:
            from histate_vllm.worker import HiStateWorker

            self._worker = HiStateWorker(
                kv_caches,
                key_bytes=self.layout.key_bytes,
                num_slots=self.histate.dram_bytes // self.layout.key_bytes,
                store=self.open_store(),
                ssd_queue_bytes=self.histate.ssd_queue_bytes,
            )
        return self._worker
