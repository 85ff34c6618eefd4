"""Engine start-up over a store root: lock, reconcile the ranks' stores, collect orphans.

Runs once in the scheduler, before any write is ordered, holding the store's lock
(`lock`), so nothing else writes these directories meanwhile. It reads manifests and
directory listings only, never a payload:

- Each tensor-parallel rank keeps its own store (its shard of every page), but the
  scheduler keeps one index. A checkpoint counts only if every rank holds it with the
  same position and chunks; what one rank holds alone (a crash between ranks' writes)
  is deleted, so a restore never finds a rank without its shard and no rank leaks.
- Orphans (chunks and states no manifest names, temporary files, unusable manifests)
  are deleted: after a normal stop vLLM kills the engine mid-write, and the next start
  leaves a store that fsck calls clean. Under the lock no other engine can be about to
  name them; `grace_s` keeps younger ones anyway where the caller wants it.
- Directories of earlier reset generations of this identity (see `reset`) hold
  states computed with weights no longer loaded: removed whole.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import msgspec

from histate_vllm.store.errors import StoreUnusable
from histate_vllm.store.format import StoreIdentity
from histate_vllm.store.gc import _removable, _unlink_if_same
from histate_vllm.store.lock import DirLock
from histate_vllm.store.reset import (
    RESET_MARK,
    rank_identity,
    remove_reset_generations,
    wipe,
)
from histate_vllm.store.scan import StoreIndex, read_identity
from histate_vllm.store.store import SSDStore
from histate_vllm.store.trust import open_root

logger = logging.getLogger(__name__)

@dataclass
class StartupReport:
    checkpoints: int = 0
    # Checkpoints deleted because another rank lacked them.
    rank_mismatches: int = 0
    orphans_removed: int = 0
    orphans_kept_young: int = 0
    reset_dirs_removed: list[str] = field(default_factory=list)
    # Store directories under the root of another identity of the same model and rank,
    # with the fields that differ: their entries are never used by this engine.
    other_identities: list[tuple[str, list[str]]] = field(default_factory=list)


def open_for_engine(
    root: str, identity: StoreIdentity, *, budget_bytes: int, grace_s: float = 0.0,
    lock_wait_s: float = 0.0, **store_kwargs,
) -> tuple[SSDStore, DirLock, StoreIndex, StartupReport]:
    """Open rank 0's store as the scheduler: lock it, clean up, return its index.

    Raises `StoreLocked` (naming the holder) if another engine holds the directory
    for `lock_wait_s` seconds; `StoreUnusable` (saying why) if the root cannot be used:
    not creatable (`/dev/null/x`, a read-only file system), not a directory, or not
    this user's alone (`trust`). The caller then serves without an SSD tier.
    Ranks whose directory does not exist on this host (another node's local disk) are
    left alone; their restores fail verification and fall back to recomputation.
    """
    identity = rank_identity(identity, 0)
    try:
        open_root(root)
    except OSError as e:
        raise StoreUnusable(root, f"cannot create or open it: {e.strerror or e}") from e
    store = SSDStore(root, identity, budget_bytes=budget_bytes, **store_kwargs)
    try:
        lock = DirLock(store.layout.dir, wait_s=lock_wait_s)
    except OSError as e:  # e.g. a read-only file system: no lock, so no writes either
        raise StoreUnusable(root, f"cannot take its lock: {e.strerror or e}") from e
    report = StartupReport()
    try:
        report.reset_dirs_removed = remove_reset_generations(root, identity)
        stores = [store]
        for r in range(1, identity.tp_size):
            other = SSDStore.existing(root, rank_identity(identity, r), **store_kwargs)
            if other is not None:
                stores.append(other)
        if identity.weights.startswith("unpinned"):
            # Entries of an earlier run may come from other weights: never restore them.
            logger.warning("store start-up: weights %s; the SSD store serves this run only",
                           identity.weights)
            for s in stores:
                wipe(s)
        report.other_identities = other_identities(root, identity, store.layout.dir)
        index, indexes = reconcile(stores, report)
        for s, idx in zip(stores, indexes):
            _collect_orphans(s, idx, grace_s, report)
    except BaseException:
        lock.release()
        raise
    report.checkpoints = len(index.checkpoints)
    return store, lock, index, report


def other_identities(root: str, identity: StoreIdentity,
                     own_dir: str) -> list[tuple[str, list[str]]]:
    """Directories under `root` holding another identity of this model and rank, each with
    the identity fields that differ (what a log line tells an operator whose restores
    stopped: new weights, another dtype, another vLLM...)."""
    found = []
    try:
        dirs = sorted(e.path for e in os.scandir(root) if e.is_dir() and e.path != own_dir)
    except OSError:
        return found
    for d in dirs:
        other = read_identity(d)
        if other is None or other.model != identity.model or other.tp_rank != identity.tp_rank:
            continue
        if RESET_MARK in other.extra:
            continue  # an earlier reset generation, removed above
        mine, theirs = msgspec.structs.asdict(identity), msgspec.structs.asdict(other)
        fields = [k for k in mine if mine[k] != theirs.get(k)]
        if fields:
            found.append((d, fields))
    return found


def reconcile(
    stores: list[SSDStore], report: StartupReport
) -> tuple[StoreIndex, list[StoreIndex]]:
    """Keep the checkpoints every store holds alike; delete the rest. Returns the first
    store's index cut to them (chunks too), and each store's own scan (its orphans)."""
    indexes = [s.scan() for s in stores]
    first = indexes[0]
    common = {
        k: info for k, info in first.checkpoints.items()
        if all(_same(info, idx.checkpoints.get(k)) for idx in indexes[1:])
    }
    referenced = {ck for info in common.values() for ck in info.chunk_keys}
    for s, idx in zip(stores, indexes):
        for k in idx.checkpoints.keys() - common.keys():
            s.delete_checkpoint(k)
            report.rank_mismatches += 1
        for ck in idx.chunks.keys() - referenced:
            s.delete_chunk(ck)
    if len(stores) > 1 and report.rank_mismatches:
        logger.warning("store start-up: deleted %d checkpoint(s) not held by every rank",
                       report.rank_mismatches)
    index = StoreIndex(
        checkpoints=common,
        chunks={ck: n for ck, n in first.chunks.items() if ck in referenced},
        skipped=first.skipped,
        orphans=first.orphans,
        scan_seconds=first.scan_seconds,
    )
    return index, indexes


def _same(a, b) -> bool:
    return b is not None and (a.position, a.chunk_keys) == (b.position, b.chunk_keys)


def _collect_orphans(store: SSDStore, index: StoreIndex, grace_s: float,
                     report: StartupReport) -> None:
    now = time.time()
    for o in index.orphans:
        if not _removable(o, now, grace_s):
            report.orphans_kept_young += 1
            continue
        try:
            if _unlink_if_same(o):
                report.orphans_removed += 1
        except OSError as e:
            logger.warning("store start-up: could not remove %s: %s", o.path, e)
