"""The write half of SSDStore: chunks written once, checkpoints published atomically.

Durability: durable. `publish_checkpoint` writes and fsyncs the state file, fsyncs the
directories of the state and of every chunk it references (those this process has not
synced since a file was last renamed into them), then writes the manifest to
a temporary name, fsyncs it, renames it into place and fsyncs its directory: a crash at
any point leaves the whole checkpoint or none (leftovers go in the garbage pass).
`write_state_ahead` is the exception, by design: a state written before the chunks its
manifest would name, read back only by the process that wrote it (an orphan afterwards).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from histate_vllm.store import quarantine
from histate_vllm.store.directio import DirectIOUnsupported
from histate_vllm.store.errors import ChunkConflict, MissingEntry
from histate_vllm.store.fileio import (
    classify,
    fsync_dir,
    remove_quietly,
    write_atomic,
    write_payload_atomic,
)
from histate_vllm.store.format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    ChecksumAlgo,
    ChunkRef,
    Kind,
    Manifest,
    PayloadHeader,
    StoreIdentity,
    bounded_provenance,
    checksum,
    encode_header,
    encode_manifest,
)
from histate_vllm.store.layout import Layout, new_state_file
from histate_vllm.store.reader import BadEntry, Expect, peek_header
from histate_vllm.store.threads import executor

logger = logging.getLogger(__name__)


def payload_view(payload) -> memoryview:
    """A flat byte view of any C-contiguous buffer (numpy array, bytes, ...); no copy."""
    mv = memoryview(payload)
    if not mv.c_contiguous:
        raise ValueError("payload must be C-contiguous")
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or not key:
        raise TypeError(f"key must be non-empty bytes, got {type(key).__name__}")


class PublishMixin:
    """write_chunk and publish_checkpoint. SSDStore supplies the attributes annotated
    here and `_fail`, `_ok`, `_ensure_dir`; RestoreMixin `_corrupt_chunk` and
    `_manifest_or_none`."""

    layout: Layout
    identity: StoreIdentity
    algo: ChecksumAlgo
    fsync: bool
    direct_io: bool
    quarantine_keep: int
    _digest: str
    _lock: threading.Lock
    # States written ahead of their chunks: key -> (state file, what was written).
    _ahead: dict[bytes, tuple[str, Expect]]
    # Directory -> renames into it by this process; and the count its last fsync covered.
    _dir_gen: dict[str, int]
    _dir_synced: dict[str, int]
    _dir_sync_lock: threading.Lock
    _dir_syncer: ThreadPoolExecutor | None

    def write_chunk(
        self,
        key: bytes,
        payload,
        *,
        provenance: str,
        sync_dir: bool = False,
        on_conflict: str = "raise",
    ) -> int:
        """Write a KV chunk once; return its size on disk.

        Idempotent: if the key is present with the same bytes, nothing is written.
        If it holds other bytes (another computation's, e.g. a leftover from before a
        restart recomputed with slightly different bits): `on_conflict="raise"` raises
        ChunkConflict; `"replace"` quarantines the old chunk together with every
        checkpoint that references it (they were computed over the old bytes, so they
        must not meet the new ones), then writes the new bytes. A replace costs one
        read of every manifest; conflicts are rare (only chunks the caller's index did
        not know about), and it never leaves later checkpoints of this chunk blocked.

        Crash-safe: the file is written under a temporary name, fsynced and renamed,
        so its final name never holds partial bytes. Its directory entry is made
        durable by the publish of the first checkpoint that references it (which
        fsyncs the directories of all its chunks), not here: a chunk no manifest
        names is worth nothing after a crash, and one directory fsync per chunk
        cut write throughput by a third on this project's disk. `sync_dir=True`
        fsyncs the directory now.
        """
        check_key(key)
        provenance = bounded_provenance(provenance)
        mv = payload_view(payload)
        path = self.layout.chunk_path(key)
        try:
            found = peek_header(path)
        except BadEntry:
            found = None  # an invalid file is replaced below
        except OSError as e:
            raise self._fail(classify(e, "write chunk")) from e
        if found is not None:
            h, size = found
            if (
                h.kind == Kind.CHUNK
                and h.key == key
                and h.identity_digest == self._digest
                and size == HEADER_BYTES + h.nbytes
            ):
                if h.nbytes == len(mv) and checksum(h.algo, mv) == h.checksum:
                    return size
                detail = (
                    f"on disk {h.nbytes} bytes from {h.provenance!r}, "
                    f"new {len(mv)} bytes from {provenance!r}"
                )
                if on_conflict != "replace":
                    raise ChunkConflict(key, detail)
                quarantine.quarantine_chunk(
                    self.layout, key, f"replaced by a recomputation ({detail})",
                    keep=self.quarantine_keep,
                )
        header = encode_header(
            PayloadHeader(
                Kind.CHUNK,
                self.algo,
                len(mv),
                checksum(self.algo, mv),
                self._digest,
                key,
                provenance,
            )
        )
        try:
            self._ensure_dir(os.path.dirname(path))
            size = self._write_payload(path, header, mv, sync_dir)
        except OSError as e:
            raise self._fail(classify(e, "write chunk")) from e
        if not sync_dir:
            self._renamed_into(os.path.dirname(path))
        self._ok()
        return size

    def _write_payload(self, path: str, header: bytes, mv: memoryview, sync_dir: bool,
                       fsync: bool | None = None) -> int:
        kw = {"fsync": self.fsync if fsync is None else fsync, "sync_dir": sync_dir}
        if self.direct_io:
            try:
                return write_payload_atomic(path, header, mv, direct=True, **kw)
            except DirectIOUnsupported as e:
                self.direct_io = False
                logger.info(
                    "SSD store %s: no O_DIRECT here (%s); writing buffered", self.layout.dir, e
                )
        return write_payload_atomic(path, header, mv, direct=False, **kw)

    def _renamed_into(self, directory: str) -> None:
        """A file was renamed into `directory`: its entry is durable only after a new fsync."""
        with self._lock:
            self._dir_gen[directory] = self._dir_gen.get(directory, 0) + 1

    def _sync_dirs(self, dirs: set[str]) -> None:
        """fsync each of `dirs` that this process has not synced since its last rename
        into it (never synced counts as not synced: a previous run may have left entries).

        At once, on a few threads: ext4 commits concurrent fsyncs in one journal
        transaction, where one after another each waits for its own commit. A checkpoint
        over a 32k context names up to 86 chunk directories (of 256); each was fsynced
        serially at every publish before."""
        with self._dir_sync_lock:
            with self._lock:
                todo = {d: self._dir_gen.get(d, 0) for d in dirs
                        if self._dir_synced.get(d) != self._dir_gen.get(d, 0)}
            if not todo:
                return
            if len(todo) == 1:
                fsync_dir(next(iter(todo)))
            else:
                list(self._dir_pool().map(fsync_dir, sorted(todo)))  # raises the first error
            with self._lock:
                # The generation seen before the fsync: a rename since then syncs again.
                self._dir_synced.update(todo)

    def _dir_pool(self) -> ThreadPoolExecutor:
        """Threads for a publish's many small waits: chunk header reads, directory fsyncs."""
        with self._lock:
            if self._dir_syncer is None:
                self._dir_syncer = executor(8, "histate-publish", writes=True)
            return self._dir_syncer

    def chunk_ref(self, ck: bytes) -> ChunkRef:
        """The chunk's size and checksum from its header (MissingEntry when absent; a bad
        header is quarantined and raised as CorruptEntry)."""
        return self._chunk_ref(ck, ck)

    def _chunk_ref(self, ck: bytes, owner: bytes) -> ChunkRef:
        path = self.layout.chunk_path(ck)
        try:
            found = peek_header(path)
        except BadEntry as e:
            raise self._corrupt_chunk(ck, str(e)) from None
        except OSError as e:
            raise self._fail(classify(e, "read chunk header")) from e
        if found is None:
            raise MissingEntry(
                ck, "chunk", f"checkpoint {owner.hex()[:16]}… references it; write it first"
            )
        h, size = found
        if h.kind != Kind.CHUNK or h.key != ck or h.identity_digest != self._digest:
            raise self._corrupt_chunk(ck, "header names another entry")
        if size != HEADER_BYTES + h.nbytes:
            expected = HEADER_BYTES + h.nbytes
            raise self._corrupt_chunk(ck, f"{size} bytes on disk, expected {expected}")
        return ChunkRef(ck, h.nbytes, h.checksum, int(h.algo))

    def write_state_ahead(self, key: bytes, payload, *, provenance: str) -> int:
        """Write a checkpoint's state ahead of the KV chunks before it (they are held in
        DRAM, not on SSD yet): no manifest, so nothing after a restart can trust it. This
        process reads it back (`read_checkpoint`, verified against what it wrote here),
        restored together with KV read from elsewhere; the next start removes the file as
        an orphan. Not fsynced, for the same reason. Returns the bytes on disk."""
        check_key(key)
        provenance = bounded_provenance(provenance)
        mv = payload_view(payload)
        csum = checksum(self.algo, mv)
        state_file = new_state_file(key)
        path = self.layout.state_path(key, state_file)
        header = encode_header(
            PayloadHeader(Kind.STATE, self.algo, len(mv), csum, self._digest, key, provenance)
        )
        try:
            self._ensure_dir(os.path.dirname(path))
            size = self._write_payload(path, header, mv, sync_dir=False, fsync=False)
        except OSError as e:
            raise self._fail(classify(e, "write state ahead")) from e
        with self._lock:
            old = self._ahead.get(key)
            self._ahead[key] = (state_file, Expect(len(mv), csum, int(self.algo)))
        if old is not None and old[0] != state_file:
            remove_quietly(self.layout.state_path(key, old[0]))
        self._ok()
        return size

    def publish_checkpoint(
        self,
        key: bytes,
        payload,
        *,
        position: int,
        chunk_keys: Sequence[bytes],
        provenance: str,
    ) -> int:
        """Publish a checkpoint: its state payload and a manifest naming its chunks.

        Every chunk in `chunk_keys` must already be in the store (MissingEntry
        otherwise). Replaces an older checkpoint of the same key; a no-op if the same
        one is already published. Returns the bytes on disk the checkpoint owns.
        """
        check_key(key)
        provenance = bounded_provenance(provenance)
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        mv = payload_view(payload)
        if len(chunk_keys) > 8:  # cold header reads: many at once keep the disk busy
            refs = tuple(self._dir_pool().map(lambda ck: self._chunk_ref(ck, key), chunk_keys))
        else:
            refs = tuple(self._chunk_ref(ck, key) for ck in chunk_keys)
        csum = checksum(self.algo, mv)
        old = self._manifest_or_none(key)
        layout = self.layout
        if (
            old is not None
            and old.state_checksum == csum
            and old.state_nbytes == len(mv)
            and old.position == position
            and old.chunk_refs() == list(refs)
            and old.identity == self.identity
        ):
            try:
                return HEADER_BYTES + len(mv) + os.stat(layout.manifest_path(key)).st_size
            except FileNotFoundError:
                pass  # deleted meanwhile: publish again
        state_file = new_state_file(key)
        state_path = layout.state_path(key, state_file)
        manifest_path = layout.manifest_path(key)
        header = encode_header(
            PayloadHeader(Kind.STATE, self.algo, len(mv), csum, self._digest, key, provenance)
        )
        manifest = Manifest(
            version=FORMAT_VERSION,
            identity=self.identity,
            key=key,
            position=position,
            provenance=provenance,
            state_file=state_file,
            state_nbytes=len(mv),
            state_checksum=csum,
            state_algo=int(self.algo),
            chunk_keys=tuple(r.key for r in refs),
            chunk_nbytes=tuple(r.nbytes for r in refs),
            chunk_checksums=tuple(r.checksum for r in refs),
            chunk_algos=tuple(r.algo for r in refs),
            created_ns=time.time_ns(),
        )
        try:
            self._ensure_dir(os.path.dirname(state_path))
            self._ensure_dir(os.path.dirname(manifest_path))
            size = self._write_payload(state_path, header, mv, sync_dir=False)
            self._renamed_into(os.path.dirname(state_path))
            renamed = False
            try:
                if self.fsync:  # the state's and every chunk's directory entry
                    dirs = {os.path.dirname(layout.chunk_path(r.key)) for r in refs}
                    dirs.add(os.path.dirname(state_path))
                    self._sync_dirs(dirs)
                size += write_atomic(
                    manifest_path,
                    [encode_manifest(manifest)],
                    fsync=self.fsync,
                    sync_dir=False,
                )
                renamed = True
                if self.fsync:
                    fsync_dir(os.path.dirname(manifest_path))
            except BaseException:
                if not renamed:
                    remove_quietly(state_path)
                raise
        except OSError as e:
            raise self._fail(classify(e, "publish checkpoint")) from e
        if old is not None and old.state_file != state_file:
            remove_quietly(layout.state_path(key, old.state_file))
        with self._lock:
            ahead = self._ahead.pop(key, None)
        if ahead is not None:  # published now: the copy written ahead is not read again
            remove_quietly(layout.state_path(key, ahead[0]))
        self._ok()
        return size
