"""Run one offline vLLM engine over a list of token prompts; write what it saw as JSON.

    python -m histate_vllm.offline SPEC.json OUT.json

SPEC: {"model": dir, "connector": extra_config or null, "requests": [{"name", "prompt":
[token ids], "max_tokens"}], and optional engine settings}. OUT: per request the cached
tokens vLLM reports, greedy tokens, their logprobs and the time to first token.

Each engine runs in its own process (vLLM spawns workers and keeps global state), so the
demo and the tests restart an engine over the same SSD directory exactly as a user would.
"""

from __future__ import annotations

import json
import os
import sys
import time

for _m in ("torchvision", "torchaudio", "torchcodec"):  # ABI-broken next to the CPU torch
    sys.modules[_m] = None


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _engine_rss() -> dict[str, int]:
    """RSS of every process below this one (engine core, worker)."""
    import psutil

    return {
        f"{p.pid}:{p.name()}": _rss_bytes(p.pid)
        for p in psutil.Process().children(recursive=True)
    }


def run_engine(spec: dict, out_path: str | None = None, *, timeout: float = 1800,
               log_path: str | None = None) -> tuple[int, dict, str]:
    """Run SPEC in a fresh process; return (exit code, results, log)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        spec_path = os.path.join(tmp, "spec.json")
        out_path = out_path or os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                   HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
        proc = subprocess.run(
            [sys.executable, "-m", "histate_vllm.offline", spec_path, out_path],
            capture_output=True, text=True, timeout=timeout, env=env,
        )
        log = proc.stdout + proc.stderr
        if log_path:
            with open(log_path, "w") as f:
                f.write(log)
        results = {}
        if os.path.exists(out_path):
            with open(out_path) as f:
                results = json.load(f)
        return proc.returncode, results, log


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kwargs = dict(
        model=spec["model"],
        dtype="bfloat16",
        max_model_len=spec.get("max_model_len", 8192),
        max_num_batched_tokens=spec.get("max_num_batched_tokens", 2048),
        enable_prefix_caching=spec.get("prefix_caching", True),
        num_gpu_blocks_override=spec.get("num_gpu_blocks", 64),
        seed=0,
        enforce_eager=True,
        disable_log_stats=False,
    )
    if spec.get("dense_states"):
        # Offer the state at every prefill chunk end to the connector, not only at the
        # prompt tail and shared-prefix junctions (vLLM's default retention).
        kwargs["prefix_cache_retention_interval"] = None
    if spec.get("connector") is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(
            kv_connector="HiStateConnector",
            kv_connector_module_path=spec.get("module_path", "histate_vllm.connector"),
            kv_role="kv_both",
            kv_connector_extra_config=spec["connector"],
        )
        if spec.get("by_name"):
            kwargs["kv_transfer_config"].kv_connector_module_path = None
    llm = LLM(**kwargs)
    results = []
    for req in spec["requests"]:
        sp = SamplingParams(max_tokens=req.get("max_tokens", 4), temperature=0, logprobs=1)
        t0 = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=req["prompt"])], sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t0
        completion = out.outputs[0]
        metrics = out.metrics
        ttft = getattr(metrics, "first_token_latency", 0.0) or wall
        results.append(
            dict(
                name=req["name"],
                num_prompt_tokens=len(req["prompt"]),
                num_cached_tokens=out.num_cached_tokens or 0,
                token_ids=list(completion.token_ids),
                logprobs=[lp[tok].logprob for tok, lp in zip(completion.token_ids, completion.logprobs)],
                ttft=ttft,
                wall=wall,
            )
        )
        print(f"[runner] {req['name']}: {len(req['prompt'])} tokens, "
              f"{results[-1]['num_cached_tokens']} cached, {ttft:.3f}s", flush=True)
    rss = _engine_rss()
    with open(out_path, "w") as f:
        json.dump(dict(results=results, rss=rss), f)
    del llm


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
