"""`python -m trace_replay fleet`: N simulated engines behind a router, with and without a
tier they share (trace_replay/simulate_fleet.py); prints a markdown table over the seeds.

    python -m trace_replay fleet ../shared/traces/weka --format weka --seeds 0,1,2 \\
        --json fleet.json
    python -m trace_replay fleet --report fleet.json [more.json ...]   # the tables again
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .costmodel import DEFAULT_DRAM_BYTES, DEFAULT_SSD_BYTES, DEVICES, MODELS, GiB
from .sim.fleet import (
    DEFAULT_FLEET_BYTES,
    DEFAULT_FLEET_LATENCY,
    DEFAULT_FLEET_READ_BW,
    DEFAULT_FLEET_WRITE_BW,
)

ROW_NAMES = {
    "hash": "(a) consistent_hash, HiState per engine, no fleet tier",
    "load": "(b') least-loaded, HiState per engine, no fleet tier",
    "load+fleet": "(b) least-loaded, HiState per engine + fleet tier",
    "load+native": "(c) least-loaded, {native}, shared file tier",
    "bounded": "(d') consistent_hash with bounded loads, HiState per engine, no fleet tier",
    "bounded+fleet": "(d) consistent_hash with bounded loads, HiState per engine + fleet tier",
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_parser(sub) -> None:
    from .cli import _add_inputs, _gib

    f = sub.add_parser("fleet", help="N engines behind a router, with and without a shared "
                       "fleet tier")
    _add_inputs(f)
    f.add_argument("--report", type=Path, nargs="+", help="print the tables of saved JSONs")
    f.add_argument("--rows", default="hash,load,load+fleet,load+native",
                   help="comma-separated rows: hash, load, load+fleet, load+native, "
                   "bounded, bounded+fleet")
    f.add_argument("--engines", type=int, default=4)
    f.add_argument("--seeds", type=_ints, default=[0, 1, 2], help="admission orders, e.g. 0,1,2")
    f.add_argument("--concurrency", type=int, default=None,
                   help="live main sessions in the whole fleet (default 24 per engine)")
    f.add_argument("--ramp", type=float, default=None,
                   help="s over which the first sessions start (default 600 for recorded "
                        "traces, 0 for synthetic)")
    f.add_argument("--model", choices=sorted(MODELS), default="qwen3.5-9b")
    f.add_argument("--device", choices=sorted(DEVICES), default="h100")
    f.add_argument("--dram-gib", type=_gib, dest="dram_bytes", default=DEFAULT_DRAM_BYTES,
                   help=f"per engine (default {DEFAULT_DRAM_BYTES / GiB:g})")
    f.add_argument("--ssd-gib", type=_gib, dest="ssd_bytes", default=DEFAULT_SSD_BYTES,
                   help=f"per engine (default {DEFAULT_SSD_BYTES / GiB:g})")
    f.add_argument("--fleet-gib", type=_gib, dest="fleet_bytes", default=DEFAULT_FLEET_BYTES,
                   help=f"the fleet tier's budget, LRU (default {DEFAULT_FLEET_BYTES / GiB:g})")
    f.add_argument("--fleet-read-gbps", type=float, default=DEFAULT_FLEET_READ_BW / 1e9,
                   help="restore bandwidth of each engine's fleet link (default: "
                        "bench_fleet_tier.py, DirBackend on local disk)")
    f.add_argument("--fleet-write-gbps", type=float, default=DEFAULT_FLEET_WRITE_BW / 1e9,
                   help="publish bandwidth of each engine's fleet link")
    f.add_argument("--fleet-latency-ms", type=float, default=DEFAULT_FLEET_LATENCY * 1e3,
                   help="added to each restore from the fleet tier")
    f.add_argument("--native", default="vllm034-lru-r4",
                   help="vLLM 0.34 native setting of row load+native")
    f.add_argument("--json", type=Path)


def cmd_fleet(a: argparse.Namespace) -> int:
    if a.report:
        for path in a.report:
            print_tables(json.loads(path.read_text()))
        return 0
    from .cli import load_inputs
    from .sim import ReplaySettings
    from .simulate import SimConfig
    from .simulate_fleet import FleetConfig, simulate_fleet

    wl = load_inputs(a.traces, a.format, a.synth)
    ramp = a.ramp if a.ramp is not None else (600.0 if wl.arrivals == "recorded" else 0.0)
    cfg = SimConfig(model=a.model, device=a.device, dram_bytes=a.dram_bytes,
                    ssd_bytes=a.ssd_bytes,
                    replay=ReplaySettings(concurrency=a.concurrency or 24 * a.engines,
                                          ramp=ramp))
    fleet = FleetConfig(engines=a.engines, fleet_bytes=a.fleet_bytes,
                        fleet_read_bw=a.fleet_read_gbps * 1e9,
                        fleet_write_bw=a.fleet_write_gbps * 1e9,
                        fleet_latency=a.fleet_latency_ms / 1e3, native=a.native)

    def progress(row, seed, m, dt):
        print(f"  {row} seed {seed}: mean {m['ttft_mean']:.3f} s, p99 {m['ttft_p99']:.3f} s, "
              f"cached {m['cached']:.1%} ({dt:.0f} s)", file=sys.stderr, flush=True)

    rep = simulate_fleet(wl, cfg, fleet, [r for r in a.rows.split(",") if r], a.seeds,
                         progress)
    rep["command"] = " ".join(["python -m trace_replay", *sys.argv[1:]])
    print_tables(rep)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(rep))
        print(f"wrote {a.json}")
    return 0


def _spread(xs: list[float], fmt: str, unit: str = "") -> str:
    """The mean over the seeds, then the range (one seed: its value)."""
    mean = sum(xs) / len(xs)
    if len(xs) == 1:
        return format(mean, fmt) + unit
    return f"{format(mean, fmt)}{unit} ({format(min(xs), fmt)}-{format(max(xs), fmt)})"


def print_tables(rep: dict) -> None:
    s, w = rep["settings"], rep["workload"]
    print(f"{w['name']}: {w['sessions']} sessions, {w['requests']} requests; "
          f"{s['engines']} engines, {s['concurrency']} live sessions, seeds "
          f"{','.join(map(str, s['seeds']))}; fleet link {s['fleet_read_bw'] / 1e9:g} GB/s "
          f"restore, {s['fleet_write_bw'] / 1e9:g} GB/s publish, "
          f"{s['fleet_latency'] * 1e3:g} ms; fleet tier {s['fleet_bytes'] / GiB:g} GiB\n")
    print("| row | TTFT mean (s) | TTFT p99 (s) | cached tokens | restored from the fleet "
          "tier | read over the fleet links (GB) | turns moved |")
    print("|---|---|---|---|---|---|---|")
    for row, runs in rep["rows"].items():
        name = ROW_NAMES.get(row, row).format(native=s.get("native", ""))
        print(f"| {name} | {_spread([r['ttft_mean'] for r in runs], '.3f')} | "
              f"{_spread([r['ttft_p99'] for r in runs], '.2f')} | "
              f"{_spread([100 * r['cached'] for r in runs], '.1f', '%')} | "
              f"{_spread([100 * r['fleet_tokens'] for r in runs], '.2f', '%')} | "
              f"{_spread([r['fleet_read_gb'] for r in runs], '.0f')} | "
              f"{_spread([100 * r['moved'] for r in runs], '.0f', '%')} |")
    print()
