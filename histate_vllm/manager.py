"""HiStateManager: vLLM's offloading-manager contract over a DRAM slot pool and an SSD store.

A thin adapter: the books and every step around the policy core (what is admitted, staging,
SSD copies, evictions, moves to SSD) live in `histate_vllm.orchestration.Orchestrator`, which
the trace simulator drives too. This class translates vLLM's calls and types (requests,
offload keys, store specs, events) and owns the SSD store handle. It runs in the scheduler
process; the worker moves the bytes.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable, Sequence

from vllm.logger import init_logger
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

from histate_vllm.config import HiStateConfig
from histate_vllm.eventlog import EventLogWriter, Lookup, fingerprints
from histate_vllm.layout import CacheLayout
from histate_vllm.metrics import to_stats
from histate_vllm.orchestration import Orchestrator, SlotPool, headroom_bytes
from histate_vllm.policy import Tier, make_policy
from histate_vllm.specs import HiStateLoadSpec, HiStateStoreSpec, SSDWrite
from histate_vllm.telemetry import Telemetry, summary

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply


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
    ):
        """step_tokens: most tokens one engine step prefills (vLLM's max_num_batched_tokens);
        the policy keeps that many blocks of DRAM free for copies moving to SSD."""
        self.layout = layout
        self.config = config
        self.store = store
        self.tokens_per_hash = tokens_per_hash
        self.hashes_per_block = layout.block_tokens // tokens_per_hash
        self.num_slots = config.dram_bytes // layout.key_bytes
        if self.num_slots == 0:
            raise ValueError(
                f"HiStateConnector: dram_bytes={config.dram_bytes} holds no block; one "
                f"block of this model takes {layout.key_bytes} bytes"
            )
        pool_bytes = self.num_slots * layout.key_bytes
        headroom = 0
        if store is not None and step_tokens:
            step_keys = -(-step_tokens // layout.block_tokens) * len(layout.group_ids)
            headroom = headroom_bytes(pool_bytes, step_keys * layout.key_bytes)
        budgets = {Tier.DRAM: pool_bytes - headroom}
        if store is not None:
            budgets[Tier.SSD] = self._ssd_payload_budget(config.ssd_bytes, max_model_len)
        self.policy = make_policy(
            config.policy,
            budgets=budgets,
            block_tokens=layout.block_tokens,
            interval=config.interval,
            kv_groups=layout.kv_group_ids,
            state_groups=sorted(layout.state_group_ids),
        )
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self.orch = Orchestrator(
            self.policy,
            SlotPool(self.num_slots, layout.key_bytes),
            block_tokens=layout.block_tokens,
            kv_groups=layout.kv_group_ids,
            state_groups=sorted(layout.state_group_ids),
            key_bytes=lambda is_state: layout.key_bytes,
            has_ssd=store is not None,
            delete=self._delete_from_store if store is not None else None,
            on_dram=self._dram_event if enable_events else None,
        )
        self._requests: dict = {}  # req_id -> vllm Request (live, its block_hashes grow)
        self._init_observability()
        if store is not None:
            self._load_store_index()

    @property
    def _entries(self):
        return self.orch.entries

    def _ssd_payload_budget(self, ssd_bytes: int, max_model_len: int) -> int:
        """The policy counts payload bytes; the disk also holds a header per file, a
        manifest per checkpoint (up to one reference per KV chunk of a full context) and
        the identity file. Scale the budget so the worst case still fits in ssd_bytes."""
        from histate_vllm.store import HEADER_BYTES

        max_refs = max_model_len // self.layout.block_tokens * len(self.layout.kv_group_ids)
        per_key = HEADER_BYTES + 256 + 80 * max_refs
        usable = max(ssd_bytes - (64 << 10), 0)
        return usable * self.layout.key_bytes // (self.layout.key_bytes + per_key)

    # --- start-up ---

    def _load_store_index(self) -> None:
        """Re-admit what a previous run left on SSD (manifests and sizes only)."""
        index = self.store.scan()
        checkpoints, chunks = self.orch.restore(index.checkpoints, index.chunks)
        logger.info("HiState: found %d checkpoints and %d KV chunks on SSD (%s)",
                    checkpoints, chunks, self.store.root)

    # --- requests ---

    def register_request(self, request) -> None:
        self._requests[request.request_id] = request

    def note_hit(self, request, hit_tokens: int, gpu_tokens: int = 0) -> None:
        """Tokens the request resumes from (GPU prefix cache + this connector), of which
        `gpu_tokens` the GPU prefix cache served."""
        nb = gpu_tokens // self.layout.block_tokens
        self.orch.note_hit(request.request_id, hit_tokens,
                           (lambda: self._block_hashes(request)[:nb]) if nb else None)
        self._note_lookup(request, hit_tokens, gpu_tokens)

    def capture_positions(self, request) -> list[int]:
        """Where the policy wants this request's states (ascending, block-aligned).

        Asked every step while a request prefills: the block hashes are sliced only once,
        when the plan is made."""
        plan = self.orch.planned(request.request_id)
        if plan is None:
            plan = self.orch.plan(request.request_id, self._block_hashes(request),
                                  request.num_prompt_tokens)
        return plan

    def live_request(self, request_id: str):
        return self._requests.get(request_id)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._requests.pop(req_context.req_id, None)
        self._loading.pop(req_context.req_id, None)
        self.telemetry.request_finished(req_context.req_id)
        self.orch.request_finished(req_context.req_id)

    # --- lookup and load ---

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if self.orch.readable(key) else LookupResult.MISS

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource.HOST if self.orch.in_dram(key) else CacheHitSource.DISK

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> HiStateLoadSpec:
        keys = list(keys)
        slots, is_state = self.orch.prepare_load(keys)
        self._note_load(req_context.req_id, keys, slots)
        return HiStateLoadSpec(slots=slots, keys=keys, is_state=is_state)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.orch.touch(keys)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.orch.complete_load(keys)
        self._loading.pop(req_context.req_id, None)
        self.telemetry.load_done(req_context.req_id)

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
            request.num_prompt_tokens,
        )
        logger.debug("HiState: %s offers %d keys, stores %d", req_context.req_id, len(keys),
                     len(keys_to_store))
        return PrepareStoreOutput(
            keys_to_store=keys_to_store,
            store_spec=HiStateStoreSpec(slots=slots),
            evicted_keys=[OffloadKey(k) for k in evicted],
        )

    def _block_hashes(self, request) -> list[bytes]:
        hpb = self.hashes_per_block
        return list(request.block_hashes[hpb - 1 :: hpb])

    def take_ssd_writes(self) -> list[SSDWrite]:
        """SSD copies of what this step staged in DRAM; called after all its store jobs."""
        writes = self.orch.take_ssd_writes()
        self.telemetry.add("ssd_writes", len(writes))
        return writes

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        stored = self.orch.complete_store(keys, success)
        if stored and self.events is not None:
            self.events.append(OffloadingEvent(keys=stored, medium=Medium.CPU, removed=False))

    def on_ssd_written(self, results: dict[bytes, bool]) -> None:
        """The worker finished (or gave up) writing these keys to SSD."""
        entries = self.orch.entries
        dropped = sum(1 for k, ok in results.items()
                      if not ok and (e := entries.get(k)) is not None and e.ssd_pending)
        self.telemetry.add("ssd_writes_dropped", dropped)
        self.orch.on_ssd_written(results)

    def on_ssd_lost(self, keys: Iterable[bytes], reason: str) -> None:
        """Keys the worker found corrupt or missing on SSD (already quarantined there)."""
        self.orch.on_ssd_lost(keys, reason)

    def apply_demotions(self) -> None:
        self.orch.apply_demotions()

    def _dram_event(self, keys: list[bytes], removed: bool) -> None:
        self.events.append(OffloadingEvent(keys=keys, medium=Medium.CPU, removed=removed))

    def _delete_from_store(self, key: bytes, is_state: bool) -> None:
        try:
            if is_state:
                self.store.delete_checkpoint(key)
            else:
                self.store.delete_chunk(key)
        except OSError as exc:  # never take the server down for a cache file
            logger.warning("HiState: could not delete %s from SSD: %s", key.hex()[:16], exc)

    # --- misc ---

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events:
            yield from self.events
            self.events.clear()

    def reset_cache(self) -> None:
        self.orch.reset_cache()

    def dram_slots_in_use(self) -> int:
        return self.orch.pool.in_use()

    # --- observability (telemetry.py counts, metrics.py publishes, eventlog.py keeps) ---

    GAUGE_INTERVAL = 1.0  # seconds between scans of the entries for the gauges

    def _init_observability(self) -> None:
        self.telemetry = Telemetry(self.layout.block_tokens, time.monotonic)
        self._loading: dict[str, list[bytes]] = {}  # request -> keys of its load in flight
        self.orch.on_events = self._on_policy_events
        self._gauges_at = float("-inf")
        self._other_stores = self._sibling_stores()
        log_dir = self.config.event_log_dir
        if log_dir is None and self.store is not None:
            log_dir = os.path.join(self.store.layout.dir, "events")
        self.event_log: EventLogWriter | None = None
        if log_dir is not None:
            try:
                self.event_log = EventLogWriter(log_dir, max_bytes=self.config.event_log_bytes)
            except OSError as exc:
                logger.warning("HiState: no event log in %s: %s", log_dir, exc)
        self._stop = threading.Event()
        if self.config.summary_interval:
            # A thread, so the last burst before an idle spell is reported too.
            threading.Thread(target=self._summary_loop, name="histate-summary",
                             daemon=True).start()
        # Operators (and the server test) read the real block size from this line.
        logger.info("HiState: %d-token blocks, %d bytes per key, %d DRAM slots, SSD %s, "
                    "event log %s", self.layout.block_tokens, self.layout.key_bytes,
                    self.num_slots, self.store.root if self.store is not None else "off",
                    log_dir or "off")

    def _on_policy_events(self, events) -> None:
        entries = self.orch.entries
        self.telemetry.on_events(events, lambda k: k not in entries)
        if self.event_log is not None:
            self.event_log.append(events=events)

    def _note_lookup(self, request, hit_tokens: int, gpu_tokens: int) -> None:
        """Once per request: was anything cached past where it resumes, and why not used."""
        rid = request.request_id
        if self.telemetry.looked_up(rid):
            return
        bt = self.layout.block_tokens
        hashes = self._block_hashes(request)
        hit = self.policy.restorable(hashes) if hashes else None
        shared = hit.shared if hit is not None else 0
        usable = (request.num_prompt_tokens - 1) // bt * bt
        miss = self.telemetry.lookup(rid, hashes, hit_tokens, usable, shared, self._writing,
                                     self._elsewhere if self._other_stores else None)
        if self.event_log is not None:
            self.event_log.append(lookups=[Lookup(
                t=time.time(), request_id=rid, prompt_tokens=request.num_prompt_tokens,
                block_tokens=bt, covered=hit_tokens, gpu=gpu_tokens,
                position=hit.position if hit is not None else 0, shared=shared,
                cause=miss[0] if miss else "", missed=miss[1] if miss else 0,
                fps=fingerprints(request.prompt_token_ids or [], bt, len(hashes)),
                nodes=hashes,
            )])

    def _writing(self, node: bytes) -> bool:
        """A key of this block is admitted but its write has not landed."""
        entries = self.orch.entries
        for g in self.layout.group_ids:
            e = entries.get(node + g.to_bytes(4, "big"))
            if e is not None and not e.readable:
                return True
        return False

    def _sibling_stores(self) -> list[str]:
        """Identity directories of other engines (model, dtype, layout) under ssd_dir."""
        if self.store is None:
            return []
        root, own = self.store.root, self.store.layout.dir
        try:
            dirs = [e.path for e in os.scandir(root) if e.is_dir() and e.path != own]
        except OSError:
            return []
        return [d for d in dirs if os.path.isdir(os.path.join(d, "manifests"))]

    def _elsewhere(self, nodes: Sequence[bytes]) -> bool:
        """A checkpoint at one of the deepest of these blocks exists under another identity
        (a few stat calls, on a miss only)."""
        from histate_vllm.store.layout import Layout

        groups = sorted(self.layout.state_group_ids)
        for d in self._other_stores:
            other = Layout(os.path.dirname(d), os.path.basename(d))
            for node in nodes[-4:]:
                for g in groups:
                    if os.path.exists(other.manifest_path(node + g.to_bytes(4, "big"))):
                        return True
        return False

    def _note_load(self, request_id: str, keys: Sequence[bytes], slots: Sequence[int]) -> None:
        """Restored tokens per tier: each block of the load counts under the slowest tier
        one of its keys is read from (slot -1: SSD)."""
        tier_at: dict[int, str] = {}
        entries = self.orch.entries
        for key, slot in zip(keys, slots):
            pos = entries[key].position
            if tier_at.get(pos) != "ssd":
                tier_at[pos] = "ssd" if slot < 0 else "dram"
        bt = self.layout.block_tokens
        per_tier = Counter(tier_at.values())
        self.telemetry.load_issued(request_id, {t: n * bt for t, n in per_tier.items()})
        self._loading[request_id] = keys

    def note_failed_loads(self, request_ids: Iterable[str], lost: Collection[bytes] = ()
                          ) -> None:
        """Loads the worker could not complete (vLLM recomputes those requests); `lost`:
        keys it found corrupt or missing on SSD in the same step."""
        for rid in request_ids:
            keys = self._loading.get(rid, ())
            cause = "corrupt" if any(k in lost for k in keys) else "load_failed"
            self.telemetry.load_failed([rid], cause)

    def _measure(self) -> dict:
        """Gauges from the books: bytes and entries per tier, SSD writes in flight."""
        nbytes = {"dram": 0, "ssd": 0}
        count = {(t, k): 0 for t in ("dram", "ssd") for k in ("kv", "state")}
        queue = 0
        for e in self.orch.entries.values():
            kind = "state" if e.is_state else "kv"
            if e.slot >= 0 and e.dram_ready:
                nbytes["dram"] += e.nbytes
                count[("dram", kind)] += 1
            if e.on_ssd:
                nbytes["ssd"] += e.nbytes
                count[("ssd", kind)] += 1
            queue += e.ssd_pending
        if self.store is None:
            del nbytes["ssd"], count[("ssd", "kv")], count[("ssd", "state")]
        gauges = {("bytes", (t,)): v for t, v in nbytes.items()}
        gauges.update({("entries", tk): v for tk, v in count.items()})
        gauges[("ssd_write_queue", ())] = queue
        return gauges

    def get_stats(self):
        """vLLM's stats channel (published on /metrics): counts since the last call, and
        the gauges at most once per GAUGE_INTERVAL."""
        now = time.monotonic()
        gauges = {}
        if now - self._gauges_at >= self.GAUGE_INTERVAL:
            gauges, self._gauges_at = self._measure(), now
        delta, samples = self.telemetry.take()
        return to_stats(delta, samples, gauges)

    def _summary_loop(self) -> None:
        while not self._stop.wait(self.config.summary_interval):
            self.log_summary()

    def log_summary(self) -> str | None:
        """Log (and return) the INFO line for the counts since the last one; None, and
        nothing logged, when nothing happened (background SSD copies alone do not count)."""
        window = self.telemetry.window()
        if not window or {name for name, _ in window} <= {"ssd_writes"}:
            return None
        # The books change under this thread: copy the entries at once (one C-level call).
        entries = list(self.orch.entries.values())
        dram = sum(e.nbytes for e in entries if e.slot >= 0 and e.dram_ready)
        gauges = {"DRAM MiB": round(dram / 2**20, 1)}
        if self.store is not None:
            gauges["SSD MiB"] = round(sum(e.nbytes for e in entries if e.on_ssd) / 2**20, 1)
            gauges["SSD queue"] = sum(e.ssd_pending for e in entries)
        line = summary(window, gauges)
        logger.info(line)
        return line

    def shutdown(self) -> None:
        self._stop.set()
        if self.event_log is not None:
            self.event_log.close()
