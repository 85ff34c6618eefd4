"""Brute-force reference of histate's eviction order, recomputed from scratch at every step.

It reads only the primary state of a policy (tree links, entries, residency, pins, t_last,
touch order) and re-derives liveness, units, costs, scores and placement ranks without any of
the incremental machinery, then evicts one candidate at a time exactly as the contract says:
stage 1 (copies the other tier also holds: from DRAM what SSD backs, and when spilling KV
chunks held in DRAM only, and historical checkpoints held in DRAM only (with `states_lead`
any; without, only those whose KV path is all on SSD), which move to SSD; from SSD the
backups of KV chunks and terminal checkpoints DRAM holds; placement rank (DRAM: historical
checkpoints, then terminal ones and KV chunks alike), then least recently touched),
then stage 2 (the unit with the lowest H = t_last + tau*C/M, ties by node id): deleted in
every tier, or with `spill` (DRAM pressure, an SSD tier) its DRAM copies move to SSD.
"""

from __future__ import annotations

from histate_vllm.policy.eviction import cost_inner, cost_leaf, score
from histate_vllm.policy.types import Kind, Tier

BIT = {Tier.DRAM: 1, Tier.SSD: 2}
TIERS = (Tier.DRAM, Tier.SSD)


class E:
    def __init__(self, e):
        self.key, self.kind, self.nbytes = e.key, e.kind, e.nbytes
        self.resident, self.pending, self.pins, self.touch = e.resident, e.pending, e.pins, e.touch


class N:
    def __init__(self, n):
        self.nid, self.position, self.t_last, self.req = n.nid, n.position, n.t_last, n.req
        self.parent = n.parent.nid if n.parent is not None else None
        self.children = list(n.children)
        self.kv = [E(e) for e in n.kv.values()]
        self.st = [E(e) for e in n.st.values()]


def snapshot(p):
    p._flush()
    return {
        "nodes": {nid: N(n) for nid, n in p.index.nodes.items()},
        "q": p.ev.q,
        "tau": p.ev.tau,
        "token_bytes": p.ev.token_bytes,
        "protected": set(p.ev.protected_reqs),
        "used": dict(p.used),
        "budgets": dict(p.budgets),
        "states_lead": p.ev.states_lead,
    }


def reference_evictions(snap, tier: Tier, budget: int, units: bool = True,
                        spill: bool = False) -> list[tuple[bytes, Tier]]:
    nodes: dict[bytes, N] = snap["nodes"]
    used = dict(snap["used"])
    lead = snap["states_lead"]
    out: list[tuple[bytes, Tier]] = []
    bit = BIT[tier]

    while used[tier] > budget:
        live: dict[bytes, bool] = {}

        def is_live(nid):
            if nid not in live:
                n = nodes[nid]
                live[nid] = bool(n.st) or any(is_live(c) for c in n.children)
            return live[nid]

        def live_kids(n):
            return [c for c in n.children if is_live(c)]

        def cp_parent(n):
            x = nodes.get(n.parent) if n.parent is not None else None
            while x is not None and not x.st:
                x = nodes.get(x.parent) if x.parent is not None else None
            return x

        def cp_children(n):
            out_, stack = [], live_kids(n)
            while stack:
                x = nodes[stack.pop()]
                if x.st:
                    out_.append(x)
                else:
                    stack.extend(live_kids(x))
            return out_

        def seg(n):
            s, x = [n], nodes.get(n.parent) if n.parent is not None else None
            while x is not None and not x.st and len(live_kids(x)) == 1:
                s.append(x)
                x = nodes.get(x.parent) if x.parent is not None else None
            return s

        def is_leaf(n):
            return bool(n.st) and not live_kids(n)

        def path_on_ssd(n):
            x = n
            while x is not None:
                if any(not k.resident & BIT[Tier.SSD] for k in x.kv):
                    return False
                x = nodes.get(x.parent) if x.parent is not None else None
            return True

        # Stage 1: copies the other tier also holds.
        best = None
        for n in nodes.values():
            for e in n.kv + n.st:
                if not e.resident & bit or e.pins or e.pending:
                    continue
                if not e.resident & ~bit and not (
                        spill and tier == Tier.DRAM
                        and (e.kind == Kind.KV
                             or (not is_leaf(n) and (lead or path_on_ssd(n))))):
                    # held once: only a KV chunk, or a historical checkpoint (without
                    # states_lead, one whose every KV chunk before it is on SSD), moves down
                    continue
                if tier == Tier.DRAM:
                    rank = 0 if e.kind == Kind.STATE and not is_leaf(n) else 1
                elif e.kind == Kind.KV:
                    rank = 0
                elif is_leaf(n):
                    rank = 1
                else:
                    continue  # a historical checkpoint's SSD copy is its home

                k = (rank, e.touch, e.key)
                if best is None or k < best[0]:
                    best = (k, e, n)
        if best is not None:
            _, e, n = best
            if not e.resident & ~bit:
                e.pending |= BIT[Tier.SSD]
                used[Tier.SSD] += e.nbytes
            e.resident &= ~bit
            used[tier] -= e.nbytes
            out.append((e.key, tier))
            _prune_entry(nodes, n, e)
            continue

        # Stage 2: GDS units.
        if not units:
            break
        q, tau, tb = snap["q"], snap["tau"], snap["token_bytes"]
        cands = []
        for n in nodes.values():
            if n.req and n.req in snap["protected"]:
                continue  # stored by a request still in flight
            if n.st:
                a = cp_parent(n)
                pa = a.position if a is not None else 0
                if is_leaf(n):
                    c = cost_leaf(q, n.position, pa)
                    ents = list(n.st)
                    for m in seg(n):
                        ents += m.kv
                else:
                    kids = cp_children(n)
                    if len(kids) != 1:
                        continue
                    c = cost_inner(q, n.position, pa, kids[0].position)
                    ents = list(n.st)
            elif not is_live(n.nid) and n.kv:
                c, ents = 0.0, list(n.kv)
            else:
                continue
            m = sum(e.nbytes for e in ents if e.resident & bit)
            if m == 0 or any(e.pins or e.pending for e in ents):
                continue
            cands.append((score(n.t_last, tau, c, m, tb), n.nid, ents))
        if not cands:
            break
        _, _, ents = min(cands, key=lambda x: (x[0], x[1]))
        if spill and tier == Tier.DRAM:
            ssd = BIT[Tier.SSD]
            for e in ents:
                if e.resident & bit:
                    if not (e.resident | e.pending) & ssd:
                        e.pending |= ssd
                        used[Tier.SSD] += e.nbytes
                    e.resident &= ~bit
                    used[tier] -= e.nbytes
                    out.append((e.key, tier))
            continue
        for e in ents:
            for t in TIERS:
                if e.resident & BIT[t]:
                    e.resident &= ~BIT[t]
                    used[t] -= e.nbytes
                    out.append((e.key, t))
        for n in list(nodes.values()):
            for e in [e for e in n.kv + n.st if not e.resident and not e.pending]:
                _prune_entry(nodes, n, e)
    return out


def _prune_entry(nodes, n, e):
    if e.resident or e.pending:
        return
    if e in n.kv:
        n.kv.remove(e)
    elif e in n.st:
        n.st.remove(e)
    x = n
    while x is not None and x.nid in nodes and not x.kv and not x.st and not x.children:
        del nodes[x.nid]
        parent = nodes.get(x.parent) if x.parent is not None else None
        if parent is not None:
            parent.children.remove(x.nid)
        x = parent
