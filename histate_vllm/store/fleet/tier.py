"""The fleet tier: checkpoints and their KV chunks shared by every engine of a fleet.

An engine publishes a checkpoint with the KV chunks before it; any engine of the same
store identity (model, weights, layout, rank; the tenant's cache salt is in every key)
restores it whole: the manifest, the state and every chunk are read, each checked against
the identity, its size and its checksum, before any byte is handed back. Anything less is a
miss with a cause, counted, never a partial or foreign restore.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from histate_vllm.store.fleet import objects
from histate_vllm.store.fleet.backends import FleetUnavailable, FleetWriteFailed
from histate_vllm.store.format import Kind, StoreIdentity

MISS_CAUSES = ("missing", "corrupt", "truncated", "identity", "unavailable")


class FleetMiss(Exception):
    """A checkpoint the fleet tier cannot restore; `cause` is one of MISS_CAUSES."""

    def __init__(self, key: bytes, cause: str, detail: str = "") -> None:
        self.key = key
        self.cause = cause
        super().__init__(f"checkpoint {key.hex()[:16]}… not restored from the fleet tier: "
                         f"{cause}{': ' + detail if detail else ''}")


@dataclass(frozen=True)
class Restored:
    key: bytes
    position: int
    state: memoryview
    chunks: list[tuple[bytes, memoryview]]  # (key, payload) in prefix order

    @property
    def nbytes(self) -> int:
        return self.state.nbytes + sum(c.nbytes for _, c in self.chunks)


class FleetTier:
    def __init__(self, backend, identity: StoreIdentity):
        self.backend = backend
        self.identity = identity
        # (operation, outcome) -> count: ("publish", "ok" | "exists" | "write_failed" |
        # "unavailable"), ("restore", "ok" | a miss cause).
        self.counts: Counter = Counter()

    def publish_checkpoint(self, key: bytes, position: int, state, chunks, *,
                           provenance: str = "") -> bool:
        """Publish a checkpoint: `state` at `position`, `chunks` the (key, payload) of every KV
        chunk before it. Chunks and state first, the manifest last (its presence publishes).
        Returns whether it was published; a failure is counted and leaves the tier as it
        was for every reader."""
        try:
            refs = self._put_chunks(chunks, provenance)
            state_file = objects.new_state_file(key)
            obj, csum, algo = objects.encode_payload(self.identity, Kind.STATE, key, state,
                                                     provenance)
            self.backend.put(objects.state_name(self.identity, state_file), obj)
            self.backend.upsert(objects.manifest_name(self.identity, key),
                                objects.encode_checkpoint_manifest(
                                    self.identity, key, position, provenance, state_file,
                                    len(obj) - objects.HEADER_BYTES, csum, algo, refs))
        except FleetUnavailable:
            self.counts["publish", "unavailable"] += 1
            return False
        except FleetWriteFailed:
            self.counts["publish", "write_failed"] += 1
            return False
        self.counts["publish", "ok"] += 1
        return True

    def _put_chunks(self, chunks, provenance: str) -> list[tuple[bytes, int, int, int]]:
        # A chunk's name needs its checksum; its object is built only where it is absent.
        summed = [objects.payload_checksum(payload) for _, payload in chunks]
        names = [objects.chunk_name(self.identity, ck, csum)
                 for (ck, _), (csum, _) in zip(chunks, summed)]
        present = self.backend.exists(names) if names else []
        refs = []
        for (ck, payload), sums, name, there in zip(chunks, summed, names, present):
            if not there:
                obj, _, _ = objects.encode_payload(self.identity, Kind.CHUNK, ck, payload,
                                                   provenance, sums)
                self.backend.put(name, obj)
            refs.append((ck, memoryview(payload).nbytes, sums[0], int(sums[1])))
        return refs

    def has_checkpoints(self, keys: list[bytes]) -> list[bool]:
        """Which of these checkpoints have a manifest in the tier (all False when it cannot
        be reached)."""
        try:
            return self.backend.exists([objects.manifest_name(self.identity, k) for k in keys])
        except FleetUnavailable:
            self.counts["lookup", "unavailable"] += 1
            return [False] * len(keys)

    def restore_checkpoint(self, key: bytes) -> Restored:
        """The checkpoint, whole and checked, or FleetMiss."""
        try:
            restored = self._restore(key)
        except FleetMiss as miss:
            self.counts["restore", miss.cause] += 1
            raise
        self.counts["restore", "ok"] += 1
        return restored

    def _read(self, key: bytes, name: str) -> bytes:
        try:
            data = self.backend.get(name)
        except FleetUnavailable as e:
            raise FleetMiss(key, "unavailable", str(e)) from None
        if data is None:
            raise FleetMiss(key, "missing", name)
        return data

    def _restore(self, key: bytes) -> Restored:
        name = objects.manifest_name(self.identity, key)
        try:
            m = objects.verify_manifest(name, self._read(key, name), self.identity, key)
            sname = objects.state_name(self.identity, m.state_file)
            state = objects.verify_payload(sname, self._read(key, sname), self.identity,
                                           Kind.STATE, key, m.state_nbytes, m.state_checksum)
            chunks = []
            for ck, nbytes, csum in zip(m.chunk_keys, m.chunk_nbytes, m.chunk_checksums):
                cname = objects.chunk_name(self.identity, ck, csum)
                chunks.append((ck, objects.verify_payload(
                    cname, self._read(key, cname), self.identity, Kind.CHUNK, ck, nbytes,
                    csum)))
        except objects.FleetObjectError as e:
            raise FleetMiss(key, e.cause, str(e)) from None
        return Restored(key, m.position, state, chunks)
