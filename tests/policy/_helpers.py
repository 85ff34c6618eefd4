"""Shared builders for the policy tests: chained block hashes, items, a fake manager."""

from __future__ import annotations

import hashlib

from histate_vllm.policy import Item, Kind, Tier, make_key

KV_G = 0
ST_G = 1


def chain(labels, salt: bytes = b"") -> list[bytes]:
    """vLLM-style chained hashes: hash i fingerprints labels [0, i]."""
    out, prev = [], salt
    for lab in labels:
        prev = hashlib.blake2b(prev + repr(lab).encode(), digest_size=8).digest()
        out.append(prev)
    return out


def kv_item(hashes, i, bt, nbytes, req="") -> Item:
    return Item(make_key(hashes[i], KV_G), hashes[i], hashes[i - 1] if i else None, Kind.KV,
                (i + 1) * bt, nbytes, request_id=req)


def st_item(hashes, i, bt, nbytes, terminal=False, req="", group=ST_G) -> Item:
    return Item(make_key(hashes[i], group), hashes[i], hashes[i - 1] if i else None, Kind.STATE,
                (i + 1) * bt, nbytes, terminal=terminal, request_id=req)


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class FakeManager:
    """Does exactly what the policy says and remembers what it physically holds.

    `check()` asserts the policy's view of residency equals what was really written.
    """

    def __init__(self, core):
        self.core = core
        self.items: dict[bytes, Item] = {}
        self.stored = {Tier.DRAM: set(), Tier.SSD: set()}
        self.pending = {Tier.DRAM: set(), Tier.SSD: set()}

    def admit(self, items, tier):
        for it in items:
            self.items.setdefault(it.key, it)
        adm = self.core.admit(items, tier)
        if adm is None:
            return []
        for k, t in adm.evict:
            assert k in self.stored[t], f"told to drop {k!r} from {t.name} which it never held"
            self.stored[t].discard(k)
        for k in adm.spill:  # moved to SSD: copied from DRAM at once
            self.core.committed(k, Tier.SSD, True)
            self.stored[Tier.SSD].add(k)
        for k in adm.accepted:
            assert k not in self.stored[tier] and k not in self.pending[tier]
            self.pending[tier].add(k)
        return adm.accepted

    def commit(self, tier, fail=frozenset()):
        for k in sorted(self.pending[tier]):
            ok = k not in fail
            self.core.committed(k, tier, ok)
            if ok:
                self.stored[tier].add(k)
        self.pending[tier].clear()

    def copy_down(self):
        """Stage DRAM contents to SSD, then ask placement what DRAM keeps."""
        keys = [k for k in sorted(self.stored[Tier.DRAM]) if k not in self.stored[Tier.SSD]]
        self.admit([self.items[k] for k in keys], Tier.SSD)
        self.commit(Tier.SSD)
        for k in sorted(self.stored[Tier.DRAM] & self.stored[Tier.SSD]):
            if not self.core.keep(k, Tier.DRAM):
                self.stored[Tier.DRAM].discard(k)
        self.drain()

    def drain(self):
        for t in (Tier.DRAM, Tier.SSD):
            for k in self.core.demotions(t):
                self.stored[t].discard(k)
                self.pending[t].discard(k)

    def drop(self, evicted):
        for k, t in evicted:
            assert k in self.stored[t]
            self.stored[t].discard(k)

    def check(self):
        for t in (Tier.DRAM, Tier.SSD):
            for k in self.stored[t]:
                assert t in self.core.where(k), f"{t.name} holds {k!r}; the policy forgot it"
            for k in self.items:
                if t in self.core.where(k):
                    assert k in self.stored[t], f"policy thinks {t.name} holds {k!r}"
            held = sum(self.items[k].nbytes for k in self.stored[t] | self.pending[t])
            assert held == self.core.usage(t)
            assert held <= self.core.budgets[t]
