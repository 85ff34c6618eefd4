"""Block-id hashing: namespaces and prefix chaining.

Every block id in a `Workload` is a *chained* id: a 63-bit int that identifies the whole
prefix up to and including its block, so two requests share a cached prefix of k blocks
iff their first k ids are equal (equivalently, iff their k-th ids are equal).

    chained[0] = mix64(seed, local[0])
    chained[i] = mix64(chained[i-1], local[i])

`seed` comes from a namespace name (e.g. "weka:trace_0012"), so ids from different trace
files never collide, while streams that share a namespace (a Weka session and its
subagents) share ids wherever their local ids and prefixes agree.

Ids are kept below 2**63 so they fit int64 and uint64 alike and stay non-negative.
The mixer is splitmix64's finaliser: fast, not cryptographic; with ~10^7 distinct blocks the
chance of any accidental collision is ~10^-5.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB

ID_DTYPE = np.dtype(np.int64)


def namespace_seed(*parts: object) -> int:
    """Stable 63-bit seed for a namespace named by `parts` (joined with NUL)."""
    key = "\0".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


def mix64(prev: int, local: int) -> int:
    """Chain one block: a 63-bit id for (prefix id `prev`, block value `local`)."""
    x = (prev * _GOLDEN + (local & _M64)) & _M64
    x = ((x ^ (x >> 30)) * _C1) & _M64
    x = ((x ^ (x >> 27)) * _C2) & _M64
    return (x ^ (x >> 31)) >> 1


def mix64_array(prev: int, local: np.ndarray) -> np.ndarray:
    """`mix64(prev, v)` for every v of `local` at once (used to re-key whole sessions)."""
    x = np.asarray(local).astype(np.uint64) + np.uint64((prev * _GOLDEN) & _M64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(_C1)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(_C2)
    return ((x ^ (x >> np.uint64(31))) >> np.uint64(1)).astype(ID_DTYPE)


def frozen_ids(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """A read-only int64 array of block ids (the storage type of `Request.block_hashes`)."""
    arr = np.asarray(values, dtype=ID_DTYPE)
    if arr.ndim != 1:
        raise ValueError(f"block ids must be 1-D, got shape {arr.shape}")
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr


class Chainer:
    """Chains the local block ids of one request stream inside one namespace.

    A stream is a sequence of prompts that mostly extend each other (a session, a subagent).
    Only the part of each prompt that differs from the previous prompt of the same stream is
    hashed in Python; the common prefix is copied, which keeps loading ~1M-block traces fast.
    The result never depends on that shortcut: ids are a pure function of (seed, local ids).
    """

    __slots__ = ("seed", "_last_local", "_last_chained")

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._last_local = np.empty(0, dtype=ID_DTYPE)
        self._last_chained = np.empty(0, dtype=ID_DTYPE)

    def chain(self, local: Sequence[int] | np.ndarray) -> np.ndarray:
        loc = np.asarray(local, dtype=ID_DTYPE)
        n = len(loc)
        m = min(n, len(self._last_local))
        diff = np.flatnonzero(loc[:m] != self._last_local[:m])
        k = int(diff[0]) if len(diff) else m
        out = np.empty(n, dtype=ID_DTYPE)
        out[:k] = self._last_chained[:k]
        prev = int(out[k - 1]) if k else self.seed
        tail = []
        for v in loc[k:].tolist():
            prev = mix64(prev, v)
            tail.append(prev)
        out[k:] = tail
        self._last_local = loc
        self._last_chained = out
        return frozen_ids(out)
