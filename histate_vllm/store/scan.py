"""Start-up scan: build the index of published checkpoints from manifests and sizes.

Reads every manifest (small) and the directory listings with file sizes; never reads a
payload, so the time grows with the number of entries, not their size. A checkpoint is
listed only if its manifest verifies, names this store's identity, and its state file
and every chunk it references are present with the recorded sizes. Everything else is
skipped with a reason; files that no listed checkpoint names are returned as orphans
for the background garbage pass.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from histate_vllm.store.format import (
    HEADER_BYTES,
    MAX_IDENTITY_BYTES,
    MAX_MANIFEST_BYTES,
    FormatError,
    Manifest,
    ManifestHead,
    StoreIdentity,
    decode_manifest,
)
from histate_vllm.store.layout import (
    CHUNK_SUFFIX,
    IDENTITY_FILE,
    MANIFEST_SUFFIX,
    STATE_SUFFIX,
    Layout,
    tmp_owner_pid,
)

logger = logging.getLogger(__name__)

# Individual skip warnings per scan before the rest is summarised in one line.
_MAX_SKIP_WARNINGS = 20
_READ_PIECE = 1 << 16


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    position: int
    # Bytes on disk this checkpoint owns (state file + manifest), freed by deleting it.
    nbytes: int
    chunk_keys: tuple[bytes, ...]
    provenance: str
    # Publish time, seconds since the epoch (recorded in the manifest).
    mtime: float
    # Payload size of the state: the buffer size `read_checkpoint` needs.
    state_nbytes: int


@dataclass(slots=True)
class OrphanFile:
    path: str
    nbytes: int
    mtime: float
    ino: int
    reason: str
    # Owner of a temporary file, from its name; None for other files.
    tmp_pid: int | None = None
    # Unusable whatever its age (garbage, another identity): no grace period applies.
    # A manifest whose files are missing gets the grace period, since a publish that
    # raced the scan looks the same.
    urgent: bool = False


@dataclass(slots=True)
class StoreIndex:
    # Published, complete checkpoints.
    checkpoints: dict[bytes, CheckpointInfo] = field(default_factory=dict)
    # Chunks referenced by at least one listed checkpoint: key -> bytes on disk.
    chunks: dict[bytes, int] = field(default_factory=dict)
    # (path, reason) of every manifest that was not listed.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # Files no listed checkpoint names (unusable manifests included).
    orphans: list[OrphanFile] = field(default_factory=list)
    scan_seconds: float = 0.0

    @property
    def total_bytes(self) -> int:
        """Bytes on disk of the listed checkpoints and the chunks they reference."""
        return sum(c.nbytes for c in self.checkpoints.values()) + sum(self.chunks.values())

    @property
    def orphan_bytes(self) -> int:
        return sum(o.nbytes for o in self.orphans)

    def chunk_refcounts(self) -> dict[bytes, int]:
        counts = dict.fromkeys(self.chunks, 0)
        for info in self.checkpoints.values():
            for k in info.chunk_keys:
                counts[k] = counts.get(k, 0) + 1
        return counts

    def referencing(self, chunk_key: bytes) -> list[bytes]:
        return [k for k, c in self.checkpoints.items() if chunk_key in c.chunk_keys]


def walk_files(top: str) -> Iterator[os.DirEntry]:
    """Files in the fan-out subdirectories of `top` (and stray files in `top`)."""
    try:
        subdirs = list(os.scandir(top))
    except FileNotFoundError:
        return
    for sub in subdirs:
        if not sub.is_dir(follow_symlinks=False):
            yield sub
            continue
        try:
            yield from os.scandir(sub.path)
        except FileNotFoundError:
            continue


# What opening or reading something that is not a regular file gives (with O_NOFOLLOW and
# O_NONBLOCK): a symlink, a socket, a FIFO with a writer, a directory.
_NOT_A_FILE = {errno.ELOOP, errno.ENXIO, errno.EAGAIN, errno.EISDIR}


def read_small_file(path: str, limit: int = MAX_MANIFEST_BYTES) -> bytes:
    """The whole file; three system calls for a file under 64 KiB (no stat).

    Never through a symlink (the store makes none), never blocking on a FIFO, never more
    than `limit` bytes: FormatError for any of these, so callers skip it with a reason.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in _NOT_A_FILE:
            raise FormatError(f"not a regular file ({e.strerror})") from None
        raise
    try:
        parts = [os.read(fd, _READ_PIECE)]
        total = len(parts[0])
        while len(parts[-1]) == _READ_PIECE:
            if total > limit:
                raise FormatError(f"larger than {limit} bytes, more than its format allows")
            parts.append(os.read(fd, _READ_PIECE))
            total += len(parts[-1])
        if total > limit:
            raise FormatError(f"larger than {limit} bytes, more than its format allows")
        return b"".join(parts)
    except OSError as e:
        if e.errno in _NOT_A_FILE:
            raise FormatError(f"not a regular file ({e.strerror})") from None
        raise
    finally:
        os.close(fd)


def read_identity(ident_dir: str) -> StoreIdentity | None:
    """The identity.json of a store directory, None if missing or not one the store
    wrote (unreadable, too large, not a regular file, not an identity)."""
    try:
        data = read_small_file(os.path.join(ident_dir, IDENTITY_FILE), MAX_IDENTITY_BYTES)
        return msgspec.json.decode(data, type=StoreIdentity)
    except (OSError, FormatError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def _orphan(entry: os.DirEntry, reason: str) -> OrphanFile | None:
    try:
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
    return OrphanFile(
        entry.path, st.st_size, st.st_mtime, st.st_ino, reason, tmp_owner_pid(entry.name)
    )


class _Scanner:
    def __init__(
        self, layout: Layout, identity: StoreIdentity, log: bool, keep_manifests: bool
    ) -> None:
        self.layout = layout
        self.identity = identity
        self.log = log
        self.index = StoreIndex()
        # Full manifests of the listed checkpoints, when the caller wants them (fsck).
        self.manifests: dict[bytes, Manifest] | None = {} if keep_manifests else None

    def _stray(self, entry: os.DirEntry, reason: str = "") -> None:
        pid = tmp_owner_pid(entry.name)
        o = _orphan(entry, reason or ("temporary file" if pid is not None else "unknown file"))
        if o is not None:
            self.index.orphans.append(o)

    def _skip(self, entry: os.DirEntry, reason: str, *, urgent: bool) -> None:
        idx = self.index
        idx.skipped.append((entry.path, reason))
        if self.log and len(idx.skipped) <= _MAX_SKIP_WARNINGS:
            logger.warning("store scan: skipping %s: %s", entry.path, reason)
        o = _orphan(entry, f"unusable manifest: {reason}")
        if o is not None:
            o.urgent = urgent
            idx.orphans.append(o)

    def _list(self, top: str, suffix: str) -> dict[str, os.DirEntry]:
        """Entries of the fan-out directories under `top` named `*suffix`, by name.

        Anything else (temporary files, strays) goes to the orphans. Names are not
        parsed here: a name no manifest can match simply stays unreferenced.
        """
        found: dict[str, os.DirEntry] = {}
        try:
            subdirs = list(os.scandir(top))
        except FileNotFoundError:
            return found
        for sub in subdirs:
            if not sub.is_dir(follow_symlinks=False):
                self._stray(sub)
                continue
            try:
                with os.scandir(sub.path) as it:
                    for entry in it:
                        name = entry.name
                        # d_type, no system call: a symlink, FIFO or device under a
                        # store name is not the store's, and is never opened.
                        if not entry.is_file(follow_symlinks=False):
                            self._stray(entry, "not a regular file")
                        elif name[0] != "." and name.endswith(suffix):
                            found[name] = entry
                        else:
                            self._stray(entry)
            except FileNotFoundError:
                continue
        return found

    def _missing(self, m: ManifestHead, states, chunk_sizes) -> str | None:
        """None if the files `m` names are all present with the recorded sizes."""
        st = states.get(m.state_file)
        if st is None:
            return f"state file {m.state_file} missing"
        size = st.stat(follow_symlinks=False).st_size
        if size != HEADER_BYTES + m.state_nbytes:
            return f"state file is {size} bytes, expected {HEADER_BYTES + m.state_nbytes}"
        # C-level lookups for all chunks at once (no Python loop per chunk): every
        # chunk present, and the payload sizes add up. A loop only explains a failure.
        try:
            if sum(map(chunk_sizes.__getitem__, m.chunk_keys)) == sum(m.chunk_nbytes):
                return None
        except KeyError:
            pass
        for k, n in zip(m.chunk_keys, m.chunk_nbytes):
            if k not in chunk_sizes:
                return f"chunk {k.hex()[:16]}… missing"
            if chunk_sizes[k] != n:
                size = HEADER_BYTES + chunk_sizes[k]
                return f"chunk {k.hex()[:16]}… is {size} bytes, expected {HEADER_BYTES + n}"
        return "chunk sizes differ from the manifest"

    def run(self) -> StoreIndex:
        t0 = time.perf_counter()
        layout, idx = self.layout, self.index
        chunk_entries: dict[bytes, os.DirEntry] = {}
        # Payload size of every chunk file, and the (key, payload size) pairs.
        chunk_sizes: dict[bytes, int] = {}
        for name, entry in self._list(layout.chunks_dir, CHUNK_SUFFIX).items():
            try:
                k = bytes.fromhex(name[: -len(CHUNK_SUFFIX)])
                size = entry.stat(follow_symlinks=False).st_size
            except ValueError:
                self._stray(entry)
                continue
            except FileNotFoundError:
                continue
            chunk_entries[k] = entry
            chunk_sizes[k] = size - HEADER_BYTES
        states = self._list(layout.states_dir, STATE_SUFFIX)
        referenced: set[bytes] = set()
        used_states: set[str] = set()
        for name, entry in self._list(layout.manifests_dir, MANIFEST_SUFFIX).items():
            try:
                data = read_small_file(entry.path)
                m = decode_manifest(data, head_only=True)
            except FileNotFoundError:
                continue  # deleted while we scanned
            except FormatError as e:
                self._skip(entry, f"garbage manifest: {e}", urgent=True)
                continue
            if m.key.hex() + MANIFEST_SUFFIX != name:
                self._skip(entry, "manifest names another key", urgent=True)
                continue
            if m.identity != self.identity:
                ident = f"model={m.identity.model!r}, {m.identity.digest()}"
                self._skip(entry, f"other identity ({ident})", urgent=True)
                continue
            reason = self._missing(m, states, chunk_sizes)
            if reason is not None:
                self._skip(entry, reason, urgent=False)
                continue
            if self.manifests is not None:
                self.manifests[m.key] = decode_manifest(data)
            used_states.add(m.state_file)
            referenced.update(m.chunk_keys)
            idx.checkpoints[m.key] = CheckpointInfo(
                position=m.position,
                nbytes=HEADER_BYTES + m.state_nbytes + len(data),
                chunk_keys=m.chunk_keys,
                provenance=m.provenance,
                mtime=m.created_ns / 1e9,
                state_nbytes=m.state_nbytes,
            )
        idx.chunks = {k: chunk_sizes[k] + HEADER_BYTES for k in referenced}
        for k, entry in chunk_entries.items():
            if k not in referenced:
                o = _orphan(entry, "chunk no manifest names")
                if o is not None:
                    idx.orphans.append(o)
        for name, entry in states.items():
            if name not in used_states:
                o = _orphan(entry, "state file no manifest names")
                if o is not None:
                    idx.orphans.append(o)
        if self.log and len(idx.skipped) > _MAX_SKIP_WARNINGS:
            logger.warning(
                "store scan: skipped %d manifests in all (first %d listed above)",
                len(idx.skipped),
                _MAX_SKIP_WARNINGS,
            )
        idx.scan_seconds = time.perf_counter() - t0
        return idx


def scan(layout: Layout, identity: StoreIdentity, *, log: bool = True) -> StoreIndex:
    return _Scanner(layout, identity, log, keep_manifests=False).run()


def scan_with_manifests(
    layout: Layout, identity: StoreIdentity, *, log: bool = True
) -> tuple[StoreIndex, dict[bytes, Manifest]]:
    s = _Scanner(layout, identity, log, keep_manifests=True)
    index = s.run()
    assert s.manifests is not None
    return index, s.manifests
