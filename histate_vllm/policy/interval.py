"""Adaptive checkpoint interval (HiState §3.2) and the online estimates it needs.

For a new segment of L tokens, I* = argmin_I [ r·(L/I)·N_s + (1/L)·Σ_{t<L} (t mod I) ] with
r = T_kv / T_state (EMA residence times of KV chunks and of checkpoints) and N_s the size of
one checkpoint in KV-token equivalents; continuous solution sqrt(2·L·N_s·r). The discrete
minimum is taken over multiples of the block size around the continuous one.

The objective weighs one checkpoint's storage against the recomputation of one internal hit
per segment, a token for a token. Two measured factors make both sides what the workload
pays: `price`, KV tokens later prompts recompute per KV token eviction deletes (ghost.py),
and `hit_rate`, internal hits per new segment (the core observes them; 1, the paper's
assumption, until measured). The weight on storage is w = r·price/hit_rate, and
I* = sqrt(2·L·N_s·w). Until eviction has deleted anything the price is unknown and w = r,
the paper's model (storage priced by how full the cache is would put dense checkpoints on
long cold prompts before anything is known, which the raw Weka replay pays for).

`on_credit` (the core's `credit` option, while eviction has deleted nothing): storage is
free, w = 0, and the checkpoints so planned are held on terms that let them displace nothing
(core.py, "credit").
"""

from __future__ import annotations

import math


class Ema:
    __slots__ = ("alpha", "value", "count")

    def __init__(self, alpha: float, initial: float | None = None):
        self.alpha = alpha
        self.value = initial
        self.count = 0

    def update(self, x: float) -> float:
        self.count += 1
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)
        return self.value

    def get(self, default: float) -> float:
        return default if self.value is None else self.value


def recompute_cost(length: int, interval: int) -> float:
    """(1/L)·Σ_{t=0}^{L-1} (t mod I): mean tokens recomputed by an internal hit, uniform p_t."""
    if length <= 0:
        return 0.0
    full, rest = divmod(length, interval)
    return (full * interval * (interval - 1) / 2 + rest * (rest - 1) / 2) / length


class IntervalModel:
    """Online estimates (N_s, T_kv, T_state) and the interval they imply.

    `fixed` (tokens) bypasses the model: the ablation "fixed interval" of the paper.
    """

    def __init__(self, block_tokens: int, fixed: int | None = None, alpha: float = 0.1,
                 default_ns_tokens: float | None = None):
        self.block_tokens = block_tokens
        self.fixed = fixed
        self.kv_bytes_per_token = Ema(alpha)
        self.state_bytes = Ema(alpha)  # bytes of one whole checkpoint (all state groups)
        self.t_kv = Ema(alpha)
        self.t_state = Ema(alpha)
        self.default_ns_tokens = default_ns_tokens or 4.0 * block_tokens
        self.price: float | None = None  # KV recomputed per KV deleted (ghost.py)
        self.on_credit = False  # storage is free until eviction first deletes (core.py)
        # Internal hits per segment: decayed counts over ~1024 segments; the prior, a rate
        # of 1 (the paper's), weighs as 16 segments.
        self._hits = self._segments = 16.0
        self._memo: dict[tuple[int, int, float, int], int] = {}

    # -- observations ------------------------------------------------------------------------
    def observe_kv_chunk(self, nbytes_all_groups: int) -> None:
        self.kv_bytes_per_token.update(nbytes_all_groups / self.block_tokens)

    def observe_checkpoint(self, nbytes_all_groups: int) -> None:
        self.state_bytes.update(nbytes_all_groups)

    def observe_residence(self, is_state: bool, seconds: float) -> None:
        ema = self.t_state if is_state else self.t_kv
        v = ema.value
        x = seconds if seconds > 0.0 else 0.0
        ema.count += 1
        ema.value = x if v is None else v + ema.alpha * (x - v)

    # -- derived -----------------------------------------------------------------------------
    @property
    def ns_tokens(self) -> float:
        kvt = self.kv_bytes_per_token.value
        sb = self.state_bytes.value
        if not kvt or sb is None:
            return self.default_ns_tokens
        return sb / kvt

    @property
    def pressure(self) -> float:
        """T_kv / T_state; 1 until both have been observed."""
        tk, ts = self.t_kv.value, self.t_state.value
        if tk is None or ts is None or ts <= 0 or tk <= 0:
            return 1.0
        return min(max(tk / ts, 1e-3), 1e3)

    def observe_segment(self, internal_hit: bool) -> None:
        """One planned segment; `internal_hit`: its prompt left a cached context inside."""
        d = 1.0 - 1.0 / 1024
        self._hits = self._hits * d + (1.0 if internal_hit else 0.0)
        self._segments = self._segments * d + 1.0

    @property
    def hit_rate(self) -> float:
        return self._hits / self._segments

    @property
    def weight(self) -> float:
        """One KV-token equivalent of checkpoint against one token of an internal hit's
        recomputation: r·price/hit_rate."""
        if self.price is None:  # not priced yet: free on credit, else the paper's model
            w = 0.0 if self.on_credit else self.pressure
        else:
            w = self.pressure * self.price / max(self.hit_rate, 1e-3)
        return min(max(w, 1e-3), 1e3)

    def continuous(self, length: int) -> float:
        return math.sqrt(2.0 * length * self.ns_tokens * self.weight)

    def cost(self, length: int, interval: int) -> float:
        return self.weight * (length / interval) * self.ns_tokens + recompute_cost(
            length, interval
        )

    def choose(self, length: int, step_tokens: float = 0.0) -> int:
        """Interval in tokens (a multiple of the block size, >= one block) for a segment.

        `step_tokens`: what else one checkpoint costs, in tokens of prefill (the engine step
        it adds where it is not a chunk end vLLM takes anyway; chunk_grid.py).
        Exact argmin over block multiples in [bt, L]: start at the continuous optimum and walk
        outwards while the lower bound A/I + (I-1)/2 - I^2/(8L) of the cost (the remainder term
        is -r(I-r)/(2L) >= -I^2/(8L)) can still beat the best so far.
        """
        bt = self.block_tokens
        if self.fixed is not None:
            return max(bt, (self.fixed // bt) * bt)
        if length <= bt:
            return bt
        # The estimates drift a little with every observation; whole tokens and a 1e-3
        # weight step are plenty for the choice and let equal lengths share one search.
        ns, w, step = round(self.ns_tokens), round(self.weight, 3), round(max(step_tokens, 0))
        key = (length, ns, w, step)
        got = self._memo.get(key)
        if got is None:
            if len(self._memo) > 4096:
                self._memo.clear()
            got = self._memo[key] = self._search(length, w * ns + step)
        return got

    def _search(self, length: int, per: float) -> int:
        """per: one checkpoint's cost in tokens of recomputation."""
        bt = self.block_tokens
        kmax = -(-length // bt)
        a = per * length
        k0 = min(max(1, round(math.sqrt(2.0 * a) / bt)), kmax)

        def cost(k: int) -> float:
            return a / (k * bt) + recompute_cost(length, k * bt)

        best_k, best = k0, cost(k0)

        def bound(k: int) -> float:
            i = k * bt
            return a / i + (i - 1) / 2 - i * i / (8 * length)

        for step in (-1, 1):
            k = k0 + step
            while 1 <= k <= kmax and bound(k) <= best:
                c = cost(k)
                if c < best or (c == best and k < best_k):
                    best_k, best = k, c
                k += step
        return best_k * bt
