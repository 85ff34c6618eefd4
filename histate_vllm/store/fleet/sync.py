"""Moving checkpoints between an engine's own SSD stores and the fleet tier.

`publish_from_store` copies a published local checkpoint to the fleet tier; chunks the tier
already holds (named by the local manifest's checksums) are not read from disk.
`pull_into_store` restores one from the fleet tier, whole and checked, into the local store
through the store's own crash-safe publish, so the engine then restores it like any of its
own. A chunk the local store holds with other bytes stops the pull: the state was computed
over the fleet's bytes and must never meet the local ones.
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


def pull_into_store(tier: FleetTier, store, key: bytes, avoid=frozenset()) -> Pulled:
    """Restore `key` from `tier` into `store` (FleetMiss with a cause otherwise, the local
    store then holding at most chunks no manifest names, which its collector removes).
    `avoid`: chunk keys the engine holds with its own bytes elsewhere (DRAM): a checkpoint
    naming one is refused before anything is read or written."""
    local = {}

    def have(ck: bytes, csum: int) -> bool:
        if ck in avoid:
            local[ck] = None
            return True
        if not store.has_chunk(ck):
            return False
        try:
            ref = store.chunk_ref(ck)
        except StoreError:
            return False
        if ref.checksum != csum:
            local[ck] = ref.checksum
        return True  # same bytes, or a conflict reported below: not read either way

    restored = tier.restore_checkpoint(key, have=have)
    if local:  # before any write: the books hold these chunks with this engine's bytes
        tier.counts["restore", "conflict"] += 1
        raise FleetMiss(key, "conflict", f"{len(local)} chunk(s) held here with other bytes")
    origin = f"fleet:{restored.provenance}"  # `inspect` shows where it came from
    try:
        for ck, payload in restored.chunks:
            store.write_chunk(ck, payload, provenance=origin)
        store.publish_checkpoint(key, restored.state, position=restored.position,
                                 chunk_keys=restored.chunk_keys, provenance=origin)
    except ChunkConflict as e:
        tier.counts["restore", "conflict"] += 1
        raise FleetMiss(key, "conflict", str(e)) from None
    except StoreError as e:
        tier.counts["restore", "local_store"] += 1
        raise FleetMiss(key, "local_store", str(e)) from None
    return Pulled(key, restored.position, restored.chunk_keys, restored.nbytes)
