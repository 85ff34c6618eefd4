"""Verified reads of payload files: into a caller's buffer, or streamed (for fsck).

A payload is returned only after its header, size and checksum all check out; any
mismatch raises `BadEntry` with the reason, and the store turns that into quarantine.
"""

from __future__ import annotations

import errno
import os

from histate_vllm.store.directio import read_direct
from histate_vllm.store.fileio import read_exact
from histate_vllm.store.format import (
    HEADER_BYTES,
    FormatError,
    Kind,
    PayloadHeader,
    checksum,
    decode_header,
    new_hasher,
)

# Streaming verification reads this much at a time (fsck, no caller buffer).
_VERIFY_PIECE = 8 << 20


class BadEntry(Exception):
    """A payload file that fails verification; the message is the reason."""


class Expect:
    """What a manifest recorded about a payload; the file must agree."""

    __slots__ = ("algo", "checksum", "nbytes")

    def __init__(self, nbytes: int, checksum: int, algo: int) -> None:
        self.nbytes = nbytes
        self.checksum = checksum
        self.algo = algo


def out_view(out, nbytes: int | None = None) -> memoryview:
    """A writable flat byte view of `out`, cut to `nbytes` (which it must hold)."""
    mv = memoryview(out)
    if mv.readonly:
        raise ValueError("output buffer is read-only")
    if not mv.c_contiguous:
        raise ValueError("output buffer must be C-contiguous")
    mv = mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")
    if nbytes is None:
        return mv
    if len(mv) < nbytes:
        raise ValueError(f"output buffer holds {len(mv)} bytes, the entry has {nbytes}")
    return mv[:nbytes]


def _checked(
    buf, size: int, key: bytes, kind: Kind, digest: str, expect: Expect | None
) -> PayloadHeader:
    """Decode a header and check it against what the caller and the file say."""
    try:
        h = decode_header(buf)
    except FormatError as e:
        raise BadEntry(f"bad header: {e}") from None
    if h.kind != kind:
        raise BadEntry(f"header says {h.kind.name.lower()}, expected {kind.name.lower()}")
    if h.key != key:
        raise BadEntry("header names another key")
    if h.identity_digest != digest:
        raise BadEntry(f"header of another identity ({h.identity_digest})")
    if expect is not None and (
        h.nbytes != expect.nbytes or h.checksum != expect.checksum or h.algo != expect.algo
    ):
        raise BadEntry("payload differs from the one the manifest recorded")
    if size != HEADER_BYTES + h.nbytes:
        what = "truncated" if size < HEADER_BYTES + h.nbytes else "has trailing bytes"
        raise BadEntry(f"{what}: {size} bytes on disk, expected {HEADER_BYTES + h.nbytes}")
    return h


def _read(fd: int, bufs: list[memoryview], offset: int) -> int:
    try:
        return read_exact(fd, bufs, offset)
    except OSError as e:
        if e.errno == errno.EIO:
            raise BadEntry(f"I/O error: {e.strerror}") from None
        raise


def check_header(
    fd: int, key: bytes, kind: Kind, digest: str, expect: Expect | None, *, direct: bool = False
) -> PayloadHeader:
    size = os.fstat(fd).st_size
    if size < HEADER_BYTES:
        raise BadEntry("truncated: shorter than its header")
    if direct:
        buf, got = _read_direct(fd, HEADER_BYTES, memoryview(b""))
    else:
        buf = bytearray(HEADER_BYTES)
        got = _read(fd, [memoryview(buf)], 0)
    if got < HEADER_BYTES:
        raise BadEntry("truncated: shorter than its header")
    return _checked(buf, size, key, kind, digest, expect)


def _read_direct(fd: int, size: int, payload: memoryview) -> tuple[bytes, int]:
    try:
        return read_direct(fd, HEADER_BYTES, size, payload)
    except OSError as e:
        if e.errno == errno.EIO:
            raise BadEntry(f"I/O error: {e.strerror}") from None
        raise


def read_into(
    fd: int,
    key: bytes,
    kind: Kind,
    digest: str,
    out,
    expect: Expect | None = None,
    *,
    direct: bool = False,
) -> int:
    """Verify the file open at `fd` and fill `out` with its payload; return its size.

    The header and the payload come in one sequential read (the file size says how
    long the payload is), so the kernel's readahead sees one stream per file. `direct`:
    `fd` was opened with O_DIRECT and `out` is page-aligned (`directio.read_direct`);
    raises DirectIOUnsupported if the file system refuses the read.
    """
    size = os.fstat(fd).st_size
    if size < HEADER_BYTES:
        raise BadEntry("truncated: shorter than its header")
    dst = out_view(out)
    if size - HEADER_BYTES > len(dst):
        # Too big for `out`: a valid header makes that the caller's ValueError.
        h = check_header(fd, key, kind, digest, expect, direct=direct)
        out_view(out, h.nbytes)
        raise AssertionError("unreachable: check_header saw the size")
    payload = dst[: size - HEADER_BYTES]
    if direct:
        hdr, got = _read_direct(fd, size, payload)
        if got < HEADER_BYTES:
            raise BadEntry("truncated: shorter than its header")
    else:
        hdr = bytearray(HEADER_BYTES)
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
        got = _read(fd, [memoryview(hdr), payload], 0)
    h = _checked(hdr, size, key, kind, digest, expect)
    if got < size:
        raise BadEntry(f"truncated while reading: {got} of {size} bytes")
    if checksum(h.algo, payload) != h.checksum:
        raise BadEntry("payload checksum mismatch")
    return h.nbytes


def open_entry(path: str, flags: int = os.O_RDONLY) -> int:
    """Open a payload file: never through a symlink (the store makes none), never blocking
    on a FIFO (it reads as empty, so truncated). BadEntry for a symlink or socket."""
    try:
        return os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            raise BadEntry(f"not a regular file ({e.strerror})") from None
        raise


def verify_stream(
    path: str, key: bytes, kind: Kind, digest: str, expect: Expect | None = None
) -> PayloadHeader:
    """Verify a payload file without a caller buffer (reads it in 8 MiB pieces)."""
    fd = open_entry(path)
    try:
        h = check_header(fd, key, kind, digest, expect)
        hasher = new_hasher(h.algo)
        buf = memoryview(bytearray(min(_VERIFY_PIECE, max(h.nbytes, 1))))
        off = 0
        while off < h.nbytes:
            piece = buf[: min(len(buf), h.nbytes - off)]
            got = read_exact(fd, [piece], HEADER_BYTES + off)
            if got < len(piece):
                raise BadEntry(f"truncated while reading: {off + got} of {h.nbytes} bytes")
            hasher.update(piece)
            off += got
        if hasher.intdigest() != h.checksum:
            raise BadEntry("payload checksum mismatch")
        return h
    finally:
        os.close(fd)


def peek_header(path: str, *, prefetch: bool = False) -> tuple[PayloadHeader, int] | None:
    """(header, file size) of a payload file; None if it does not exist.

    Raises BadEntry when the file exists but its header does not verify. `prefetch`
    also asks the kernel to start reading the whole file in the background.
    """
    try:
        fd = open_entry(path)
    except FileNotFoundError:
        return None
    try:
        if prefetch:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        buf = bytearray(HEADER_BYTES)
        if read_exact(fd, [memoryview(buf)], 0) < HEADER_BYTES:
            raise BadEntry("truncated: shorter than its header")
        try:
            h = decode_header(buf)
        except FormatError as e:
            raise BadEntry(f"bad header: {e}") from None
        return h, os.fstat(fd).st_size
    finally:
        os.close(fd)
