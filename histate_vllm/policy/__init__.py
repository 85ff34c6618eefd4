"""HiState's model-free policy core: where to checkpoint, where to keep it, what to evict.

Pure Python (msgspec for events); imports neither vllm nor torch, so the connector's
offloading manager and the trace simulator drive exactly the same code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence

from .base import PolicyCore
from .events import Event, decode_events, encode_events
from .explain import explain_log
from .interval import IntervalModel
from .lru import LRUPolicy
from .options import OPTIONS, check_options
from .planner import CapturePlanner, Plan
from .types import Admission, Hit, Item, Kind, Tier, key_group, make_key

POLICIES = ("histate", "lru")


def make_policy(
    name: str = "histate",
    budgets: Mapping[Tier, int] | None = None,
    block_tokens: int = 256,
    interval: str | int = "adaptive",
    clock: Callable[[], float] = time.monotonic,
    *,
    identity: bytes = b"",
    kv_groups: Sequence[int] | None = None,
    state_groups: Sequence[int] | None = None,
    learn_min_tokens: int = 512,
    max_intermediate: int = 16,
    chunk_tokens: int | None = None,
    step_cost_tokens: float = 0.0,
    record: str | None = "",
    **options,
) -> PolicyCore:
    """Build a policy by name (`histate` or the `lru` ablation).

    budgets: bytes per managed tier (DRAM, SSD); a missing tier has budget 0.
    interval: "adaptive" (HiState I*) or a fixed interval in tokens (rounded down to blocks).
    kv_groups / state_groups: the KV-cache group ids of attention KV and of recurrent state
        (the 4-byte suffix of every key). Unset: learned from admitted keys; until a state
        group has been seen no position is restorable. Attention-only model: state_groups=[].
    learn_min_tokens: a learned boundary needs a cached prefix this far past the restore point.
    max_intermediate: cap on interval checkpoints per request (required ones always kept;
        0: none).
    chunk_tokens / step_cost_tokens: the engine's prefill chunk and the fixed cost of one more
        engine step in tokens of prefill; with both, checkpoints prefer the chunk ends the
        engine takes anyway (policy/chunk_grid.py). Unset: placed as if chunk ends were free.
    record: a file to record every call into (replay with record.replay); default: the
        HISTATE_POLICY_RECORD environment variable, if set.
    options: histate only: tau (s, GDS time scale; default: learned from reuse intervals),
        terminal_alpha (EMA weight of terminal reuse), terminal_reuse (fix q instead),
        kv_bytes_per_token (for M; else learned), keep_backups (SSD never drops the backup
        copy of what DRAM holds: restarts keep more, the tiers' capacities do not add up),
        drop_stuck (DRAM pressure deletes a historical checkpoint that cannot move to SSD
        and was not hit within tau, instead of moving live KV down in its place; off by
        default: not a robust win, benchmarks/results_trace_replay.md),
        states_lead (default on: a historical checkpoint moves to SSD ahead of the KV
        chunks before it, which stay in DRAM; a restart does not keep one written so),
        credit (off by default: until eviction first deletes KV, storage is priced at zero
        and the dense checkpoints that buys displace nothing; core.py, "Credit").
    """
    if record == "":
        # "{pid}" in the path keeps the engines of one test run apart.
        record = (os.environ.get("HISTATE_POLICY_RECORD") or "").format(pid=os.getpid()) or None
    if record:
        from .record import Recorder

        kw = dict(name=name, budgets=budgets, block_tokens=block_tokens, interval=interval,
                  identity=identity, kv_groups=kv_groups, state_groups=state_groups,
                  learn_min_tokens=learn_min_tokens, max_intermediate=max_intermediate,
                  chunk_tokens=chunk_tokens, step_cost_tokens=step_cost_tokens, **options)
        inner = make_policy(clock=clock, record=None, **kw)
        return Recorder(inner, record, kw)  # type: ignore[return-value]
    if interval == "adaptive":
        fixed = None
    elif isinstance(interval, int) and not isinstance(interval, bool) and interval > 0:
        fixed = interval
    else:
        raise ValueError(f"interval must be 'adaptive' or a positive int, got {interval!r}")
    model = IntervalModel(block_tokens, fixed=fixed)
    planner = CapturePlanner(block_tokens, model, learn_min_tokens, max_intermediate,
                             chunk_tokens, step_cost_tokens)
    budgets = dict(budgets or {})
    if name == "lru":
        return LRUPolicy(budgets, planner, clock, identity=identity, kv_groups=kv_groups,
                         state_groups=state_groups)
    if name == "histate":
        from .core import HiStatePolicy

        check_options(options)
        return HiStatePolicy(budgets, planner, clock, identity=identity, kv_groups=kv_groups,
                             state_groups=state_groups, **options)
    raise ValueError(f"unknown policy {name!r}; valid: {list(POLICIES)}")


__all__ = [
    "Admission",
    "CapturePlanner",
    "OPTIONS",
    "Event",
    "Hit",
    "IntervalModel",
    "Item",
    "Kind",
    "LRUPolicy",
    "POLICIES",
    "Plan",
    "PolicyCore",
    "Tier",
    "decode_events",
    "encode_events",
    "check_options",
    "explain_log",
    "key_group",
    "make_key",
    "make_policy",
]
