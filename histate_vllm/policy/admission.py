"""The write side of HiStatePolicy: admission, commits, losses, budget changes, restart.

A mixin over the state `HiStatePolicy.__init__` sets up (index, evictor, budgets, plans, log).
Every copy goes pending -> resident -> forgotten through `_forget`; an entry with no copy left
leaves the index, which updates liveness, bundles and the committed-KV flags (index.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from . import events as ev
from .index import MANAGED, TIER_BIT, Entry, Node
from .placement import is_backup
from .types import Admission, Item, Kind, Tier, key_group

_DRAM, _SSD = TIER_BIT[Tier.DRAM], TIER_BIT[Tier.SSD]
_KV, _STATE = Kind.KV, Kind.STATE
_TIERS = ((Tier.DRAM, _DRAM), (Tier.SSD, _SSD))
_NAME = {t: t.name for t in Tier}


def _by_position(it: Item) -> int:
    return it.position


def _spill_keep_order(e: Entry) -> tuple[bool, int]:
    return (e.kind is _STATE, e.node.position)


def _rollback_order(x: tuple[Entry, Item, bool]) -> tuple[int, int]:
    return (x[1].position, x[1].kind)



class Residency:
    def _set_resident(self, e: Entry, bit: int) -> None:
        if not e.resident:
            n = e.node
            if e.kind is _KV:
                n.rkv += 1
                if n.rkv >= self.index.nkv and not n.kok:
                    self.index.update_kok(n)
            else:
                n.rst += 1
        e.resident |= bit
        self.epoch += 1

    def _res_changed(self, e: Entry) -> None:
        n = e.node
        dirty = self.ev.dirty
        if e.kind is _STATE:
            dirty[n] = None
        else:
            b = n.bundle
            if b is not None:
                dirty[b] = None
            elif not n.st and not n.live_children:
                dirty[n] = None  # orphan unit
        self.ev.edirty[e] = None

    def _forget(self, e: Entry, tier: Tier, lifetime: float | None = None) -> None:
        """Drop one copy (resident or pending); drop the entry when no copy is left."""
        bit = TIER_BIT[tier]
        r = e.resident
        if r & bit:
            e.resident = r = r & ~bit
            self.epoch += 1
            if not r:
                n = e.node
                if e.kind is _KV:
                    n.rkv -= 1
                    if n.kok and n.rkv < self.index.nkv:
                        self.index.update_kok(n)
                else:
                    n.rst -= 1
        elif e.pending & bit:
            e.pending &= ~bit
        else:
            return
        self.used[tier] -= e.nbytes
        if r or e.pending:
            self._res_changed(e)
            return
        if lifetime is not None:  # the time of a policy eviction: feeds T_kv / T_state
            self.interval.observe_residence(e.kind is _STATE, lifetime - e.born)
            if e.kind is not _STATE:  # and the ghost that prices capacity (ghost.py)
                self.ghost.deleted(e.node.nid, e.nbytes, lifetime, self.ghost_horizon())
        self.index.drop(e)

    # -- admission -----------------------------------------------------------------------------
    def admit(self, items: Sequence[Item], tier: Tier) -> Admission | None:
        if tier not in TIER_BIT:
            raise ValueError(f"tier {tier!r} is not managed; managed: {list(MANAGED)}")
        bit = TIER_BIT[tier]
        now = self.clock()
        kvs: list[Item] = []
        sts: list[Item] = []
        extras: list[Item] = []
        entries = self.index.entries
        budget = self.budgets[tier]
        seen: set[bytes] = set()
        for it in items:
            key = it.key
            if key in seen:
                continue
            seen.add(key)
            e = entries.get(key)
            if e is not None:
                prefix = self._prefix(it.identity) if it.identity else self._dprefix
                if e.node.nid != prefix + it.node:
                    self._emit(ev.REJECT, it, tier, "key already held for another node/identity",
                               it.request_id)
                elif not (e.resident | e.pending) & bit:
                    (kvs if it.kind is _KV else sts).append(it)
                continue
            if it.nbytes > budget:
                self._emit(ev.REJECT, it, tier, f"larger than the {tier.name} budget",
                           it.request_id)
                continue
            if it.kind is _KV:
                kvs.append(it)
                continue
            if not it.terminal:
                plan = self.plans.get(it.request_id)
                if plan is not None and it.position not in plan:
                    extras.append(it)  # vLLM kept it anyway (dense retention): free space only
                    continue
                if self._credit and it.position in self._credit.get(it.request_id, ()):
                    extras.append(it)  # planned on credit: free space only too (core.py)
                    continue
            sts.append(it)
        if len(kvs) > 1:
            kvs.sort(key=_by_position)
        if len(sts) > 1:
            sts.sort(key=_by_position)
        kvs.extend(sts)
        done: list[tuple[Entry, Item, bool]] = []
        used = self.used
        for it in kvs:
            self._add_pending(it, tier, now, done)
        out = Admission()
        # Writing a backup (SSD copy of what DRAM holds) may displace other backups, never
        # data held nowhere else.
        units = self.ev.keep_backups or not (tier is Tier.SSD and done and all(
            (e.resident | e.pending) & _DRAM and is_backup(e) for e, _, _ in done))
        spilled: list[Entry] = []
        if used[tier] > budget:
            self._make_room(tier, out.evict, units,
                            spilled if tier is Tier.DRAM and self.budgets[Tier.SSD] else None)
            if used[tier] > budget:
                # Roll back deepest first (a state before the KV of its own block).
                done.sort(key=_rollback_order)
                while done and used[tier] > budget:
                    e, it, _ = done.pop()
                    self._forget(e, tier)
                    self._emit(ev.REJECT, it, tier, f"no room in {_NAME[tier]}", it.request_id)
        if spilled:
            self._settle_spills(spilled, out)
        if extras:
            self._admit_extras(extras, tier, now, done)
        accepted = out.accepted
        emit = self._emit
        for e, it, new in done:
            accepted.append(e.key)
            emit(ev.ADMIT, it, tier, "new" if new else "copy", it.request_id)
            if new and e.kind is _STATE:
                self._observe_sizes(e.node)
        if not accepted and not out.evict:
            return None
        return out

    def _add_pending(self, it: Item, tier: Tier, now: float,
                     done: list[tuple[Entry, Item, bool]]) -> bool:
        """Index `it` (if new) with a pending copy in `tier`; False if refused."""
        key = it.key
        e = self.index.entries.get(key)
        new = e is None
        if new:
            group = int.from_bytes(key[-4:], "big")
            if it.kind is _STATE:
                missing = self._state_path_missing(it)
                if missing is not None:
                    self._emit(ev.REJECT, it, tier, "KV chunks before it are missing "
                               f"(first gap at position {missing})", it.request_id)
                    return False
            if group not in self._groups[it.kind]:
                self._learn_group(it.kind, group)
            e = self.index.add(it, self._prefix(it.identity) if it.identity else self._dprefix,
                               group)
            if self._pins:
                e.pins = self._pins.get(key, 0)
            e.born = now
            n = e.node
            if n.t_last < now:
                n.t_last = now
            if it.request_id and not n.req and it.kind is _KV:
                n.req = it.request_id
            if self._credit and it.kind is _STATE:
                planned = self._credit.get(it.request_id)
                if planned and n.position in planned and not n.credit:
                    n.credit = True
                    self.credit_nodes.append(n)
        e.pending |= TIER_BIT[tier]
        self.used[tier] += e.nbytes
        if not new:  # `add` already marked what a new entry changes
            self._res_changed(e)
        done.append((e, it, new))
        return True

    def _admit_extras(self, extras: list[Item], tier: Tier, now: float,
                      done: list[tuple[Entry, Item, bool]]) -> None:
        """States outside the capture plan that vLLM offers anyway (it keeps a state at
        every prefill chunk end under dense retention, and then serves hits from them on
        the GPU), and interval checkpoints planned on credit (core.py). Kept only where
        they fit without evicting anything, so they never displace what the plan chose;
        once in, GDS prices them as any inner checkpoint.
        A checkpoint (one state key per state group) is admitted whole or not at all."""
        units: dict[bytes, list[Item]] = {}
        for it in extras:
            units.setdefault(it.node, []).append(it)
        budget = self.budgets[tier]
        for unit in sorted(units.values(), key=lambda u: u[0].position):
            nbytes = sum(it.nbytes for it in unit)
            if self.used[tier] + nbytes > budget:
                for it in unit:
                    plan = sorted(self.plans.get(it.request_id) or ())
                    why = ("was planned on credit" if it.position in plan else
                           f"is not in the capture plan {plan}")
                    self._emit(ev.REJECT, it, tier, f"position {it.position} {why} and "
                               f"{_NAME[tier]} has no free room", it.request_id)
                continue
            mark = len(done)
            if not all(self._add_pending(it, tier, now, done) for it in unit):
                for e, _, _ in done[mark:]:
                    self._forget(e, tier)
                del done[mark:]

    def _state_path_missing(self, it: Item) -> int | None:
        nkv = self.index.nkv
        node = self.index.nodes.get(self._prefix(it.identity or None) + it.node)
        if node is None:
            return it.position if nkv else None
        if not nkv:
            return None
        gap = self.index.path_kv_missing(node, nkv)
        return None if gap is None else gap.position

    def _observe_sizes(self, n: Node) -> None:
        # Sizes are fixed per model: the first 64 checkpoints, then one in 64, are plenty.
        self._n_obs += 1
        if self._n_obs > 64 and self._n_obs % 64:
            return
        if len(n.st) == len(self._groups[_STATE]):
            self.interval.observe_checkpoint(sum(e.nbytes for e in n.st.values()))
        if n.kv and len(n.kv) == len(self._groups[_KV]):
            self.interval.observe_kv_chunk(sum(e.nbytes for e in n.kv.values()))

    def _settle_spills(self, spilled: list[Entry], out: Admission) -> None:
        """Make SSD room for what DRAM pressure moved there; what still does not fit is
        deleted (checkpoints first, then KV deepest first, each KV chunk with the checkpoints
        below it). The rest the manager copies from DRAM (`spill`)."""
        ssd = Tier.SSD
        if self.used[ssd] > self.budgets[ssd]:
            self._make_room(ssd, out.evict)
        # Delete checkpoints before KV, deepest KV first: no checkpoint loses its path.
        spilled.sort(key=_spill_keep_order)
        while spilled and self.used[ssd] > self.budgets[ssd]:
            e = spilled.pop()
            if not e.pending & _SSD:
                continue  # went with a KV chunk above it
            self._emit(ev.EVICT, e, ssd, "no room on SSD for a DRAM eviction")
            # A KV chunk takes the checkpoints below it along (`demotions` names them).
            self._lose(e, ssd, "no room on SSD")
        out.spill.extend(e.key for e in spilled if e.pending & _SSD)

    def _make_room(self, tier: Tier, out: list[tuple[bytes, Tier]], units: bool = True,
                   spill: list[Entry] | None = None) -> None:
        """Demote, then evict GDS units, until `tier` fits its budget or nothing can go.

        units=False: stage 1 only. `spill` (DRAM only): a GDS unit's DRAM-only copies move
        to SSD (pending there, appended to `spill`) instead of being deleted."""
        budget = self.budgets[tier]
        if self.used[tier] <= budget:
            return
        aside_u: list = []
        aside_c: list = []
        other = Tier.SSD if tier == Tier.DRAM else Tier.DRAM
        self.ev.stuck_before = self.clock() - self.ev.tau
        while self.used[tier] > budget:
            self._flush()
            e = self.ev.next_copy(tier, aside_c, spill is not None)
            if e is not None:
                if tier is Tier.DRAM and self._drop_on_credit(e, out, "DRAM full"):
                    continue
                if self.ev.stuck:  # a historical checkpoint that cannot move: deleted
                    self._emit(ev.EVICT, e, tier, "DRAM full; historical checkpoint whose "
                               "KV is not on SSD (it cannot move there)")
                    out.append((e.key, tier))
                    self._forget(e, tier, self.clock())
                    continue
                if not e.resident & TIER_BIT[other]:  # a KV chunk in DRAM only: moves down
                    e.pending |= _SSD
                    self.used[Tier.SSD] += e.nbytes
                    spill.append(e)  # type: ignore[union-attr]
                    self._emit(ev.DEMOTE, e, tier, "DRAM full; moves to SSD")
                else:
                    self._emit(ev.DEMOTE, e, tier,
                               f"{tier.name} full; a copy stays in {other.name}")
                out.append((e.key, tier))
                self._forget(e, tier)
                continue
            if not units:
                break
            r = self.ev.next_unit(tier, aside_u)
            if r is None:
                break
            if spill is not None:
                self._spill_unit(r[0], r[1], out, r[2], spill)
            else:
                self._evict_unit(r[0], r[1], tier, out, r[2])
        self.ev.put_back(tier, aside_u, aside_c)

    def shed(self, tier: Tier, nbytes: int) -> list[tuple[bytes, Tier]]:
        """Delete GDS units with bytes in `tier`, lowest H first, until `nbytes` of it are
        freed or nothing can go (stage 2 only, never a move: a move holds its slot too).
        Called when the manager's slots run out although the policy is within budget."""
        out: list[tuple[bytes, Tier]] = []
        aside: list = []
        bit = TIER_BIT[tier]
        freed = 0
        while freed < nbytes:
            self._flush()
            r = self.ev.next_unit(tier, aside)
            if r is None:
                break
            freed += sum(e.nbytes for e in r[2] if e.resident & bit)
            self._evict_unit(r[0], r[1], tier, out, r[2])
        self.ev.put_back(tier, aside, [])
        return out

    def _evict_unit(self, n: Node, h: float, tier: Tier, out: list[tuple[bytes, Tier]],
                    entries: list[Entry]) -> None:
        if n.st:
            what = "leaf bundle" if n.live_children == 0 else "checkpoint"
        else:
            what = "orphan KV"
        reason = f"GDS {what} for {_NAME[tier]}: H={h:.3f} C={n.cost:.1f} t_last={n.t_last:.3f}"
        forget = self._forget
        log = self.log
        emit = log.emit if log.enabled else None
        now = self.clock()
        for e in entries:
            for t, bit in _TIERS:
                if e.resident & bit:
                    if emit is not None:
                        m = e.node
                        emit(ev.EVICT, e.key, m.hash, t, e.kind, m.position, reason, "", None, h)
                    out.append((e.key, t))
                    forget(e, t, now)

    def _spill_unit(self, n: Node, h: float, out: list[tuple[bytes, Tier]],
                    entries: list[Entry], spill: list[Entry]) -> None:
        """DRAM pressure on a GDS unit: its DRAM copies go, each kept as an SSD copy."""
        reason = f"GDS unit for DRAM: H={h:.3f}; moves to SSD"
        used = self.used
        for e in entries:
            if not e.resident & _DRAM:
                continue
            if self._drop_on_credit(e, out, "GDS unit for DRAM"):
                continue
            if not (e.resident | e.pending) & _SSD:
                e.pending |= _SSD
                used[Tier.SSD] += e.nbytes
                spill.append(e)
            self._emit(ev.DEMOTE, e, Tier.DRAM, reason)
            out.append((e.key, Tier.DRAM))
            self._forget(e, Tier.DRAM)

    def _drop_on_credit(self, e: Entry, out: list[tuple[bytes, Tier]], why: str) -> bool:
        """DRAM pressure on a checkpoint taken on credit that SSD does not hold: deleted, not
        moved (core.py, "Credit"). False for anything else."""
        if e.kind is not _STATE or not e.node.credit or (e.resident | e.pending) & _SSD:
            return False
        self._emit(ev.EVICT, e, Tier.DRAM, f"{why}; a checkpoint on credit is deleted, "
                   "not moved to SSD")
        out.append((e.key, Tier.DRAM))
        self._forget(e, Tier.DRAM, self.clock())
        return True

    def committed(self, key: bytes, tier: Tier, ok: bool) -> None:
        e = self.index.entries.get(key)
        bit = TIER_BIT.get(tier, 0)
        if e is None or not e.pending & bit:
            return
        if ok:
            e.pending &= ~bit
            self._set_resident(e, bit)
            e.touch = self._tick()
            self._res_changed(e)
        else:
            self._emit(ev.FAIL, e, tier, "write failed")
            self._lose(e, tier, "a write of it failed")

    def _lose(self, e: Entry, tier: Tier, why: str) -> None:
        """An external loss; a KV chunk's last copy takes the checkpoints below it along."""
        node = e.node
        self._forget(e, tier)
        if e.kind != Kind.KV or e.present() or not node.live:
            return
        stack = [node]
        doomed: list[Node] = []
        while stack:
            x = stack.pop()
            if x.st:
                doomed.append(x)
            stack.extend(c for c in x.children.values() if c.live)
        for x in doomed:
            for s in list(x.st.values()):
                for t in MANAGED:
                    if (s.resident | s.pending) & TIER_BIT[t]:
                        self._emit(ev.REMOVE, s, t, f"KV chunk at {node.position} lost ({why})")
                        self._drops[t].append(s.key)
                        self._forget(s, t)

    def restore_resident(self, items, tier, last_access=None, now=None) -> list[bytes]:
        """Start-up: re-add committed copies (see PolicyCore.restore_resident).

        Data from before a restart ranks at least one GDS time scale older than anything
        touched since: t_last = clock() - tau - (now - last_access), where `last_access` may
        be in any clock (file mtimes) and `now` is that clock's present (default: the newest
        of them). Without `last_access` every item gets clock() - tau.
        """
        bit = TIER_BIT[tier]
        order = list(range(len(items)))
        base = self.clock() - self.ev.tau
        if last_access is not None:
            order.sort(key=lambda i: last_access[i])
            ref = max(last_access, default=0.0) if now is None else now
        own: dict[Node, None] = {}
        for i in order:
            it = items[i]
            t = base - max(ref - last_access[i], 0.0) if last_access is not None else base
            e = self.index.entries.get(it.key)
            if e is None:
                group = key_group(it.key)
                self._learn_group(it.kind, group)
                e = self.index.add(it, self._prefix(it.identity or None), group)
                e.pins = self._pins.get(it.key, 0)
                e.born = t
            elif (e.resident | e.pending) & bit:
                continue
            self._set_resident(e, bit)
            e.touch = self._tick()
            e.node.t_last = max(e.node.t_last, t)
            self.used[tier] += e.nbytes
            self._res_changed(e)
            if e.kind == Kind.STATE:
                own[e.node] = None
            self._emit(ev.RESTORE, e, tier)
        dropped: list[bytes] = []
        nkv = len(self._groups[Kind.KV])
        for n in sorted(own, key=lambda n: n.position):
            if nkv and n.st and self.index.path_kv_missing(n, nkv) is not None:
                for s in list(n.st.values()):
                    for t in MANAGED:
                        if s.resident & TIER_BIT[t]:
                            self._emit(ev.REMOVE, s, t, "restored without its KV chunks")
                            (dropped if t == tier else self._drops[t]).append(s.key)
                            self._forget(s, t)
            else:
                self._observe_sizes(n)
        out: list[tuple[bytes, Tier]] = []
        self._make_room(tier, out)
        for k, t in out:
            (dropped if t == tier else self._drops[t]).append(k)
        return dropped

    def set_budget(self, tier: Tier, nbytes: int) -> list[tuple[bytes, Tier]]:
        """Change a tier's budget; returns the copies the manager must drop to fit it."""
        self.budgets[tier] = int(nbytes)
        out: list[tuple[bytes, Tier]] = []
        self._make_room(tier, out)
        return out
