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
from histate_vllm.store.format import ChecksumAlgo, Kind, StoreIdentity

# The last only when pulling into a local store (sync.pull_into_store) that refused it.
MISS_CAUSES = ("missing", "corrupt", "truncated", "identity", "unavailable", "local_store")


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
    chunks: list[tuple[bytes, memoryview]]  # (key, payload) in prefix order, those read
    chunk_keys: tuple[bytes, ...] = ()  # every chunk before `position`, in order
    provenance: str = ""  # the request that computed it, on the engine that published it

    @property
    def nbytes(self) -> int:
        return self.state.nbytes + sum(c.nbytes for _, c in self.chunks)


class FleetTier:
    def __init__(self, backend, identity: StoreIdentity):
        self.backend = backend
        self.identity = identity
        # (operation, outcome) -> count: ("publish", "ok" | "write_failed" | "unavailable"
        # | "gone_locally"), ("restore", "ok" | a miss cause), ("lookup", "unavailable").
        self.counts: Counter = Counter()

    def publish_checkpoint(self, key: bytes, position: int, state, chunks, *,
                           provenance: str = "") -> bool:
        """Publish a checkpoint: `state` at `position`, `chunks` the (key, payload) of every KV
        chunk before it. Returns whether it was published (see `publish_refs`)."""
        payloads = {}
        refs = []
        for ck, payload in chunks:
            csum, algo = objects.payload_checksum(payload)
            payloads[ck] = payload
            refs.append((ck, memoryview(payload).nbytes, csum, int(algo)))
        ok, _ = self.publish_refs(key, position, state, refs,
                                  lambda ck, nbytes: payloads[ck], provenance=provenance)
        return ok

    def publish_refs(self, key: bytes, position: int, state, refs, read, *,
                     provenance: str = "") -> tuple[bool, int]:
        """Publish a checkpoint whose chunks are given by reference: `refs` the (key, nbytes,
        checksum, algorithm) of every KV chunk before `position`, `read(key, nbytes)` their
        payloads, called only for chunks the tier does not hold yet. Chunks and state
        first, the manifest last (its presence publishes). Returns (published, bytes
        sent); a failure is counted and leaves the tier as it was for every reader."""
        sent = 0
        try:
            names = [objects.chunk_name(self.identity, ck, csum) for ck, _, csum, _ in refs]
            present = self.backend.exists(names) if names else []
            for (ck, nbytes, csum, algo), name, there in zip(refs, names, present):
                if there:
                    continue
                payload = read(ck, nbytes)
                obj, _, _ = objects.encode_payload(self.identity, Kind.CHUNK, ck, payload,
                                                   provenance, (csum, ChecksumAlgo(algo)))
                self.backend.put(name, obj)
                sent += len(obj)
            state_file = objects.new_state_file(key)
            obj, csum, algo = objects.encode_payload(self.identity, Kind.STATE, key, state,
                                                     provenance)
            self.backend.put(objects.state_name(self.identity, state_file), obj)
            manifest = objects.encode_checkpoint_manifest(
                self.identity, key, position, provenance, state_file,
                len(obj) - objects.HEADER_BYTES, csum, algo, refs)
            self.backend.upsert(objects.manifest_name(self.identity, key), manifest)
            sent += len(obj) + len(manifest)
        except FleetUnavailable:
            self.counts["publish", "unavailable"] += 1
            return False, sent
        except FleetWriteFailed:
            self.counts["publish", "write_failed"] += 1
            return False, sent
        self.counts["publish", "ok"] += 1
        return True, sent

    def has_checkpoints(self, keys: list[bytes]) -> list[bool]:
        """Which of these checkpoints have a manifest in the tier (all False when it cannot
        be reached)."""
        try:
            return self.backend.exists([objects.manifest_name(self.identity, k) for k in keys])
        except FleetUnavailable:
            self.counts["lookup", "unavailable"] += 1
            return [False] * len(keys)

    def restore_checkpoint(self, key: bytes, have=None) -> Restored:
        """The checkpoint, whole and checked, or FleetMiss. `have(chunk key, checksum)`:
        whether the caller holds that chunk already (it is then not read)."""
        try:
            restored = self._restore(key, have)
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

    def _restore(self, key: bytes, have) -> Restored:
        name = objects.manifest_name(self.identity, key)
        try:
            m = objects.verify_manifest(name, self._read(key, name), self.identity, key)
            sname = objects.state_name(self.identity, m.state_file)
            state = objects.verify_payload(sname, self._read(key, sname), self.identity,
                                           Kind.STATE, key, m.state_nbytes, m.state_checksum)
            chunks = []
            for ck, nbytes, csum in zip(m.chunk_keys, m.chunk_nbytes, m.chunk_checksums):
                if have is not None and have(ck, csum):
                    continue
                cname = objects.chunk_name(self.identity, ck, csum)
                chunks.append((ck, objects.verify_payload(
                    cname, self._read(key, cname), self.identity, Kind.CHUNK, ck, nbytes,
                    csum)))
        except objects.FleetObjectError as e:
            raise FleetMiss(key, e.cause, str(e)) from None
        return Restored(key, m.position, state, chunks, tuple(m.chunk_keys), m.provenance)
