"""A growing/shrinking token context with synthesised chained block ids.

Used where a source gives token counts but no block hashes (TraceLab) and by the synthetic
generators. A `Context` is the token sequence a session would send next: `keep(n)` cuts it
to its first n tokens (a rewind, truncation or compaction point), `append(n)` adds n new
tokens. Each block that becomes full gets a *fresh* chained id, so:

* blocks wholly before a cut keep their ids (the reusable prefix);
* a block that straddles a cut, and everything after it, gets new ids (content changed);
* a partial tail block has no id until it is full (vLLM caches full blocks only).

Fresh ids come from a `Namespace`; every context that can diverge from another one after a
shared prefix (forks, other sessions) must draw from its own namespace or share one, never
two namespaces with the same seed, else their "new" blocks would collide.
"""

from __future__ import annotations

import itertools

import numpy as np

from .hashing import frozen_ids, mix64, namespace_seed


class Namespace:
    """Source of fresh local block values for one id namespace."""

    __slots__ = ("seed", "_counter")

    def __init__(self, *name: object) -> None:
        self.seed = namespace_seed(*name)
        self._counter = itertools.count(1)

    def fresh(self) -> int:
        """A local value never returned before by this namespace."""
        return mix64(self.seed, next(self._counter))


class Context:
    """Token context of one session; `block_hashes()` is the chained id list of full blocks."""

    __slots__ = ("ns", "block_size", "n_tokens", "_ids")

    def __init__(self, ns: Namespace, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.ns = ns
        self.block_size = block_size
        self.n_tokens = 0
        self._ids: list[int] = []

    def append(self, n: int) -> None:
        """Add `n` new tokens; newly completed blocks get fresh ids."""
        if n < 0:
            raise ValueError(f"cannot append {n} tokens")
        self.n_tokens += n
        target = self.n_tokens // self.block_size
        prev = self._ids[-1] if self._ids else self.ns.seed
        while len(self._ids) < target:
            prev = mix64(prev, self.ns.fresh())
            self._ids.append(prev)

    def keep(self, n: int) -> None:
        """Cut the context to its first `n` tokens (n <= current length)."""
        if not 0 <= n <= self.n_tokens:
            raise ValueError(f"cannot keep {n} of {self.n_tokens} tokens")
        self.n_tokens = n
        del self._ids[n // self.block_size :]

    def fork(self, ns: Namespace) -> Context:
        """A copy sharing this prefix whose new blocks come from namespace `ns`."""
        other = Context(ns, self.block_size)
        other.n_tokens = self.n_tokens
        other._ids = list(self._ids)
        return other

    def block_hashes(self) -> np.ndarray:
        """Read-only int64 array of the chained ids of all full blocks."""
        return frozen_ids(self._ids)
