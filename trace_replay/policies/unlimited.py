"""Unlimited cache (the paper's reference): every computed prefix keeps its KV and a state at
every block boundary, forever, and restores for free. Its hits are the reusable tokens."""

from __future__ import annotations

from ..sim.job import Job
from .base import PolicyContext, SimPolicy


class Unlimited(SimPolicy):
    name = "unlimited"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx)
        self.seen: set[int] = set()

    def lookup(self, job: Job) -> None:
        # Chained ids: a block seen at index i means its whole prefix was seen, so the cached
        # prefix is monotone along the prompt and can be bisected.
        hl, seen = job.blocks, self.seen
        lo, hi = 0, job.max_blocks
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hl[mid - 1] in seen:
                lo = mid
            else:
                hi = mid - 1
        job.resume = job.gpu_hit = job.shared = lo * self.B

    def prefilled(self, job: Job) -> None:
        self.seen.update(job.blocks)
