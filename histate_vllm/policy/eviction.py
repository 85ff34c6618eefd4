"""Unified GreedyDual-Size eviction (HiState §3.3) over the prefix index, per tier.

Units (derived from index.py's tree): each non-leaf checkpoint alone (its state keys); each
leaf checkpoint with its seg (the last KV segment nobody else uses) as one bundle; each orphan
node's KV (used by no checkpoint). A checkpoint with >= 2 checkpoint children (a branch point)
is no candidate: it outlives its leaves.

Score H = t_last + tau·C/M, lowest evicted first, ties by node id:
  leaf at x, nearest checkpoint above at a:          C = q·(x - a)
  inner at x, above at a, checkpoint child at y:     C = (1-q)·(x - a)·(y - x)/y
  orphan:                                            C = 0
q = EMA of how often a hit lands on a leaf (terminal) checkpoint (a unit's C uses the q of its
last re-score: "affected costs are updated after eviction"); M = bytes of the unit committed
in the tier, in KV-token equivalents. A hit refreshes t_last of the matched checkpoint and
every checkpoint above it (refresh-all). A unit with a pinned or pending key is skipped, as
is an orphan of a request whose capture plan is still open; evicting a unit deletes its
copies in every tier (the KV it frees is used by no other checkpoint).

Before any unit is deleted, "demote before delete" (stage 1) drops copies the other tier also
holds, in placement order (placement.py), least recently touched first: from DRAM, copies SSD
backs; from SSD, backups of what DRAM holds. DRAM's stage 1 also moves down what DRAM alone
holds but whose home is SSD or lower: historical checkpoints first (once every KV chunk
before one is on SSD, which its manifest needs; until then it waits in DRAM: without this
they piled up there, ~40% of DRAM on the Weka replay), then KV chunks. Under DRAM pressure with an SSD tier, a stage-2
unit is not deleted but spilled: its DRAM-only copies move to SSD (admission.py), so the two
tiers hold disjoint data once SSD is under pressure and their capacities add up.

tau is derived online (`TauModel`): the EMA of observed reuse intervals (time from a
checkpoint's last access to the hit that reuses it), so a unit whose removal would cost a
full recomputation of its bytes lives about one typical reuse interval longer than free data.

Scores are recomputed lazily: mutations of structure or residency mark nodes dirty, `flush`
recomputes their C, seg and M and pushes fresh heap entries; a heap entry is valid only if its
version matches the node's. A hit only raises t_last (H only grows), so it pushes nothing: a
popped entry whose H is below the node's current H is re-queued with the current H, and the
first popped entry that is current is the true minimum.
"""

from __future__ import annotations

import heapq
import itertools

from .index import MANAGED, TIER_BIT, Entry, Node, PrefixIndex
from .placement import is_leaf_state, stage1_rank
from .types import Kind

_KV = Kind.KV

_BOTH = TIER_BIT[MANAGED[0]] | TIER_BIT[MANAGED[1]]


def cost_leaf(q: float, x: int, a: int) -> float:
    return q * (x - a)


def cost_inner(q: float, x: int, a: int, y: int) -> float:
    return (1.0 - q) * (x - a) * (y - x) / y


# Subtracted from the H of an intermediate checkpoint taken on credit once eviction deletes
# KV (core.py, "credit"): below every unit on time, in GDS order among themselves.
CREDIT_FIRST = 1e12


def score(t_last: float, tau: float, cost: float, nbytes: int, token_bytes: float) -> float:
    return t_last + tau * cost / (nbytes / token_bytes)


def unit_entries(n: Node) -> list[Entry]:
    if n.st:
        out = list(n.st.values())
        if n.live_children == 0:
            for m in n.seg:
                out.extend(m.kv.values())
        return out
    return list(n.kv.values())


def unit_bytes(entries: list[Entry], bit: int) -> int:
    return sum(e.nbytes for e in entries if e.resident & bit)


class TauModel:
    """GDS time scale from observed reuse: the EMA of (hit time - t_last) over hits on a
    checkpoint, in effect once `min_samples` reuses were seen (until then `initial`).
    `fixed` pins tau (sensitivity runs, tests)."""

    def __init__(self, initial: float = 120.0, fixed: float | None = None,
                 alpha: float = 0.05, min_samples: int = 16):
        self.value = float(fixed if fixed is not None else initial)
        self.fixed = fixed is not None
        self.alpha = alpha
        self.min_samples = min_samples
        self.count = 0
        self._ema: float | None = None

    def observe(self, seconds: float) -> bool:
        """One reuse interval; True if tau changed."""
        if self.fixed:
            return False
        x = seconds if seconds > 0.0 else 0.0
        self._ema = x if self._ema is None else self._ema + self.alpha * (x - self._ema)
        self.count += 1
        if self.count < self.min_samples or self._ema <= 0.0:
            return False
        self.value = self._ema
        return True


class Evictor:
    def __init__(self, index: PrefixIndex, tau: float):
        self.index = index
        self.tau = tau
        self.tau_pushed = tau  # the tau of the scores in the heaps
        self.credit_due = False  # checkpoints taken on credit go first (CREDIT_FIRST)
        # True: SSD never drops a backup (every DRAM copy stays backed on SSD: the mirror
        # that restarts want, at the cost of DRAM capacity that does not add to SSD's).
        self.keep_backups = False
        # True: DRAM and SSD are one hierarchy: DRAM's stage 1 also moves KV chunks held
        # only in DRAM down to SSD, in the order it drops backed copies (rank, then LRU).
        self.move_down = True
        # True (with move_down): under DRAM pressure a historical checkpoint that cannot
        # move to SSD (a KV chunk before it is not there; its manifest needs them) and was
        # not hit within tau is deleted from DRAM in its stage-1 turn instead of waiting there while live KV
        # chunks move down in its place: it is read at most once per fork, the KV on
        # every turn. `stuck` tells the caller the copy it got is such a one.
        self.drop_stuck = False
        # True: a historical checkpoint moves to SSD ahead of the KV chunks before it (its
        # SSD copy serves while that KV is held in any tier; a restart does not keep it:
        # no manifest names it). Its DRAM bytes go back to KV at once, instead of live KV
        # moving down in its place (SSD reads 468 -> 52 GB, paper-like seed 0).
        self.states_lead = False
        self.stuck = False
        # Only one not hit since this time (set by the core before each pass: now - tau,
        # the learned reuse interval): one hit more recently may still be forked from.
        self.stuck_before = 0.0
        self.q = 0.5  # set by the core from its terminal-reuse EMA before each flush
        self.token_bytes = 1.0  # bytes of one token of KV (all groups), set by the core
        # DRAM-only historical checkpoint -> the node of the KV chunk found not on SSD the
        # last time (`_kv_on_ssd` resumes there: each path is walked about once).
        self.blocker: dict[Entry, Node] = {}
        self.dirty: dict[Node, None] = {}
        self.edirty: dict[Entry, None] = {}
        self.heaps: dict[int, list] = {t: [] for t in MANAGED}
        self.sheaps: dict[int, list] = {t: [] for t in MANAGED}
        self.protected_reqs: set[str] = set()
        self.n_units = 0  # nodes whose cost is not None (heap entries beyond 2x are garbage)
        # Versions come from one counter, so no two heap entries ever compare equal (a node
        # pruned and re-created under the same id must not meet its old entries).
        self._ver = itertools.count(1)

    def mark(self, n: Node) -> None:
        """Structure or residency of n's unit changed: recompute C, seg and M."""
        self.dirty[n] = None


    def mark_entry(self, e: Entry) -> None:
        self.edirty[e] = None

    def set_tau(self, tau: float) -> None:
        """A hit only re-queues entries whose H grew; a smaller tau lowers every H, so once
        tau drifts by more than a quarter from the heaps' tau, re-score every unit."""
        self.tau = tau
        if abs(tau - self.tau_pushed) > 0.25 * self.tau_pushed:
            self.tau_pushed = tau
            for n in self.index.nodes.values():
                if n.cost is not None:
                    self.dirty[n] = None

    # -- re-scoring ---------------------------------------------------------------------------
    def _set_seg(self, n: Node, seg: list[Node]) -> None:
        old = n.seg
        if old == seg or (not old and not seg):
            return
        for m in old:
            if m.bundle is n:
                m.bundle = None
        n.seg = seg
        for m in seg:
            m.bundle = n

    def unit_cost(self, n: Node) -> float | None:
        """C of the unit anchored at n (None: no unit / not a candidate). Updates seg."""
        if n.gone:
            self._set_seg(n, ())
            return None
        if n.st:
            if n.live_children == 0:
                # One walk up: the seg, then on to the nearest checkpoint above.
                seg = [n]
                x = n.parent
                while x is not None and not x.st and x.live_children == 1:
                    seg.append(x)
                    x = x.parent
                while x is not None and not x.st:
                    x = x.parent
                self._set_seg(n, seg)
                return cost_leaf(self.q, n.position, x.position if x is not None else 0)
            if n.seg:
                self._set_seg(n, ())
            # Its single checkpoint child, unless the live chain below forks first (then n
            # is a branch point: no candidate, it outlives its leaves).
            x = n
            while True:
                if x.live_children != 1:
                    return None
                for c in x.children.values():
                    if c.st or c.live_children:
                        x = c
                        break
                if x.st:
                    break
            a = self.index.cp_parent(n)
            pa = a.position if a is not None else 0
            return cost_inner(self.q, n.position, pa, x.position)
        if n.seg:
            self._set_seg(n, ())
        if n.live_children == 0 and n.kv:
            return 0.0
        return None

    def flush(self) -> None:
        heaps, tau, tb = self.heaps, self.tau, self.token_bytes
        hd, hs = heaps[MANAGED[0]], heaps[MANAGED[1]]
        td, ts = MANAGED
        bd, bs = TIER_BIT[td], TIER_BIT[ts]
        ver = self._ver
        edirty = self.edirty
        push = heapq.heappush
        while self.dirty:
            nodes = list(self.dirty)
            self.dirty.clear()
            for n in nodes:
                c = self.unit_cost(n)
                old = n.cost
                if c is None and old is None:
                    continue  # had no unit and has none: no heap entry to invalidate
                if (old is None) != (c is None):
                    self.n_units += 1 if old is None else -1
                n.cost = c
                hv, mb = n.hver, n.mb
                hv[td] = vd = next(ver)
                hv[ts] = vs = next(ver)
                if c is None:
                    mb[td] = mb[ts] = 0
                else:
                    md = ms = 0
                    for e in unit_entries(n):
                        r = e.resident
                        if r & bd:
                            md += e.nbytes
                        if r & bs:
                            ms += e.nbytes
                    mb[td], mb[ts] = md, ms
                    t0 = n.t_last
                    if n.credit and self.credit_due and n.live_children:
                        t0 -= CREDIT_FIRST
                    if md:
                        push(hd, (t0 + tau * c / (md / tb), n.nid, vd, n))
                    if ms:
                        push(hs, (t0 + tau * c / (ms / tb), n.nid, vs, n))
                for e in n.st.values():
                    edirty[e] = None
        if edirty:
            entries = self.index.entries
            move = self.move_down
            for e in edirty:
                r = e.resident
                # Stage-1 entries: copies held twice; with move_down also KV chunks held in
                # DRAM only (they move to SSD). Stale entries fail the test in next_copy.
                if r != _BOTH and not (move and r == bd and self._movable(e)):
                    continue
                live = entries.get(e.key) is e
                for t in MANAGED:
                    e.sver[t] = v = next(ver)
                    if not live or (t is ts and r != _BOTH):
                        continue
                    rank = stage1_rank(e, t)
                    if rank is not None and not (self.keep_backups and t is ts):
                        push(self.sheaps[t], (rank, e.touch, e.key, v, e))
            edirty.clear()
        lim_n = 2 * self.n_units + 1024
        lim_e = 2 * len(self.index.entries) + 1024
        sh = self.sheaps
        if (len(hd) > lim_n or len(hs) > lim_n or len(sh[td]) > lim_e or len(sh[ts]) > lim_e):
            for t in MANAGED:
                self._compact(t)

    def _compact(self, t: int) -> None:
        # Keep only what next_unit / next_copy would not skip as stale: an entry of a pruned
        # node or a forgotten key keeps its version, and left in, every flush after a mass
        # removal compacted the whole heap again.
        h = self.heaps[t]
        if len(h) > 2 * self.n_units + 1024:
            self.heaps[t] = [x for x in h if x[3].hver[t] == x[2] and not x[3].gone]
            heapq.heapify(self.heaps[t])
        s = self.sheaps[t]
        entries = self.index.entries
        if len(s) > 2 * len(entries) + 1024:
            self.sheaps[t] = [x for x in s
                              if x[4].sver[t] == x[3] and entries.get(x[4].key) is x[4]]
            heapq.heapify(self.sheaps[t])

    # -- candidates ---------------------------------------------------------------------------
    def next_copy(self, t: int, aside: list, move: bool = False) -> Entry | None:
        """Stage 1: the next copy to drop from tier t: one another tier also holds, or
        (`move`, DRAM, `move_down`) a KV chunk held only in DRAM, which moves to SSD."""
        heap = self.sheaps[t]
        bit = TIER_BIT[t]
        entries = self.index.entries
        while heap:
            top = heapq.heappop(heap)
            e = top[4]
            if top[3] != e.sver[t] or entries.get(e.key) is not e:
                continue
            if not e.resident & bit:
                continue
            stuck = False
            if not e.resident & ~bit:
                if not (self.move_down and t is MANAGED[0] and self._movable(e)):
                    continue
                if not move:
                    aside.append(top)
                    continue
                if e.kind is not _KV and not self.states_lead and not self._kv_on_ssd(e):
                    if not self.drop_stuck or e.node.t_last > self.stuck_before:
                        aside.append(top)
                        continue
                    stuck = True
            if stage1_rank(e, t) is None:  # rank changed since the push (leaf -> inner)
                continue
            if e.pins or e.pending:
                aside.append(top)
                continue
            self.stuck = stuck
            return e
        return None

    @staticmethod
    def _movable(e: Entry) -> bool:
        """A copy DRAM alone holds that stage 1 moves down: KV, or a historical checkpoint."""
        return e.kind is _KV or not is_leaf_state(e)

    def _kv_on_ssd(self, e: Entry) -> bool:
        """Whether every KV chunk before checkpoint e is on SSD (written: a move queued in
        the same pass waits for the next, so the manifest's chunks land first).

        A failed check remembers where it stopped and the next one resumes there, so a
        checkpoint waiting for its KV costs little per pass. The chunks below that point
        can give up their SSD copies meanwhile (backups go first under SSD pressure), so
        a resumed check that succeeds is confirmed by a whole walk before e moves."""
        x = self.blocker.pop(e, None)
        stop = self._first_kv_off_ssd(x) if x is not None else None
        if stop is None:  # no earlier check, or its part of the path is on SSD now
            stop = self._first_kv_off_ssd(e.node)
        if stop is None:
            return True
        if len(self.blocker) > 4 * len(self.index.entries) + 1024:
            self.blocker.clear()  # entries gone since: rebuilt on demand
        self.blocker[e] = stop
        return False

    @staticmethod
    def _first_kv_off_ssd(x: Node | None) -> Node | None:
        """The first node from x up to the root with a KV chunk not on SSD, or None."""
        ssd = TIER_BIT[MANAGED[1]]
        while x is not None:
            for k in x.kv.values():
                if not k.resident & ssd:
                    return x
            x = x.parent
        return None

    def next_unit(self, t: int, aside: list) -> tuple[Node, float, list[Entry]] | None:
        """Stage 2: the evictable unit with the lowest H that has bytes in tier t."""
        heap = self.heaps[t]
        pop = heapq.heappop
        tau, tb, protected = self.tau, self.token_bytes, self.protected_reqs
        while heap:
            top = pop(heap)
            n = top[3]
            if top[2] != n.hver[t] or n.gone:
                continue
            if n.req and n.req in protected:
                # Stored by a request still prefilling: its KV, and the checkpoint it left
                # mid-way (a leaf bundle until the next chunk lands). Evicting that bundle
                # takes its KV along and the request's later states are refused.
                aside.append(top)
                continue
            h = n.t_last + tau * n.cost / (n.mb[t] / tb)  # = score(...), inlined
            if n.credit and self.credit_due and n.live_children:
                h -= CREDIT_FIRST
            if h > top[0]:  # refreshed by a hit since it was pushed: re-queue, keep looking
                heapq.heappush(heap, (h, top[1], top[2], n))
                continue
            entries = unit_entries(n)
            for e in entries:
                if e.pins or e.pending:
                    aside.append(top)
                    break
            else:
                return n, h, entries
        return None

    def put_back(self, t: int, aside_units: list, aside_copies: list) -> None:
        for x in aside_units:
            heapq.heappush(self.heaps[t], x)
        for x in aside_copies:
            heapq.heappush(self.sheaps[t], x)
