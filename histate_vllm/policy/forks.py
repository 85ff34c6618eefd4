"""Where internal hits land, learned online, and checkpoint positions placed for them.

HiState's interval objective weighs the recomputation of an internal hit at t, Σ p_t·(t mod
I), with p_t uniform over the new segment unless known. `ForkDepths` learns p_t: the token
depths at which requests diverged from a cached context that continues past them (an edit,
rewind or compaction returning to an earlier prefix), over a sliding window. `place` keeps
the number of intermediate checkpoints the interval model chose for a segment and moves them
to minimise the expected recomputation under an even mixture of the uniform prior and the
observed depths inside the segment (greedy, exact per step).
"""

from __future__ import annotations

from collections import deque

import numpy as np


class ForkDepths:
    def __init__(self, window: int = 512):
        self.depths: deque[int] = deque(maxlen=window)

    def observe(self, depth: int) -> None:
        self.depths.append(depth)

    def inside(self, start: int, end: int) -> list[int]:
        return [d for d in self.depths if start < d < end]


def place(start: int, end: int, k: int, grid: list[int], observed: list[int],
          block_tokens: int) -> list[int]:
    """k checkpoint positions in (start, end), block-aligned, from the uniform grid and the
    observed depths, minimising E[t - (deepest checkpoint <= t)] under p = 1/2 uniform over
    the segment's blocks + 1/2 the observed depths."""
    if k <= 0 or not observed:
        return grid
    bt = block_tokens
    uni = np.arange(start + bt, end + 1, bt, dtype=np.float64)
    obs = np.array(observed, dtype=np.float64)
    samples = np.concatenate([uni, obs])
    weights = np.concatenate([np.full(len(uni), 0.5 / max(len(uni), 1)),
                              np.full(len(obs), 0.5 / len(obs))])
    cands = sorted({*grid, *(d // bt * bt for d in observed if start < d // bt * bt < end)})
    floor = np.full(len(samples), float(start))
    chosen: list[int] = []
    for _ in range(min(k, len(cands))):
        best, best_gain = None, 0.0
        for c in cands:
            if c in chosen:
                continue
            m = (samples >= c) & (floor < c)
            gain = float(np.dot(weights[m], c - floor[m]))
            if gain > best_gain:
                best, best_gain = c, gain
        if best is None:
            break
        chosen.append(best)
        m = (samples >= best) & (floor < best)
        floor[m] = best
    return sorted(chosen)
