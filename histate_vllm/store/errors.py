"""Errors raised by the SSD store.

Every error is a `StoreError`, so a caller that must keep serving catches one type and
treats the entry as a miss. The subclasses say what the caller can do next:

- `MissingEntry`: the entry is not in the store (never written, evicted, lost).
- `CorruptEntry`: the entry failed verification. It has been quarantined already, and
  `quarantined` lists the checkpoint keys that became unusable with it (a corrupt chunk
  takes every checkpoint that references it along). Fall back to an earlier checkpoint
  or a cold prefill.
- `ChunkConflict`: a chunk key already holds bytes of another computation. Chunks are
  written once and shared by provenance: a checkpoint computed over the new bytes must
  not be published against this key.
- `StoreUnavailable`: the disk is full, read-only or failing. Nothing already published
  was touched; the cache degrades and the engine keeps serving.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises."""


class MissingEntry(StoreError):
    def __init__(self, key: bytes, kind: str, detail: str = "") -> None:
        self.key = key
        self.kind = kind
        msg = f"{kind} {key.hex()[:16]}… is not in the store"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class CorruptEntry(StoreError):
    def __init__(
        self, key: bytes, kind: str, reason: str, quarantined: tuple[bytes, ...] = ()
    ) -> None:
        self.key = key
        self.kind = kind
        self.reason = reason
        # Checkpoint keys made unusable by this entry (including `key` for a checkpoint).
        self.quarantined = quarantined
        super().__init__(
            f"corrupt {kind} {key.hex()[:16]}…: {reason}"
            f" ({len(quarantined)} checkpoint(s) quarantined)"
        )


class ChunkConflict(StoreError):
    def __init__(self, key: bytes, detail: str) -> None:
        self.key = key
        super().__init__(f"chunk {key.hex()[:16]}… already holds other bytes: {detail}")


class StoreUnavailable(StoreError):
    def __init__(self, reason: str, errno: int | None = None, detail: str = "") -> None:
        # Short, stable reason: "disk full", "read-only file system", "I/O error", ...
        self.reason = reason
        self.errno = errno
        self.detail = detail
        msg = f"SSD store unavailable: {reason}"
        super().__init__(f"{msg} ({detail})" if detail else msg)


class StoreUnusable(StoreError):
    """The store root cannot be used at all (missing and not creatable, not a
    directory, not trusted): the engine runs without an SSD tier."""

    def __init__(self, root: str, reason: str) -> None:
        self.root = root
        self.reason = reason
        super().__init__(f"SSD store {root}: {reason}")
