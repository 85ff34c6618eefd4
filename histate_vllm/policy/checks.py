"""From-scratch recomputation of everything the histate core maintains incrementally.

Used by tests and the simulator after every step; any mismatch is an AssertionError.
"""

from __future__ import annotations

from .index import MANAGED, TIER_BIT
from .types import Kind


def check_histate(p) -> None:
    idx = p.index
    used = {t: 0 for t in MANAGED}
    for k, e in idx.entries.items():
        assert e.key == k
        assert e.resident or e.pending, "entry without any copy"
        assert not (e.resident & e.pending), "copy both resident and pending"
        n = e.node
        assert idx.nodes.get(n.nid) is n, "entry of a pruned node"
        assert (n.kv if e.kind == Kind.KV else n.st).get(e.group) is e
        assert e.pins == p._pins.get(k, 0), "pin count out of sync"
        for t in MANAGED:
            if (e.resident | e.pending) & TIER_BIT[t]:
                used[t] += e.nbytes
    for t in MANAGED:
        assert used[t] == p.used[t], (t, used[t], p.used[t])
        assert p.used[t] <= p.budgets[t], f"{t.name} over budget: {p.used[t]} > {p.budgets[t]}"

    # Tree shape and liveness.
    live: dict = {}

    def is_live(n) -> bool:
        v = live.get(n)
        if v is None:
            v = live[n] = bool(n.st) or any(is_live(c) for c in n.children.values())
        return v

    for nid, n in idx.nodes.items():
        assert n.nid == nid
        assert n.rkv == sum(1 for e in n.kv.values() if e.resident), "rkv out of sync"
        assert n.rst == sum(1 for e in n.st.values() if e.resident), "rst out of sync"
        assert n.kv or n.st or n.children, "empty node not pruned"
        for cid, c in n.children.items():
            assert c.parent is n and idx.nodes.get(cid) is c
        if n.parent is not None:
            assert n.parent.children.get(nid) is n
    assert idx.nkv == len(p._groups[Kind.KV])
    for n in sorted(idx.nodes.values(), key=lambda n: n.position):
        ok = n.rkv >= idx.nkv and (
            n.parent.kok if n.parent is not None else n.position <= p.planner.block_tokens)
        assert n.kok == ok, ("kok out of sync", n)
    order = sorted(idx.nodes.values(), key=lambda n: -n.position)
    for n in order:  # deepest first keeps the recursion shallow
        is_live(n)
    for n in idx.nodes.values():
        lc = sum(1 for c in n.children.values() if live[c])
        assert n.live_children == lc, (n, lc)

    # No checkpoint without every KV chunk before it (referenced chunks never freed).
    nkv = len(p._groups[Kind.KV])
    bt = p.planner.block_tokens
    if nkv:
        for n in idx.nodes.values():
            if not n.st:
                continue
            x = n
            while x is not None:
                assert len(x.kv) >= nkv, f"checkpoint at {n.position} lost KV at {x.position}"
                if x.parent is None:
                    assert x.position <= bt, f"checkpoint at {n.position}: ancestors unknown"
                x = x.parent

    # Bundles (after a flush, every leaf's seg and every bundle pointer are exact).
    p._flush()
    owner = {}
    for n in idx.nodes.values():
        if n.st and n.live_children == 0:
            seg = [n]
            x = n.parent
            while x is not None and not x.st and sum(live[c] for c in x.children.values()) == 1:
                seg.append(x)
                x = x.parent
            assert n.seg == seg, (n, n.seg, seg)
            for m in seg:
                owner[m] = n
    for n in idx.nodes.values():
        assert n.bundle is owner.get(n), (n, n.bundle, owner.get(n))
