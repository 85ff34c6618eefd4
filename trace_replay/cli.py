"""Command line: `python -m trace_replay {simulate,fleet,live,synth,plot} ...` (see --help of each).

    python -m trace_replay simulate ../shared/traces/weka --format weka
        --policies histate,vllm-marconi,unlimited --json out.json       (one line)
    python -m trace_replay simulate --synth mutation:p=0.05 --policies all --json mb5.json
    python -m trace_replay synth mutation:p=0.05,seed=1 --out mb5.workload
    python -m trace_replay plot out.json mb*.json --out figures/
    python -m trace_replay live --synth append:n_sessions=2,turns=3 --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from .costmodel import DEFAULT_DRAM_BYTES, DEFAULT_SSD_BYTES, DEVICES, MODELS, GiB
from .model import Workload

DEFAULT_SSD_QUEUE_BYTES = 256 << 20  # HiStateConfig.ssd_queue_bytes (checked in tests)

ALL = "all"


def _policy_list(text: str) -> list[str]:
    from .policies import ORACLES, POLICIES

    names = [p.strip() for p in text.split(",") if p.strip()]
    if names == [ALL]:
        return [p for p in POLICIES if p not in ORACLES]
    bad = [n for n in names if n not in POLICIES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown policies {bad}; valid: {', '.join(POLICIES)}")
    return names


def load_inputs(traces: list[str], fmt: str | None, synth_specs: list[str]) -> Workload:
    """Trace files/directories, saved `.workload` files and synthetic specs, as one workload."""
    from . import load
    from .synth_spec import generate
    from .workload_io import is_workload_file, load_workload

    parts: list[Workload] = []
    trace_paths = []
    for t in traces:
        if Path(t).is_file() and is_workload_file(t):
            parts.append(load_workload(t))
        else:
            trace_paths.append(t)
    if trace_paths:
        parts.append(load(trace_paths, format=fmt))
    parts.extend(generate(s) for s in synth_specs)
    if not parts:
        raise SystemExit("no input: give trace paths or --synth SPEC")
    if len(parts) == 1:
        return parts[0]
    sizes = {p.block_size for p in parts}
    if len(sizes) > 1:
        raise SystemExit(f"inputs have different block sizes {sorted(sizes)}")
    return Workload(
        name="+".join(p.name for p in parts),
        block_size=sizes.pop(),
        sessions=tuple(s for p in parts for s in p.sessions),
        source="; ".join(p.source for p in parts),
        arrivals="recorded" if all(p.arrivals == "recorded" for p in parts) else "synthetic",
    ).validate()


def _add_inputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("traces", nargs="*", help="trace files/directories or saved .workload files")
    p.add_argument("--format", choices=["weka", "tracelab", "tracelab_csv", "mooncake"],
                   help="trace format (default: detected per file)")
    p.add_argument("--synth", action="append", default=[], metavar="SPEC",
                   help="synthetic workload, e.g. mutation:p=0.05,seed=1 (repeatable)")


def _seconds_or_none(x: str) -> float:
    if x.strip().lower() in ("none", "inf", "off"):
        return math.inf
    v = float(x)
    if v <= 0:
        raise argparse.ArgumentTypeError("--max-delay wants seconds > 0 or 'none'")
    return v


def _mib_or_none(x: str) -> int | None:
    if x.strip().lower() in ("none", "inf", "off"):
        return None
    v = float(x)
    if v <= 0:
        raise argparse.ArgumentTypeError("--ssd-queue-mib wants MiB > 0 or 'none'")
    return int(v * (1 << 20))


def _gib(x: str) -> int:
    return int(float(x) * GiB)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m trace_replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("simulate", help="replay workloads against simulated cache systems")
    _add_inputs(s)
    s.add_argument("--policies", type=_policy_list, default=_policy_list(ALL),
                   help="comma-separated policy names or 'all' (default)")
    s.add_argument("--json", type=Path, help="write the report here")
    s.add_argument("--model", choices=sorted(MODELS), default="qwen3.5-9b")
    s.add_argument("--device", choices=sorted(DEVICES), default="h100")
    s.add_argument("--gpu-gib", type=_gib, dest="gpu_bytes",
                   help="GPU prefix-cache pool (default: 0.9 x HBM - weights - 5 GiB)")
    s.add_argument("--dram-gib", type=_gib, dest="dram_bytes", default=DEFAULT_DRAM_BYTES,
                   help=f"DRAM tier (default {DEFAULT_DRAM_BYTES / GiB:g})")
    s.add_argument("--ssd-gib", type=_gib, dest="ssd_bytes", default=DEFAULT_SSD_BYTES,
                   help=f"SSD tier (default {DEFAULT_SSD_BYTES / GiB:g})")
    s.add_argument("--block-tokens", type=int, help="default: the model's vLLM block size")
    s.add_argument("--chunk-tokens", type=int, help="prefill chunk (default: per device)")
    s.add_argument("--mfu", type=float, help="override the device's sustained fraction")
    s.add_argument("--histate-option", action="append", default=[], metavar="KEY=VALUE",
                   help="option of HiState's policy, e.g. tau=3600 or max_intermediate=0 "
                        "(repeatable; histate_vllm/policy/options.py lists them)")
    s.add_argument("--ssd-writes", choices=["charged", "free"], default="charged",
                   help="charged (default): SSD writes share the drive with restores through "
                        "the engine's bounded write queue, which drops what does not fit; "
                        "free: instant and never dropped (no drive model)")
    s.add_argument("--chunk-ends", choices=["free", "charged"], default="free",
                   help="free (default): a checkpoint's extra prefill chunk end costs nothing "
                        "(a split compute-bound chunk, under the roofline); charged: one more "
                        "weight pass each (an upper bound), and HiState's planner knows it")
    s.add_argument("--breakpoints", choices=["declared", "none"], default="declared",
                   help="declared (default): the client's breakpoints the trace records (Weka: "
                        "ends of the tool definitions and system prompt) reach the server, "
                        "which checkpoints there; none: a client that marks nothing")
    s.add_argument("--ssd-queue-mib", type=_mib_or_none, dest="ssd_queue_bytes",
                   default=DEFAULT_SSD_QUEUE_BYTES,
                   help="bound on queued SSD writes, MiB, or 'none' (default: the "
                        f"connector's ssd_queue_bytes, {DEFAULT_SSD_QUEUE_BYTES >> 20})")
    s.add_argument("--ssd-write-gbps", type=float,
                   help="SSD write bandwidth, GB/s (default: the device's SSD bandwidth)")
    s.add_argument("--concurrency", type=int, default=24,
                   help="live main sessions (default 24, the paper's session concurrency)")
    s.add_argument("--concurrent-prefills", type=int, default=1, metavar="K",
                   help="prefills that advance together (default 1: vLLM's FCFS, a long "
                        "prefill holds every request behind it; K: vLLM with "
                        "--long-prefill-token-threshold = max_num_batched_tokens / K)")
    s.add_argument("--gap", choices=["arrival", "think"], default=None,
                   help="gap before a session's next request, counted from the end of the "
                        "previous one: 'arrival' = recorded arrival gap t[k+1]-t[k] "
                        "(kv-cache-tester's 'original' timing), 'think' = think_time "
                        "(default: arrival for recorded traces, think for synthetic)")
    s.add_argument("--max-delay", type=_seconds_or_none, default=None, metavar="S",
                   help="cap one gap (and a subagent's spawn offset) at S seconds, 'none' for "
                        "no cap (default: 60 for recorded traces, kv-cache-tester's "
                        "--max-delay; none for synthetic workloads)")
    s.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply every capped gap (default 1.0; 0.5 = twice as fast), as "
                        "kv-cache-tester's --time-scale")
    s.add_argument("--max-context", type=int, default=None, metavar="TOKENS",
                   help="end a session at its first request with more input tokens "
                        "(kv-cache-tester's --max-context); 0 = no limit (default: the "
                        "model's context length, 262144 for the Qwen models)")
    s.add_argument("--seed", type=int, default=0, help="session admission order")
    s.add_argument("--ramp", type=float, default=None,
                   help="spread the first sessions' starts over this many s (default: 600 "
                        "for recorded traces, 0 for synthetic workloads, which stagger)")
    s.add_argument("--think-scale", type=float, default=1.0, help="'think' gaps only")
    s.add_argument("--max-think", type=float, default=None,
                   help="'think' gaps only: cap one think gap (s)")
    s.add_argument("--jobs", type=int, default=None,
                   help="processes (default: CPUs; 1 runs every policy in this process)")
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("--no-per-request", action="store_true",
                   help="leave per-request arrays out of the JSON")

    y = sub.add_parser("synth", help="generate a synthetic workload")
    y.add_argument("spec", help="e.g. mutation:p=0.05,seed=1 or rewind-edit:p=0.2")
    y.add_argument("--out", type=Path, help="save as a .workload file (simulate/live read it)")

    p = sub.add_parser("plot", help="draw Figures 8-11-style charts from simulate JSONs")
    p.add_argument("reports", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=Path("figures"))
    p.add_argument("--figures", default="8,9,10,11,12",
                   help="8-12: the paper's figures; 13: TTFT CDFs by request class, every "
                        "report given pooled (give the admission orders of one replay)")
    p.add_argument("--name", default="", help="title of figure 13 (default: the workload)")

    v = sub.add_parser("live", help="replay against a running OpenAI-compatible server")
    _add_inputs(v)
    v.add_argument("--url", default="http://127.0.0.1:8000", help="loopback only")
    v.add_argument("--model", help="served model id (default: the server's first)")
    v.add_argument("--concurrency", type=int, default=4)
    v.add_argument("--max-requests", type=int, default=50)
    v.add_argument("--max-time", type=float, default=600.0, help="s, whole replay")
    v.add_argument("--time-scale", type=float, default=0.0,
                   help="multiply every (capped) gap (default 0: send the next turn at once)")
    v.add_argument("--gap", choices=["think", "arrival"], default="think",
                   help="gap before a session's next request, from the end of the previous "
                        "one: think_time, or the recorded arrival gap (kv-cache-tester's "
                        "'original' timing)")
    v.add_argument("--max-delay", type=_seconds_or_none, default=math.inf, metavar="S",
                   help="cap one gap at S seconds before --time-scale (default: none)")
    v.add_argument("--max-context", type=int, default=0, metavar="TOKENS",
                   help="end a session at its first longer request (0: no limit)")
    v.add_argument("--warm-prefix", type=int, default=0, metavar="TOKENS",
                   help="the same TOKENS tokens in front of every prompt")
    v.add_argument("--breakpoints", choices=["declared", "none"], default="declared",
                   help="declared (default): send the trace's client breakpoints as "
                        "kv_transfer_params (HiState checkpoints there; vLLM alone ignores "
                        "them); none: send none")
    v.add_argument("--recycle", action="store_true",
                   help="users start the workload again (new conversations) when it runs out")
    v.add_argument("--block-tokens", type=int, default=16, metavar="TOKENS",
                   help="the server's block size, for the ceiling any cache could reach "
                        "(reusable tokens); default 16, a divisor of every vLLM block size")
    v.add_argument("--max-input-tokens", type=int, default=7680)
    v.add_argument("--max-output-tokens", type=int, default=16)
    v.add_argument("--vocab", type=int, default=2000, help="token ids are drawn below this")
    v.add_argument("--timeout", type=float, default=300.0, help="s per request")
    v.add_argument("--json", type=Path)
    from .cli_fleet import add_parser as add_fleet

    add_fleet(sub)
    return ap


def cmd_simulate(a: argparse.Namespace) -> int:
    from .sim import ReplaySettings
    from .simulate import SimConfig, simulate

    wl = load_inputs(a.traces, a.format, a.synth)
    ramp = a.ramp if a.ramp is not None else (600.0 if wl.arrivals == "recorded" else 0.0)
    cfg = SimConfig(
        model=a.model, device=a.device, gpu_bytes=a.gpu_bytes, dram_bytes=a.dram_bytes,
        ssd_bytes=a.ssd_bytes, block_tokens=a.block_tokens, chunk_tokens=a.chunk_tokens,
        mfu=a.mfu, core_options=_options(a.histate_option), ssd_writes=a.ssd_writes,
        chunk_ends=a.chunk_ends, breakpoints=a.breakpoints,
        ssd_queue_bytes=a.ssd_queue_bytes, ssd_write_bw=a.ssd_write_gbps * 1e9
        if a.ssd_write_gbps else None,
        replay=ReplaySettings(concurrency=a.concurrency, seed=a.seed, ramp=ramp,
                              gap=a.gap, max_delay=a.max_delay, time_scale=a.time_scale,
                              max_context=a.max_context, think_scale=a.think_scale,
                              max_think=a.max_think,
                              concurrent_prefills=a.concurrent_prefills),
    )
    extra = {"inputs": a.traces, "synth": a.synth, "format": a.format,
             "command": " ".join(["python -m trace_replay", *sys.argv[1:]])}
    rep = simulate(wl, a.policies, cfg, jobs=a.jobs, progress=not a.no_progress,
                   per_request=not a.no_per_request, extra=extra)
    print_table(rep)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(_clean(rep)))
        print(f"wrote {a.json}")
    return 0


def _options(pairs: list[str]) -> dict:
    """--histate-option KEY=VALUE pairs, checked against the policy core's options."""
    from histate_vllm.policy import check_options

    out = {}
    for p in pairs:
        key, eq, val = p.partition("=")
        if not eq:
            raise SystemExit(f"--histate-option wants KEY=VALUE, got {p!r}")
        out[key.strip()] = _value(val.strip())
    try:
        check_options(out)
    except ValueError as e:
        raise SystemExit(f"--histate-option: {e}") from None
    return out


def _value(val: str) -> bool | int | float | str:
    """An option's value: true/false, an int where it reads as one, else a float, else
    the string (which the check then names)."""
    if val.lower() in ("true", "false"):
        return val.lower() == "true"
    for kind in (int, float):
        try:
            return kind(val)
        except ValueError:
            pass
    return val


def _clean(x):
    """JSON has no NaN: write null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def print_table(rep: dict) -> None:
    names = rep["policies"] + rep.get("references", [])
    extra = [k for k in ("mutation_ttft_mean", "mutation_hit_rate")
             if any(k in rep[n] for n in names)]
    cols = ["policy", "p50 s", "p95 s", "p99 s", "mean s", "hit rate", "recovery",
            *[k.replace("_", " ") for k in extra], "sim s"]
    rows = []
    for n in names:
        m = rep[n]
        rec = m.get("recovery")
        rows.append([
            n + ("" if n in rep["policies"] else " (ref)"),
            f"{m['ttft_p50']:.3f}", f"{m['ttft_p95']:.3f}", f"{m['ttft_p99']:.3f}",
            f"{m['ttft_mean']:.3f}", f"{m['hit_rate']:.2%}",
            "-" if rec is None or math.isnan(rec) else f"{rec:.1%}",
            *[(f"{m[k]:.3f}" if "ttft" in k else f"{m[k]:.2%}") if k in m else "-"
              for k in extra],
            f"{m['sim_wall_s']:.1f}",
        ])
    w = rep["workload"]
    title = (f"{w['name']}: {w['sessions']} sessions, {w['requests']} requests, "
             f"{rep['reuse_sensitive']['count']} reuse-sensitive")
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for c in cols:
            t.add_column(c, justify="left" if c == "policy" else "right", no_wrap=True)
        for r in rows:
            t.add_row(*r)
        Console(width=None if sys.stdout.isatty() else 160).print(t)
    except ImportError:
        print(title)
        for r in [cols, *rows]:
            print("  ".join(f"{x:>14}" for x in r))


def cmd_synth(a: argparse.Namespace) -> int:
    from .synth_spec import generate
    from .workload_io import save_workload

    wl = generate(a.spec)
    labels: dict[str, int] = {}
    for s in wl.sessions:
        for r in s.requests:
            labels[r.label] = labels.get(r.label, 0) + 1
    tokens = sum(s.input_tokens for s in wl.sessions)
    print(f"{wl.name}: {len(wl.sessions)} sessions, {wl.n_requests} requests, "
          f"{tokens:,} input tokens, labels {labels}")
    if a.out:
        save_workload(wl, a.out)
        print(f"wrote {a.out}")
    return 0


def cmd_plot(a: argparse.Namespace) -> int:
    from .plot import plot_reports

    figs = {int(x) for x in a.figures.split(",") if x.strip()}
    for path in plot_reports(a.reports, a.out, figs, a.name):
        print(f"wrote {path}")
    return 0


def cmd_live(a: argparse.Namespace) -> int:
    from .live import LiveConfig, replay_live

    wl = load_inputs(a.traces, a.format, a.synth)
    cfg = LiveConfig(url=a.url, model=a.model, concurrency=a.concurrency,
                     max_requests=a.max_requests, max_time=a.max_time,
                     time_scale=a.time_scale, max_input_tokens=a.max_input_tokens,
                     max_output_tokens=a.max_output_tokens, vocab=a.vocab,
                     request_timeout=a.timeout, gap=a.gap, max_delay=a.max_delay,
                     max_context=a.max_context, warm_prefix_tokens=a.warm_prefix,
                     recycle=a.recycle, block_tokens=a.block_tokens,
                     breakpoints=a.breakpoints == "declared")
    import httpx

    try:
        rep = replay_live(wl, cfg, progress=True)
    except (httpx.HTTPError, OSError) as exc:
        raise SystemExit(f"live replay: cannot reach {a.url}: {exc!r}") from None
    s = rep["summary"]
    print(f"{s['completed']} requests ({s['failed']} failed): TTFT p50 {s['ttft_p50']:.3f} s, "
          f"p90 {s['ttft_p90']:.3f} s, p99 {s['ttft_p99']:.3f} s, cached tokens {s['cached_tokens']:,} of "
          f"{s['prompt_tokens']:,} ({s['hit_rate']:.1%})")
    if "reusable_tokens" in s:
        print(f"any cache could have served {s['reusable_tokens']:,} ({s['reusable_rate']:.1%} of "
              f"prompt tokens): cached / reusable {s['cached_of_reusable']:.1%}")
    if a.json:
        a.json.write_text(json.dumps(_clean(rep)))
        print(f"wrote {a.json}")
    return 0 if s["failed"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd == "fleet":
        from .cli_fleet import cmd_fleet

        return cmd_fleet(a)
    return {"simulate": cmd_simulate, "synth": cmd_synth, "plot": cmd_plot,
            "live": cmd_live}[a.cmd](a)
