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
import time
from dataclasses import dataclass, field

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
    OffloadingConnectorMetadata,
    OffloadingWorkerMetadata,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput

from histate_vllm.bookkeeping import rank_reports
from histate_vllm.bookkeeping.restore_admission import Admission, evictable_blocks
from histate_vllm.bookkeeping.step_cost import StepCost
from histate_vllm.config import HiStateConfig
from histate_vllm.vllm_glue.cpu_binding import check_worker_binding, place_worker_threads
from histate_vllm.vllm_glue.identity import check_parallelism, store_identity, store_root
from histate_vllm.vllm_glue.layout import CacheLayout, check_kv_cache_pages, check_ssd_bytes
from histate_vllm.vllm_glue.offloading_spec import HiStateSpec
from histate_vllm.vllm_glue.seam import capabilities
from histate_vllm.vllm_glue.seam.connector import (
    ConnectorSeam,
    offloading_config,
    recompute_failed_loads,
)
from histate_vllm.vllm_glue.seam.scheduler import SchedulerSeam, intercept_local_lookup
from histate_vllm.vllm_glue.seam.worker import WorkerSeam, metadata_fields

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply

# An idle engine stepped only for SSD writes in flight waits this long per step for one to
# land: at most this much later for a request that arrives meanwhile, and no spinning.
IDLE_WAIT_S = 0.01


@dataclass
class HiStateConnectorMetadata(OffloadingConnectorMetadata):
    # SSD deletes, resets and writes for every worker, in the order decided.
    ssd_writes: list = field(default_factory=list)
    # Nothing scheduled: vLLM steps the engine only for HiState's SSD work.
    idle: bool = False


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
            **metadata_fields(base),  # failed_jobs too, where vLLM has them
            ssd_written=rank_reports.merge(self.ssd_written, other.ssd_written),
            ssd_lost=self.ssd_lost | other.ssd_lost,
        )


class HiStateConnectorScheduler(SchedulerSeam):
    def __init__(self, spec: HiStateSpec, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig):
        super().__init__(spec, vllm_config, kv_cache_config)
        self._layout = spec.layout
        # vLLM counts job completions the same way (one per worker).
        self._ssd_tally = rank_reports.SSDReportTally(vllm_config.parallel_config.world_size)
        self.admission = Admission(
            spec.layout.block_tokens, len(spec.layout.kv_group_ids),
            len(spec.layout.state_group_ids), vllm_config.model_config.max_model_len,
        )
        # Blocks of each request's GPU hit in vLLM's free queue (see local_prefix_hit),
        # from its local lookup to the connector's lookup that follows it.
        self._own_evictable: dict[str, int] = {}
        self._kv_cache_manager_ref = None
        # The price of a chunk end off vLLM's grid, measured from this engine's steps.
        self._step_cost = None
        if spec.histate.step_cost_tokens == "auto":
            self._step_cost = StepCost(
                spec.layout.block_tokens, min_tokens=spec.layout.block_tokens,
                lag=1 if vllm_config.scheduler_config.async_scheduling else 0)

    def _keep_block_size(self) -> None:
        if self._layout.state_group_ids:  # else chunk ends do not matter
            self.keep_block_size(self._layout.block_tokens, logger)

    def on_new_request(self, request) -> None:
        self._keep_block_size()
        self.manager.register_request(request)
        super().on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int, max_num_new_tokens=None):
        # A load that does not fit the free GPU blocks would stall vLLM's whole waiting
        # queue: look up only as deep as fits (the deepest checkpoint within; see
        # bookkeeping/restore_admission.py). One lookup, so vLLM's lookup stats count each once.
        if not self.manager.fleet_gate(request, num_computed_tokens):
            return None, False  # the fleet tier may take it further: asked again next step
        limit = self.admission.limit(request, num_computed_tokens,
                                     self._own_evictable.pop(request.request_id, 0))
        cut = None
        if limit is not None and (max_num_new_tokens is None or limit < max_num_new_tokens):
            cut = num_computed_tokens + limit
            logger.debug("HiState: %s restore limited to %d tokens past %d to fit the free "
                         "GPU blocks", request.request_id, limit, num_computed_tokens)
            max_num_new_tokens = limit
        hit, is_async = super().get_num_new_matched_tokens(
            request, num_computed_tokens, max_num_new_tokens
        )
        if hit is not None:
            done = num_computed_tokens + hit
            self.manager.note_hit(request, done, num_computed_tokens, cut)
            if not (hit and self.chunk_end_target(request) == done):
                self._steer_chunk_end(request, done)
            # else: vLLM found the GPU holding this prefix's KV but not its state (a
            # junction) and the restore brings that state: keep the junction, so vLLM
            # caches the restored state on the GPU when the load lands (it retains a
            # state only at a prompt end or a junction) and the next request sharing the
            # prefix hits the GPU instead of restoring it again.
            logger.debug("HiState: %s resumes at %d; checkpoints planned at %s",
                         request.request_id, done, self.manager.capture_positions(request))
        return hit, is_async

    # --- GPU hits first ---

    def bind_local_lookup(self, kv_cache_manager) -> None:
        """Take over vLLM's local prefix lookup for a connector (`KVCacheManager.
        get_computed_blocks_for_connector`, which vLLM's scheduler calls instead of
        `get_computed_blocks` when the connector `supports_divergent_local_hybrid_hits`)."""
        self._kv_cache_manager_ref = kv_cache_manager
        intercept_local_lookup(kv_cache_manager, self.local_prefix_hit)

    def local_prefix_hit(self, lookup, request, *bound):
        """The GPU part of a request's hit: vLLM's, or a deeper one the connector completes.

        On a hybrid model vLLM's own hit is the deepest position where every group has
        its blocks: the attention KV *and* a recurrent state. Its attention KV often
        reaches further (a shared prefix whose state was never kept, or was evicted
        before its KV, as states are freed as soon as a request moves past them). A
        restore from there would copy attention KV the GPU already holds into new blocks,
        duplicating the prefix in the GPU cache and crowding out other sessions. So where
        the attention KV reaches past vLLM's hit and this connector holds a state at or
        beyond a point past that hit, the GPU serves the attention KV up to `start` and
        the connector loads only the KV from `start` and the state (`_divergent_start`).
        Otherwise vLLM's own all-group hit stands, so this is never worse than before.
        """
        blocks, local, junction, diverged = lookup(request, *bound)
        if diverged:
            kvm = self._kv_cache_manager_ref
            all_blocks, all_local, all_junction = kvm.get_computed_blocks(request, *bound)
            # vLLM's GPU lookup drops an EAGLE-type drafter's last block (0.32, 0.33):
            # its group may cover less than the target's attention KV.
            bt = self._layout.block_tokens
            gpu_kv = min((len(blocks.blocks[g]) * bt for g in self._layout.kv_group_ids),
                         default=local)
            start = self._divergent_start(request, all_local, min(local, gpu_kv))
            if start is None:
                blocks, local, junction, diverged = all_blocks, all_local, all_junction, False
            else:
                logger.debug("HiState: %s GPU attention hit %d, all-group hit %d: GPU "
                             "serves %d", request.request_id, local, all_local, start)
                # The junction vLLM found (where the shared prefix's state is missing):
                # kept where the restore ends on it, so the GPU caches the restored state.
                blocks, local, junction = (
                    kvm.truncate_computed_blocks(blocks, start), start, all_junction)
        self._own_evictable[request.request_id] = evictable_blocks(blocks)
        return blocks, local, junction, diverged

    def _divergent_start(self, request, all_local: int, attn_local: int) -> int | None:
        """Where the GPU's share of a divergent hit ends, or None (use vLLM's all-group hit).

        `attn_local`: tokens of attention KV the GPU holds; `all_local`: vLLM's all-group
        hit. The deepest state p this connector can restore past `all_local` decides:
        past `attn_local`, the GPU serves all its attention KV and the load starts there;
        at or below it, the load starts one block before p (vLLM loads at least one token,
        and the state needs the KV of at least one block with it). Either way the load
        must be within what fits the free GPU blocks now, and every KV block from the
        start to p must be readable here (an EAGLE-type drafter's KV included: it is
        served up to p, see `SchedulerSeam._lookup_complete_chunks`)."""
        if not self._layout.state_group_ids:
            return None
        keys = self.offload_keys(request.request_id, self._layout.state_group_ids)
        if keys is None:
            return None
        bt = self._layout.block_tokens
        state_keys, kv_keys = keys
        if not state_keys:
            return None
        top = (request.num_tokens - 1) // bt
        top = min([top] + [len(keys) for keys in state_keys + kv_keys])
        readable = self.manager.orch.readable
        limit = None
        for end in range(top, all_local // bt, -1):  # p = end * bt, deepest first
            if not all(readable(keys[end - 1]) for keys in state_keys):
                continue
            start = min(attn_local // bt, end - 1)
            if start * bt <= all_local:
                return None  # vLLM's all-group hit loads as much with as few blocks
            if limit is None:
                limit = self.admission.limit(request, start * bt)
            if limit is not None and (end - start) * bt > limit:
                continue
            if all(readable(keys[i]) for keys in kv_keys for i in range(start, end)):
                return start * bt
        return None

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        # vLLM allocated this request's first blocks: from now on it holds a reservation
        # for the rest of its sequence (an in-flight prefill or load), until
        # build_connector_meta sees it done prefilling.
        local = self.locally_computed_tokens(request.request_id)
        self.admission.track(request, max(request.num_computed_tokens,
                                          local + num_external_tokens))
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def request_finished(self, request):
        self.admission.drop(request.request_id)
        self._own_evictable.pop(request.request_id, None)
        return super().request_finished(request)

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
        if self.chunk_end_target(request) > done:
            return
        nxt = next((p for p in self.manager.capture_positions(request) if p > done), 0)
        if nxt and nxt < request.num_prompt_tokens:
            self.steer_chunk_end(request, nxt)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        self._keep_block_size()
        cost = self._step_cost
        if cost is not None and cost.step(time.perf_counter(),
                                          scheduler_output.total_num_scheduled_tokens):
            self.manager.set_step_cost(cost.tokens, cost.fixed_s, cost.per_token_s)
        # Before vLLM advances num_computed_tokens: where this step's chunks end.
        prefilling = False
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            request = self.manager.live_request(req_id)
            if request is not None:
                prefilling |= request.num_computed_tokens < request.num_prompt_tokens
                done = request.num_computed_tokens + n
                if done < request.num_prompt_tokens:
                    self._steer_chunk_end(request, done)
                # vLLM allocated this step's blocks: a prefill still in flight after it
                # keeps a (smaller) reservation, a finished one none.
                if done < request.num_tokens:
                    self.admission.track(request, done)
                else:
                    self.admission.drop(req_id)
        for req_id in scheduler_output.preempted_req_ids or ():
            self.admission.drop(req_id)  # its blocks are freed
        for req_id in scheduler_output.finished_req_ids:
            self.admission.drop(req_id)
        meta = super().build_connector_meta(scheduler_output)
        # After every store job of the step, so each state's chunks are already staged.
        # Deletes (and a reset) first: they were decided before this step's writes.
        # A lone prefill: its decode or the idle gap after it is the quiet time the backups
        # wait for. Beside other requests (a loaded server) no step is quiet, and holding
        # only makes the writes burstier (bench_load, results_load.md).
        lone = len(scheduler_output.num_scheduled_tokens) == 1
        fleet = self.manager.fleet
        if fleet is not None and scheduler_output.total_num_scheduled_tokens == 0:
            fleet.wait(IDLE_WAIT_S)  # requests wait on the fleet tier: no spinning
        return HiStateConnectorMetadata(
            **{f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)},
            ssd_writes=(self.manager.take_ssd_deletes()
                        + self.manager.take_ssd_writes(prefilling and lone)),
            idle=scheduler_output.total_num_scheduled_tokens == 0,
        )

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


class HiStateConnectorWorker(WorkerSeam):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ssd_writes: list = []
        self._idle = False

    def register_kv_caches(self, kv_caches: dict) -> None:
        # vLLM views each layer as [num_blocks, page] bytes whatever its strides: a layout
        # with a block's bytes scattered must stop start-up here, not misplace bytes.
        check_kv_cache_pages(kv_caches, self.kv_cache_config)
        super().register_kv_caches(kv_caches)

    def prepare_store_kv(self, metadata: HiStateConnectorMetadata) -> None:
        super().prepare_store_kv(metadata)
        # Deferred like the stores they follow: they read the slots those stores fill.
        self._ssd_writes.extend(metadata.ssd_writes)

    def start_kv_transfers(self, metadata: HiStateConnectorMetadata) -> None:
        super().start_kv_transfers(metadata)
        self._idle = metadata.idle
        if self._ssd_writes:
            self.worker.submit_ssd_writes(self._ssd_writes)
            self._ssd_writes = []

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        if self._idle:
            self.worker.wait_idle(IDLE_WAIT_S)
        return super().get_finished(finished_req_ids)

    def build_connector_worker_meta(self):
        base = super().build_connector_worker_meta()  # vLLM's: completed jobs, stats
        written = {key: (1, ok) for key, ok in self.worker.ssd_written.items()}  # this rank's
        lost = set(self.worker.ssd_lost)
        self.worker.ssd_written.clear()
        self.worker.ssd_lost.clear()
        if base is None and not (written or lost):
            return None
        return HiStateWorkerMetadata(**metadata_fields(base), ssd_written=written, ssd_lost=lost)


def prefill_chunk_tokens(scheduler_config) -> int:
    """The longest prefill chunk one step runs: vLLM caps a prefill's tokens per step at
    its token budget and, when set, at long_prefill_token_threshold."""
    chunk = scheduler_config.max_num_batched_tokens
    threshold = scheduler_config.long_prefill_token_threshold
    return min(chunk, threshold) if threshold > 0 else chunk


class HiStateConnector(ConnectorSeam):
    # vLLM's offloading connector with HiState's spec; the layout it asks for is vLLM's own
    # offloading connector's (a block's page one contiguous run, which every copy here
    # moves; the worker checks the tensors it gets: check_kv_cache_pages).
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ):
        super().__init__(vllm_config, role, kv_cache_config)
        transfer_config = vllm_config.kv_transfer_config
        histate = HiStateConfig.from_extra_config(transfer_config.kv_connector_extra_config)
        recompute_failed_loads(transfer_config)
        check_parallelism(vllm_config)
        layout = CacheLayout.from_config(kv_cache_config)
        check_ssd_bytes(histate, layout, vllm_config.model_config.max_model_len)
        offloading = offloading_config(vllm_config, kv_cache_config)
        root = store_root(histate.ssd_dir, vllm_config)
        spec = HiStateSpec(
            offloading, histate, layout,
            # Without an SSD store the identity names nothing on disk: weights not read.
            store_identity(vllm_config, layout, kv_cache_config, weights_cache_dir=root,
                           hash_weights=root is not None),
            max_model_len=vllm_config.model_config.max_model_len,
            step_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
            chunk_tokens=prefill_chunk_tokens(vllm_config.scheduler_config),
            store_root=root,
        )
        self._gpu_hits_first = False
        if role == KVConnectorRole.SCHEDULER:
            capabilities.check_version(logger)
            self.connector_scheduler = HiStateConnectorScheduler(spec, vllm_config, kv_cache_config)
        elif role == KVConnectorRole.WORKER:
            check_worker_binding()
            place_worker_threads()
            self.connector_worker = HiStateConnectorWorker(spec, vllm_config, kv_cache_config)

    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        super().bind_kv_cache_manager(kv_cache_manager)
        if self.connector_scheduler is not None:
            self.connector_scheduler.admission.bind(kv_cache_manager)
            self.connector_scheduler.bind_local_lookup(kv_cache_manager)
            self._gpu_hits_first = True

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        # vLLM's scheduler then asks KVCacheManager.get_computed_blocks_for_connector for
        # the local hit, which the connector's scheduler side answers (local_prefix_hit):
        # attention KV the GPU holds is served from the GPU, not loaded again.
        return self._gpu_hits_first

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        from histate_vllm.vllm_glue.seam.metrics import HiStatePromMetrics

        return HiStatePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        return self.connector_worker.get_finished(finished_req_ids)

