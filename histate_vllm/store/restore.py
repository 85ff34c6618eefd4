"""The read half of SSDStore: verified restores, prefetch, quarantine on failure.

Nothing is returned before it verifies: the manifest's checksum and identity, each
referenced chunk's recorded checksum (headers), then the payload's size and checksum.
A failure quarantines what it makes unusable and raises CorruptEntry.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, Future, wait
from typing import NamedTuple

from histate_vllm.store import quarantine
from histate_vllm.store.errors import CorruptEntry, MissingEntry
from histate_vllm.store.fileio import classify, remove_quietly
from histate_vllm.store.format import (
    HEADER_BYTES,
    FormatError,
    Kind,
    Manifest,
    StoreIdentity,
    decode_manifest,
)
from histate_vllm.store.layout import Layout
from histate_vllm.store.directio import DirectIOUnsupported, is_aligned
from histate_vllm.store.reader import (
    BadEntry,
    Expect,
    open_entry,
    out_view,
    peek_header,
    read_into,
)
from histate_vllm.store.scan import read_small_file
from histate_vllm.store.threads import executor


class Read(NamedTuple):
    """One entry for `read_many`: a chunk, or a checkpoint's state, into `out`."""

    key: bytes
    is_state: bool
    out: object


class RestoreMixin:
    """read_chunk(s), read_many, read_checkpoint, prefetch. SSDStore supplies the attributes
    annotated here and `_fail`."""

    layout: Layout
    identity: StoreIdentity
    quarantine_keep: int
    _digest: str
    _lock: threading.Lock
    _ahead: dict[bytes, tuple[str, Expect]]
    _direct_reads: bool = True  # O_DIRECT restores until the file system refuses one

    def read_chunk(self, key: bytes, out) -> int:
        """Fill `out` with the chunk's payload, verified; return its size in bytes."""
        try:
            return self._read_payload(self.layout.chunk_path(key), key, Kind.CHUNK, out, None)
        except FileNotFoundError:
            raise MissingEntry(key, "chunk") from None
        except BadEntry as e:
            raise self._corrupt_chunk(key, str(e)) from None
        except OSError as e:
            raise self._fail(classify(e, "read chunk")) from e

    def _read_payload(self, path: str, key: bytes, kind: Kind, out, expect) -> int:
        """`read_into` of the file at `path`, with O_DIRECT when `out` is page-aligned
        (a pinned staging row, `aligned_buffer`) and the file system allows it."""
        try:
            direct = self._direct_reads and is_aligned(out_view(out))
        except ValueError:
            direct = False  # read_into says what is wrong with `out`, after the open
        flags = os.O_RDONLY
        try:
            fd = open_entry(path, flags | (os.O_DIRECT if direct else 0))
        except OSError as e:
            if not direct or e.errno != errno.EINVAL:
                raise
            self._direct_reads, direct = False, False
            fd = open_entry(path, flags)
        try:
            return read_into(fd, key, kind, self._digest, out, expect, direct=direct)
        except DirectIOUnsupported:
            self._direct_reads = False
        finally:
            os.close(fd)
        return self._read_payload(path, key, kind, out, expect)  # buffered, once

    def read_chunks(self, keys: Sequence[bytes], outs: Sequence, *, ahead: int = 4) -> list[int]:
        """`read_chunk` for each (key, out), `ahead` files read in parallel (see
        `read_many`; the outputs must be distinct). Raises the first failure in order."""
        if len(keys) != len(outs):
            raise ValueError(f"{len(keys)} keys but {len(outs)} output buffers")
        reads = [Read(k, False, o) for k, o in zip(keys, outs)]
        return [n for _, n in self.read_many(reads, ahead=ahead)]

    def read_many(
        self, reads: Sequence[Read], *, ahead: int = 4, executor: Executor | None = None
    ) -> Iterator[tuple[int, int]]:
        """Read entries in parallel, `ahead` at a time; yield (index, size) in order.

        One sequential stream per file leaves the disk idle between files (the Python
        work, the checksum, the next open); `ahead` reads in flight keep its queue full,
        which is what fills an NVMe drive. This project's virtual disk restores as fast
        with 1 in flight as with 4 (benchmarks/results_store.md).

        Read i + ahead starts only when the caller asks for the item after i, so a
        caller may reuse read i's buffer for read i + ahead (a ring of `ahead` buffers).
        States are read with `verify_chunks=False`: the caller reads (and so verifies)
        the chunks too. The first failure in order is raised; reads still in flight are
        waited for before it propagates, so no buffer is written after this returns.
        """
        pool = executor or self._read_pool(ahead)
        futs: deque[Future] = deque()
        nxt = 0

        def submit() -> None:
            nonlocal nxt
            r = reads[nxt]
            fn = self._read_state if r.is_state else self.read_chunk
            futs.append(pool.submit(fn, r.key, r.out))
            nxt += 1

        try:
            while nxt < min(ahead, len(reads)):
                submit()
            for i in range(len(reads)):
                n = futs.popleft().result()
                yield i, n
                if nxt < len(reads):
                    submit()
        finally:
            for f in futs:
                f.cancel()
            wait(futs)

    def _read_state(self, key: bytes, out) -> int:
        return self.read_checkpoint(key, out, verify_chunks=False)

    def _read_pool(self, workers: int) -> Executor:
        with self._lock:
            pool = getattr(self, "_pool", None)
            if pool is None or self._pool_workers < workers:
                pool = self._pool = executor(workers, "histate-ssd-read", writes=False)
                self._pool_workers = workers
            return pool

    def read_checkpoint(
        self, key: bytes, out, *, verify_chunks: bool = True, prefetch_chunks: bool = False
    ) -> int:
        """Fill `out` with the checkpoint's state, verified; return its size in bytes.

        With `verify_chunks`, also checks (headers only) that every chunk the manifest
        names is present with the recorded checksum; the chunk payloads are verified
        by `read_chunk`. On any failure the checkpoint is quarantined.
        `prefetch_chunks` (with `verify_chunks`) starts reading those chunk files in
        the background, for a restore that reads them next (see `prefetch`).
        """
        ahead = self._ahead.get(key)
        if ahead is not None:
            return self._read_ahead(key, ahead, out)
        for attempt in range(2):
            m = self.load_manifest(key)
            if verify_chunks:
                self._verify_refs(key, m, prefetch_chunks)
            path = self.layout.state_path(key, m.state_file)
            expect = Expect(m.state_nbytes, m.state_checksum, m.state_algo)
            try:
                return self._read_payload(path, key, Kind.STATE, out, expect)
            except FileNotFoundError:
                if attempt == 0:
                    continue  # replaced or deleted while we looked: look again
                raise self._corrupt_checkpoint(key, "state file missing", False) from None
            except BadEntry as e:
                raise self._corrupt_checkpoint(key, str(e), True) from None
            except OSError as e:
                raise self._fail(classify(e, "read checkpoint")) from e
        raise AssertionError("unreachable")

    def _read_ahead(self, key: bytes, ahead: tuple[str, Expect], out) -> int:
        """A state written ahead of its chunks (`write_state_ahead`), verified against the
        size and checksum written; a bad or missing one is forgotten and its file removed."""
        state_file, expect = ahead
        path = self.layout.state_path(key, state_file)
        try:
            return self._read_payload(path, key, Kind.STATE, out, expect)
        except (FileNotFoundError, BadEntry) as e:
            reason = "state file missing" if isinstance(e, FileNotFoundError) else str(e)
        except OSError as e:
            raise self._fail(classify(e, "read checkpoint")) from e
        with self._lock:
            if self._ahead.get(key) is ahead:
                del self._ahead[key]
        remove_quietly(path)
        raise CorruptEntry(key, "checkpoint", f"written ahead: {reason}", (key,))

    def load_manifest(self, key: bytes) -> Manifest:
        """The verified manifest of a checkpoint (quarantined if it does not verify)."""
        try:
            data = read_small_file(self.layout.manifest_path(key))
        except FileNotFoundError:
            raise MissingEntry(key, "checkpoint") from None
        except OSError as e:
            raise self._fail(classify(e, "read manifest")) from e
        try:
            m = decode_manifest(data)
        except FormatError as e:
            raise self._corrupt_checkpoint(key, f"garbage manifest: {e}", True) from None
        if m.key != key or m.identity != self.identity:
            raise self._corrupt_checkpoint(key, "manifest of another key or identity", True)
        return m

    def _manifest_or_none(self, key: bytes) -> Manifest | None:
        try:
            m = decode_manifest(read_small_file(self.layout.manifest_path(key)))
        except (OSError, FormatError):
            return None
        return m if m.key == key else None

    def prefetch(self, chunk_keys: Sequence[bytes]) -> None:
        """Start reading these chunk files in the background (posix_fadvise WILLNEED).

        Reading many files one after another leaves the disk idle between them. On
        this project's VM (9 MiB chunks, cold cache) reading with the next 4 files
        hinted took restores from ~540 to ~760 MiB/s; hinting all 86 files of a 32k
        context at once was slower than none (the queue floods). Missing files are
        ignored. `read_many` (parallel reads) does better than hints; this is for a
        caller that reads one file at a time.
        """
        for ck in chunk_keys:
            try:
                fd = open_entry(self.layout.chunk_path(ck))
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)

    def _verify_refs(self, key: bytes, m: Manifest, prefetch: bool = False) -> None:
        for ref in m.chunk_refs():
            try:
                found = peek_header(self.layout.chunk_path(ref.key), prefetch=prefetch)
            except BadEntry as e:
                raise self._corrupt_chunk(ref.key, str(e)) from None
            except OSError as e:
                raise self._fail(classify(e, "read chunk header")) from e
            if found is None:
                why = f"chunk {ref.key.hex()[:16]}… missing"
                raise self._corrupt_checkpoint(key, why, False)
            h, size = found
            if h.kind != Kind.CHUNK or h.key != ref.key or h.identity_digest != self._digest:
                raise self._corrupt_chunk(ref.key, "header names another entry")
            if (h.nbytes, h.checksum, h.algo) != (ref.nbytes, ref.checksum, ref.algo):
                why = f"chunk {ref.key.hex()[:16]}… holds other bytes than it was computed with"
                raise self._corrupt_checkpoint(key, why, False)
            if size != HEADER_BYTES + h.nbytes:
                why = f"{size} bytes on disk, expected {HEADER_BYTES + h.nbytes}"
                raise self._corrupt_chunk(ref.key, why)

    def _corrupt_chunk(self, key: bytes, reason: str) -> CorruptEntry:
        deps = quarantine.quarantine_chunk(self.layout, key, reason, keep=self.quarantine_keep)
        return CorruptEntry(key, "chunk", reason, deps)

    def _corrupt_checkpoint(self, key: bytes, reason: str, state_is_bad: bool) -> CorruptEntry:
        quarantine.quarantine_checkpoint(
            self.layout, key, reason, state_is_bad=state_is_bad, keep=self.quarantine_keep
        )
        return CorruptEntry(key, "checkpoint", reason, (key,))

    def quarantine_checkpoint(self, key: bytes, reason: str) -> None:
        """Take a checkpoint out of the store, e.g. after the caller saw it fail."""
        self._corrupt_checkpoint(key, reason, False)
