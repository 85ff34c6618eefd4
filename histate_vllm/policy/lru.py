"""The LRU ablation: plain least-recently-used over keys, one order per tier.

No units, no reference counts, no placement preferences: what vLLM-Disk* does (write-through,
LRU per tier). Capture planning uses the same planner as `histate` so that the ablation
changes only eviction and placement.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from . import events as ev
from .base import PolicyCore
from .events import Event, EventLog
from .lookup import lookup
from .planner import CapturePlanner
from .types import Admission, Hit, Item, Kind, Tier, key_group

_MANAGED = (Tier.DRAM, Tier.SSD)


class _Entry:
    __slots__ = ("item", "resident", "pending")

    def __init__(self, item: Item):
        self.item = item
        self.resident: set[Tier] = set()
        self.pending: set[Tier] = set()


class LRUPolicy(PolicyCore):
    def __init__(self, budgets: dict[Tier, int], planner: CapturePlanner, clock, identity=b"",
                 kv_groups=None, state_groups=None):
        self.budgets = {t: int(budgets.get(t, 0)) for t in _MANAGED}
        self.clock = clock
        self.identity = identity
        self.planner = planner
        self.log = EventLog(clock)
        self._entries: dict[bytes, _Entry] = {}
        # key -> None in access order (oldest first); committed copies only.
        self._order: dict[Tier, OrderedDict[bytes, None]] = {t: OrderedDict() for t in _MANAGED}
        self._used: dict[Tier, int] = {t: 0 for t in _MANAGED}
        self._pins: dict[bytes, int] = {}
        self._gpu: set[bytes] = set()
        self._fixed_groups = kv_groups is not None or state_groups is not None
        self._groups: dict[Kind, set[int]] = {
            Kind.KV: set(kv_groups or ()),
            Kind.STATE: set(state_groups or ()),
        }

    # -- residency -------------------------------------------------------------------------
    def where(self, key: bytes) -> frozenset[Tier]:
        e = self._entries.get(key)
        res = set(e.resident) if e is not None else set()
        if key in self._gpu:
            res.add(Tier.GPU)
        return frozenset(res)

    def usage(self, tier: Tier) -> int:
        return self._used.get(tier, 0)

    def observe_gpu(self, keys: Iterable[bytes], resident: bool) -> None:
        if resident:
            self._gpu.update(keys)
        else:
            self._gpu.difference_update(keys)

    def _forget(self, key: bytes, tier: Tier) -> None:
        e = self._entries.get(key)
        if e is None:
            return
        if tier in e.resident:
            e.resident.discard(tier)
            self._order[tier].pop(key, None)
            self._used[tier] -= e.item.nbytes
        elif tier in e.pending:
            e.pending.discard(tier)
            self._used[tier] -= e.item.nbytes
        if not e.resident and not e.pending:
            del self._entries[key]

    # -- admission ---------------------------------------------------------------------------
    def admit(self, items: Sequence[Item], tier: Tier) -> Admission | None:
        if tier not in self.budgets:
            raise ValueError(f"tier {tier!r} is not managed; managed: {list(self.budgets)}")
        budget = self.budgets[tier]
        new: list[Item] = []
        seen: set[bytes] = set()
        for it in items:
            if it.key in seen:
                continue
            seen.add(it.key)
            e = self._entries.get(it.key)
            if e is not None and (tier in e.resident or tier in e.pending):
                continue
            if it.identity and it.identity != self.identity:
                self._reject(it, tier, "identity differs from this policy's")
                continue
            new.append(it)
        # Candidates oldest first, scanning only as far as the offered bytes need.
        order = self._order[tier]
        excess = self._used[tier] + sum(it.nbytes for it in new) - budget
        victims: list[bytes] = []
        freed = 0
        if excess > 0:
            for k in order:
                if freed >= excess:
                    break
                if self._pins.get(k):
                    continue
                victims.append(k)
                freed += self._entries[k].item.nbytes
        room = budget - self._used[tier] + freed
        accepted: list[Item] = []
        need = 0
        for it in new:
            if need + it.nbytes > room:
                self._reject(it, tier, f"no room in {tier.name} ({budget} bytes budget)")
                continue
            accepted.append(it)
            need += it.nbytes
        if not accepted:
            return None
        evict: list[tuple[bytes, Tier]] = []
        for k in victims:
            if self._used[tier] + need <= budget:
                break
            it = self._entries[k].item
            self.log.emit(ev.EVICT, key=k, node=it.node, tier=tier, kind=it.kind,
                          position=it.position, reason="least recently used")
            self._forget(k, tier)
            evict.append((k, tier))
        assert self._used[tier] + need <= budget
        for it in accepted:
            e = self._entries.get(it.key)
            if e is None:
                e = self._entries[it.key] = _Entry(it)
            e.pending.add(tier)
            self._used[tier] += it.nbytes
            if not self._fixed_groups:
                self._groups[it.kind].add(key_group(it.key))
            self.log.emit(ev.ADMIT, key=it.key, node=it.node, tier=tier, kind=it.kind,
                          position=it.position, request_id=it.request_id)
        return Admission([it.key for it in accepted], evict)

    def _reject(self, it: Item, tier: Tier, reason: str) -> None:
        self.log.emit(ev.REJECT, key=it.key, node=it.node, tier=tier, kind=it.kind,
                      position=it.position, request_id=it.request_id, reason=reason)

    def committed(self, key: bytes, tier: Tier, ok: bool) -> None:
        e = self._entries.get(key)
        if e is None or tier not in e.pending:
            return
        if ok:
            e.pending.discard(tier)
            e.resident.add(tier)
            self._order[tier][key] = None
            self.log.emit(ev.COMMIT, key=key, node=e.item.node, tier=tier, kind=e.item.kind,
                          position=e.item.position)
        else:
            self.log.emit(ev.FAIL, key=key, node=e.item.node, tier=tier, kind=e.item.kind,
                          position=e.item.position, reason="write failed")
            self._forget(key, tier)

    def restore_resident(self, items, tier, last_access=None, now=None) -> list[bytes]:
        order = range(len(items))
        if last_access is not None:
            order = sorted(order, key=lambda i: last_access[i])
        for i in order:
            it = items[i]
            e = self._entries.get(it.key)
            if e is not None and (tier in e.resident or tier in e.pending):
                continue
            if e is None:
                e = self._entries[it.key] = _Entry(it)
            e.resident.add(tier)
            self._order[tier][it.key] = None
            self._used[tier] += it.nbytes
            if not self._fixed_groups:
                self._groups[it.kind].add(key_group(it.key))
            self.log.emit(ev.RESTORE, key=it.key, node=it.node, tier=tier, kind=it.kind,
                          position=it.position)
        drop = []
        for k in list(self._order[tier]):
            if self._used[tier] <= self.budgets[tier]:
                break
            self._forget(k, tier)
            drop.append(k)
        return drop

    def set_budget(self, tier: Tier, nbytes: int) -> list[tuple[bytes, Tier]]:
        self.budgets[tier] = int(nbytes)
        return self._evict_oldest(tier, self._used[tier] - self.budgets[tier],
                                  "least recently used (budget lowered)")

    def shed(self, tier: Tier, nbytes: int) -> list[tuple[bytes, Tier]]:
        return self._evict_oldest(tier, nbytes, "least recently used (no slot)")

    def _evict_oldest(self, tier: Tier, nbytes: int, reason: str) -> list[tuple[bytes, Tier]]:
        """Evict committed copies of `tier`, least recently used first and never a pinned
        one, until `nbytes` are freed or none is left."""
        out: list[tuple[bytes, Tier]] = []
        freed = 0
        for k in list(self._order[tier]):
            if freed >= nbytes:
                break
            if self._pins.get(k):
                continue
            it = self._entries[k].item
            self.log.emit(ev.EVICT, key=k, node=it.node, tier=tier, kind=it.kind,
                          position=it.position, reason=reason)
            freed += it.nbytes
            self._forget(k, tier)
            out.append((k, tier))
        return out

    # -- placement ---------------------------------------------------------------------------
    def keep(self, key: bytes, tier: Tier) -> bool:
        return True  # write-through: every tier keeps its copy until LRU evicts it

    def demotions(self, tier: Tier) -> list[bytes]:
        return []

    # -- access ------------------------------------------------------------------------------
    def pin(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            self._pins[k] = self._pins.get(k, 0) + 1

    def pinned(self, key: bytes) -> int:
        return self._pins.get(key, 0)

    def unpin(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            n = self._pins.get(k, 0) - 1
            if n > 0:
                self._pins[k] = n
            else:
                self._pins.pop(k, None)

    def hit(self, keys: Iterable[bytes], copies: bool = True) -> None:
        if not copies:  # plain per-tier LRU: only its copies' recency matters
            return
        for k in keys:
            e = self._entries.get(k)
            if e is None:
                continue
            for t in e.resident:
                self._order[t].move_to_end(k)

    def remove(self, key: bytes, tier: Tier, reason: str) -> None:
        e = self._entries.get(key)
        if e is None:
            return
        self.log.emit(ev.REMOVE, key=key, node=e.item.node, tier=tier, kind=e.item.kind,
                      position=e.item.position, reason=reason)
        self._forget(key, tier)

    # -- lookup and planning -----------------------------------------------------------------
    def _present(self, key: bytes) -> Tier | None:
        if key in self._gpu:
            return Tier.GPU
        e = self._entries.get(key)
        if e is None or not e.resident:
            return None
        return min(e.resident)

    def restorable(self, block_hashes, kv_groups=None, state_groups=None) -> Hit:
        kv = sorted(self._groups[Kind.KV]) if kv_groups is None else list(kv_groups)
        st = sorted(self._groups[Kind.STATE]) if state_groups is None else list(state_groups)
        known = bool(st) or state_groups is not None or self._fixed_groups
        return lookup(block_hashes, self.planner.block_tokens, kv, st, self._present,
                      states_known=known)

    def plan_captures(self, request_id, block_hashes, num_prompt_tokens, hit_tokens,
                      boundaries=()) -> list[int]:
        hit = self.restorable(block_hashes)
        plan = self.planner.plan(num_prompt_tokens, hit_tokens, hit.position, hit.shared,
                                 boundaries)
        self.log.emit(ev.PLAN, request_id=request_id, positions=plan.positions,
                      position=hit.position, reason=plan.reason)
        return plan.positions

    def request_finished(self, request_id: str) -> None:
        pass

    def drain_events(self) -> list[Event]:
        return self.log.drain()

    def explain(self, block_hashes, position) -> str:
        from .explain import explain

        return explain(self, block_hashes, position)

    def check_invariants(self) -> None:
        used = {t: 0 for t in _MANAGED}
        for k, e in self._entries.items():
            assert e.resident or e.pending
            for t in e.resident | e.pending:
                used[t] += e.item.nbytes
            for t in e.resident:
                assert k in self._order[t]
        for t in _MANAGED:
            assert used[t] == self._used[t], (t, used[t], self._used[t])
            assert self._used[t] <= self.budgets[t]
            assert len(self._order[t]) == sum(1 for e in self._entries.values() if t in e.resident)
