"""HiStatePolicy: the facade the connector's manager and the simulator drive.

Wires the prefix index (index.py), capture planner (planner.py + interval.py), unified GDS
eviction (eviction.py), asymmetric placement (placement.py) and the event log (events.py)
behind the `PolicyCore` contract (base.py); the write side (admission, commits, losses,
restart) is in admission.py.

Credit (option `credit`, off by default): until eviction first deletes KV, capacity costs
nothing, so the interval model prices storage at zero (interval.py) and a session's early
history gets dense checkpoints. They are held on credit, so that they cannot cost the KV
that the paper's sparse plan would have kept: an interval checkpoint planned on credit is
admitted only into free room (as the states vLLM keeps outside the plan are), reaches SSD
only as a backup when the writer has room (under DRAM pressure it is deleted, never moved:
a move queues a write ahead of KV and holds DRAM slots until it lands), and once eviction
has deleted KV these checkpoints are the first to go. The measured price then replaces the
credit only once deleted KV has had one reuse interval to be wanted again (ghost.py).

Costs per call: a lookup binary-searches the prompt's committed-KV
prefix and walks up to the nearest checkpoint; admissions, commits and evictions touch only
the nodes whose status changes plus O(log n) heap operations; nothing scans the cache.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from . import events as ev
from .admission import Residency
from .base import PolicyCore
from .events import Event, EventLog
from .eviction import Evictor, TauModel
from .ghost import Ghost
from .index import MANAGED, TIER_BIT, Entry, Node, PrefixIndex
from .interval import Ema
from .lookup import lookup
from .placement import keep_copy
from .planner import INTERVAL, CapturePlanner
from .types import Hit, Item, Kind, Tier

_DRAM, _SSD = TIER_BIT[Tier.DRAM], TIER_BIT[Tier.SSD]
_DRAM_T, _SSD_T = Tier.DRAM, Tier.SSD
_BOTH = _DRAM | _SSD
_KV, _STATE = Kind.KV, Kind.STATE
MAX_OPEN_PLANS = 65536
# A fork this close to the end of the context it leaves counts as a tail fork (forks.py);
# also bounds the walk that measures it.
TAIL_MAX_TOKENS = 8192


def _fastest(mask: int) -> Tier:
    return Tier.DRAM if mask & _DRAM else Tier.SSD


class HiStatePolicy(Residency, PolicyCore):
    def __init__(
        self,
        budgets: dict[Tier, int],
        planner: CapturePlanner,
        clock,
        identity: bytes = b"",
        *,
        tau: float | None = None,
        terminal_alpha: float = 0.05,
        terminal_reuse: float | None = None,
        keep_backups: bool = False,
        drop_stuck: bool = False,
        states_lead: bool = True,
        kv_groups: Sequence[int] | None = None,
        state_groups: Sequence[int] | None = None,
        kv_bytes_per_token: float | None = None,
        credit: bool = False,
    ):
        self.budgets = {t: int(budgets.get(t, 0)) for t in MANAGED}
        self.planner = planner
        self.interval = planner.model
        self.clock = clock
        self.identity = identity
        self.log = EventLog(clock)
        self.tau_model = TauModel(fixed=tau)
        self.ev = Evictor(None, self.tau_model.value)  # type: ignore[arg-type]
        self.ev.keep_backups = bool(keep_backups)
        self.ev.move_down = not keep_backups
        self.ev.drop_stuck = bool(drop_stuck)
        self.ev.states_lead = self.states_lead = bool(states_lead)
        self.index = PrefixIndex(planner.block_tokens, self.ev.dirty)
        self.ev.index = self.index
        self._dprefix = self._prefix(None)
        self.used = {t: 0 for t in MANAGED}
        # Capacity's price (ghost.py), decayed over about one turnover of the cache.
        self.credit = bool(credit) and planner.model.fixed is None
        self.ghost = Ghost(sum(self.budgets.values()), mature=self.credit)
        self.interval.on_credit = self.credit
        self._credit: dict[str, set[int]] = {}  # request -> interval points planned on credit
        self.credit_nodes: list[Node] = []  # nodes holding a checkpoint taken on credit
        self._pins: dict[bytes, int] = {}
        self._gpu: set[bytes] = set()
        self._fixed_groups = kv_groups is not None or state_groups is not None
        self._groups: dict[Kind, set[int]] = {
            Kind.KV: set(kv_groups or ()),
            Kind.STATE: set(state_groups or ()),
        }
        self._sorted_groups = (sorted(self._groups[Kind.KV]), sorted(self._groups[Kind.STATE]))
        self.index.nkv = len(self._groups[Kind.KV])
        self.terminal_fixed = terminal_reuse
        self.terminal_ema = Ema(terminal_alpha, 0.5)
        self.token_bytes = kv_bytes_per_token
        self.plans: OrderedDict[str, set[int]] = OrderedDict()
        self._seq = 0
        self._n_obs = 0
        self._drops: dict[Tier, list[bytes]] = {t: [] for t in MANAGED}
        self._inner: dict[Node, None] = {}  # checkpoints that stopped being leaves
        self.epoch = 0  # bumped by every change of committed residency (lookup cache)
        self._last_lookup: tuple | None = None

    # -- small helpers -----------------------------------------------------------------------
    def _prefix(self, identity: bytes | None) -> bytes:
        ident = self.identity if identity is None else identity
        return bytes([len(ident)]) + ident if ident else b""

    def _tick(self) -> int:
        self._seq += 1
        return self._seq

    @property
    def q(self) -> float:
        if self.terminal_fixed is not None:
            return self.terminal_fixed
        return self.terminal_ema.value

    def _learn_group(self, kind: Kind, group: int) -> None:
        gs = self._groups[kind]
        if group not in gs and not self._fixed_groups:
            gs.add(group)
            self._sorted_groups = (sorted(self._groups[Kind.KV]), sorted(self._groups[Kind.STATE]))
            if kind is _KV:
                self.index.nkv = len(gs)
                self.index.recompute_kok()
                self.epoch += 1

    def _flush(self) -> None:
        ev_ = self.ev
        ev_.q = self.q
        if self.token_bytes is None:
            # Frozen at the first observation: scores must not move without a re-push.
            kvt = self.interval.kv_bytes_per_token.value
            if kvt:
                self.token_bytes = kvt
                for n in self.index.nodes.values():  # once, while the cache is nearly empty
                    ev_.mark(n)
            ev_.token_bytes = kvt or 1.0
        else:
            ev_.token_bytes = self.token_bytes
        inner = self._inner
        for n in ev_.dirty:
            if n.st and n.live_children:
                inner[n] = None
        if len(inner) > len(self.index.nodes) + 1024:  # nobody asks for demotions: trim
            self._inner = {n: None for n in inner if not n.gone and n.st and n.live_children}
        ev_.flush()

    def _emit(self, op: str, e: Entry | Item, tier: Tier | None, reason: str = "",
              request_id: str = "", score: float | None = None) -> None:
        log = self.log
        if not log.enabled:
            return
        if type(e) is Entry:
            n = e.node
            log.emit(op, e.key, n.hash, tier, e.kind, n.position, reason, request_id,
                     None, score)
        else:
            log.emit(op, e.key, e.node, tier, e.kind, e.position, reason, request_id,
                     None, score)

    # -- residency -----------------------------------------------------------------------------
    def where(self, key: bytes) -> frozenset[Tier]:
        e = self.index.entries.get(key)
        out = []
        if key in self._gpu:
            out.append(Tier.GPU)
        if e is not None:
            if e.resident & _DRAM:
                out.append(Tier.DRAM)
            if e.resident & _SSD:
                out.append(Tier.SSD)
        return frozenset(out)

    def usage(self, tier: Tier) -> int:
        return self.used.get(tier, 0)

    def observe_gpu(self, keys: Iterable[bytes], resident: bool) -> None:
        if resident:
            self._gpu.update(keys)
        else:
            self._gpu.difference_update(keys)
        self.epoch += 1

    # -- placement -----------------------------------------------------------------------------
    def keep(self, key: bytes, tier: Tier) -> bool:
        """If False, the copy in `tier` is already forgotten here: the manager drops it."""
        e = self.index.entries.get(key)
        if e is None:
            return False
        bit = TIER_BIT.get(tier, 0)
        if not e.resident & bit or not e.resident & ~bit:
            return True
        if keep_copy(e, tier):
            return True
        if e.pins or e.pending:
            self._inner[e.node] = None  # `demotions` asks again once it is free
            return True
        self._emit(ev.DEMOTE, e, tier, "historical checkpoint: its home is SSD")
        self._forget(e, tier)
        return False

    def manifest_keys(self, key: bytes) -> list[bytes] | None:
        """The KV keys of every block before the checkpoint `key` (root first, groups in
        order): what its SSD manifest names. None if a block's KV is not held."""
        e = self.index.entries.get(key)
        if e is None:
            return None
        groups = self._sorted_groups[0]
        out: list[bytes] = []
        x: Node | None = e.node
        while x is not None:
            kv = x.kv
            for g in reversed(groups):
                ke = kv.get(g)
                if ke is None:
                    return None
                out.append(ke.key)
            x = x.parent
        out.reverse()
        return out

    def demotions(self, tier: Tier) -> list[bytes]:
        out, self._drops[tier] = self._drops.get(tier, []), []
        if tier != Tier.DRAM:
            return out
        self._flush()
        retry: dict[Node, None] = {}
        for n in self._inner:
            if n.gone or not n.st or not n.live_children:
                continue
            for e in list(n.st.values()):
                if not (e.resident & _DRAM and e.resident & _SSD):
                    continue
                if e.pins or e.pending:
                    retry[n] = None
                    continue
                self._emit(ev.DEMOTE, e, tier, "no longer terminal: its home is SSD")
                self._forget(e, tier)
                out.append(e.key)
        self._inner = retry
        return out

    # -- access --------------------------------------------------------------------------------
    def pin(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            self._pins[k] = self._pins.get(k, 0) + 1
            e = self.index.entries.get(k)
            if e is not None:
                e.pins += 1

    def pinned(self, key: bytes) -> int:
        return self._pins.get(key, 0)

    def unpin(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            c = self._pins.get(k, 0)
            if c <= 0:
                continue
            if c == 1:
                del self._pins[k]
            else:
                self._pins[k] = c - 1
            e = self.index.entries.get(k)
            if e is not None and e.pins > 0:
                e.pins -= 1

    def hit(self, keys: Iterable[bytes], copies: bool = True) -> None:
        """Refresh-all: the deepest hit checkpoint and every checkpoint above it get t_last =
        now; the hit keys become most recently touched (stage-1 order); the terminal-reuse
        EMA q learns whether the hit landed on a leaf (terminal) checkpoint.

        copies=False (a hit the GPU served): the same, except that tau learns nothing (GPU
        hits come turns apart, not one reuse interval). The copies still become the most
        recent: they are what the session reads once the GPU has let its pages go. Left in
        their old order, a long session served by the GPU turn after turn had its DRAM copies
        moved to SSD as the oldest, and read its whole prefix from SSD when the GPU evicted
        it (SSD reads 181 -> 88 GB over ten paper-like Weka orders)."""
        now = self.clock()
        deepest: Node | None = None
        deepest_state: Node | None = None
        entries = self.index.entries
        tick = self._tick()
        edirty = self.ev.edirty
        for k in keys:
            e = entries.get(k)
            if e is None:
                continue
            e.touch = tick
            if e.resident & _DRAM:  # DRAM copies have a stage-1 (LRU) entry to refresh
                edirty[e] = None
            n = e.node
            if e.kind is _STATE:
                if deepest_state is None or n.position > deepest_state.position:
                    deepest_state = n
            elif deepest is None or n.position > deepest.position:
                deepest = n
        top = deepest_state or deepest
        if top is None:
            return
        if deepest_state is not None:
            self.terminal_ema.update(1.0 if deepest_state.live_children == 0 else 0.0)
            # tau is the time scale of reuse from DRAM and SSD; GPU hits come turns apart.
            if copies and self.tau_model.observe(now - deepest_state.t_last):
                self.ev.set_tau(self.tau_model.value)
        x: Node | None = top
        while x is not None:  # refresh-all along the matched path
            if x.st or x is top:
                x.t_last = now  # H only grows: the heap catches up lazily (eviction.py)
            x = x.parent
        self.log.emit(ev.HIT, node=top.hash, position=top.position)

    def remove(self, key: bytes, tier: Tier, reason: str) -> None:
        e = self.index.entries.get(key)
        if e is None or not (e.resident | e.pending) & TIER_BIT.get(tier, 0):
            return
        self._emit(ev.REMOVE, e, tier, reason)
        self._lose(e, tier, reason)

    # -- lookup and planning -------------------------------------------------------------------
    def restorable(self, block_hashes, kv_groups=None, state_groups=None, identity=None) -> Hit:
        # The last chained hash fingerprints the whole prompt: cache one answer per epoch
        # (the manager looks up, then plans, with nothing changing in between).
        key = (self.epoch, len(block_hashes), block_hashes[-1] if block_hashes else b"",
               identity, None if kv_groups is None else tuple(kv_groups),
               None if state_groups is None else tuple(state_groups))
        last = self._last_lookup
        if last is not None and last[0] == key:
            return last[1]
        hit = self._restorable(block_hashes, kv_groups, state_groups, identity)
        self._last_lookup = (key, hit)
        return hit

    def _restorable(self, block_hashes, kv_groups, state_groups, identity) -> Hit:
        kvg = self._sorted_groups[0] if kv_groups is None else list(kv_groups)
        stg = self._sorted_groups[1] if state_groups is None else list(state_groups)
        prefix = self._prefix(identity)
        if self._gpu or kv_groups is not None or state_groups is not None or not kvg:
            known = bool(stg) or state_groups is not None or self._fixed_groups
            return lookup(block_hashes, self.planner.block_tokens, kvg, stg,
                          lambda k: self._present(prefix, k), states_known=known)
        # Groups not configured and no state seen yet: a hybrid model's hit needs a state we
        # cannot name, so report the shared prefix only. (Attention-only: state_groups=[].)
        nst = len(stg) if (stg or self._fixed_groups) else 1 << 30
        get = self.index.nodes.get
        # Shared prefix: `kok` is monotone along the prompt, so binary search it.
        lo, hi = 0, len(block_hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            n = get(prefix + block_hashes[mid] if prefix else block_hashes[mid])
            if n is not None and n.kok:
                lo = mid + 1
            else:
                hi = mid
        shared = best = lo
        # Deepest complete checkpoint at or above it (the nearest one, walking up).
        x = get(prefix + block_hashes[lo - 1] if prefix else block_hashes[lo - 1]) if lo else None
        while x is not None and x.rst < nst:
            x = x.parent
            best -= 1
        if x is None:
            best = 0
        bt = self.planner.block_tokens
        return Hit(position=best * bt, shared=shared * bt, hashes=tuple(block_hashes[:best]),
                   kv_suffixes=[g.to_bytes(4, "big") for g in kvg],
                   state_suffixes=[g.to_bytes(4, "big") for g in stg],
                   block_tokens=bt, fastest=self._fastest_tier)

    def _fastest_tier(self, key: bytes) -> Tier | None:
        e = self.index.entries.get(key)
        if e is None or not e.resident:
            return None
        return _DRAM_T if e.resident & _DRAM else _SSD_T

    def _present(self, prefix: bytes, key: bytes) -> Tier | None:
        if key in self._gpu:
            return Tier.GPU
        e = self.index.entries.get(key)
        if e is None or not e.resident or not e.node.nid.startswith(prefix):
            return None
        return _fastest(e.resident)

    def plan_captures(self, request_id, block_hashes, num_prompt_tokens, hit_tokens,
                      boundaries=(), identity=None) -> list[int]:
        hit = self.restorable(block_hashes, identity=identity)
        self.interval.observe_segment(self._observe_fork(block_hashes, hit.shared, identity))
        self._observe_ghost(block_hashes, hit.shared, identity)
        plan = self.planner.plan(num_prompt_tokens, hit_tokens, hit.position, hit.shared,
                                 boundaries)
        positions = [p for p in plan.positions if p != hit.position]
        plans = self.plans
        plans[request_id] = set(positions)
        if self.interval.on_credit and plan.interval:
            self._credit[request_id] = {p for p in positions if plan.labels[p] == INTERVAL}
        self.ev.protected_reqs.add(request_id)
        if len(plans) > MAX_OPEN_PLANS:  # request_finished never came for the oldest
            old, _ = plans.popitem(last=False)
            self.ev.protected_reqs.discard(old)
            self._credit.pop(old, None)
        bt = self.planner.block_tokens
        if hit.shared > hit.position and hit.shared // bt <= len(block_hashes):
            self.log.emit(ev.MISS, node=block_hashes[hit.shared // bt - 1], position=hit.shared,
                          request_id=request_id,
                          reason=f"KV shared to {hit.shared} but deepest checkpoint at "
                                 f"{hit.position}")
        self.log.emit(ev.PLAN, request_id=request_id, positions=positions, position=hit.position,
                      reason=plan.reason)
        return positions

    def _observe_fork(self, block_hashes, shared: int, identity) -> bool:
        """An internal hit: the prompt leaves a cached context that continues past `shared`."""
        forks = self.planner.forks
        bt = self.planner.block_tokens
        nb = shared // bt
        if nb == 0 or nb >= len(block_hashes):
            return False
        prefix = self._prefix(identity)
        n = self.index.nodes.get(prefix + block_hashes[nb - 1])
        if n is None or not n.children:
            return False
        if forks is not None:
            forks.observe(shared, self._tail_past(n))
        return True

    def _observe_ghost(self, block_hashes, shared: int, identity) -> None:
        """Blocks eviction deleted that continue the cached prefix are wanted again; what
        they make the prompt recompute prices the model's checkpoints (ghost.py)."""
        ghost = self.ghost
        if ghost.blocks:
            prefix = self._prefix(identity)
            now, horizon = self.clock(), self.ghost_horizon()
            start = i = shared // self.planner.block_tokens
            n, wanted = len(block_hashes), 0
            nodes = self.index.nodes
            # The prompt recomputes from `shared` on: everything up to the last block it
            # would have read had eviction kept the ghost blocks (held blocks past a
            # deleted one are of no use to a prefix) is what the deletions cost.
            while i < n:
                key = prefix + block_hashes[i]
                if ghost.take(key, now, horizon):
                    wanted = i + 1
                elif nodes.get(key) is None:
                    break
                i += 1
            if wanted:
                ghost.recomputed((wanted - start) * self._block_bytes())
        if self.credit and ghost.deletions:
            self._end_credit()
            ghost.age(self.clock(), self.tau_model.value)
        self.interval.price = ghost.price

    def _end_credit(self) -> None:
        """Eviction has deleted KV: no more checkpoints on credit, and those taken on it
        rank below everything else in eviction (eviction.py, `credit_due`)."""
        if not self.interval.on_credit:
            return
        self.interval.on_credit = False
        self._credit.clear()
        self.ev.credit_due = True
        for n in self.credit_nodes:
            if not n.gone:
                self.ev.mark(n)
        self.credit_nodes = []

    def _block_bytes(self) -> float:
        kvt = self.interval.kv_bytes_per_token.value or 0.0
        return kvt * self.planner.block_tokens

    def ghost_horizon(self) -> float:
        """How long deleted KV counts as displaced: as long as a checkpoint stays (T_state);
        unbounded until a checkpoint has been evicted."""
        return self.interval.t_state.get(math.inf)

    def _tail_past(self, n) -> int | None:
        """Tokens from n to the end of the one context continuing below it (its leaf
        checkpoint), if that end lies within TAIL_MAX_TOKENS; None otherwise."""
        x = n
        limit = n.position + TAIL_MAX_TOKENS
        while x.position < limit:
            live = [c for c in x.children.values() if c.st or c.live_children]
            if len(live) != 1:
                return None
            x = live[0]
            if x.st and x.live_children == 0:
                return x.position - n.position if x.position <= limit else None
        return None

    def request_finished(self, request_id: str) -> None:
        self.plans.pop(request_id, None)
        self._credit.pop(request_id, None)
        self.ev.protected_reqs.discard(request_id)

    def drain_events(self) -> list[Event]:
        return self.log.drain()

    def explain(self, block_hashes, position) -> str:
        from .explain import explain

        return explain(self, block_hashes, position)

    def check_invariants(self) -> None:
        from .checks import check_histate

        check_histate(self)
