"""vLLM-like GPU prefix cache: KV blocks and recurrent states in one paged pool, LRU.

Keys are Python ints: a block's chained id `h` (>= 0) names its KV block, `~h` (< 0) the
recurrent state at that block's end. A key is *held* while requests use it (refcount > 0)
and *cached* once free: free keys wait in an LRU queue and are evicted from its head when
room is needed. As in vLLM, a finished request frees its blocks tail first, so a prefix's
deepest blocks go before its shallow ones. A hit needs the KV of every block before the
resume point and a state exactly there (vLLM's hybrid prefix-cache rule).

`split` gives KV and states separate pools (SGLang's static partition); otherwise they share
one pool (vLLM's unified pages).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class GpuPrefixCache:
    def __init__(self, capacity: int, kv_bytes: int, state_bytes: int,
                 state_share: float | None = None):
        self.kv_bytes = kv_bytes
        self.state_bytes = state_bytes
        if state_share is None:
            self.caps = [capacity, capacity]
            self._pool = (0, 0)
        else:
            st = int(capacity * state_share)
            self.caps = [capacity - st, st]
            self._pool = (0, 1)
        self.used = [0, 0]
        self.refs: dict[int, int] = {}
        self.free: list[OrderedDict[int, None]] = [OrderedDict(), OrderedDict()]
        if state_share is None:
            self.free[1] = self.free[0]
        self.overcommit = 0  # allocations that found nothing left to evict

    def __contains__(self, key: int) -> bool:
        return key in self.refs

    def kv_prefix(self, hashes: Sequence[int], limit: int) -> int:
        """Leading blocks (at most `limit`) whose KV is on the GPU."""
        refs = self.refs
        n = 0
        for h in hashes[:limit]:
            if h not in refs:
                break
            n += 1
        return n

    def hit(self, hashes: Sequence[int], limit: int) -> tuple[int, int]:
        """(restorable blocks, KV prefix blocks): the deepest block end within the KV prefix
        that also holds a state."""
        k = self.kv_prefix(hashes, limit)
        refs = self.refs
        j = k
        while j > 0 and ~hashes[j - 1] not in refs:
            j -= 1
        return j, k

    def acquire(self, keys: Iterable[int]) -> None:
        """Hold `keys` for a request; keys not cached are allocated (evicting if needed)."""
        refs = self.refs
        grow = False
        for k in keys:
            rc = refs.get(k)
            if rc is None:
                refs[k] = 1
                if k >= 0:
                    self.used[0] += self.kv_bytes
                else:
                    self.used[self._pool[1]] += self.state_bytes
                grow = True
            else:
                if rc == 0:
                    del self.free[self._pool[k < 0]][k]
                refs[k] = rc + 1
        if grow:
            self._make_room()

    def release(self, keys: Iterable[int]) -> None:
        """Drop one hold on each key; a key nobody holds joins the LRU tail (in this order)."""
        refs = self.refs
        for k in keys:
            rc = refs[k] - 1
            refs[k] = rc
            if rc == 0:
                self.free[self._pool[k < 0]][k] = None

    def hold_hit(self, hashes: Sequence[int], g: int) -> list[int]:
        """Hold a GPU hit of `g` blocks for a request: their KV and the state at the last
        one. Returns the keys held."""
        held = list(hashes[:g])
        if g:
            held.append(~hashes[g - 1])
        self.acquire(held)
        return held

    def hold_prompt(self, hashes: Sequence[int], block_tokens: int, states: set[int],
                    previous: Iterable[int], max_blocks: int) -> list[int]:
        """A request's hold once prefilled: its prompt's KV and the states at token positions
        `states`, then its earlier hold (`previous`) let go and the states it passed retired
        (`retire_states`: the prompt end's, block `max_blocks`, stays held). Returns the keys
        held."""
        keys: list[int] = []
        for i, h in enumerate(hashes):
            keys.append(h)
            if (i + 1) * block_tokens in states:
                keys.append(~h)
        self.acquire(keys)
        self.release(previous)
        return self.retire_states(keys, ~hashes[max_blocks - 1] if max_blocks else None)

    def retire_states(self, keys: list[int], keep: int | None) -> list[int]:
        """A prefilled request's hold, less the states it has passed: vLLM (align mode) frees
        a request's state blocks behind its prefill as it goes (`MambaManager.
        remove_skipped_blocks`), cached but evictable from then on, and holds only the state
        it runs on, `keep` (the prompt end's). Returns the keys still held."""
        passed = [k for k in keys if k < 0 and k != keep]
        if passed:
            self.release(passed)
            held = set(passed)
            keys = [k for k in keys if k not in held]
        return keys

    def _make_room(self) -> None:
        for p in set(self._pool):
            cap = self.caps[p]
            free = self.free[p]
            while self.used[p] > cap:
                if not free:
                    self.overcommit += 1
                    break
                k, _ = free.popitem(last=False)
                del self.refs[k]
                if k >= 0:
                    self.used[0] -= self.kv_bytes
                else:
                    self.used[self._pool[1]] -= self.state_bytes

    def usage(self) -> int:
        return self.used[0] + (self.used[1] if self._pool[1] else 0)
