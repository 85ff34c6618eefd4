"""Connector resets: entries of old weights become unreachable, now and after a restart.

`reset_prefix_cache(reset_connector=True)` (e.g. after a weight update) must make every
stored entry unreachable. Deleting them is not enough: entries written after the reset
are computed with the new weights, which a restart does not load (it reads the model
from disk). So after a reset the engine writes under a new identity, the old one plus
`|reset=<generation>` in `extra`: its own directory, wiped whole at the next start.
"""

from __future__ import annotations

import logging
import os
import shutil

import msgspec

from histate_vllm.store.format import StoreIdentity
from histate_vllm.store.layout import KIND_DIRS
from histate_vllm.store.scan import read_identity
from histate_vllm.store.store import SSDStore

logger = logging.getLogger(__name__)

RESET_MARK = "|reset="


def reset_identity(identity: StoreIdentity, generation: str) -> StoreIdentity:
    """The identity entries take after the reset `generation`."""
    base = base_identity(identity)
    return msgspec.structs.replace(base, extra=f"{base.extra}{RESET_MARK}{generation}")


def base_identity(identity: StoreIdentity) -> StoreIdentity:
    """The identity the engine started with (no reset generation)."""
    return msgspec.structs.replace(identity, extra=identity.extra.split(RESET_MARK, 1)[0])


def rank_identity(identity: StoreIdentity, rank: int) -> StoreIdentity:
    return msgspec.structs.replace(identity, tp_rank=rank)


def wipe(store: SSDStore) -> None:
    """Delete every entry of `store` (nothing may write it any more). A reset
    generation's directory goes whole; the start-up one keeps its identity file and
    the engine's lock."""
    if RESET_MARK in store.identity.extra:
        shutil.rmtree(store.layout.dir, ignore_errors=True)
        return
    for d in (*KIND_DIRS, "quarantine"):
        shutil.rmtree(os.path.join(store.layout.dir, d), ignore_errors=True)


def remove_reset_generations(root: str, identity: StoreIdentity) -> list[str]:
    """Delete the directories of reset generations of `identity` (any rank); call it
    at start-up, holding the store's lock. Returns the directories removed."""
    want = rank_identity(base_identity(identity), 0)
    removed = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return removed
    for e in entries:
        if not e.is_dir(follow_symlinks=False):
            continue
        other = read_identity(e.path)
        if other is None or RESET_MARK not in other.extra or other.digest() != e.name:
            continue
        if rank_identity(base_identity(other), 0) == want:
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(e.path)
    if removed:
        logger.info("store start-up: removed %d director(ies) of earlier cache resets",
                    len(removed))
    return removed
