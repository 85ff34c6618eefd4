"""HiStateSpec: vLLM's offloading-spec contract, building our manager and worker."""

from __future__ import annotations

from vllm.logger import init_logger
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingSpec
from vllm.v1.kv_offload.config import OffloadingConfig

from histate_vllm.config import HiStateConfig
from histate_vllm.store import SSDStore, StoreIdentity
from histate_vllm.store.errors import StoreUnusable
from histate_vllm.store.startup import open_for_engine
from histate_vllm.vllm_glue.layout import CacheLayout, dram_slots

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply

# What HiStateManager.config_info reports: the settings that shape what is cached.
CONFIG_INFO_KEYS = ("connector", "policy", "block_tokens", "dram_bytes", "ssd_bytes",
                    "ssd_dir", "store_identity")

_said_unusable: set[str] = set()  # roots already reported in this process


def _dram_only(e: StoreUnusable) -> None:
    """Say once per process why the SSD tier is off."""
    if e.root not in _said_unusable:
        _said_unusable.add(e.root)
        logger.warning("HiState: %s; serving with DRAM only", e)


class HiStateSpec(OffloadingSpec):
    def __init__(
        self,
        config: OffloadingConfig,
        histate: HiStateConfig,
        layout: CacheLayout,
        identity: StoreIdentity,
        max_model_len: int,
        step_tokens: int | None = None,
        store_root: str | None = None,
        chunk_tokens: int | None = None,
    ):
        """store_root: where this engine's stores live (ssd_dir, or a data-parallel
        rank's directory in it); None without an SSD tier. chunk_tokens: the longest
        prefill chunk one step runs (see HiStateManager)."""
        super().__init__(config)
        if self.blocks_per_chunk != 1:
            raise ValueError("HiStateConnector offloads one vLLM block per key")
        self.histate = histate
        self.layout = layout
        self.identity = identity
        self.max_model_len = max_model_len
        self.step_tokens = step_tokens
        self.chunk_tokens = chunk_tokens
        self.store_root = store_root
        self._manager = None
        self._worker = None

    @classmethod
    def build_metric_definitions(cls, extra_config):
        from histate_vllm.vllm_glue.prom_metrics import definitions

        return definitions()

    @classmethod
    def config_info_keys(cls, extra_config):
        # vLLM 0.33+: labels of its `vllm:kv_offload_config_info` series, which the
        # manager fills (HiStateManager.config_info).
        return CONFIG_INFO_KEYS

    @property
    def ranks(self) -> int:
        """Workers of this engine, each with its own DRAM pool (tensor x pipeline x ...)."""
        return max(self.config.parallel.world_size, 1)

    def open_store(self) -> SSDStore | None:
        """The worker's store: this rank's shard (the identity names the rank)."""
        if self.store_root is None:
            return None
        try:
            store = SSDStore(self.store_root, self.identity, budget_bytes=self.histate.ssd_bytes,
                             fsync=self.histate.ssd_fsync)
        except StoreUnusable as e:
            _dram_only(e)
            return None
        self._warn_unwritable(store)
        return store

    def _warn_unwritable(self, store: SSDStore) -> None:
        if store.unavailable_reason is not None:
            logger.warning(
                "HiState: SSD store %s is not writable (%s); serving with DRAM only",
                store.root, store.unavailable_reason,
            )

    def open_scheduler_store(self):
        """(store, lock, index) for the scheduler, or Nones without an SSD tier.

        Takes the store's lock (a second engine on this directory stops here, naming the
        first), reconciles the ranks' stores and collects orphans (see store.startup)."""
        if self.store_root is None:
            return None, None, None
        try:
            store, lock, index, report = open_for_engine(
                self.store_root, self.identity, budget_bytes=self.histate.ssd_bytes,
                lock_wait_s=10.0,  # a restarted engine's predecessor may still be exiting
            )
        except StoreUnusable as e:
            _dram_only(e)
            return None, None, None
        self._warn_unwritable(store)
        for path, fields in report.other_identities:
            logger.info("HiState: entries in %s are not used: they were stored under "
                        "another identity of this model (differing: %s)", path,
                        ", ".join(fields))
        logger.info(
            "HiState: SSD store %s: %d checkpoints usable, %d orphan files removed, "
            "%d checkpoints not held by every rank removed",
            store.layout.dir, report.checkpoints, report.orphans_removed, report.rank_mismatches,
        )
        return store, lock, index

    def get_manager(self):
        if self._manager is None:
            from histate_vllm.vllm_glue.manager import HiStateManager

            store, lock, index = self.open_scheduler_store()
            self._manager = HiStateManager(
                self.layout,
                self.histate,
                tokens_per_hash=self.tokens_per_hash,
                max_model_len=self.max_model_len,
                store=store,
                store_index=index,
                store_lock=lock,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                step_tokens=self.step_tokens,
                chunk_tokens=self.chunk_tokens,
                ranks=self.ranks,
            )
        return self._manager

    def get_worker(self, kv_caches: CanonicalKVCaches):
        if self._worker is None:
            from histate_vllm.vllm_glue.worker import HiStateWorker

            self._worker = HiStateWorker(
                kv_caches,
                key_bytes=self.layout.key_bytes,
                num_slots=dram_slots(self.histate.dram_bytes, self.layout.key_bytes, self.ranks),
                store=self.open_store(),
                ssd_queue_bytes=self.histate.ssd_queue_bytes,
                ssd_read_timeout_s=self.histate.ssd_read_timeout_s,
            )
        return self._worker
