"""Moving checkpoints between an engine's own SSD stores and the fleet tier.

`publish_from_store` copies a published local checkpoint to the fleet tier; chunks the tier
already holds (named by the local manifest's checksums) are not read from disk.
`pull_into_store` restores one from the fleet tier, whole and checked, into the local store
through the store's own crash-safe publish, so the engine then restores it like any of its
own; chunks the local store holds already serve as they are (see `pull_into_store`).
"""

from __future__ import annotations

from dataclasses import dataclass

from histate_vllm.store.errors import ChunkConflict, StoreError
from histate_vllm.store.fleet.tier import FleetMiss, FleetTier


@dataclass(frozen=True)
class Pulled:
    key: bytes
    position: int
    chunk_keys: tuple[bytes, ...]
    nbytes: int  # bytes read from the fleet tier


def publish_from_store(tier: FleetTier, store, key: bytes) -> int:
    """Publish the local checkpoint `key` of `store` to `tier`; returns the bytes sent
    (0 when it was not published: gone locally, or the tier refused, counted there)."""
    try:
        m = store.load_manifest(key)
    except StoreError:
        tier.counts["publish", "gone_locally"] += 1
        return 0
    refs = list(zip(m.chunk_keys, m.chunk_nbytes, m.chunk_checksums, m.chunk_algos))

    def read(ck: bytes, nbytes: int):
        buf = bytearray(nbytes)
        store.read_chunk(ck, buf)
        return buf

    state = bytearray(m.state_nbytes)
    try:
        store.read_checkpoint(key, state, verify_chunks=False)
        ok, sent = tier.publish_refs(key, m.position, state, refs, read,
                                     provenance=m.provenance)
    except StoreError:  # deleted or quarantined while read: nothing was published
        tier.counts["publish", "gone_locally"] += 1
        return 0
    return sent if ok else 0


def pull_into_store(tier: FleetTier, store, key: bytes) -> Pulled:
    """Restore `key` from `tier` into `store` (FleetMiss with a cause otherwise, the local
    store then holding at most chunks no manifest names, which its collector removes).

    A chunk the local store holds is neither read nor replaced: it is the KV of the same
    tokens under the same identity, this engine's computation of them, and it serves the
    pulled state as the GPU's cached blocks serve a state restored from SSD (vLLM's prefix
    cache mixes computations of a prefix the same way). The local manifest names the local
    bytes, so every read is still checked against what is on disk."""
    restored = tier.restore_checkpoint(key, have=lambda ck, csum: store.has_chunk(ck))
    origin = f"fleet:{restored.provenance}"  # `inspect` shows where it came from
    try:
        for ck, payload in restored.chunks:
            try:
                store.write_chunk(ck, payload, provenance=origin)
            except ChunkConflict:
                pass  # this engine wrote its own copy meanwhile: that one serves
        store.publish_checkpoint(key, restored.state, position=restored.position,
                                 chunk_keys=restored.chunk_keys, provenance=origin)
    except StoreError as e:
        tier.counts["restore", "local_store"] += 1
        raise FleetMiss(key, "local_store", str(e)) from None
    return Pulled(key, restored.position, restored.chunk_keys, restored.nbytes)
