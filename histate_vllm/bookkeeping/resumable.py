"""Where a request can resume, tier by tier: what HiState publishes as KV cache events.

For a hybrid model a cached KV block alone is no hit: vLLM resumes a request only at a
position where it also has the recurrent state, so KV past the deepest saved state is
recomputed anyway. A router that counts published KV blocks would credit an engine for
blocks it cannot use. So each tier (DRAM, SSD) publishes:

- a state key (its own KV cache group) when the tier holds that checkpoint's state;
- a KV key when the tier holds it and it lies before a checkpoint whose state the same tier
  holds, on the same prefix (the checkpoint's manifest lists it): a block counts up to the
  deepest checkpoint the tier can resume at.

A model without state groups publishes every KV block a tier holds. The view is recomputed
from the books only when they changed, and published as differences (stored / removed).
A recomputation walks every checkpoint's manifest, which on a large cache costs the
scheduler's step real time, so recomputations are spaced to keep them under `DUTY` of the
scheduler thread's time: small books publish at every step, large ones a little later.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from histate_vllm.policy import Tier

TIERS = (Tier.DRAM, Tier.SSD)
DUTY = 0.05  # most of the scheduler thread's time spent recomputing the view


def _held(entry, tier: Tier) -> bool:
    if tier == Tier.DRAM:
        return entry.slot >= 0 and entry.dram_ready
    return entry.on_ssd


class ResumableView:
    def __init__(self, has_states: bool, clock: Callable[[], float] = time.perf_counter):
        self.has_states = has_states
        self.clock = clock
        self._next_at = float("-inf")  # no recomputation before this
        self.published: dict[Tier, set[bytes]] = {t: set() for t in TIERS}
        # Manifests of checkpoints re-admitted from SSD (their entries carry no refs).
        self._manifests: dict[bytes, tuple[bytes, ...]] = {}
        self.dirty = True

    def note_manifests(self, manifests: Mapping[bytes, Iterable[bytes]]) -> None:
        for key, refs in manifests.items():
            self._manifests[key] = tuple(refs)
        self.dirty = True

    def current(self, entries: Mapping) -> dict[Tier, set[bytes]]:
        """The keys each tier publishes now."""
        view: dict[Tier, set[bytes]] = {t: set() for t in TIERS}
        for key, e in entries.items():
            if self.has_states and not e.is_state:
                continue
            for tier in TIERS:
                if not _held(e, tier):
                    continue
                out = view[tier]
                out.add(key)
                if e.is_state:
                    for ref in e.refs or self._manifests.get(key, ()):
                        r = entries.get(ref)
                        if r is not None and _held(r, tier):
                            out.add(ref)
        return view

    def changes(self, entries: Mapping) -> list[tuple[Tier, list[bytes], bool]]:
        """(tier, keys, removed) since the last call, stores before removals; empty when
        nothing changed."""
        if not self.dirty:
            return []
        start = self.clock()
        if start < self._next_at:
            return []  # still dirty: published at a later step
        self.dirty = False
        if self._manifests:
            for key in [k for k in self._manifests if k not in entries]:
                del self._manifests[key]
        now = self.current(entries)
        stored, removed = [], []
        for tier in TIERS:
            before = self.published[tier]
            added, gone = now[tier] - before, before - now[tier]
            if added:
                stored.append((tier, sorted(added), False))
            if gone:
                removed.append((tier, sorted(gone), True))
        self.published = now
        self._next_at = start + (self.clock() - start) / DUTY
        return stored + removed
