"""Quarantine: take entries that failed verification out of the store, keep evidence.

A quarantined checkpoint's manifest moves to `quarantine/` (so no scan lists it again);
its state file moves there too when the state itself was bad, and is deleted otherwise.
A corrupt chunk moves there and takes every checkpoint that references it along. The
directory keeps the newest `keep` files. Failures here (a read-only disk) are logged,
never raised: the caller is already handling the corrupt entry.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

from histate_vllm.store.fileio import remove_quietly
from histate_vllm.store.format import FormatError, Manifest, decode_manifest
from histate_vllm.store.layout import MANIFEST_SUFFIX, Layout, key_of
from histate_vllm.store.scan import read_small_file, walk_files
from histate_vllm.store.sysio import SYS

logger = logging.getLogger(__name__)


def _move(layout: Layout, path: str) -> bool:
    dest = os.path.join(layout.quarantine_dir, f"{time.time_ns()}.{os.path.basename(path)}")
    try:
        SYS.rename(path, dest)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        logger.warning("store: could not quarantine %s: %s", path, e)
        return False


def trim(layout: Layout, keep: int) -> int:
    """Delete the oldest quarantined files beyond `keep`; return bytes freed."""
    try:
        entries = sorted(os.scandir(layout.quarantine_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return 0
    freed = 0
    for e in entries[: max(0, len(entries) - keep)]:
        try:
            size = e.stat(follow_symlinks=False).st_size
        except FileNotFoundError:
            continue
        if remove_quietly(e.path):
            freed += size
    return freed


def iter_manifests(layout: Layout) -> Iterator[tuple[bytes, Manifest]]:
    """Every manifest that decodes, with the key its file name encodes."""
    for entry in walk_files(layout.manifests_dir):
        key = key_of(entry.name, MANIFEST_SUFFIX)
        if key is None:
            continue
        try:
            data = read_small_file(entry.path)
            yield key, decode_manifest(data)
        except (OSError, FormatError):
            continue


def quarantine_checkpoint(
    layout: Layout, key: bytes, reason: str, *, state_is_bad: bool, keep: int
) -> None:
    mpath = layout.manifest_path(key)
    state_file = None
    try:
        data = read_small_file(mpath)
        state_file = decode_manifest(data).state_file
    except (OSError, FormatError):
        pass
    moved = _move(layout, mpath)
    if state_file is not None:
        spath = layout.state_path(key, state_file)
        if not (state_is_bad and _move(layout, spath)):
            remove_quietly(spath)
    if moved:
        logger.warning("store: quarantined checkpoint %s…: %s", key.hex()[:16], reason)
    trim(layout, keep)


def quarantine_chunk(layout: Layout, key: bytes, reason: str, *, keep: int) -> tuple[bytes, ...]:
    """Quarantine a chunk and every checkpoint that references it; return those keys."""
    _move(layout, layout.chunk_path(key))
    dependents = tuple(k for k, m in iter_manifests(layout) if key in m.chunk_keys)
    why = f"references corrupt chunk {key.hex()[:16]}…"
    for k in dependents:
        quarantine_checkpoint(layout, k, why, state_is_bad=False, keep=keep)
    logger.warning(
        "store: quarantined chunk %s… (%s) and %d checkpoint(s) that use it",
        key.hex()[:16],
        reason,
        len(dependents),
    )
    trim(layout, keep)
    return dependents
