"""Unlimited cache (the paper's reference): every computed prefix keeps its KV and a state at
every block boundary, forever, and restores for free. Its hits are the reusable tokens."""

from __future__ import annotations

from ..sim.gpu import GpuPrefixCache
from ..sim.job import Job
from .base import PolicyContext, SimPolicy


def seen_prefix(seen: set[int], job: Job) -> int:
    """Leading blocks of the prompt (at most `max_blocks`) computed before. Chained ids: a
    block seen at index i means its whole prefix was seen, so the prefix can be bisected."""
    hl = job.blocks
    lo, hi = 0, job.max_blocks
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hl[mid - 1] in seen:
            lo = mid
        else:
            hi = mid - 1
    return lo


class Unlimited(SimPolicy):
    name = "unlimited"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx)
        self.seen: set[int] = set()

    def lookup(self, job: Job) -> None:
        job.resume = job.gpu_hit = job.shared = seen_prefix(self.seen, job) * self.B

    def prefilled(self, job: Job) -> None:
        self.seen.update(job.blocks)


class UnlimitedHost(SimPolicy):
    """The limit of any offloading cache on this machine: every computed prefix keeps its KV
    and a state at every block boundary in host memory, forever; the GPU prefix cache is the
    same as every other system's, and what it misses is copied over the host-to-device link
    (no SSD, nothing evicted, nothing written). Unlimited minus the copy: how much of a
    cache's distance to Unlimited any tiered cache pays."""

    name = "unlimited-host"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx)
        self.seen: set[int] = set()
        self.kvb, self.sb = ctx.kv_block_bytes, ctx.state_bytes
        self.gpu = GpuPrefixCache(ctx.gpu_bytes, self.kvb, self.sb)

    def lookup(self, job: Job) -> None:
        hl = job.blocks
        lo = seen_prefix(self.seen, job)
        g, k = self.gpu.hit(hl, job.max_blocks)
        job.gpu_hit = g * self.B
        job.shared = max(lo, k) * self.B
        if lo > g:  # the KV of blocks [g, lo) and the state at lo, from host memory
            job.dram_bytes = (lo - g) * self.kvb + self.sb
            job.resume = lo * self.B
        else:
            job.resume = g * self.B
        job.state = self.gpu.hold_hit(hl, g)

    def prefilled(self, job: Job) -> None:
        # On the GPU, as every system's vLLM leaves it: the prompt's KV, a state at its end
        # and where it resumed.
        hl = job.blocks
        job.state = self.gpu.hold_prompt(hl, self.B, {job.prompt_end, job.resume}, job.state,
                                         job.max_blocks)
        self.seen.update(hl)

    def finished(self, job: Job) -> None:
        self.gpu.release(reversed(job.state))
