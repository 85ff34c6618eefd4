"""HiState in the simulator: the real `histate_vllm.policy` core driven as the vLLM connector's
manager (histate_vllm/manager.py) drives it, over the same vLLM-like GPU prefix cache as the
baselines.

Per request:
* lookup: GPU hit g from vLLM's prefix cache; then, as vLLM's offloading scheduler does
  through `manager.lookup`, the KV chunks held in DRAM/SSD from block g on and the deepest
  state among them give the offload hit p. If p > g, the KV of blocks [g, p) and the state at
  p are loaded from their fastest tier (pinned and `hit()` like `prepare_load`, unpinned when
  loaded).
  Then `plan_captures(request, blocks, L, resume)`: the prefill leaves states exactly there
  (HiState's scheduler ends prefill chunks at planned positions).
* prefilled: like `prepare_store` + `take_ssd_writes`: every full block's KV not yet held is
  offered to DRAM, then each planned state (in position order, `terminal` at the prompt end);
  what DRAM accepted is committed and copied to SSD (KV first; a state only once every KV
  chunk before it is on SSD); after each SSD commit `keep()` decides whether the DRAM copy
  stays. Evictions the core names are dropped from the books.
* finished: the GPU blocks are freed; `request_finished`.
Writes complete instantly (the SSD write queue is assumed to keep up; it is off the TTFT
path). Keys: 8-byte block id + 4-byte group (0 = attention KV, 1 = recurrent state).

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

from histate_vllm.policy import Item, Kind, Tier, make_policy

from ..sim.gpu import GpuPrefixCache
from ..sim.job import Job
from .base import PolicyContext, SimPolicy

KV_GROUP, STATE_GROUP = 0, 1
_KVS = KV_GROUP.to_bytes(4, "big")
_STS = STATE_GROUP.to_bytes(4, "big")
_DRAM, _SSD = Tier.DRAM, Tier.SSD
_BIT = {Tier.DRAM: 1, Tier.SSD: 2}
_D, _S = 1, 2


class CoreAdapter(SimPolicy):
    name = "histate"

    def __init__(self, ctx: PolicyContext, core: str = "histate",
                 interval: str | int = "adaptive", **options):
        super().__init__(ctx)
        self.kvb, self.sb = ctx.kv_block_bytes, ctx.state_bytes
        self.gpu = GpuPrefixCache(ctx.gpu_bytes, self.kvb, self.sb)
        if core == "histate":
            options = {**ctx.core_options, **options}
        self.core = make_policy(
            core,
            budgets={_DRAM: ctx.dram_bytes, _SSD: ctx.ssd_bytes},
            block_tokens=self.B,
            interval=interval,
            clock=ctx.clock,
            kv_groups=[KV_GROUP],
            state_groups=[STATE_GROUP],
            **options,
        )
        # The manager's books: tiers holding a copy of each key (1 = DRAM, 2 = SSD).
        self.book: dict[bytes, int] = {}
        self.n = {"loads": 0, "dram_evictions": 0, "ssd_evictions": 0, "demotions": 0,
                  "state_offers": 0, "states_admitted": 0, "ssd_state_skips": 0,
                  "spills": 0, "spill_state_skips": 0, "restorable_tokens": 0,
                  "restorable_from_ssd_tokens": 0}

    # -- lookup ------------------------------------------------------------------------------
    def lookup(self, job: Job) -> None:
        B, hl, limit, book = self.B, job.blocks, job.max_blocks, self.book
        hb = job.hashes_bytes()
        g, k = self.gpu.hit(hl, limit)
        # vLLM's offloading scheduler asks the manager key by key from the GPU hit on: KV
        # chunks while they are held, then the deepest state among them.
        j = g
        while j < limit and hb[j] + _KVS in book:
            j += 1
        p = j
        while p > g and hb[p - 1] + _STS not in book:
            p -= 1
        job.shared = max(k, j) * B
        job.gpu_hit = g * B
        loaded: list[bytes] = []
        if p > g:
            loaded = [h + _KVS for h in hb[g:p]]
            loaded.append(hb[p - 1] + _STS)
            for key in loaded:
                nbytes = self.sb if key.endswith(_STS) else self.kvb
                if book[key] & _D:
                    job.dram_bytes += nbytes
                else:
                    job.ssd_bytes += nbytes
            self.core.pin(loaded)
            self.core.hit(loaded)
            self.n["loads"] += 1
            job.resume = p * B
        else:
            job.resume = g * B
        job.captures = self.core.plan_captures(job.request_id, hb, job.input_tokens, job.resume)
        held = list(hl[:g])
        if g:
            held.append(~hl[g - 1])
        self.gpu.acquire(held)
        job.state = (held, loaded)

    def loaded(self, job: Job) -> None:
        self.core.unpin(job.state[1])

    # -- store -------------------------------------------------------------------------------
    def prefilled(self, job: Job) -> None:
        B, hl = self.B, job.blocks
        states = set(job.captures)
        if job.resume:
            states.add(job.resume)
        gpu_keys: list[int] = []
        for i, h in enumerate(hl):
            gpu_keys.append(h)
            if (i + 1) * B in states:
                gpu_keys.append(~h)
        self.gpu.acquire(gpu_keys)
        self.gpu.release(job.state[0])
        job.state = (gpu_keys, ())
        self._offload(job)

    def _offload(self, job: Job) -> None:
        B, core, book = self.B, self.core, self.book
        hb = job.hashes_bytes()
        rid = job.request_id
        kv_items = []
        for i, h in enumerate(hb):
            key = h + _KVS
            if key not in book:
                kv_items.append(Item(key, h, hb[i - 1] if i else None, Kind.KV, (i + 1) * B,
                                     self.kvb, False, rid))
        staged: list[Item] = []
        if kv_items:
            self._apply(core.admit(kv_items, _DRAM), _DRAM, {it.key: it for it in kv_items},
                        staged)
        end = job.prompt_end
        for pos in job.captures:
            i = pos // B - 1
            key = hb[i] + _STS
            if key in book:
                continue
            self.n["state_offers"] += 1
            item = Item(key, hb[i], hb[i - 1] if i else None, Kind.STATE, pos, self.sb,
                        pos >= end, rid)
            if self._apply(core.admit([item], _DRAM), _DRAM, {key: item}, staged):
                self.n["states_admitted"] += 1
        if staged and self.ctx.ssd_bytes > 0:
            self._write_ssd(staged, hb)
        self._apply_demotions()
        self._probe_restart(hb)

    def _apply_demotions(self) -> None:
        """Copies the policy dropped on its own (historical checkpoints leaving DRAM, what a
        lost KV chunk took along), as the manager's `apply_demotions`."""
        demotions = getattr(self.core, "demotions", None)
        if demotions is None:
            return
        book = self.book
        for tier in (_DRAM, _SSD):
            bit = _BIT[tier]
            for key in demotions(tier):
                bits = book.get(key, 0) & ~bit
                if bits:
                    book[key] = bits
                else:
                    book.pop(key, None)

    def _probe_restart(self, hb: list[bytes]) -> None:
        book, n = self.book, self.n
        best_any = best_ssd = 0
        all_ssd = True
        for i, h in enumerate(hb):
            b = book.get(h + _KVS, 0)
            if not b:
                break
            all_ssd = all_ssd and bool(b & _S)
            s = book.get(h + _STS, 0)
            if s:
                best_any = i + 1
                if all_ssd and s & _S:
                    best_ssd = i + 1
        n["restorable_tokens"] += best_any * self.B
        n["restorable_from_ssd_tokens"] += best_ssd * self.B

    def _write_ssd(self, staged: list[Item], hb: list[bytes]) -> None:
        core, book, B = self.core, self.book, self.B
        on_ssd = None  # leading blocks whose KV is on SSD (computed when a state needs it)
        for item in staged:
            key = item.key
            if not book.get(key, 0) & _D:
                continue  # evicted from DRAM meanwhile: nothing to copy from
            if item.kind is Kind.STATE:
                if on_ssd is None:
                    on_ssd = 0
                    while on_ssd < len(hb) and book.get(hb[on_ssd] + _KVS, 0) & _S:
                        on_ssd += 1
                if on_ssd < item.position // B:
                    self.n["ssd_state_skips"] += 1
                    continue
            adm = core.admit([item], _SSD)
            if adm is None or key not in adm.accepted:
                continue
            if self._drop(adm.evict):
                on_ssd = None
            self._spill(adm.spill)
            book[key] = book.get(key, 0) | _S
            core.committed(key, _SSD, True)
            if book[key] & _D and not core.keep(key, _DRAM):
                book[key] &= ~_D
                self.n["demotions"] += 1

    def _apply(self, adm, tier: Tier, items: dict[bytes, Item], staged: list[Item]) -> bool:
        if adm is None:
            return False
        self._drop(adm.evict)
        self._spill(adm.spill)
        bit = _BIT[tier]
        book, core = self.book, self.core
        for key in adm.accepted:
            book[key] = book.get(key, 0) | bit
            core.committed(key, tier, True)
            staged.append(items[key])
        return bool(adm.accepted)

    def _spill(self, keys: list[bytes]) -> None:
        """DRAM evictions that move to SSD: copied from the DRAM copy (instant here), KV
        first; a state only if every KV chunk before it is on SSD (its manifest names them),
        as the manager writes them."""
        if not keys:
            return
        core, book = self.core, self.book
        keys = sorted(keys, key=lambda k: k.endswith(_STS))
        for key in keys:
            if key.endswith(_STS):
                refs = core.manifest_keys(key)
                if refs is None or not all(book.get(k, 0) & _S for k in refs):
                    self.n["spill_state_skips"] += 1
                    core.committed(key, _SSD, False)
                    continue
            book[key] = book.get(key, 0) | _S
            core.committed(key, _SSD, True)
            self.n["spills"] += 1

    def _drop(self, evict) -> bool:
        """Forget evicted copies; True if an SSD copy of a KV chunk went."""
        book = self.book
        kv_ssd = False
        for key, tier in evict:
            bits = book.get(key)
            if bits is None:
                continue
            bit = _BIT[tier]
            if tier == _DRAM:
                self.n["dram_evictions"] += 1
            else:
                self.n["ssd_evictions"] += 1
                kv_ssd |= key.endswith(_KVS)
            bits &= ~bit
            if bits:
                book[key] = bits
            else:
                del book[key]
        return kv_ssd

    def finished(self, job: Job) -> None:
        self.gpu.release(reversed(job.state[0]))
        self.core.request_finished(job.request_id)

    def stats(self) -> dict:
        out = dict(self.n)
        out["gpu_overcommit"] = self.gpu.overcommit
        out["dram_used"] = self.core.usage(_DRAM)
        out["ssd_used"] = self.core.usage(_SSD)
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
