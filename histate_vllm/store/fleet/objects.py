"""What the fleet tier stores, and how an object is checked before anything uses it.

Objects are immutable and named by what they hold, under the store identity's digest:

    histate/<identity digest>/kv/<key hex>.<checksum hex>   a KV chunk
    histate/<identity digest>/st/<key hex>.<generation>     a checkpoint's state
    histate/<identity digest>/mf/<key hex>                  a checkpoint's manifest

A chunk or state object is the SSD store's payload file (a 4096-byte header with kind, key,
identity digest, size and checksum, then the payload); a manifest is the store's manifest
(the full identity, the state object, every chunk with its checksum). Engines that compute
a chunk's bytes differently (another batch, another rounding) write different objects, so
a manifest always reads exactly the bytes its checkpoint was computed over, and two
engines writing the same checkpoint at once each publish a consistent one: whichever
manifest stays names its own state and chunks.
"""

from __future__ import annotations

import secrets
import time

from histate_vllm.store.format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    ChecksumAlgo,
    FormatError,
    Kind,
    Manifest,
    PayloadHeader,
    StoreIdentity,
    bounded_provenance,
    checksum,
    decode_header,
    decode_manifest,
    default_algo,
    encode_header,
    encode_manifest,
)


class FleetObjectError(ValueError):
    """An object that must not be used: `cause` is corrupt, truncated or identity."""

    def __init__(self, name: str, cause: str, detail: str) -> None:
        self.name = name
        self.cause = cause
        super().__init__(f"fleet object {name}: {detail}")


def prefix(identity: StoreIdentity) -> str:
    return f"histate/{identity.digest()}"


def manifest_name(identity: StoreIdentity, key: bytes) -> str:
    return f"{prefix(identity)}/mf/{key.hex()}"


def chunk_name(identity: StoreIdentity, key: bytes, csum: int) -> str:
    return f"{prefix(identity)}/kv/{key.hex()}.{csum:016x}"


def new_state_file(key: bytes) -> str:
    """A state object's base name, unique per publish (the manifest's `state_file`)."""
    return f"{key.hex()}.{secrets.token_hex(8)}.st"


def state_name(identity: StoreIdentity, state_file: str) -> str:
    return f"{prefix(identity)}/st/{state_file}"


def payload_checksum(payload) -> tuple[int, ChecksumAlgo]:
    """(checksum, algorithm) of a payload, as its object records them."""
    algo = default_algo()
    return checksum(algo, memoryview(payload).cast("B")), algo


def encode_payload(identity: StoreIdentity, kind: Kind, key: bytes, payload,
                   provenance: str, summed: tuple[int, ChecksumAlgo] | None = None
                   ) -> tuple[bytes, int, ChecksumAlgo]:
    """(object bytes, payload checksum, algorithm) of a chunk or state; `summed`: its
    `payload_checksum`, where the caller has it already."""
    mv = memoryview(payload).cast("B")
    csum, algo = summed or payload_checksum(mv)
    header = encode_header(PayloadHeader(
        kind=kind, algo=algo, nbytes=mv.nbytes, checksum=csum,
        identity_digest=identity.digest(), key=key,
        provenance=bounded_provenance(provenance)))
    return header + mv.tobytes(), csum, algo


def verify_payload(name: str, data: bytes, identity: StoreIdentity, kind: Kind, key: bytes,
                   nbytes: int, csum: int) -> memoryview:
    """The payload of an object read back, after every check; else FleetObjectError."""
    if len(data) < HEADER_BYTES:
        raise FleetObjectError(name, "truncated", f"{len(data)} bytes, no whole header")
    try:
        h = decode_header(data)
    except FormatError as e:
        raise FleetObjectError(name, "corrupt", str(e)) from None
    if h.identity_digest != identity.digest():
        raise FleetObjectError(name, "identity", "stored under another identity")
    if h.kind != kind or h.key != key:
        raise FleetObjectError(name, "corrupt", "header names another entry")
    body = memoryview(data)[HEADER_BYTES:]
    if len(body) != h.nbytes or h.nbytes != nbytes:
        raise FleetObjectError(name, "truncated",
                               f"payload of {len(body)} bytes, expected {nbytes}")
    if h.checksum != csum or checksum(h.algo, body) != csum:
        raise FleetObjectError(name, "corrupt", "payload checksum mismatch")
    return body


def encode_checkpoint_manifest(identity: StoreIdentity, key: bytes, position: int,
                               provenance: str, state_file: str, state_nbytes: int,
                               state_csum: int, state_algo: int,
                               chunks: list[tuple[bytes, int, int, int]]) -> bytes:
    """chunks: (key, nbytes, checksum, algorithm) of every KV chunk before `position`."""
    return encode_manifest(Manifest(
        version=FORMAT_VERSION, identity=identity, key=key, position=position,
        provenance=bounded_provenance(provenance), created_ns=time.time_ns(),
        state_file=state_file, state_nbytes=state_nbytes, state_checksum=state_csum,
        state_algo=state_algo,
        chunk_keys=tuple(c[0] for c in chunks), chunk_nbytes=tuple(c[1] for c in chunks),
        chunk_checksums=tuple(c[2] for c in chunks), chunk_algos=tuple(c[3] for c in chunks)))


def verify_manifest(name: str, data: bytes, identity: StoreIdentity, key: bytes) -> Manifest:
    try:
        m = decode_manifest(data)
    except FormatError as e:
        cause = "truncated" if "truncated" in str(e) or "body is" in str(e) else "corrupt"
        raise FleetObjectError(name, cause, str(e)) from None
    if m.identity != identity:
        raise FleetObjectError(name, "identity", "stored under another identity")
    if m.key != key:
        raise FleetObjectError(name, "corrupt", "manifest names another checkpoint")
    return m
