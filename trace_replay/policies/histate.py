"""HiState in the simulator: the real `histate_vllm.policy` core and the connector manager's
orchestration (`histate_vllm.bookkeeping.orchestration.Orchestrator`, the object HiStateManager
drives), over the same vLLM-like GPU prefix cache as the baselines.

Per request, the calls vLLM makes on the manager, with every transfer completing at once:
* lookup: GPU hit g from vLLM's prefix cache; then, as vLLM's offloading scheduler does
  through `manager.lookup`, the KV chunks readable from block g on and the deepest state
  among them give the offload hit p. If p > g, the KV of blocks [g, p) and the state at p
  are loaded (`prepare_load`: pinned and hit; a DRAM slot or SSD per key), unpinned when
  loaded. Then the capture plan (`note_hit` + `plan`): the prefill leaves states exactly
  there (HiState's scheduler ends prefill chunks at planned positions).
* each step's end and prefilled: `offer` (vLLM's `prepare_store`: per block its KV key, and
  its state key where the prefill left a state), `complete_store`, then `take_ssd_writes`,
  queued on the drive; `on_ssd_written` when each lands or is dropped.
* finished: the GPU blocks are freed; `request_finished`.
SSD writes go through the drive's bounded queue (sim/drive.py): they take the drive's time
beside the restores, land later (the DRAM slot stays pinned until then) and, when the queue
is full, are dropped as the engine's StoreWriter drops them (`on_ssd_written(False)`). Keys: 8-byte block id + 4-byte group (0 = attention KV, 1 = recurrent state).

Variants (the paper's ablations, each changing one mechanism): `align` = checkpoint interval
fixed to vLLM's prefill chunk (align-mode chunk ends), `fixed-32` = fixed 32-block interval,
`lru-disk` = the core's `lru` policy (write-through, per-tier LRU) with HiState's planner,
`histate-mirror` = SSD keeps every backup (restart survival vs capacity).

Restart survival (stats): after each request is stored, the deepest position of its prompt
restorable from SSD alone (KV chunks and a state there, all on SSD) against the deepest
restorable from any tier; `restart_survival` = the ratio of their sums, i.e. the share of
resumable tokens a restart at a random moment would keep.
"""

from __future__ import annotations

from collections.abc import Collection

from histate_vllm.bookkeeping.orchestration import BytePool, Orchestrator, headroom_bytes
from histate_vllm.policy import Tier, make_policy

from ..sim.gpu import GpuPrefixCache
from ..sim.job import Job
from .base import PolicyContext, SimPolicy

KV_GROUP, STATE_GROUP = 0, 1
_KVS = KV_GROUP.to_bytes(4, "big")
_STS = STATE_GROUP.to_bytes(4, "big")


class CoreAdapter(SimPolicy):
    name = "histate"

    def __init__(self, ctx: PolicyContext, core: str = "histate",
                 interval: str | int = "adaptive", **options):
        super().__init__(ctx)
        self.kvb, self.sb = ctx.kv_block_bytes, ctx.state_bytes
        self.gpu = GpuPrefixCache(ctx.gpu_bytes, self.kvb, self.sb)
        if core == "histate":
            options = {**ctx.core_options, **options}
        kvb, sb = self.kvb, self.sb
        # One prefill chunk (a vLLM step) is offered at a time; DRAM slots of copies moving
        # to SSD stay taken until their writes land, so the policy keeps one step's worth
        # of DRAM free (`headroom_bytes`, as HiStateManager does).
        self.step_blocks = max(1, ctx.chunk_tokens // self.B)
        headroom = headroom_bytes(ctx.dram_bytes, self.step_blocks * (kvb + sb))
        self.core = make_policy(
            core,
            budgets={Tier.DRAM: ctx.dram_bytes - headroom, Tier.SSD: ctx.ssd_bytes},
            block_tokens=self.B,
            interval=interval,
            clock=ctx.clock,
            kv_groups=[KV_GROUP],
            state_groups=[STATE_GROUP],
            chunk_tokens=ctx.chunk_tokens,
            step_cost_tokens=ctx.step_cost_tokens,
            **options,
        )
        self.orch = Orchestrator(
            self.core, BytePool(ctx.dram_bytes), block_tokens=self.B, kv_groups=[KV_GROUP],
            state_groups=[STATE_GROUP], key_bytes=lambda is_state: sb if is_state else kvb,
            has_ssd=ctx.ssd_bytes > 0,
            # As HiStateManager: never more SSD writes out than the writer's queue takes.
            write_budget=ctx.drive.queue_bytes
            if ctx.drive is not None and ctx.drive.charge_writes else None,
        )
        self.n = {"loads": 0, "state_offers": 0, "states_stored": 0, "restorable_tokens": 0,
                  "restorable_from_ssd_tokens": 0}

    # -- lookup ------------------------------------------------------------------------------
    def lookup(self, job: Job) -> None:
        B, hl, limit, orch = self.B, job.blocks, job.max_blocks, self.orch
        readable = orch.readable
        hb = job.hashes_bytes()
        g, k = self.gpu.hit(hl, limit)
        # vLLM's offloading scheduler asks the manager key by key from the GPU hit on: KV
        # chunks while they are held, then the deepest state among them.
        j = g
        while j < limit and readable(hb[j] + _KVS):
            j += 1
        p = j
        while p > g and not readable(hb[p - 1] + _STS):
            p -= 1
        job.gpu_hit = g * B
        # A tier beyond this engine's may restore deeper (a fleet tier: policies/fleet.py);
        # the keys it serves are not loaded from here.
        p, remote = self.beyond_local(job, g, p)
        job.shared = max(k, j, p) * B
        loaded: list[bytes] = []
        if p > g:
            loaded = [h + _KVS for h in hb[g:p]]
            loaded.append(hb[p - 1] + _STS)
            if remote:
                loaded = [key for key in loaded if key not in remote]
        if loaded:
            slots, is_state = orch.prepare_load(loaded)
            for slot, st in zip(slots, is_state):
                nbytes = self.sb if st else self.kvb
                if slot >= 0:
                    job.dram_bytes += nbytes
                else:
                    job.ssd_bytes += nbytes
            # Promotion: the read fills the DRAM copies, nothing more to charge.
            orch.promote(loaded, slots, job.request_id)
        if p > g:
            self.n["loads"] += 1
            job.resume = p * B
        else:
            job.resume = g * B
        orch.note_hit(job.request_id, job.resume, lambda: hb[:g])
        # Where the prompt's first message ends, when the trace records it (what the engine
        # reads from the token ids), and the client's breakpoints (vllm_glue/boundaries.py).
        ends = (job.req.message_end,) if job.req.message_end else ()
        if self.ctx.client_breakpoints:
            ends += job.req.breakpoints
        job.captures = orch.plan(job.request_id, hb, job.input_tokens, ends)
        held = self.gpu.hold_hit(hl, g)
        job.state = (held, loaded)

    def beyond_local(self, job: Job, g: int, p: int) -> tuple[int, Collection[bytes]]:
        """(blocks to resume at, the keys of [g, that) and its state read from elsewhere):
        here, none; p is the local offload hit, g the GPU's."""
        return p, ()

    def loaded(self, job: Job) -> None:
        self.orch.complete_load(job.state[1], job.request_id)

    # -- store -------------------------------------------------------------------------------
    def prefilled(self, job: Job) -> None:
        hl = job.blocks
        states = set(job.captures)
        if job.resume:
            states.add(job.resume)
        job.state = (self.gpu.hold_prompt(hl, self.B, states, job.state[0], job.max_blocks), ())
        self.store_step(job, len(hl))
        self._probe_restart(job.hashes_bytes())

    def store_step(self, job: Job, blocks: int) -> None:
        """vLLM offers every computed block's KV key and, where the prefill left a state,
        its state key, one step at a time; the manager stores what is new and queues its
        SSD copies on the drive."""
        first = job.stored
        if blocks <= first:
            return
        job.stored = blocks
        B, orch = self.B, self.orch
        hb = job.hashes_bytes()
        captures = set(job.captures)
        step = self.step_blocks
        for lo in range(first, blocks, step):  # at most one vLLM step's blocks at a time
            keys: list[bytes] = []
            positions: list[int] = []
            for i in range(lo, min(lo + step, blocks)):
                pos = (i + 1) * B
                keys.append(hb[i] + _KVS)
                positions.append(pos)
                if pos in captures:
                    keys.append(hb[i] + _STS)
                    positions.append(pos)
                    self.n["state_offers"] += 1
            stored, _, _ = orch.offer(job.request_id, keys, positions, hb, job.input_tokens)
            self.n["states_stored"] += sum(k.endswith(_STS) for k in stored)
            orch.complete_store(stored, True)
            dropped = {}
            for w in orch.take_ssd_writes():
                nbytes = self.sb if w.is_state else self.kvb
                if not self.ssd_write(nbytes, self._written, w.key):
                    dropped[w.key] = False  # the engine's writer rejects it: queue full
            if dropped:
                orch.on_ssd_written(dropped)

    def _written(self, key: bytes) -> None:
        self.orch.on_ssd_written({key: True})

    def _probe_restart(self, hb: list[bytes]) -> None:
        entries, n = self.orch.entries, self.n
        best_any = best_ssd = 0
        all_ssd = True
        for i, h in enumerate(hb):
            e = entries.get(h + _KVS)
            if e is None or not e.readable:
                break
            all_ssd = all_ssd and e.on_ssd
            s = entries.get(h + _STS)
            if s is not None and s.readable:
                best_any = i + 1
                if all_ssd and s.on_ssd:
                    best_ssd = i + 1
        n["restorable_tokens"] += best_any * self.B
        n["restorable_from_ssd_tokens"] += best_ssd * self.B

    def finished(self, job: Job) -> None:
        self.gpu.release(reversed(job.state[0]))
        self.orch.request_finished(job.request_id)

    def stats(self) -> dict:
        out = dict(self.n)
        out.update(self.orch.stats)
        out["gpu_overcommit"] = self.gpu.overcommit
        out["dram_used"] = self.core.usage(Tier.DRAM)
        out["ssd_used"] = self.core.usage(Tier.SSD)
        if out["restorable_tokens"]:
            out["restart_survival"] = round(
                out["restorable_from_ssd_tokens"] / out["restorable_tokens"], 4)
        if hasattr(self.core, "tau_model"):
            out["tau_s"] = round(self.core.ev.tau, 1)
        return out


class HiState(CoreAdapter):
    name = "histate"


class AlignAblation(CoreAdapter):
    """HiState with vLLM align-mode checkpoints (a state at every prefill chunk end)."""

    name = "align"

    def __init__(self, ctx: PolicyContext):
        chunk = max(ctx.block_tokens, ctx.chunk_tokens // ctx.block_tokens * ctx.block_tokens)
        super().__init__(ctx, interval=chunk)


class Fixed32Ablation(CoreAdapter):
    name = "fixed-32"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx, interval=32 * ctx.block_tokens)


class LruDiskAblation(CoreAdapter):
    name = "lru-disk"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx, core="lru")


class MirrorAblation(CoreAdapter):
    """HiState whose SSD never drops the backup of what DRAM holds (the write-through
    mirror): what a restart finds against the capacity the two tiers add up to."""

    name = "histate-mirror"

    def __init__(self, ctx: PolicyContext):
        super().__init__(ctx, keep_backups=True)
