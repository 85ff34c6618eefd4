"""A byte-budgeted ARC store over int keys: vLLM 0.34's `arc` offload eviction, in the
simulator's terms (`LruStore`'s interface).

As vLLM's `ARCCachePolicy` (v1/kv_offload/cpu/policies/arc.py): new keys enter T1 (seen
once); a key read again moves to T2 (seen more than once); eviction takes T1's LRU end while
T1 holds at least its adaptive target, else T2's, and remembers the key in a ghost list (B1
or B2); storing a key found in B1 grows T1's target, in B2 shrinks it. vLLM counts chunks
of one page each; here keys carry their bytes (a KV block or a recurrent state), so the
target and the step it moves by are in bytes, and each ghost list keeps at most as many keys
as the store holds.
"""

from __future__ import annotations

from collections import OrderedDict


class ArcStore:
    __slots__ = ("b1", "b2", "capacity", "evictions", "t1", "t1_bytes", "t2", "target",
                 "used")

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.used = 0
        self.t1: OrderedDict[int, int] = OrderedDict()
        self.t2: OrderedDict[int, int] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.t1_bytes = 0
        self.target = 0.0
        self.evictions = 0

    def __contains__(self, key: int) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def put(self, key: int, nbytes: int) -> bool:
        """Write `key` if absent into T1 (adapting T1's target on a ghost hit); evict to fit."""
        if key in self:
            return True
        if nbytes > self.capacity:
            return False
        if key in self.b1:
            self.target = min(self.target + nbytes * max(1.0, len(self.b2) / len(self.b1)),
                              self.capacity)
            del self.b1[key]
        elif key in self.b2:
            self.target = max(self.target - nbytes * max(1.0, len(self.b1) / len(self.b2)),
                              0.0)
            del self.b2[key]
        self.t1[key] = nbytes
        self.t1_bytes += nbytes
        self.used += nbytes
        while self.used > self.capacity:
            self._evict_one()
        return True

    def _evict_one(self) -> None:
        if self.t1 and (self.t1_bytes >= self.target or not self.t2):
            key, b = self.t1.popitem(last=False)
            self.t1_bytes -= b
            ghosts = self.b1
        else:
            key, b = self.t2.popitem(last=False)
            ghosts = self.b2
        self.used -= b
        self.evictions += 1
        ghosts[key] = None
        while len(ghosts) > max(len(self), 1):
            ghosts.popitem(last=False)

    def touch(self, key: int) -> None:
        """A read: a key seen once moves to T2, one seen before to T2's MRU end."""
        b = self.t1.pop(key, None)
        if b is not None:
            self.t1_bytes -= b
            self.t2[key] = b
        elif key in self.t2:
            self.t2.move_to_end(key)
