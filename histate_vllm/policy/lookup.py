"""Prefix lookup over chained block hashes, shared by every policy.

Walks the prompt's blocks once (one dict probe per key, nothing proportional to the cache):
`shared` = longest prefix whose KV chunks are all present in some tier; `position` = deepest
block boundary within it where every state group's key is present too. Each key is read from
its fastest tier (GPU > DRAM > SSD).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .types import Hit, Tier


def lookup(
    block_hashes: Sequence[bytes],
    block_tokens: int,
    kv_groups: Sequence[int],
    state_groups: Sequence[int],
    present: Callable[[bytes], Tier | None],
    states_known: bool = True,
) -> Hit:
    """`states_known=False`: no state group is known yet, so no position is restorable."""
    if not kv_groups and not state_groups:
        return Hit()
    kv_suffix = [g.to_bytes(4, "big") for g in kv_groups]
    st_suffix = [g.to_bytes(4, "big") for g in state_groups]
    sources: list[tuple[bytes, Tier]] = []
    best_blocks = 0
    best_len = 0  # len(sources) covering KV of blocks [0, best_blocks)
    best_state: list[tuple[bytes, Tier]] = []
    shared_blocks = 0
    for i, h in enumerate(block_hashes):
        ok = True
        row = []
        for s in kv_suffix:
            k = h + s
            t = present(k)
            if t is None:
                ok = False
                break
            row.append((k, t))
        if not ok:
            break
        sources.extend(row)
        state = []
        for s in st_suffix:
            k = h + s
            t = present(k)
            if t is None:
                state = None
                break
            state.append((k, t))
        if state is not None and states_known:
            best_blocks, best_len, best_state = i + 1, len(sources), state
        # A pure-recurrent model has no KV to share: its shared prefix is its checkpoint.
        shared_blocks = i + 1 if kv_suffix else best_blocks
    if best_blocks == 0:
        return Hit(shared=shared_blocks * block_tokens, block_tokens=block_tokens)
    kv = sources[:best_len]
    return Hit(
        position=best_blocks * block_tokens,
        shared=shared_blocks * block_tokens,
        kv_keys=tuple(k for k, _ in kv),
        state_keys=tuple(k for k, _ in best_state),
        sources=tuple(kv) + tuple(best_state),
        block_tokens=block_tokens,
    )
