"""HiStateManager: vLLM's offloading-manager contract over a DRAM slot pool and an SSD store.

It keeps the books (which key is where, which DRAM slot holds it, what is being written or
read) and asks the policy core for every decision: what to admit, what to evict, whether a
key keeps its DRAM copy once it is on SSD. It runs in the scheduler process; the worker
moves the bytes.

New data is always staged in a DRAM slot first (the GPU page may be reused right after the
step), and the worker copies it from there to SSD. A slot is pinned until that copy is done.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

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
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from histate_vllm.config import HiStateConfig
from histate_vllm.layout import CacheLayout
from histate_vllm.policy import Item, Kind, Tier, make_policy
from histate_vllm.specs import HiStateLoadSpec, HiStateStoreSpec, SSDWrite

logger = init_logger(f"vllm.{__name__}")  # under vllm: its log level and format apply


@dataclass(slots=True)
class Entry:
    is_state: bool
    position: int
    slot: int = -1  # DRAM slot, -1 when none
    dram_ready: bool = False
    on_ssd: bool = False
    ssd_pending: bool = False
    # The policy dropped this copy while a write to it was in flight: drop it when it lands.
    forget_dram: bool = False
    forget_ssd: bool = False

    @property
    def readable(self) -> bool:
        return (self.slot >= 0 and self.dram_ready) or self.on_ssd


class HiStateManager(OffloadingManager):
    def __init__(
        self,
        layout: CacheLayout,
        config: HiStateConfig,
        tokens_per_hash: int,
        max_model_len: int,
        store=None,
        enable_events: bool = False,
    ):
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
        self._free_slots = list(range(self.num_slots - 1, -1, -1))
        budgets = {Tier.DRAM: self.num_slots * layout.key_bytes}
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
        self._entries: dict[bytes, Entry] = {}
        self._requests: dict = {}  # req_id -> vllm Request (live, its block_hashes grow)
        self._planned: set[str] = set()
        self._hit_tokens: dict[str, int] = {}
        # (item, chunk refs) staged in DRAM this step, waiting for take_ssd_writes().
        self._staged: list[tuple[Item, tuple[bytes, ...]]] = []
        # State keys admitted with a sibling, waiting for vLLM to offer them: key -> slot.
        self._reserved: dict[bytes, int] = {}
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        if store is not None:
            self._load_store_index()

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
        """Re-admit what a previous run left on SSD (manifests and sizes only).

        Sizes are payload bytes, as at admission: `_ssd_payload_budget` already set aside
        the headers and manifests, so counting them again would shrink the budget."""
        index = self.store.scan()
        items: list[Item] = []
        seen: set[bytes] = set()
        for key, info in index.checkpoints.items():
            chunk_keys = list(info.chunk_keys)
            parent = None
            for i, ck in enumerate(self._chunk_keys_by_block(chunk_keys)):
                for k in ck:
                    if k in seen or k not in index.chunks:
                        continue
                    seen.add(k)
                    node = get_offload_block_hash(OffloadKey(k))
                    items.append(Item(k, node, parent, Kind.KV, (i + 1) * self.layout.block_tokens,
                                      self.layout.key_bytes))
                if ck:
                    parent = get_offload_block_hash(OffloadKey(ck[0]))
            node = get_offload_block_hash(OffloadKey(key))
            items.append(Item(key, node, parent, Kind.STATE, info.position, self.layout.key_bytes))
            seen.add(key)
        for item in items:
            self._entries[item.key] = Entry(
                is_state=item.kind == Kind.STATE, position=item.position, on_ssd=True
            )
        mtimes = {key: info.mtime for key, info in index.checkpoints.items()}
        last_access = [mtimes.get(item.key, 0.0) for item in items]
        for key in self.policy.restore_resident(items, Tier.SSD, last_access=last_access):
            self._drop(key, Tier.SSD)  # over the budget, or a state without its KV
        logger.info(
            "HiState: found %d checkpoints and %d KV chunks on SSD (%s)",
            len(index.checkpoints), len(seen) - len(index.checkpoints), self.store.root,
        )

    def _chunk_keys_by_block(self, chunk_keys: list[bytes]) -> list[list[bytes]]:
        """A manifest lists, per block, one KV key per attention group."""
        n = max(1, len(self.layout.kv_group_ids))
        return [chunk_keys[i : i + n] for i in range(0, len(chunk_keys), n)]

    # --- requests ---

    def register_request(self, request) -> None:
        self._requests[request.request_id] = request

    def note_hit(self, request_id: str, hit_tokens: int) -> None:
        """Tokens the request resumes from (GPU prefix cache + this connector)."""
        self._hit_tokens[request_id] = hit_tokens

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._requests.pop(req_context.req_id, None)
        self._planned.discard(req_context.req_id)
        self._hit_tokens.pop(req_context.req_id, None)
        self.policy.request_finished(req_context.req_id)

    # --- lookup and load ---

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        entry = self._entries.get(key)
        return LookupResult.HIT if entry is not None and entry.readable else LookupResult.MISS

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        entry = self._entries.get(key)
        if entry is not None and entry.slot >= 0 and entry.dram_ready:
            return CacheHitSource.HOST
        return CacheHitSource.DISK

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> HiStateLoadSpec:
        keys = list(keys)
        slots, is_state = [], []
        for key in keys:
            entry = self._entries[key]
            assert entry.readable, "prepare_load of a key lookup() did not report"
            slots.append(entry.slot if entry.slot >= 0 and entry.dram_ready else -1)
            is_state.append(entry.is_state)
        self.policy.pin(keys)
        self.policy.hit(keys)
        return HiStateLoadSpec(slots=slots, keys=keys, is_state=is_state)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.policy.hit([k for k in keys if k in self._entries])

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.policy.unpin(list(keys))

    # --- store ---

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        request = self._requests.get(req_context.req_id)
        new_keys = [k for k in keys if k in self._reserved or k not in self._entries]
        if request is None or not new_keys:
            return PrepareStoreOutput([], HiStateStoreSpec([]), [])
        self._plan(request)
        # A checkpoint is one state page per state group, offered one key at a time by vLLM:
        # admit the whole unit on its first key and hand its siblings their reserved slots.
        keys_to_store = [k for k in new_keys if k in self._reserved]
        fresh = [k for k in new_keys if k not in self._reserved]
        items = {k: self._item(k, req_context.get_offload_key_position(k), request) for k in fresh}
        for item in list(items.values()):
            if item.kind == Kind.STATE:
                for sibling in self._siblings(item.key):
                    if sibling not in self._entries and sibling not in items:
                        items[sibling] = self._item(sibling, item.position, request)
        evicted: list[OffloadKey] = []
        if items:
            admission = self.policy.admit(list(items.values()), Tier.DRAM)
            accepted = set(admission.accepted) if admission is not None else set()
            logger.debug(
                "HiState: %s offers %s, admitted %d", req_context.req_id,
                [(i.kind.name, i.position) for i in items.values()], len(accepted),
            )
            if admission is not None:  # evictions stand even when nothing was accepted
                evicted = self._apply_evictions(admission.evict)
                # DRAM evictions the policy would move to SSD: this manager does not copy
                # a slot it is freeing yet, so they are deleted (the simulator copies them).
                for key in admission.spill:
                    self.policy.committed(key, Tier.SSD, False)
            assert len(accepted) <= len(self._free_slots), "policy overcommitted DRAM"
            for key in accepted:
                item = items[key]
                slot = self._free_slots.pop()
                self._entries[key] = Entry(
                    is_state=item.kind == Kind.STATE, position=item.position, slot=slot
                )
                if self.store is not None:
                    refs = self._chunk_refs(request, item.position) if item.kind == Kind.STATE else ()
                    self._staged.append((item, refs))
                if key not in fresh:
                    self._reserved[key] = slot
            keys_to_store += [k for k in fresh if k in accepted]
        for key in keys_to_store:
            self._reserved.pop(key, None)
        order = {k: i for i, k in enumerate(new_keys)}
        keys_to_store.sort(key=order.__getitem__)  # vLLM pairs them with blocks in offer order
        slots = [self._entries[k].slot for k in keys_to_store]
        return PrepareStoreOutput(
            keys_to_store=keys_to_store,
            store_spec=HiStateStoreSpec(slots=slots),
            evicted_keys=evicted,
        )

    def _plan(self, request) -> None:
        if request.request_id in self._planned:
            return
        self._planned.add(request.request_id)
        self.policy.plan_captures(
            request.request_id,
            self._block_hashes(request),
            request.num_prompt_tokens,
            self._hit_tokens.get(request.request_id, 0),
        )

    def _block_hashes(self, request) -> list[bytes]:
        hpb = self.hashes_per_block
        return list(request.block_hashes[hpb - 1 :: hpb])

    def _siblings(self, key: bytes) -> list[bytes]:
        block_hash = get_offload_block_hash(OffloadKey(key))
        return [make_offload_key(block_hash, g) for g in sorted(self.layout.state_group_ids)]

    def _item(self, key: bytes, position: int | None, request) -> Item:
        assert position is not None and position % self.layout.block_tokens == 0
        block = position // self.layout.block_tokens - 1
        hashes = request.block_hashes
        hpb = self.hashes_per_block
        parent = hashes[block * hpb - 1] if block > 0 else None
        is_state = get_offload_group_idx(key) in self.layout.state_group_ids
        tail = (request.num_prompt_tokens - 1) // self.layout.block_tokens * self.layout.block_tokens
        return Item(
            key=key,
            node=get_offload_block_hash(key),
            parent=parent,
            kind=Kind.STATE if is_state else Kind.KV,
            position=position,
            nbytes=self.layout.key_bytes,
            terminal=is_state and position >= tail,
            request_id=request.request_id,
        )

    def take_ssd_writes(self) -> list[SSDWrite]:
        """SSD copies of what this step staged in DRAM; called after all its store jobs.

        KV chunks go first: a state's manifest names the chunks before it, so they must be
        on SSD, or queued ahead of it, for the state to be published at all."""
        self.apply_demotions()
        # The policy keeps a bounded ring of recent events for `explain`; the undrained
        # list would otherwise grow with every decision.
        self.policy.drain_events()
        for key in self._reserved:  # siblings vLLM did not offer after all
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._free_slots.append(entry.slot)
                self.policy.committed(key, Tier.DRAM, False)
        self._reserved.clear()
        staged, self._staged = self._staged, []
        staged = [s for s in staged if s[0].key in self._entries]
        if not staged:
            return []
        staged.sort(key=lambda s: s[0].kind == Kind.STATE)
        writes: list[SSDWrite] = []
        for item, refs in staged:
            entry = self._entries.get(item.key)
            if entry is None or entry.slot < 0:
                continue
            if item.kind == Kind.STATE and not all(self._on_or_to_ssd(k) for k in refs):
                logger.debug("HiState: state at %d stays in DRAM: a KV chunk before it is "
                             "not on SSD", item.position)
                continue
            admission = self.policy.admit([item], Tier.SSD)
            if admission is not None:
                self._apply_evictions(admission.evict)
            if admission is None or item.key not in admission.accepted:
                continue
            entry.ssd_pending = True
            self.policy.pin([item.key])  # the DRAM copy is the source of the SSD write
            writes.append(SSDWrite(key=item.key, slot=entry.slot,
                                   is_state=item.kind == Kind.STATE, position=item.position,
                                   chunk_keys=refs, provenance=item.request_id))
        return writes

    def _on_or_to_ssd(self, key: bytes) -> bool:
        entry = self._entries.get(key)
        return entry is not None and (entry.on_ssd or entry.ssd_pending)

    def _chunk_refs(self, request, position: int) -> tuple[bytes, ...]:
        """KV chunk keys of every block before `position`, one per attention group."""
        hpb = self.hashes_per_block
        return tuple(
            make_offload_key(request.block_hashes[(block + 1) * hpb - 1], group)
            for block in range(position // self.layout.block_tokens)
            for group in self.layout.kv_group_ids
        )

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext,
                       success: bool = True) -> None:
        stored = []
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or entry.slot < 0 or entry.dram_ready:
                continue
            entry.dram_ready = success
            self.policy.committed(key, Tier.DRAM, success)
            if success and not entry.forget_dram:
                stored.append(key)
                self._settle(key, entry)
            elif not entry.ssd_pending:
                self._release_slot(key, entry)
        if stored and self.events is not None:
            self.events.append(OffloadingEvent(keys=stored, medium=Medium.CPU, removed=False))

    def on_ssd_written(self, results: dict[bytes, bool]) -> None:
        """The worker finished (or gave up) writing these keys to SSD."""
        for key, ok in results.items():
            entry = self._entries.get(key)
            if entry is None or not entry.ssd_pending:
                continue
            entry.ssd_pending = False
            entry.on_ssd = ok
            self.policy.unpin([key])
            self.policy.committed(key, Tier.SSD, ok)
            if entry.forget_ssd and ok:
                self._drop(key, Tier.SSD)
            if entry.forget_dram:
                self._drop(key, Tier.DRAM)
            elif key in self._entries:
                self._settle(key, entry)
        self.apply_demotions()

    def on_ssd_lost(self, keys: Iterable[bytes], reason: str) -> None:
        """Keys the worker found corrupt or missing on SSD (already quarantined there)."""
        for key in keys:
            entry = self._entries.get(key)
            if entry is None or not entry.on_ssd:
                continue
            entry.on_ssd = False
            self.policy.remove(key, Tier.SSD, reason)
            self._forget_if_gone(key, entry)
        self.apply_demotions()

    def apply_demotions(self) -> None:
        """Drop the copies the policy no longer wants (it has forgotten them already)."""
        for tier in (Tier.DRAM, Tier.SSD) if self.store is not None else (Tier.DRAM,):
            for key in self.policy.demotions(tier):
                self._drop(key, tier)

    def _settle(self, key: bytes, entry: Entry) -> None:
        """Once both copies are known, drop the DRAM one if the policy places the key on SSD."""
        if entry.ssd_pending or not entry.dram_ready or not entry.on_ssd:
            return
        if not self.policy.keep(key, Tier.DRAM):  # the policy forgets that copy itself
            self._release_slot(key, entry)

    def _drop(self, key: bytes, tier: Tier) -> None:
        """Drop one copy; a copy whose write is still in flight goes when the write lands."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if tier == Tier.DRAM and entry.slot >= 0:
            if entry.ssd_pending or not entry.dram_ready:
                entry.forget_dram = True  # still the source or target of a write
            else:
                self._release_slot(key, entry)
                if self.events is not None:
                    self.events.append(OffloadingEvent(keys=[key], medium=Medium.CPU, removed=True))
        elif tier == Tier.SSD:
            if entry.ssd_pending:
                entry.forget_ssd = True
            elif entry.on_ssd:
                entry.on_ssd = False
                self._delete_from_store(key, entry.is_state)
                self._forget_if_gone(key, entry)

    def _release_slot(self, key: bytes, entry: Entry) -> None:
        if entry.slot >= 0:
            self._free_slots.append(entry.slot)
        entry.slot, entry.dram_ready, entry.forget_dram = -1, False, False
        self._forget_if_gone(key, entry)

    def _forget_if_gone(self, key: bytes, entry: Entry) -> None:
        if entry.slot < 0 and not entry.on_ssd and not entry.ssd_pending:
            self._entries.pop(key, None)

    def _apply_evictions(self, evict: list[tuple[bytes, Tier]]) -> list[OffloadKey]:
        for key, tier in evict:
            self._drop(key, tier)
        return [OffloadKey(key) for key, _ in evict if key not in self._entries]

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
        for key, entry in list(self._entries.items()):
            if entry.slot >= 0 and not entry.ssd_pending:
                self._release_slot(key, entry)
                self.policy.remove(key, Tier.DRAM, "reset_cache")

    def dram_slots_in_use(self) -> int:
        return self.num_slots - len(self._free_slots)
