"""HiStateSpec: vLLM's offloading-spec contract, building our manager and worker."""

from __future__ import annotations

import socket

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
                fleet=self.open_fleet(store),
            )
        return self._manager

    def open_fleet(self, store):
        """The engine's link to the fleet tier (docs/fleet.md), or None: not configured, no
        SSD store to pull into, or the tier unreachable at start-up (said once; the
        engine serves from its own tiers)."""
        cfg = self.histate
        if cfg.fleet_backend is None or store is None:
            return None
        from histate_vllm.store.fleet import DirBackend, FleetTier, FleetUnavailable
        from histate_vllm.store.fleet.backends import MooncakeBackend
        from histate_vllm.store.fleet.link import FleetLink
        from histate_vllm.store.reset import rank_identity

        try:
            if cfg.fleet_backend == "dir":
                backend = DirBackend(cfg.fleet_dir, cfg.fleet_bytes, fsync=cfg.ssd_fsync)
                where = cfg.fleet_dir
            else:
                where = f"Mooncake Store at {cfg.fleet_master}"
                try:
                    backend = MooncakeBackend(
                        cfg.fleet_master, cfg.fleet_metadata_server,
                        local_hostname=cfg.fleet_local_hostname or socket.gethostname(),
                        protocol=cfg.fleet_protocol, device=cfg.fleet_device)
                except FleetUnavailable as e:  # an outage: joins the tier once it is back
                    logger.warning("HiState fleet tier: %s; serving from this engine's own "
                                   "tiers until it answers", e)
                    backend = MooncakeBackend(
                        cfg.fleet_master, cfg.fleet_metadata_server,
                        local_hostname=cfg.fleet_local_hostname or socket.gethostname(),
                        protocol=cfg.fleet_protocol, device=cfg.fleet_device, lazy=True)
        except FleetUnavailable as e:
            logger.warning("HiState fleet tier: %s; serving from this engine's own tiers", e)
            return None
        ranks = range(store.identity.tp_size)
        identities = [rank_identity(store.identity, r) for r in ranks]

        def opener(r: int):
            if r == 0:
                return lambda: store
            return lambda: SSDStore(self.store_root, identities[r],
                                    budget_bytes=self.histate.ssd_bytes,
                                    fsync=self.histate.ssd_fsync)

        logger.info("HiState fleet tier: %s (identity %s)", where, identities[0].digest())
        return FleetLink([FleetTier(backend, i) for i in identities],
                         [opener(r) for r in ranks])

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
