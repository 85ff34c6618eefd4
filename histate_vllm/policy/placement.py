"""Asymmetric placement (HiState §3.1): KV chunks prefer DRAM, historical checkpoints SSD,
terminal (leaf) checkpoints DRAM; a fast copy is demoted (dropped while a slower one stays)
before anything is deleted.

A hit reads every KV chunk before the resume point but exactly one checkpoint, so DRAM
bytes are worth most as KV; a historical checkpoint is read at most once per fork.
"""

from __future__ import annotations

from .index import Entry
from .types import Kind, Tier


def is_leaf_state(e: Entry) -> bool:
    return e.kind == Kind.STATE and e.node.live_children == 0


def keep_copy(e: Entry, tier: Tier) -> bool:
    """Whether the copy in `tier` should stay once a slower tier also holds the key."""
    if tier != Tier.DRAM:
        return True
    if e.kind == Kind.KV:
        return True
    return is_leaf_state(e)


def stage1_rank(e: Entry, tier: int) -> int | None:
    """Order in which backed copies are dropped from `tier` under pressure (lowest first).

    None: never dropped by stage 1. DRAM demotes (its copies are backed by SSD): historical
    checkpoints first, then terminal ones, KV chunks last. SSD is the last tier, the backing
    copy of everything DRAM holds (and what survives a restart): dropping an SSD copy because
    DRAM also holds it would only turn safe data into data that DRAM pressure then deletes,
    so SSD never demotes; its pressure goes straight to GDS units.
    """
    if tier != Tier.DRAM:
        return None
    if e.kind == Kind.STATE:
        return 1 if is_leaf_state(e) else 0
    return 2
