"""Asymmetric placement (HiState §3.1): KV chunks prefer DRAM, historical checkpoints SSD,
terminal (leaf) checkpoints DRAM (in one recency order with the KV); a fast copy is demoted
(dropped while a slower one stays) before anything is deleted.

DRAM and SSD are one hierarchy whose capacity adds up: a copy held in both tiers where DRAM
is its home (a KV chunk, a terminal checkpoint) is on SSD only so that a restart finds it (a
"backup"). Backups are the first to give up SSD space, and writing one never deletes data
held nowhere else; what DRAM pressure evicts moves to SSD (eviction.py, admission.py).

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


def stage1_rank(e: Entry, tier: Tier) -> int | None:
    """Order in which copies held in both tiers are dropped from `tier` under pressure
    (lowest first, then least recently touched). None: never dropped by stage 1.

    DRAM demotes (its copies are backed by SSD): historical checkpoints first, then terminal
    checkpoints and KV chunks together, least recently touched first. A session's next turn
    reads its terminal checkpoint with its KV, so ranking that checkpoint below every KV
    chunk sent the checkpoints of sessions idle for seconds to SSD while KV untouched for
    minutes stayed (464 of 3,263 requests read their 51 MB state from SSD on the
    paper-like Weka replay, order 9). SSD drops backups (copies whose home is DRAM, kept on
    SSD for a restart): KV chunks first (a restart without them still finds shorter
    prefixes), then terminal checkpoints. A historical checkpoint's SSD copy is its home:
    never a backup.
    """
    if tier == Tier.DRAM:
        return 0 if e.kind == Kind.STATE and not is_leaf_state(e) else 1
    if e.kind == Kind.KV:
        return 0
    return 1 if is_leaf_state(e) else None


def is_backup(e: Entry) -> bool:
    """An SSD copy (or one being written) of a key whose home is DRAM, which DRAM holds."""
    return e.kind == Kind.KV or is_leaf_state(e)
