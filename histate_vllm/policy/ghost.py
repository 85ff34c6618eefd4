"""What capacity is worth at the margin: a ghost of the KV that eviction deleted.

The interval model prices a checkpoint's bytes as the KV tokens they displace (interval.py).
That holds when the displaced KV is wanted again; when eviction only deletes data no later
prompt reads (sessions that ended, contexts a compaction replaced), a checkpoint costs next
to nothing to hold, and sparse checkpoints leave internal hits recomputing for no saving.
`Ghost` measures which it is. It remembers the blocks whose KV eviction deleted, for one
`horizon` (the time a checkpoint stays, T_state: as long as the KV a checkpoint displaces
would have stayed without it); a prompt whose cached prefix ends where ghost blocks continue
it marks them wanted. `price` is the KV a later prompt recomputes because of the deletions
(the wanted blocks and any held ones past them, which a prefix cannot use) per KV byte
deleted, decayed over about one turnover of the cache; a byte not yet wanted counts as
unwanted until it is. None until eviction has deleted anything (interval.py then uses the
paper's model).

`mature` (the core's `credit` option): a deleted byte joins the price only once it has gone
unwanted for `mature` seconds (the reuse time scale, tau) or is wanted. A young ghost
otherwise prices capacity at zero: sessions that return hours later have not come back yet.
Until then the price stays None.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

MAX_BLOCKS = 1 << 18  # memory bound: ~40 MB of ids, terabytes of KV at real block sizes


class Ghost:
    __slots__ = ("half_life", "blocks", "deleted_bytes", "wanted_bytes", "deletions",
                 "young", "mature")

    def __init__(self, half_life_bytes: int, mature: bool = False):
        self.half_life = float(max(1, half_life_bytes))
        self.blocks: OrderedDict[bytes, tuple[float, int]] = OrderedDict()  # id -> (t, bytes)
        self.deleted_bytes = 0.0  # decayed sums
        self.wanted_bytes = 0.0
        self.deletions = 0
        self.mature = mature
        self.young: deque[tuple[float, int]] = deque()  # (t, bytes) not yet in the sums

    def deleted(self, nid: bytes, nbytes: int, now: float, horizon: float) -> None:
        """Eviction deleted the last copy of `nbytes` of KV of the block `nid`."""
        self.deletions += 1
        if self.mature:
            self.young.append((now, nbytes))
        else:
            self._count(nbytes)
        blocks = self.blocks
        _, before = blocks.pop(nid, (now, 0))
        blocks[nid] = (now, before + nbytes)
        while blocks:
            t, _ = next(iter(blocks.values()))
            if now - t <= horizon and len(blocks) <= MAX_BLOCKS:
                break
            blocks.popitem(last=False)

    def _count(self, nbytes: int) -> None:
        d = math.exp(-nbytes / self.half_life)
        self.deleted_bytes = self.deleted_bytes * d + nbytes
        self.wanted_bytes *= d

    def age(self, now: float, after: float) -> None:
        """(`mature`) Count the deletions at least `after` seconds old."""
        young = self.young
        while young and now - young[0][0] >= after:
            self._count(young.popleft()[1])

    def take(self, nid: bytes, now: float, horizon: float) -> bool:
        """A prompt continues its cached prefix with block `nid`: wanted if the ghost has it
        from within the horizon."""
        got = self.blocks.pop(nid, None)
        return got is not None and now - got[0] <= horizon

    def recomputed(self, nbytes: float) -> None:
        """A prompt recomputes `nbytes` of KV because eviction deleted part of its prefix
        (the deleted blocks and every held one past them, which a prefix cannot use)."""
        self.wanted_bytes += nbytes

    @property
    def price(self) -> float | None:
        """KV bytes recomputed per KV byte deleted, within the horizon; None before eviction
        has deleted anything."""
        if self.deleted_bytes <= 0.0:
            # (`mature`) wanted before any deletion matured: as dear as the KV it deleted
            return 1.0 if self.wanted_bytes > 0.0 else None
        return self.wanted_bytes / self.deleted_bytes
