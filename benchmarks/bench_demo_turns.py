"""Where each demo turn's time goes, with and without HiState, model step by model step.

A demo turn that reuses as much with HiState as without must not be slower. This replays the demo's session (`examples/agent_demo.py`, its first engine: task,
tool result, subagent, a flood of other sessions, next step, edit) through

  vllm          vLLM alone (the baseline of the ratios, rerun in every round)
  histate       HiState as the demo runs it: 16 MiB of DRAM and an SSD store (--dir)
  histate-dram  HiState with DRAM only, large enough for everything (no SSD threads)

alternating engines within each round, and splits every turn's time to first token by the
worker's own clock: from its submission to its first prefill step ("wait": the lookup, a
restore's load, a step already running when it came), the model steps that prefill it
("compute", summed), and the rest ("between steps": the engine core's scheduling,
HiState's connector, the worker's IPC and sampling, and any wait for a core).
Ratios are against vLLM alone in the same round. Step durations move 10-20% between
engine starts on a shared machine, so compare the columns, not single totals.

    python benchmarks/bench_demo_turns.py [--rounds 2] [--dir D]
    python benchmarks/bench_demo_turns.py --report D/summary.json [--into RESULTS_MD]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from agent_demo import build_prompts, replay  # noqa: E402
from results_blocks import cpu_name, show_or_write  # noqa: E402

MiB = 1 << 20
TRACE = REPO / "examples" / "traces" / "agent_session.json"


def _connector(name: str, work: Path) -> dict | None:
    return {
        "vllm": None,
        "histate": dict(dram_bytes=16 * MiB, ssd_dir=str(work / "ssd"), ssd_bytes=256 * MiB),
        "histate-dram": dict(dram_bytes=1024 * MiB),
    }[name]


def split_turn(r: dict) -> dict[str, float]:
    """A turn's TTFT (s) split by its worker steps: wait (from the request's submission to its
    first prefill step: lookup, a restore's load, a step already running), compute (its
    prefill steps, summed), between steps (the rest before the first token)."""
    prefill = [s for s in r["steps"] if s[0] < r["ttft"] and s[2] > 1]
    compute = sum(dt for _, dt, _ in prefill)
    wait = prefill[0][0] if prefill else 0.0
    return dict(ttft=r["ttft"], compute=compute, wait=wait,
                between=r["ttft"] - compute - wait, steps=len(prefill))


def _run(model: str, work: Path, name: str, turns: list[dict], block: int | None,
         ssm_dtype: str | None) -> tuple[dict, int]:
    """One engine over the session, set up exactly as the demo runs it (agent_demo.replay)."""
    import shutil

    shutil.rmtree(work / "ssd", ignore_errors=True)
    logs = work / name
    logs.mkdir(parents=True, exist_ok=True)
    results, engines = replay(model, [turns], _connector(name, work), logs, ssm_dtype, block,
                              step_times=True)
    res = {t["name"]: dict(split_turn(results[t["name"]]),
                           cached=results[t["name"]]["num_cached_tokens"],
                           tokens=results[t["name"]]["token_ids"])
           for t in turns if t.get("shown")}
    return res, engines[0]["block_size"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ssm-dtype", choices=["float32", "bfloat16"])
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--engines", default="histate,histate-dram",
                    help="HiState engines beside vLLM alone (comma-separated)")
    ap.add_argument("--report", type=Path, metavar="SUMMARY_JSON",
                    help="print the table of an earlier run's summary.json; run nothing")
    ap.add_argument("--into", type=Path, metavar="RESULTS_MD",
                    help="with --report: write it into the file's 'demo-turns' block")
    args = ap.parse_args()
    if args.report:
        show_or_write(report(json.loads(args.report.read_text())), args.into, "demo-turns")
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-demo-turns-"))
    work.mkdir(parents=True, exist_ok=True)
    from build_tiny_model import build

    model = str(build(work / "tiny-qwen3-next"))
    turns = build_prompts(json.loads(TRACE.read_text()))[0]
    engines = ["histate"] + [e for e in args.engines.split(",") if e != "histate"]
    block = None
    runs: dict[str, list[dict]] = {}
    for rnd in range(args.rounds):
        # HiState first: vLLM alone then gets its block size, as in the demo.
        for name in engines[:1] + ["vllm"] + engines[1:]:
            res, block = _run(model, work, name, turns, block, args.ssm_dtype)
            runs.setdefault(name, []).append(res)
            print(f"round {rnd + 1}: {name:<12} " + "; ".join(
                f"{t} {v['ttft'] * 1e3:.0f} ms ({v['cached']} cached)" for t, v in res.items()),
                flush=True)
    summary = {"block": block, "rounds": args.rounds, "cpus": os.cpu_count(),
               "cpu": cpu_name(), "engines": engines,
               "runs": {n: [{t: {k: v for k, v in r.items() if k != "tokens"}
                             for t, r in res.items()} for res in rs] for n, rs in runs.items()},
               "same_tokens": {n: [[t for t in mine if mine[t]["tokens"] != base[t]["tokens"]]
                                   for mine, base in zip(runs[n], runs["vllm"])]
                               for n in engines}}
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    print(report(summary))
    print(f"work directory: {work} (summary.json: python benchmarks/bench_demo_turns.py "
          f"--report {work / 'summary.json'})")


def report(summary: dict) -> str:
    """The markdown of one run, from its summary.json."""
    runs, engines = summary["runs"], summary["engines"]
    out = [f"The demo's session (first engine), {summary['block']}-token blocks, "
           f"{summary['rounds']} rounds, {summary['cpus']} CPUs ({summary['cpu']}); ms per "
           "turn, median over rounds; x: against vLLM alone's TTFT in the same round.", "",
           "| turn | engine | cached | TTFT | x | wait | compute (steps) | between steps |",
           "|---|---|---|---|---|---|---|---|"]
    for turn in runs["vllm"][0]:
        for name in ["vllm"] + engines:
            rs = [r[turn] for r in runs[name]]
            med = {k: statistics.median(r[k] for r in rs) * 1e3
                   for k in ("ttft", "wait", "compute", "between")}
            ratio = statistics.median(r[turn]["ttft"] / b[turn]["ttft"]
                                      for r, b in zip(runs[name], runs["vllm"]))
            out.append(f"| {turn} | {name} | {rs[0]['cached']} | {med['ttft']:.1f} | "
                       f"{ratio:.2f} | {med['wait']:.1f} | {med['compute']:.1f} "
                       f"({rs[0]['steps']}) | {med['between']:.1f} |")
    out.append("")
    for name, bad in summary["same_tokens"].items():
        diff = sorted({t for rnd in bad for t in rnd})
        out.append(f"- {name}: the same greedy tokens as vLLM alone on every turn of every "
                   "round" if not diff else
                   f"- {name}: other greedy tokens than vLLM alone on {', '.join(diff)}")
    return "\n".join(out)


if __name__ == "__main__":
    main()
