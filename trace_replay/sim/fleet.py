"""A fleet of engines in the simulator: the fleet tier's books and the routers.

`FleetTierModel` is what the fleet tier (histate_vllm/store/fleet/) holds, by key: KV chunks
and checkpoint states, each object once whoever published it, in one byte budget evicted
least recently used (a restore refreshes what it reads, as DirBackend's reads refresh an
object's mtime). A checkpoint is restorable while its state and every KV chunk before it
are there (or on the restoring engine): chunks evicted take their checkpoints along.
Transfers are charged elsewhere: each engine's fleet link is a `Drive` (restores and
publishes share it, half each while both have work) plus `latency` s per restore.

Routers pick an engine per request on arrival:
* `ConsistentHash`: a hash ring (`VNODES` points per engine, blake2b) over the session id
  of the request's main session (a subagent goes with its parent), as vllm-router's
  `consistent_hash` on `X-Session-ID`: a session stays on one engine.
* `BoundedHash`: consistent hashing that moves a session only off an overloaded engine.
* `LeastLoaded`: the engine with the fewest outstanding prefill tokens (the prompt tokens of
  requests routed to it whose first token has not come); ties (idle engines) to the one
  with the fewest requests in flight (prefill or decode), then to the next engine after
  the last one picked (round robin). It knows nothing of where a session's history is.

Defaults: `bench_fleet_tier.py`'s figures for FleetTier on DirBackend on local disk (2-CPU
x86 VM, cold reads, median of 5 rounds of 64-chunk checkpoints): restore 0.59 GB/s,
publish 0.62 GB/s, 1.1 ms per checkpoint restore.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter

from .engine import Engine
from .job import Job
from .lru import LruStore

GiB = 1 << 30
DEFAULT_FLEET_READ_BW = 0.59e9  # bytes/s: FleetTier.restore_checkpoint, DirBackend
DEFAULT_FLEET_WRITE_BW = 0.62e9  # bytes/s: FleetTier.publish_checkpoint, DirBackend
DEFAULT_FLEET_LATENCY = 1.1e-3  # s per checkpoint restore (a 1-chunk checkpoint)
DEFAULT_FLEET_BYTES = 512 * GiB  # the fleet tier's budget
DEFAULT_FLEET_QUEUE_BYTES = 2 * GiB  # publishes queued on one engine's link, at most
VNODES = 160


class FleetTierModel:
    def __init__(self, capacity: int):
        self.objects = LruStore(capacity)
        self.uploading: set[bytes] = set()  # chunks a publish in flight carries
        self.stats: Counter = Counter()

    def __contains__(self, key: bytes) -> bool:
        return key in self.objects

    def to_upload(self, state: bytes, chunks: list[bytes]) -> list[bytes] | None:
        """The chunks a publish of `state` must carry (those the tier holds or a publish in
        flight carries are not sent again); None: the state is there already."""
        if state in self.objects or state in self.uploading:
            self.stats["publish_exists"] += 1
            return None
        return [c for c in chunks if c not in self.objects and c not in self.uploading]

    def begin(self, keys: list[bytes]) -> None:
        self.uploading.update(keys)

    def land(self, state: bytes, chunks: list[tuple[bytes, int]], state_bytes: int,
             ok: bool) -> None:
        """A publish went through the link (ok) or was dropped by its queue: chunks first,
        then the state, as FleetTier writes them."""
        for key, _ in chunks:
            self.uploading.discard(key)
        self.uploading.discard(state)
        if not ok:
            self.stats["publish_dropped"] += 1
            return
        for key, nbytes in chunks:
            self.objects.put(key, nbytes)
        self.objects.put(state, state_bytes)
        self.stats["publish_ok"] += 1
        self.stats["published_bytes"] += state_bytes + sum(n for _, n in chunks)

    def touch(self, keys) -> None:
        for key in keys:
            self.objects.touch(key)

    def summary(self) -> dict:
        return {**self.stats, "fleet_used_bytes": self.objects.used,
                "fleet_objects": len(self.objects), "fleet_evictions": self.objects.evictions}


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class ConsistentHash:
    name = "consistent_hash"

    def __init__(self, replay, n: int):
        ring = sorted((_h(f"engine-{e}#{v}"), e) for e in range(n) for v in range(VNODES))
        self.points = [p for p, _ in ring]
        self.owner = [e for _, e in ring]
        by_id = {s.id: s for s in replay.sessions}
        self.root = []
        for s in replay.sessions:
            while s.parent is not None and s.parent in by_id:
                s = by_id[s.parent]
            self.root.append(s.id)

    def __call__(self, job: Job, session: int, engines: list[Engine]) -> int:
        i = bisect.bisect(self.points, _h(self.root[session])) % len(self.points)
        return self.owner[i]


class LeastLoaded:
    name = "least_loaded"

    def __init__(self, replay, n: int):
        self.last = n - 1

    def __call__(self, job: Job, session: int, engines: list[Engine]) -> int:
        n = len(engines)
        order = [(self.last + 1 + i) % n for i in range(n)]
        self.last = min(order, key=lambda e: (engines[e].outstanding, engines[e].in_flight))
        return self.last


class BoundedHash(ConsistentHash):
    """Consistent hashing with bounded loads (Mirrokni, Thorup and Zadimoghaddam): a
    session stays on its ring owner unless that engine's outstanding prefill tokens are
    over (1 + EPS) x the fleet's mean (and over FLOOR tokens); it then goes to the next
    engine on the ring within the bound. Sessions move only off an overloaded engine:
    what a fleet tier lets a router do without throwing the cache away."""

    name = "bounded_hash"
    EPS = 0.25
    FLOOR = 16384  # tokens: below this an engine is never overloaded

    def __call__(self, job: Job, session: int, engines: list[Engine]) -> int:
        n = len(engines)
        cap = max(self.FLOOR, (1 + self.EPS) * (sum(e.outstanding for e in engines)
                                                + job.input_tokens) / n)
        i = bisect.bisect(self.points, _h(self.root[session]))
        seen: set[int] = set()
        for k in range(len(self.points)):
            e = self.owner[(i + k) % len(self.points)]
            if e in seen:
                continue
            if engines[e].outstanding + job.input_tokens <= cap:
                return e
            seen.add(e)
            if len(seen) == n:
                break
        return self.owner[i % len(self.points)]


ROUTERS = {c.name: c for c in (ConsistentHash, LeastLoaded, BoundedHash)}
