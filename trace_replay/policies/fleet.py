"""Caching systems of an engine in a fleet that shares a tier (sim/fleet.py).

* `FleetHiState`: HiState (the same policy core and orchestration, one instance per engine)
  whose checkpoints are also published to the fleet tier, and which restores from it what
  it misses locally. Nothing of HiState's decisions changes; the fleet tier's part is:
  - publish: when a state's SSD write lands (the engine wrote that checkpoint to SSD), the
    state and the KV chunks its manifest names (every block before it) that the tier does
    not hold go up the engine's fleet link; they are in the tier once through it (a publish
    its queue drops is not).
  - restore: past the local hit p, the deepest block end q whose state and every KV chunk
    in [GPU hit, q) are each readable locally or in the tier (a restore is whole or not at
    all); the keys not readable locally come down the fleet link (its bandwidth and one
    latency), the rest are loaded as a local hit is. Taken only where that transfer alone
    takes less time than prefilling tokens [p, q) would.
* `SharedFileNative`: vLLM 0.34's native offloading (`vllm034-{lru,arc}[-rN]`) whose file
  tier is one directory every engine shares: its CPU tier stays per engine, its file tier
  is one store (evicted as its tiers are), read and written over the engine's fleet link.
"""

from __future__ import annotations

import re

from ..sim.drive import Drive
from ..sim.fleet import FleetTierModel
from ..sim.job import Job
from .base import PolicyContext
from .histate import _KVS, _STS, HiState
from .lru_tiers import TieredLru, _Tier


class FleetHiState(HiState):
    name = "histate-fleet"

    def __init__(self, ctx: PolicyContext, fleet: FleetTierModel, link: Drive,
                 latency: float):
        super().__init__(ctx)
        self.fleet, self.link, self.latency = fleet, link, latency
        self.n.update({"fleet_restores": 0, "fleet_restores_declined": 0,
                       "fleet_restored_tokens": 0, "fleet_publishes": 0})

    # -- restore -----------------------------------------------------------------------------
    def beyond_local(self, job: Job, g: int, p: int) -> tuple[int, set[bytes]]:
        hb, limit, fleet = job.hashes_bytes(), job.max_blocks, self.fleet
        readable = self.orch.readable
        q, i = p, g
        while i < limit:
            kv = hb[i] + _KVS
            if not readable(kv) and kv not in fleet:
                break
            i += 1
            st = hb[i - 1] + _STS
            if i > p and st in fleet:
                q = i
        if q <= p:
            return p, set()
        remote = {k for k in (*(h + _KVS for h in hb[g:q]), hb[q - 1] + _STS)
                  if not readable(k)}
        nbytes = sum(self.sb if k.endswith(_STS) else self.kvb for k in remote)
        cost, B = self.ctx.cost, self.B
        transfer = self.latency + nbytes / self.link.read_bw
        saved = cost.prefill_time(p * B, job.input_tokens) - \
            cost.prefill_time(q * B, job.input_tokens)
        if transfer >= saved:
            self.n["fleet_restores_declined"] += 1
            return p, set()
        fleet.touch(remote)
        job.fleet_bytes = nbytes
        self.n["fleet_restores"] += 1
        self.n["fleet_restored_tokens"] += (q - p) * B
        return q, remote

    # -- publish -----------------------------------------------------------------------------
    def _written(self, key: bytes) -> None:
        entry = self.orch.entries.get(key)
        super()._written(key)
        if entry is None or not entry.is_state:
            return
        chunks = self.fleet.to_upload(key, list(entry.refs))
        if chunks is None:
            return
        nbytes = self.sb + len(chunks) * self.kvb
        self.fleet.begin([key, *chunks])
        arg = (key, [(c, self.kvb) for c in chunks])
        self.n["fleet_publishes"] += 1
        if not self.link.write(self.ctx.clock(), nbytes, self._published, arg):
            self.fleet.land(key, arg[1], self.sb, ok=False)

    def _published(self, arg) -> None:
        key, chunks = arg
        self.fleet.land(key, chunks, self.sb, ok=True)


_NATIVE = re.compile(r"vllm034-(lru|arc)(?:-r(\d+))?")


def native_options(name: str) -> tuple[str, int]:
    """(eviction, retention interval in blocks) of a `vllm034-*` policy name."""
    m = _NATIVE.fullmatch(name)
    if m is None:
        raise ValueError(f"not a vLLM 0.34 native policy: {name!r} (vllm034-lru, "
                         "vllm034-arc-r4, ...)")
    return m.group(1), int(m.group(2) or 0)


class SharedFileNative(TieredLru):
    """ctx.drive is the engine's fleet link: the file tier's writes go up it."""

    def __init__(self, ctx: PolicyContext, base: str, shared: _Tier):
        eviction, blocks = native_options(base)
        super().__init__(ctx, dram=True, ssd=False, eviction=eviction,
                         retention_tokens=blocks * ctx.block_tokens)
        self.name = f"{base}-shared-file"
        self.tiers.append(shared)
        self.names.append("ssd")

    def lookup(self, job: Job) -> None:
        super().lookup(job)
        job.fleet_bytes, job.ssd_bytes = job.ssd_bytes, 0.0  # the file tier is remote
