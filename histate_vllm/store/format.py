"""On-disk format of the SSD store: identity, checksums, payload headers, manifests.

Payload file (a KV chunk `.kv` or a checkpoint state `.st`)::

    [0, 4096)   header: magic "HSTPAY01", format version, kind, checksum algorithm,
                payload size, payload checksum, identity digest, key, provenance,
                then a CRC32 of all of the above; zero padding to 4096
    [4096, …)   payload, exactly `nbytes` bytes (so a file's size gives its payload size)

Manifest file (`.mf`, one per checkpoint, the record that publishes it)::

    magic "HSTMAN01" | u32 body length | u32 CRC32 of body | body = msgpack(Manifest)

A manifest names its state file, the KV chunks it depends on with their sizes and
checksums, its position, provenance and the full `StoreIdentity`. Every integer is
little-endian. A reader trusts nothing that fails its magic, length or checksum.
"""

from __future__ import annotations

import hashlib
import re
import struct
import time
import zlib
from enum import IntEnum

import msgspec

try:  # 6x faster than zlib.crc32 here (14 vs 2.4 GiB/s) and releases the GIL.
    import xxhash
except ImportError:  # pragma: no cover - exercised only without the optional package
    xxhash = None

FORMAT_VERSION = 1
HEADER_BYTES = 4096
PAYLOAD_MAGIC = b"HSTPAY01"
MANIFEST_MAGIC = b"HSTMAN01"
MAX_KEY_BYTES = 1024
MAX_PROVENANCE_BYTES = 2048


def bounded_provenance(provenance: str) -> str:
    """`provenance` (a request id) cut to fit a header: a head that stays readable and a
    hash of the whole, so ids of any length never fail a write."""
    raw = provenance.encode()
    if len(raw) <= MAX_PROVENANCE_BYTES:
        return provenance
    head = raw[:256].decode(errors="ignore")
    return f"{head}…sha256:{hashlib.sha256(raw).hexdigest()[:32]}"


# Most bytes a manifest or an identity.json may hold: a larger file (or one that never
# ends, like a link to /dev/zero) is not one the store wrote, and is never read whole.
MAX_MANIFEST_BYTES = 64 << 20
MAX_IDENTITY_BYTES = 1 << 20
# A manifest's state file: `<key hex>.<hex unique per publish>.st` (layout.new_state_file).
# Checked at decode: the name is joined into paths that are read and deleted, so one
# naming anything else ("../../victim") is refused, never followed.
_STATE_FILE = re.compile(r"[0-9a-f]+\.[0-9a-f]+\.st")


class FormatError(ValueError):
    """Bytes that are not a valid header or manifest; the message is the reason."""


class Kind(IntEnum):
    CHUNK = 1
    STATE = 2


class ChecksumAlgo(IntEnum):
    XXH3_64 = 1
    CRC32 = 2


class StoreIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """Everything that must match for stored bytes to be valid in this engine.

    Entries of different identities never meet: each identity has its own directory
    (named by `digest()`), and every header and manifest carries it again.
    """

    model: str
    dtype: str
    kv_layout: str
    block_size: int
    tp_rank: int
    tp_size: int
    # Payload size of one key (one vLLM page); recorded, not enforced.
    page_bytes: int
    vllm_version: str
    # Weights revision or fingerprint, when the model name alone does not pin them.
    weights: str = ""
    # Anything else that changes the bytes (speculative decoding, quantization, ...).
    extra: str = ""

    def digest(self) -> str:
        """16 hex characters, stable across processes and versions of this package."""
        encoded = msgspec.msgpack.encode(self)
        return hashlib.blake2b(encoded, digest_size=8).hexdigest()


def default_algo() -> ChecksumAlgo:
    return ChecksumAlgo.XXH3_64 if xxhash is not None else ChecksumAlgo.CRC32


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data) -> None:
        self.value = zlib.crc32(data, self.value)

    def intdigest(self) -> int:
        return self.value


def new_hasher(algo: ChecksumAlgo):
    """A streaming hasher with `update(buffer)` and `intdigest()`."""
    if algo == ChecksumAlgo.XXH3_64:
        if xxhash is None:
            raise FormatError("checksum xxh3_64 needs the xxhash package")
        return xxhash.xxh3_64()
    if algo == ChecksumAlgo.CRC32:
        return _Crc32()
    raise FormatError(f"unknown checksum algorithm {int(algo)}")


# xxhash hashes while holding the GIL (~30 GB/s here: 2 ms for a 64 MiB state), so a
# large payload is hashed in pieces with the GIL let go between them: the engine thread
# then waits at most one piece for it, not Python's 5 ms switch interval. With the
# store's parallel writers, enqueue p99 in tests/store/test_store_writer.py was 1-2 ms
# without this on a busy 2-vCPU VM, and 0.1-0.3 ms with it.
_HASH_PIECE = 1 << 20


def checksum(algo: ChecksumAlgo, data) -> int:
    mv = memoryview(data)
    if mv.nbytes <= _HASH_PIECE:
        if algo == ChecksumAlgo.XXH3_64 and xxhash is not None:
            return xxhash.xxh3_64_intdigest(mv)
        hasher = new_hasher(algo)
        hasher.update(mv)
        return hasher.intdigest()
    mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
    hasher = new_hasher(algo)
    for off in range(0, len(mv), _HASH_PIECE):
        hasher.update(mv[off : off + _HASH_PIECE])
        time.sleep(0)  # lets a waiting thread have the GIL
    return hasher.intdigest()


# magic, version, kind, algo, payload nbytes, checksum, identity digest, key len, prov len
_HEADER = struct.Struct("<8sHBBQQ8sHH")
_CRC = struct.Struct("<I")


class PayloadHeader(msgspec.Struct, frozen=True, gc=False):
    kind: Kind
    algo: ChecksumAlgo
    nbytes: int
    checksum: int
    identity_digest: str
    key: bytes
    provenance: str


def encode_header(h: PayloadHeader) -> bytes:
    prov = h.provenance.encode()
    if len(h.key) > MAX_KEY_BYTES:
        raise ValueError(f"key of {len(h.key)} bytes, at most {MAX_KEY_BYTES}")
    if len(prov) > MAX_PROVENANCE_BYTES:
        raise ValueError(f"provenance of {len(prov)} bytes, at most {MAX_PROVENANCE_BYTES}")
    fixed = _HEADER.pack(
        PAYLOAD_MAGIC,
        FORMAT_VERSION,
        h.kind,
        h.algo,
        h.nbytes,
        h.checksum,
        bytes.fromhex(h.identity_digest),
        len(h.key),
        len(prov),
    )
    body = fixed + h.key + prov
    body += _CRC.pack(zlib.crc32(body))
    return body + bytes(HEADER_BYTES - len(body))


def decode_header(buf) -> PayloadHeader:
    if len(buf) < HEADER_BYTES:
        raise FormatError(f"header truncated ({len(buf)} of {HEADER_BYTES} bytes)")
    magic, version, kind, algo, nbytes, csum, ident, klen, plen = _HEADER.unpack_from(buf)
    if magic != PAYLOAD_MAGIC:
        raise FormatError("bad magic")
    if version != FORMAT_VERSION:
        raise FormatError(f"format version {version}, expected {FORMAT_VERSION}")
    end = _HEADER.size + klen + plen
    if klen > MAX_KEY_BYTES or plen > MAX_PROVENANCE_BYTES:
        raise FormatError("header lengths out of range")
    (crc,) = _CRC.unpack_from(buf, end)
    if crc != zlib.crc32(memoryview(buf)[:end]):
        raise FormatError("header checksum mismatch")
    try:
        return PayloadHeader(
            kind=Kind(kind),
            algo=ChecksumAlgo(algo),
            nbytes=nbytes,
            checksum=csum,
            identity_digest=ident.hex(),
            key=bytes(buf[_HEADER.size : _HEADER.size + klen]),
            provenance=bytes(buf[_HEADER.size + klen : end]).decode(),
        )
    except (ValueError, UnicodeDecodeError) as e:
        raise FormatError(f"bad header field: {e}") from None


class ChunkRef(msgspec.Struct, frozen=True, gc=False):
    """A chunk a checkpoint depends on, pinned to the exact bytes it was computed with."""

    key: bytes
    nbytes: int
    checksum: int
    algo: int


class Manifest(msgspec.Struct, frozen=True, gc=False, array_like=True):
    version: int
    identity: StoreIdentity
    key: bytes
    position: int
    provenance: str
    created_ns: int
    # Base name of the state file, in the states fan-out directory of `key`.
    state_file: str
    state_nbytes: int
    state_checksum: int
    state_algo: int
    # The chunks it depends on, in order, as columns of equal length: the start-up
    # scan checks them with set operations, without a Python object per chunk.
    chunk_keys: tuple[bytes, ...]
    chunk_nbytes: tuple[int, ...]
    chunk_checksums: tuple[int, ...]
    chunk_algos: tuple[int, ...]

    def chunk_refs(self) -> list[ChunkRef]:
        cols = (self.chunk_keys, self.chunk_nbytes, self.chunk_checksums, self.chunk_algos)
        return [ChunkRef(*ref) for ref in zip(*cols)]


class ManifestHead(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """The leading fields of a Manifest, all the start-up scan needs: decoding stops
    before the checksum columns (msgspec ignores trailing array items)."""

    version: int
    identity: StoreIdentity
    key: bytes
    position: int
    provenance: str
    created_ns: int
    state_file: str
    state_nbytes: int
    state_checksum: int
    state_algo: int
    chunk_keys: tuple[bytes, ...]
    chunk_nbytes: tuple[int, ...]


_MANIFEST_HEAD = struct.Struct("<8sII")
_manifest_encoder = msgspec.msgpack.Encoder()
_manifest_decoder = msgspec.msgpack.Decoder(Manifest)
_head_decoder = msgspec.msgpack.Decoder(ManifestHead)


def encode_manifest(m: Manifest) -> bytes:
    body = _manifest_encoder.encode(m)
    return _MANIFEST_HEAD.pack(MANIFEST_MAGIC, len(body), zlib.crc32(body)) + body


def decode_manifest(data: bytes, *, head_only: bool = False) -> Manifest:
    """Verify and decode a manifest file's bytes (a ManifestHead with `head_only`)."""
    if len(data) < _MANIFEST_HEAD.size:
        raise FormatError(f"manifest truncated ({len(data)} bytes)")
    magic, length, crc = _MANIFEST_HEAD.unpack_from(data)
    if magic != MANIFEST_MAGIC:
        raise FormatError("bad manifest magic")
    body = memoryview(data)[_MANIFEST_HEAD.size :]
    if len(body) != length:
        raise FormatError(f"manifest body is {len(body)} bytes, header says {length}")
    if zlib.crc32(body) != crc:
        raise FormatError("manifest checksum mismatch")
    try:
        m = (_head_decoder if head_only else _manifest_decoder).decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise FormatError(f"manifest does not decode: {e}") from None
    if m.version != FORMAT_VERSION:
        raise FormatError(f"manifest version {m.version}, expected {FORMAT_VERSION}")
    if len(m.chunk_nbytes) != len(m.chunk_keys) or (
        not head_only and not len(m.chunk_checksums) == len(m.chunk_algos) == len(m.chunk_keys)
    ):
        raise FormatError("manifest chunk columns differ in length")
    if not (_STATE_FILE.fullmatch(m.state_file) and m.state_file.startswith(m.key.hex() + ".")):
        raise FormatError(f"manifest names a state file outside the store: {m.state_file!r}")
    return m
