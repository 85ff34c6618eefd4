"""The LRU baselines' machinery: a vLLM-like GPU prefix cache plus write-through LRU tiers.

Per request (vLLM's hybrid rules, shared by vllm-marconi, vllm-cpu, vllm-disk and
sglang-hicache; only the options differ):
* GPU hit g: deepest block end with the KV of every block before it and a state there.
* Offload hit p > g: KV of blocks [g, p) and the state at p, each found in DRAM or SSD
  (what the offloading connector loads into the blocks allocated past the GPU hit). The
  bytes come from the fastest tier holding each key; loaded keys are touched (LRU).
* Checkpoints (`checkpoints.py`): prompt end and the junction where the cached KV prefix
  ends; with `chunk_states` also every prefill chunk end.
* After prefill the request holds the KV of all its full blocks and its checkpoint states
  on the GPU (freed tail first at the end of decode); every full block and every checkpoint
  is written through to each tier that is not already holding it (LRU eviction per tier).
* `state_share` splits a pool into KV and state partitions (SGLang's static partition).
"""

from __future__ import annotations

from ..sim.arc import ArcStore
from ..sim.gpu import GpuPrefixCache
from ..sim.job import Job
from ..sim.lru import LruStore
from .base import PolicyContext, SimPolicy
from .checkpoints import chunk_ends, merge, periodic, turn_boundaries


def _noop(_) -> None:
    pass


class _Tier:
    """One offload tier, optionally split into a KV and a state partition."""

    def __init__(self, capacity: int, state_share: float | None, store=LruStore):
        if state_share is None:
            self.kv = self.st = store(capacity)
        else:
            st = int(capacity * state_share)
            self.kv, self.st = store(capacity - st), store(st)

    def store(self, key: int) -> LruStore:
        return self.st if key < 0 else self.kv

    def __contains__(self, key: int) -> bool:
        return key in (self.st if key < 0 else self.kv)

    @property
    def evictions(self) -> int:
        return self.kv.evictions + (self.st.evictions if self.st is not self.kv else 0)


class TieredLru(SimPolicy):
    def __init__(self, ctx: PolicyContext, *, dram: bool, ssd: bool,
                 gpu_state_share: float | None = None, dram_state_share: float | None = None,
                 chunk_states: bool = False, eviction: str = "lru",
                 retention_tokens: int = 0):
        """eviction: "lru" or "arc" in the offload tiers; retention_tokens: a checkpoint
        every that many tokens besides the prompt end and junctions (0: none)."""
        super().__init__(ctx)
        store = {"lru": LruStore, "arc": ArcStore}[eviction]
        self.kvb, self.sb = ctx.kv_block_bytes, ctx.state_bytes
        self.gpu = GpuPrefixCache(ctx.gpu_bytes, self.kvb, self.sb, gpu_state_share)
        self.tiers: list[_Tier] = []
        self.names: list[str] = []
        if dram:
            self.tiers.append(_Tier(ctx.dram_bytes, dram_state_share, store))
            self.names.append("dram")
        if ssd:
            self.tiers.append(_Tier(ctx.ssd_bytes, None, store))
            self.names.append("ssd")
        self.chunk_states = chunk_states
        self.retention_tokens = retention_tokens

    def _where(self, key: int) -> int:
        """Index of the fastest tier holding `key`, -1 if none."""
        for i, t in enumerate(self.tiers):
            if key in t:
                return i
        return -1

    def lookup(self, job: Job) -> None:
        B, hl, limit = self.B, job.blocks, job.max_blocks
        g, k = self.gpu.hit(hl, limit)
        p, shared = g, k
        if self.tiers:
            where = self._where
            j = g
            while j < limit and where(hl[j]) >= 0:
                j += 1
            q = j
            while q > g and where(~hl[q - 1]) < 0:
                q -= 1
            p, shared = q, max(k, j)
            if p > g:
                got = [0, 0]
                for key in (*hl[g:p], ~hl[p - 1]):
                    got[where(key)] += self.sb if key < 0 else self.kvb
                    for t in self.tiers:
                        t.store(key).touch(key)
                for name, b in zip(self.names, got):
                    if name == "dram":
                        job.dram_bytes += b
                    else:
                        job.ssd_bytes += b
        job.gpu_hit, job.resume, job.shared = g * B, p * B, shared * B
        pos = turn_boundaries(job.resume, job.shared, job.prompt_end, B)
        if self.chunk_states:
            pos = merge(pos, chunk_ends(job.resume, job.prompt_end, self.ctx.chunk_tokens, B))
        if self.retention_tokens:
            pos = merge(pos, periodic(job.resume, job.prompt_end, self.retention_tokens, B))
        job.captures = pos
        job.state = self.gpu.hold_hit(hl, g)

    def prefilled(self, job: Job) -> None:
        hl = job.blocks
        states = set(job.captures)
        if job.resume:
            states.add(job.resume)
        job.state = self.gpu.hold_prompt(hl, self.B, states, job.state, job.max_blocks)
        self.store_step(job, len(hl))

    def store_step(self, job: Job, blocks: int) -> None:
        """Write blocks [job.stored, blocks) and the checkpoints among them through to every
        tier; a write the SSD's queue drops is not stored there."""
        first = job.stored
        if blocks <= first:
            return
        job.stored = blocks
        B, hl, kvb, sb = self.B, job.blocks, self.kvb, self.sb
        keys = [(h, kvb) for h in hl[first:blocks]]
        keys += [(~hl[p // B - 1], sb) for p in job.captures if first < p // B <= blocks]
        for name, t in zip(self.names, self.tiers):
            for key, nbytes in keys:
                store = t.store(key)
                if key in store:
                    continue
                if name == "ssd" and not self.ssd_write(nbytes, _noop, None):
                    continue
                store.put(key, nbytes)

    def finished(self, job: Job) -> None:
        self.gpu.release(reversed(job.state))

    def stats(self) -> dict:
        out = {"gpu_overcommit": self.gpu.overcommit}
        for name, t in zip(self.names, self.tiers):
            out[f"{name}_evictions"] = t.evictions
        return out
