"""Where internal hits land, learned online, and checkpoint positions placed for them.

HiState's interval objective weighs the recomputation of an internal hit at t, Σ p_t·(t mod
I), with p_t uniform over the new segment unless known. `ForkDepths` learns p_t: the token
depths at which requests diverged from a cached context that continues past them (an edit,
rewind or compaction returning to an earlier prefix), over a sliding window; and, where the
context left ends a few blocks past the fork (its deepest checkpoint, the previous prompt's
end), how far before that end: agents rewrite the tail of their last prompt (a reminder
dropped, the last message edited), and such forks land at the same distance from the end of
whatever segment comes next, at any absolute depth. `place` keeps
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
        self.tails: deque[int] = deque(maxlen=window)

    def observe(self, depth: int, tail: int | None = None) -> None:
        """A fork at `depth`; `tail`: tokens from it to the end of the context it left."""
        self.depths.append(depth)
        if tail is not None and tail > 0:
            self.tails.append(tail)

    def inside(self, start: int, end: int) -> list[int]:
        """Observed depths in (start, end): absolute ones, and tail forks as if the segment's
        end were the end of the context they left."""
        out = [d for d in self.depths if start < d < end]
        out.extend(end - t for t in self.tails if start < end - t)
        return out


# Uniform-prior samples (and candidate positions) per segment: a finer grid adds nothing to
# a placement that is itself block-aligned, and bounds the work for small vLLM blocks.
_MAX_SAMPLES = 512


def _stride(start: int, end: int, block_tokens: int) -> int:
    """Blocks between samples (and candidates): at most _MAX_SAMPLES per segment."""
    return max(1, -(-((end - start) // block_tokens) // _MAX_SAMPLES))


def prior(start: int, end: int, block_tokens: int, observed: list[int]
          ) -> tuple[np.ndarray, np.ndarray, float]:
    """(samples, weights, u): where internal hits land in (start, end] and how likely each
    is; u is the uniform share (1 without observed depths, else 1/2)."""
    bt = block_tokens
    uni = np.arange(start + bt, end + 1, bt * _stride(start, end, bt), dtype=np.float64)
    if not observed:
        return uni, np.full(len(uni), 1.0 / max(len(uni), 1)), 1.0
    obs, counts = np.unique(np.asarray(observed, dtype=np.float64), return_counts=True)
    samples = np.concatenate([uni, obs])
    weights = np.concatenate([np.full(len(uni), 0.5 / max(len(uni), 1)),
                              counts * (0.5 / len(observed))])
    return samples, weights, 0.5


def place(start: int, end: int, k: int, grid: list[int], observed: list[int],
          block_tokens: int, min_gain: float | None = None, k_max: int | None = None
          ) -> list[int]:
    """Checkpoint positions in (start, end), block-aligned, minimising E[t - (deepest
    checkpoint <= t)] under p = 1/2 uniform over the segment's blocks + 1/2 the observed
    depths, chosen greedily (exact per step). Without `min_gain`: k of them, from the
    uniform grid and the observed depths. With it (tokens of expected recomputation one
    more checkpoint must save, the interval model's w·N_s): as many as pay for themselves,
    up to `k_max`, from every block boundary; with nothing observed this is the uniform
    optimum the interval model solves, so observed depths add checkpoints only where the
    saving they bring exceeds what one costs."""
    if not observed or (k <= 0 and min_gain is None):
        return grid
    bt = block_tokens
    stride = _stride(start, end, bt)
    samples, weights, _ = prior(start, end, bt, observed)
    aligned = {d // bt * bt for d in observed if start < d // bt * bt < end}
    if min_gain is None:
        cands = np.array(sorted({*grid, *aligned}), dtype=np.float64)
        limit = k
    else:
        cands = np.array(sorted({*range(start + bt, end, bt * stride), *grid, *aligned}),
                         dtype=np.float64)
        limit = k_max if k_max is not None else len(cands)
    floor = np.full(len(samples), float(start))
    chosen: list[int] = []
    taken = np.zeros(len(cands), dtype=bool)
    for _ in range(min(limit, len(cands))):
        # gain[c] = sum of w·(c - floor) over samples at or past c whose floor is below c
        m = (samples[None, :] >= cands[:, None]) & (floor[None, :] < cands[:, None])
        gain = np.where(m, weights[None, :] * (cands[:, None] - floor[None, :]), 0.0).sum(1)
        gain[taken] = -1.0
        j = int(np.argmax(gain))
        best_gain = float(gain[j])
        if best_gain <= 0.0 or (min_gain is not None and best_gain < min_gain):
            break
        taken[j] = True
        c = float(cands[j])
        chosen.append(int(c))
        sel = (samples >= c) & (floor < c)
        floor[sel] = c
    return sorted(chosen)
