"""Checkpoints where the engine ends a prefill chunk anyway.

vLLM saves a recurrent state only where a prefill chunk ends. From a block-aligned start, a
prefill alone in its step ends chunks every `chunk` tokens (its token budget, rounded down to
blocks), and after any other stop the grid restarts there. A planned checkpoint off that grid
costs one more engine step (its fixed cost, `step_cost` tokens of prefill); on it, nothing.
`on_chunk_grid` walks the intermediate checkpoints left to right and keeps each off-grid one
or moves it to the chunk end before or after it, or drops it where the plan's other stops
already serve, whichever gives the lowest expected recomputation + extra steps under the
planner's prior (the uniform one, mixed with observed fork depths when there are any:
forks.prior).
"""

from __future__ import annotations

import numpy as np


def expected_recompute(points: list[int], start: int, samples: np.ndarray,
                       weights: np.ndarray) -> float:
    """E[t - (deepest checkpoint <= t)], the floor being `start` below every checkpoint."""
    pts = np.asarray(sorted(points), dtype=np.float64)
    idx = np.searchsorted(pts, samples, side="right") - 1
    floor = np.where(idx >= 0, pts[np.maximum(idx, 0)], float(start))
    return float((weights * (samples - floor)).sum())


def extra_steps(stops: list[int], start: int, end: int, chunk: int) -> int:
    """Engine steps a prefill of [start, end) takes beyond vLLM's own split, given the chunk
    ends `stops` forces (each restarts the grid)."""
    steps, cur = 0, start
    for s in sorted({s for s in stops if start < s < end} | {end}):
        steps += -(-(s - cur) // chunk)
        cur = s
    return steps - -(-(end - start) // chunk)


def on_chunk_grid(points: list[int], fixed: list[int], start: int, end: int, chunk: int,
                  step_cost: float, prior_: tuple[np.ndarray, np.ndarray, float]) -> list[int]:
    """The intermediate checkpoints `points`, each kept or moved onto the chunk grid.

    fixed: the plan's other positions (chunk ends the engine is made to take anyway).
    step_cost: one more engine step, in tokens of prefill, scaled by the prior's uniform
    share as the placement's own threshold is (forks.place). Each choice is exact for the
    whole plan as it stands, so the plan's cost never rises; a dropped point is left out."""
    if chunk <= 0 or step_cost <= 0 or not points:
        return points
    samples, weights, u = prior_
    step_cost = u * step_cost
    fixed = sorted(s for s in fixed if start < s <= end)
    pts = sorted(points)

    def cost(plan: list[int]) -> float:
        return (expected_recompute(plan, start, samples, weights)
                + step_cost * extra_steps(plan, start, end, chunk))

    for i, p in enumerate(pts):
        if p is None:
            continue
        kept = [q for q in pts if q is not None]
        prev = max([start] + [s for s in fixed + kept if s < p])
        if (p - prev) % chunk == 0:
            continue
        nxt = min([end] + [s for s in fixed + kept if s > p])
        others = fixed + [q for j, q in enumerate(pts) if j != i and q is not None]
        best, choice = cost(others + [p]), p
        lo = prev + (p - prev) // chunk * chunk
        for q in (lo, lo + chunk):
            if prev < q < nxt:
                c = cost(others + [q])
                if c < best:
                    best, choice = c, q
        if cost(others) < best:  # the stops around it already serve: its step does not pay
            choice = None
        pts[i] = choice
    return [q for q in pts if q is not None]
