"""SSDStore: the crash-safe on-disk checkpoint store (files: `layout`, `format`).

Durability: durable (see `publish` for the publish order; `restore` for verification).

Two processes open one store: the worker writes and reads payloads, the scheduler scans
at start-up and deletes on eviction. Nothing is cached across calls that the other
process could invalidate; every read re-verifies what it returns. The store enforces no
budget: the caller's policy does, with `scan()`, `usage_bytes()` and the sizes returned.

Thread-safe: the background writer thread and the engine thread share one instance.
"""

from __future__ import annotations

import logging
import os
import threading

import msgspec

from histate_vllm.store import gc
from histate_vllm.store.errors import StoreError, StoreUnavailable
from histate_vllm.store.fileio import classify, make_dir, write_atomic
from histate_vllm.store.format import MAX_IDENTITY_BYTES, FormatError, StoreIdentity, default_algo
from histate_vllm.store.layout import STATE_SUFFIX, Layout
from histate_vllm.store.publish import PublishMixin, payload_view
from histate_vllm.store.restore import RestoreMixin
from histate_vllm.store.scan import StoreIndex, read_small_file, scan
from histate_vllm.store.sysio import SYS
from histate_vllm.store.trust import DIR_MODE, open_root

__all__ = ["SSDStore", "payload_view"]

logger = logging.getLogger(__name__)


class SSDStore(PublishMixin, RestoreMixin):
    """The store of one identity under a root directory (see the module docstring)."""

    def __init__(
        self,
        root: str | os.PathLike,
        identity: StoreIdentity,
        *,
        budget_bytes: int,
        fsync: bool = True,
        direct_io: bool = True,
        orphan_grace_s: float = 600.0,
        quarantine_keep: int = 64,
    ) -> None:
        """Open (creating if needed) the store of `identity` under `root`.

        Raises `UnsafeStoreDir` if `root` is another user's or writable by others
        (see `trust`). Otherwise never raises on an unusable disk: a store that cannot create its directories
        works read-only (scans find what exists, writes raise `StoreUnavailable`).
        `fsync=False` keeps crash safety against process crashes but not power loss.
        `direct_io` writes payloads with O_DIRECT (falls back to buffered by itself
        where the file system refuses it); payloads in page-aligned memory (pinned
        host buffers, `aligned_buffer`) are then written without any copy, and reads
        into page-aligned buffers bypass the page cache the same way.
        """
        self.root = os.fspath(root)
        self.identity = identity
        self.budget_bytes = budget_bytes
        self.fsync = fsync
        self.direct_io = direct_io
        self._direct_reads = direct_io
        self.orphan_grace_s = orphan_grace_s
        self.quarantine_keep = quarantine_keep
        self.layout = Layout(self.root, identity.digest())
        self.algo = default_algo()
        self._digest = self.layout.digest
        self._known_dirs: set[str] = set()
        self._lock = threading.Lock()
        self._ahead = {}  # see write_state_ahead
        self._dir_gen: dict[str, int] = {}
        self._dir_synced: dict[str, int] = {}
        self._dir_sync_lock = threading.Lock()
        self._dir_syncer = None
        self._unavailable: str | None = None
        try:
            open_root(self.root)  # UnsafeStoreDir (not an OSError) goes to the caller
            make_dir(self.layout.dir, fsync=fsync)
            os.chmod(self.layout.dir, DIR_MODE)  # stores made before 0700 become private
            for d in self.layout.top_dirs:
                make_dir(d, fsync=fsync)
            self._write_identity_file()
        except OSError as e:
            self._fail(classify(e, "open store directory"))

    @classmethod
    def existing(
        cls, root: str | os.PathLike, identity: StoreIdentity, **kwargs
    ) -> SSDStore | None:
        """The store of `identity` if its directory exists under `root`, else None
        (nothing is created: e.g. another tensor-parallel rank's store, for cleanup)."""
        if not os.path.isdir(os.path.join(os.fspath(root), identity.digest())):
            return None
        return cls(root, identity, budget_bytes=0, **kwargs)

    # -- status -----------------------------------------------------------------

    @property
    def unavailable_reason(self) -> str | None:
        """Why the last write failed ("disk full", ...), None once writes succeed."""
        return self._unavailable

    def _fail(self, err: StoreError) -> StoreError:
        if isinstance(err, StoreUnavailable):
            with self._lock:
                first = self._unavailable != err.reason
                self._unavailable = err.reason
            if first:
                logger.warning(
                    "SSD store %s: %s. Published entries are untouched; the cache keeps "
                    "serving without new disk writes until they succeed again (%s).",
                    self.layout.dir,
                    err.reason,
                    err.detail,
                )
        return err

    def _ok(self) -> None:
        if self._unavailable is not None:
            with self._lock:
                was, self._unavailable = self._unavailable, None
            if was is not None:
                logger.warning("SSD store %s is writable again (was: %s)", self.layout.dir, was)

    def _write_identity_file(self) -> None:
        data = msgspec.json.encode(self.identity)
        try:
            existing = read_small_file(self.layout.identity_path, MAX_IDENTITY_BYTES)
            if existing == data:
                return
        except (FileNotFoundError, FormatError):
            pass  # replaced below (a rename replaces a link or FIFO, never follows it)
        write_atomic(self.layout.identity_path, [data], fsync=self.fsync)

    def _ensure_dir(self, path: str) -> None:
        if path not in self._known_dirs:
            make_dir(os.path.dirname(path), fsync=self.fsync)
            make_dir(path, fsync=self.fsync)
            self._known_dirs.add(path)

    # -- deletes, index, maintenance ---------------------------------------------

    def delete_checkpoint(self, key: bytes) -> int:
        """Unpublish (manifest first) and delete a checkpoint; return bytes freed.

        Chunks are not touched: the caller deletes those no other checkpoint uses.
        """
        with self._lock:
            self._ahead.pop(key, None)  # its file goes with the others below
        freed = self._unlink(self.layout.manifest_path(key), "delete checkpoint")
        sdir = self.layout.state_dir(key)
        prefix = key.hex() + "."
        try:
            names = [n for n in os.listdir(sdir) if n.startswith(prefix)]
        except FileNotFoundError:
            names = []
        for name in names:
            if name.endswith(STATE_SUFFIX):
                freed += self._unlink(os.path.join(sdir, name), "delete checkpoint")
        return freed

    def delete_chunk(self, key: bytes) -> int:
        """Delete a chunk file; return bytes freed (0 if absent).

        A checkpoint still referencing it stops being listed by `scan()`.
        """
        return self._unlink(self.layout.chunk_path(key), "delete chunk")

    def _unlink(self, path: str, what: str) -> int:
        try:
            size = os.stat(path).st_size
            SYS.unlink(path)
        except FileNotFoundError:
            return 0
        except OSError as e:
            raise self._fail(classify(e, what)) from e
        return size

    def has_checkpoint(self, key: bytes) -> bool:
        return key in self._ahead or os.path.exists(self.layout.manifest_path(key))

    def has_chunk(self, key: bytes) -> bool:
        return os.path.exists(self.layout.chunk_path(key))

    def scan(self) -> StoreIndex:
        """Index of published checkpoints from manifests and sizes (no payload reads)."""
        return scan(self.layout, self.identity)

    def collect_garbage(self, *, grace_s: float | None = None) -> gc.GcReport:
        """Remove orphans, stale temporary files, unusable manifests (see `gc`)."""
        grace = self.orphan_grace_s if grace_s is None else grace_s
        return gc.collect_garbage(
            self.layout, self.identity, grace_s=grace, quarantine_keep=self.quarantine_keep
        )

    def start_background_gc(
        self, *, delay_s: float = 0.0, grace_s: float | None = None
    ) -> threading.Thread:
        """Run one `collect_garbage` pass on a daemon thread (after start-up)."""
        return gc.start_background(
            lambda: self.collect_garbage(grace_s=grace_s),
            delay_s=delay_s,
            name="histate-store-gc",
        )

    def usage_bytes(self) -> int:
        """Bytes of every file of this store on disk (walks the directories)."""
        return gc.usage_bytes(self.layout)

    def over_budget(self, usage: int | None = None) -> int:
        """Bytes above `budget_bytes` (0 when within): what the caller should evict."""
        used = self.usage_bytes() if usage is None else usage
        return max(0, used - self.budget_bytes)
