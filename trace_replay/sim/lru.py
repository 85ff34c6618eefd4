"""A byte-budgeted LRU store over int keys (one offload tier of an LRU baseline)."""

from __future__ import annotations

from collections import OrderedDict


class LruStore:
    __slots__ = ("capacity", "evictions", "od", "used")

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.used = 0
        self.od: OrderedDict[int, int] = OrderedDict()
        self.evictions = 0

    def __contains__(self, key: int) -> bool:
        return key in self.od

    def __len__(self) -> int:
        return len(self.od)

    def put(self, key: int, nbytes: int) -> bool:
        """Write `key` if absent (a present key is left where it is); evict LRU keys to fit."""
        od = self.od
        if key in od:
            return True
        if nbytes > self.capacity:
            return False
        od[key] = nbytes
        self.used += nbytes
        while self.used > self.capacity:
            _, b = od.popitem(last=False)
            self.used -= b
            self.evictions += 1
        return True

    def touch(self, key: int) -> None:
        if key in self.od:
            self.od.move_to_end(key)
