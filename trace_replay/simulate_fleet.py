"""A fleet of N engines in the simulator: one workload, a router, and per engine the same
caching system and budgets (GPU, DRAM, SSD); optionally a tier every engine shares.

    from trace_replay.simulate_fleet import FleetConfig, simulate_fleet
    rows = simulate_fleet(workload, SimConfig(), FleetConfig(engines=4), seeds=[0, 1, 2])

Rows (`ROWS`): router, caching system, shared tier.
* `hash`: consistent hashing on the main session's id; HiState per engine; no fleet tier.
* `load`: least outstanding prefill tokens; HiState per engine; no fleet tier.
* `load+fleet`: least outstanding prefill tokens; HiState per engine, each publishing the
  checkpoints it writes to SSD to the fleet tier and restoring from it (policies/fleet.py).
* `load+native`: least outstanding prefill tokens; vLLM 0.34's native offloading
  (`FleetConfig.native`) per engine, its file tier one directory shared by all engines,
  with the disk of the other rows: N x the SSD budget + the fleet tier's budget.
* `bounded`, `bounded+fleet`: consistent hashing with bounded loads (a session moves only
  off an engine over 1.25 x the mean outstanding prefill tokens); without, with the fleet
  tier.
The fleet tier's and the shared file tier's transfers go over each engine's own fleet link
(bandwidth and latency from FleetConfig); every engine has its own SSD drive and
host-to-device link. One event loop and one clock for the fleet (sim/engine.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from .policies.base import PolicyContext
from .policies.fleet import FleetHiState, SharedFileNative, native_options
from .policies.histate import HiState
from .policies.lru_tiers import _Tier
from .sim import SimClock, Simulator
from .sim.arc import ArcStore
from .sim.drive import Drive
from .sim.engine import Engine, RunResult
from .sim.fleet import (
    DEFAULT_FLEET_BYTES,
    DEFAULT_FLEET_LATENCY,
    DEFAULT_FLEET_QUEUE_BYTES,
    DEFAULT_FLEET_READ_BW,
    DEFAULT_FLEET_WRITE_BW,
    ROUTERS,
    FleetTierModel,
)
from .sim.lru import LruStore
from .simulate import Prepared, SimConfig, prepare

# row -> (router, caching system, shared tier)
ROWS = {
    "hash": ("consistent_hash", "histate", None),
    "load": ("least_loaded", "histate", None),
    "load+fleet": ("least_loaded", "histate", "fleet"),
    "load+native": ("least_loaded", "native", "file"),
    "bounded": ("bounded_hash", "histate", None),
    "bounded+fleet": ("bounded_hash", "histate", "fleet"),
}


@dataclass(frozen=True)
class FleetConfig:
    engines: int = 4
    fleet_bytes: int = DEFAULT_FLEET_BYTES
    fleet_read_bw: float = DEFAULT_FLEET_READ_BW  # bytes/s, per engine's link
    fleet_write_bw: float = DEFAULT_FLEET_WRITE_BW
    fleet_latency: float = DEFAULT_FLEET_LATENCY  # s per restore
    fleet_queue_bytes: int | None = DEFAULT_FLEET_QUEUE_BYTES
    native: str = "vllm034-lru-r4"

    def __post_init__(self):
        if self.engines < 1:
            raise ValueError(f"engines must be >= 1, got {self.engines}")
        if min(self.fleet_read_bw, self.fleet_write_bw) <= 0 or self.fleet_latency < 0:
            raise ValueError("fleet bandwidths must be > 0 and its latency >= 0")
        native_options(self.native)

    def link(self) -> Drive:
        return Drive(self.fleet_read_bw, self.fleet_write_bw,
                     queue_bytes=self.fleet_queue_bytes)


def run_row(prep: Prepared, fleet: FleetConfig, row: str, route=None
            ) -> tuple[RunResult, dict]:
    """One replay of `row` on `fleet.engines` engines: (the run, the shared tier's stats).
    route: another router than the row's (route(job, session, engines) -> engine)."""
    router, system, shared = ROWS[row]
    cost, clock, n = prep.config.cost(), SimClock(), fleet.engines
    tier = FleetTierModel(fleet.fleet_bytes) if shared == "fleet" else None
    files = None
    if shared == "file":
        store = {"lru": LruStore, "arc": ArcStore}[native_options(fleet.native)[0]]
        files = _Tier(n * prep.ctx_args["ssd_bytes"] + fleet.fleet_bytes, None, store)
    engines = []
    for _ in range(n):
        drive = prep.config.drive()
        link = fleet.link() if shared else None
        ctx = PolicyContext(cost=cost, clock=clock, drive=drive if system == "histate" else link,
                            **prep.ctx_args)
        if system == "native":
            policy = SharedFileNative(ctx, fleet.native, files)
        elif tier is not None:
            policy = FleetHiState(ctx, tier, link, fleet.fleet_latency)
        else:
            policy = HiState(ctx)
        engines.append(Engine(policy, drive, link, fleet.fleet_latency if shared else 0.0))
    sim = Simulator(prep.replay, cost, None, clock, chunk_tokens=prep.ctx_args["chunk_tokens"],
                    charge_chunk_ends=prep.ctx_args["step_cost_tokens"] > 0,
                    engines=engines, route=route or ROUTERS[router](prep.replay, n))
    res = sim.run()
    extra = tier.summary() if tier is not None else {}
    if files is not None:
        extra = {"file_used_bytes": files.kv.used, "file_evictions": files.evictions}
    return res, extra


def moved(prep: Prepared, engine: np.ndarray) -> float:
    """Share of the requests after a session's first served by another engine than the
    session's previous request."""
    n = m = 0
    for s, off in zip(prep.replay.sessions, prep.replay.offset):
        for k in range(1, len(s.requests)):
            n += 1
            m += engine[off + k] != engine[off + k - 1]
    return m / n if n else 0.0


def metrics(prep: Prepared, res: RunResult, extra: dict) -> dict:
    inp = np.array([r.input_tokens for r in prep.replay.requests], dtype=np.int64)
    st = res.stats
    return {
        "ttft_mean": float(np.mean(res.ttft)),
        "ttft_p99": float(np.percentile(res.ttft, 99)),
        "cached": float(res.hit.sum() / inp.sum()),
        "fleet_tokens": st.get("fleet_restored_tokens", 0) / float(inp.sum()),
        "fleet_read_gb": float(res.fleet_bytes.sum()) / 1e9,
        "moved": float(moved(prep, res.engine)),
        "requests_per_engine": np.bincount(res.engine, minlength=len(st.get("engines", [0])))
        .tolist(),
        "wall_s": res.wall_s,
        "stats": {k: v for k, v in st.items() if k != "engines"},
        "shared_tier": extra,
    }


def simulate_fleet(workload, config: SimConfig, fleet: FleetConfig, rows: list[str],
                   seeds: list[int], progress=None) -> dict:
    """Every row on every admission order (seed): {"settings", "rows": {row: [per seed]}}."""
    for row in rows:
        if row not in ROWS:
            raise ValueError(f"unknown row {row!r}; valid: {', '.join(ROWS)}")
    out: dict = {"settings": {**{k: v for k, v in asdict(config).items() if k != "replay"},
                              **asdict(config.replay), **asdict(fleet), "seeds": seeds},
                 "rows": {row: [] for row in rows}}
    for seed in seeds:
        prep = prepare(workload, replace(config, replay=replace(config.replay, seed=seed)))
        out["workload"] = {"name": workload.name, "sessions": len(workload.sessions),
                           "requests": len(prep.replay.requests),
                           "context_dropped_requests": prep.context_dropped}
        for row in rows:
            t0 = time.perf_counter()
            m = metrics(prep, *run_row(prep, fleet, row))
            m["seed"] = seed
            out["rows"][row].append(m)
            if progress is not None:
                progress(row, seed, m, time.perf_counter() - t0)
    return out
