"""Values shared by every policy and by both callers (the vLLM connector and the simulator).

A cached thing is named by an opaque ``key: bytes`` (vLLM style: block hash + 4-byte big-endian
group id). Two kinds exist: a KV chunk (attention KV of one block; a hit needs every KV chunk
before the resume point) and a STATE page (recurrent state at a block boundary; one per state
group; all state keys of one node form one checkpoint, usable only when every one is present).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Tier(IntEnum):
    # Ordered fastest first: a lower value is preferred on ties.
    GPU = 0
    DRAM = 1
    SSD = 2


class Kind(IntEnum):
    KV = 1
    STATE = 2


def make_key(block_hash: bytes, group_id: int) -> bytes:
    """vLLM's `make_offload_key`: block hash + 4-byte big-endian group id."""
    return block_hash + group_id.to_bytes(4, "big", signed=False)


def key_group(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big")


@dataclass(frozen=True, slots=True)
class Item:
    """One key the manager wants to store, with where it sits in its prompt.

    `node` is the block hash the key belongs to, `parent` the previous block hash of the
    prompt (None for the first block), `position` the token count at the key's end (a
    multiple of the block size). `terminal` marks the checkpoint at a request's prompt end.
    `identity` is the compatibility identity (model, dtype, layout, block size, TP rank);
    entries of different identities never match each other. b"" = the core's default.
    """

    key: bytes
    node: bytes
    parent: bytes | None
    kind: Kind
    position: int
    nbytes: int
    terminal: bool = False
    request_id: str = ""
    identity: bytes = b""


@dataclass(slots=True)
class Admission:
    """What `admit` decided: keys to write now, and (key, tier) copies to drop first."""

    accepted: list[bytes] = field(default_factory=list)
    evict: list[tuple[bytes, Tier]] = field(default_factory=list)
    # Keys whose DRAM copy is in `evict` but which move to SSD (DRAM pressure, HiState's
    # hierarchy): pending on SSD; copy each from DRAM, then commit it there, before the DRAM
    # copy is freed.
    spill: list[bytes] = field(default_factory=list)


class Hit:
    """Result of a prefix lookup.

    position: deepest restorable token position (all KV chunks before it committed in some
        tier, plus a complete checkpoint exactly there); 0 when nothing is restorable.
    shared: longest prefix whose KV chunks are all committed, whether or not a checkpoint sits
        there (the learned-boundary signal).
    kv_keys / state_keys: the keys a restore at `position` loads (KV of blocks [0, position),
        state at `position`); derived from the prompt's hashes, so always exact.
    sources: (key, tier) for each of them, read from its fastest tier; kv_tier / state_tier:
        the slowest tier any of them is read from. These reflect residency when first read:
        read them (or pin the keys) before the cache changes. A key that vanished meanwhile
        shows tier None.
    """

    __slots__ = ("position", "shared", "_hashes", "_kvs", "_sts", "_bt", "_fastest",
                 "_kv_keys", "_state_keys", "_sources")

    def __init__(self, position: int = 0, shared: int = 0, *, hashes=(), kv_suffixes=(),
                 state_suffixes=(), block_tokens: int = 1, fastest=None,
                 kv_keys=None, state_keys=None, sources=None):
        self.position = position
        self.shared = shared
        self._hashes, self._kvs, self._sts = hashes, kv_suffixes, state_suffixes
        self._bt, self._fastest = block_tokens, fastest
        self._kv_keys, self._state_keys, self._sources = kv_keys, state_keys, sources

    @property
    def kv_keys(self) -> tuple[bytes, ...]:
        if self._kv_keys is None:
            n = self.position // self._bt
            self._kv_keys = tuple([h + s for h in self._hashes[:n] for s in self._kvs]) \
                if n else ()
        return self._kv_keys

    @property
    def state_keys(self) -> tuple[bytes, ...]:
        if self._state_keys is None:
            n = self.position // self._bt
            h = self._hashes[n - 1] if n else b""
            self._state_keys = tuple([h + s for s in self._sts]) if n else ()
        return self._state_keys

    @property
    def sources(self) -> tuple[tuple[bytes, Tier | None], ...]:
        if self._sources is None:
            f = self._fastest
            self._sources = tuple([(k, f(k)) for k in self.kv_keys + self.state_keys])
        return self._sources

    @property
    def kv_tier(self) -> Tier | None:
        nk = len(self.kv_keys)
        return _slowest(t for _, t in self.sources[:nk])

    @property
    def state_tier(self) -> Tier | None:
        nk = len(self.kv_keys)
        return _slowest(t for _, t in self.sources[nk:])

    def __repr__(self) -> str:
        return f"Hit(position={self.position}, shared={self.shared})"


def _slowest(tiers) -> Tier | None:
    out = None
    for t in tiers:
        if t is not None and (out is None or t > out):
            out = t
    return out
