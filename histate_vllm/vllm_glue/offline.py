"""Run one offline vLLM engine over a list of token prompts; write what it saw as JSON.

    python -m histate_vllm.vllm_glue.offline SPEC.json OUT.json

SPEC: {"model": dir, "connector": extra_config or null, "requests": [...], and optional
engine settings (e.g. "tensor_parallel_size"; "env": variables set before vLLM starts;
"speculative": vLLM's speculative_config; "plugin_paths": directories of vLLM plugins)}. A request is {"name", "prompt": [token ids], "max_tokens"} or a flood,
{"name", "flood": F, "prompt_tokens": N}: prompts of at most N fresh tokens (deterministic
per name), F times the GPU cache's capacity in all, sized once the engine says how many
tokens its blocks hold (it depends on the machine: 256 or 384 for the tiny model).
{"name", "batch": [request, ...]} sends its requests together. Instead of "prompt", "parts":
[{"seed", "blocks", "tokens"}, ...] builds one from whole KV blocks of the engine (or of
"prompt_block_size", so an engine with other blocks gets the same prompts); a part
{"ids": [...]} is those token ids as given (a turn-end token, say), a part {"output_of": NAME}
what request NAME decoded (built when the request is sent).
"step_times": true adds to each request the worker's model steps while it ran ([start s
after it was sent, duration s, tokens scheduled]). Any request may say "settle": true:
before it (a flood: before its first prompt) the runner waits until the connector's SSD
writes have landed, as after a user's pause.
"warmup": N runs two untimed N-token prompts first (N above the chunk size), so the first
timed turn does not pay for the engine's warm-up. OUT: the engine's block size and block count, and per request the
cached tokens vLLM reports (and of those, the GPU's and the connector's per tier), greedy
tokens, their logprobs and the time to first token.

Each engine runs in its own process (vLLM spawns workers and keeps global state), so the
demo and the tests restart an engine over the same SSD directory exactly as a user would.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

for _m in ("torchvision", "torchaudio", "torchcodec"):  # ABI-broken next to the CPU torch
    sys.modules[_m] = None


# Logprobs returned per generated token (vLLM's default cap on them is 20).
TOP_LOGPROBS = 20


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
    """RSS of every process below this one (engine core, worker); a child that exits
    while it is read (a helper of vLLM's shutting down) is left out."""
    import psutil

    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            out[f"{p.pid}:{p.name()}"] = _rss_bytes(p.pid)
        except psutil.Error:
            continue
    return out


def engine_threads() -> list[dict]:
    """Every thread of every process below this one: its OS name, the CPUs it may run on,
    its niceness, the CPU seconds it used (of them in the kernel), the seconds it was
    runnable but waited for a core, and its minor page faults: what tells whether HiState's
    threads stay off the forward pass, and what they cost it."""
    import psutil

    out = []
    tick = os.sysconf("SC_CLK_TCK")
    for p in psutil.Process().children(recursive=True):
        try:
            for t in os.listdir(f"/proc/{p.pid}/task"):
                base = f"/proc/{p.pid}/task/{t}"
                with open(f"{base}/comm") as f:
                    comm = f.read().strip()
                with open(f"{base}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                # utime + stime (fields 14 and 15 of proc(5)), in clock ticks
                cpu_s = (int(fields[11]) + int(fields[12])) / tick
                # schedstat: ns on a CPU, ns runnable but waiting for one (what another
                # thread on the same core costs this one), timeslices; absent on kernels
                # built without it
                try:
                    with open(f"{base}/schedstat") as f:
                        waited = int(f.read().split()[1])
                except (OSError, IndexError, ValueError):
                    waited = 0
                out.append(dict(pid=p.pid, tid=int(t), name=comm, nice=int(fields[16]),
                                cpus=sorted(os.sched_getaffinity(int(t))), cpu_s=cpu_s,
                                sys_s=int(fields[12]) / tick, runq_wait_s=waited / 1e9,
                                minflt=int(fields[7])))  # field 10: minor page faults
        except (OSError, psutil.Error):
            continue  # the thread or process ended meanwhile
    return out


def run_engine(spec: dict, out_path: str | None = None, *, timeout: float = 1800,
               log_path: str | None = None, progress=None) -> tuple[int, dict, str]:
    """Run SPEC in a fresh process; return (exit code, results, log).

    `progress`, if given, is called with each of the runner's own lines ("[runner] ...")
    as they come, so a caller can show turns as they finish.
    """
    import subprocess
    import tempfile
    import threading

    from histate_vllm.vllm_glue.rpc_dir import private_rpc_dir

    with tempfile.TemporaryDirectory() as tmp, private_rpc_dir(os.environ) as rpc:
        spec_path = os.path.join(tmp, "spec.json")
        out_path = out_path or os.path.join(tmp, "out.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                   HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                   **rpc)
        proc = subprocess.Popen(
            [sys.executable, "-m", "histate_vllm.vllm_glue.offline", spec_path, out_path],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        lines: list[str] = []

        def pump() -> None:
            for line in proc.stdout:
                lines.append(line)
                if progress is not None and line.startswith("[runner]"):
                    progress(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            lines.append(f"\n[runner] killed after {timeout:.0f} s\n")
        reader.join(timeout=10)
        log = "".join(lines)
        if log_path:
            with open(log_path, "w") as f:
                f.write(log)
        results = {}
        killed = spec.get("kill_after") and proc.returncode == -9  # as it asked
        if (proc.returncode == 0 or killed) and os.path.exists(out_path):
            with open(out_path) as f:
                results = json.load(f)
        return proc.returncode, results, log


def engine_layout(llm) -> dict:
    """What the engine really runs with: tokens per KV block and the GPU cache's size."""
    cache = llm.llm_engine.vllm_config.cache_config
    return dict(block_size=cache.block_size, num_gpu_blocks=cache.num_gpu_blocks,
                ssm_dtype=cache.mamba_ssm_cache_dtype)


def _gpu_hits(llm) -> int:
    """Tokens vLLM's GPU prefix cache has served so far (its prefix_cache_hits counter)."""
    return int(sum(m.value for m in llm.get_metrics()
                   if m.name == "vllm:prefix_cache_hits" and hasattr(m, "value")))


def _spec_counts(llm) -> dict[str, int]:
    """vLLM's speculative-decoding counters so far: drafts proposed, draft tokens, accepted
    tokens (zero without a speculative config)."""
    names = {"vllm:spec_decode_num_drafts": "drafts",
             "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
    out = dict.fromkeys(names.values(), 0)
    for m in llm.get_metrics():
        if m.name in names and hasattr(m, "value"):
            out[names[m.name]] += int(m.value)
    return out


def _counter(name: str = "restored_tokens") -> dict[str, int]:
    """One of the connector's counters so far, by label "tier" ("" without): by default the
    tokens it has restored, per tier (this process's Prometheus registry; vLLM's
    get_metrics lists only its own)."""
    from prometheus_client import REGISTRY

    from histate_vllm.vllm_glue.prom_metrics import PREFIX

    out: dict[str, int] = {}
    for metric in REGISTRY.collect():
        if metric.name != PREFIX + name:
            continue
        for s in metric.samples:
            if s.name.endswith("_total"):
                tier = s.labels.get("tier", "")
                out[tier] = out.get(tier, 0) + int(s.value)
    return out


def flood_prompts(name: str, total_tokens: int, prompt_tokens: int) -> list[tuple[str, list[int]]]:
    """Fresh prompts (shared with nothing) of at most `prompt_tokens`, `total_tokens` in all."""
    import random

    rng = random.Random(f"flood:{name}")
    n = -(-total_tokens // prompt_tokens)
    size = -(-total_tokens // n)
    return [(f"{name} #{i + 1}", [rng.randrange(2, 2000) for _ in range(size)]) for i in range(n)]


def part_tokens(part: dict, block_size: int, outputs: dict | None = None) -> list[int]:
    """Tokens of a prompt part: `blocks` whole blocks plus `tokens`, deterministic per
    `seed` (two parts with the same seed and length are the same tokens), the part's own
    `ids`, or what an earlier request decoded (`output_of`: its name), as an agent's next
    turn carries the last answer."""
    import random

    if "ids" in part:
        return list(part["ids"])
    if "output_of" in part:
        if outputs is None or part["output_of"] not in outputs:
            raise ValueError(f"output_of {part['output_of']!r}: no earlier request of that name")
        return list(outputs[part["output_of"]])

    rng = random.Random(f"part:{part['seed']}")
    n = part.get("blocks", 0) * block_size + part.get("tokens", 0)
    return [rng.randrange(2, 2000) for _ in range(n)]


def _with_prompt(req: dict, block_size: int, outputs: dict | None = None) -> dict:
    if "parts" in req:
        if outputs is None and any("output_of" in p for p in req["parts"]):
            return {**req, "lazy_block_size": block_size}  # built when it is sent
        prompt: list[int] = []
        marks = []  # a part with "mark": a client breakpoint where it ends (boundaries.py)
        for part in req["parts"]:
            prompt += part_tokens(part, block_size, outputs)
            if part.get("mark"):
                marks.append(len(prompt))
        req = {**{k: v for k, v in req.items() if k not in ("parts", "lazy_block_size")},
               "prompt": prompt}
        if marks:
            req["kv_transfer_params"] = {"histate_breakpoints": marks}
    if "batch" in req:
        req = {**req, "batch": [_with_prompt(r, block_size) for r in req["batch"]]}
    return req


def _core_times(metrics) -> dict[str, float]:
    queued, scheduled, first = (getattr(metrics, k, 0.0) or 0.0
                                for k in ("queued_ts", "scheduled_ts", "first_token_ts"))
    if not (queued and scheduled and first):
        return {}
    return dict(queued_s=scheduled - queued, prefill_s=first - scheduled)


def _generate_together(llm, prompts, sps):
    """Run `prompts` so that the engine's scheduler first sees all of them in one step.

    `LLM.generate` sends them one by one, and the engine core steps as soon as the first
    arrives: on a loaded machine the second can come steps later, after the first has
    loaded its restore and started prefilling (a different situation from a batch).
    Paused ("keep": no token is scheduled, adds are queued), the engine takes them all,
    and the resume lets one step schedule them together. The pause returns once the
    engine is idle: connector work in flight (HiState's SSD writes) lands first."""
    core = llm.llm_engine.engine_core
    core.call_utility("pause_scheduler", "keep", False)
    try:
        llm.enqueue(prompts, sps, use_tqdm=False)
    finally:
        core.call_utility("resume_scheduler")
    return llm.wait_for_completion(use_tqdm=False)


def _settle(llm, name: str, timeout: float = 300.0, polls: int = 3) -> None:
    """Wait until the connector's SSD writes have landed and the scheduler knows (a
    request's `"settle": true`): a user's next turn after the server went quiet, so that
    what a test expects of the tiers does not depend on how fast this machine's disk is
    today. `polls` quiet answers in a row: the engine hands staged writes to the workers
    at its next step, which comes at once while it has pending work."""
    from histate_vllm.vllm_glue.worker import ssd_settled

    t0, quiet = time.perf_counter(), 0
    while quiet < polls:
        quiet = quiet + 1 if all(llm.collective_rpc(ssd_settled)) else 0
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"HiState's SSD writes did not settle in {timeout:.0f} s "
                               f"before {name}")
        time.sleep(0.05)
    print(f"[runner] settled before {name} in {time.perf_counter() - t0:.2f} s", flush=True)


def expand_requests(requests: list[dict], layout: dict, block_size: int | None = None
                    ) -> list[dict]:
    """Requests with their prompts: floods sized from the engine's capacity, `parts`
    from `block_size` (default: the engine's own)."""
    capacity = layout["block_size"] * layout["num_gpu_blocks"]
    out = []
    for req in requests:
        if "flood" not in req:
            out.append(_with_prompt(req, block_size or layout["block_size"]))
            continue
        total = int(req["flood"] * capacity)
        prompts = flood_prompts(req["name"], total, req.get("prompt_tokens", 3000))
        for i, (name, prompt) in enumerate(prompts):
            # `settle` waits before the flood's first prompt only.
            out.append(dict(name=name, prompt=prompt, max_tokens=req.get("max_tokens", 4),
                            flood=req["name"], settle=bool(req.get("settle")) and i == 0))
    return out


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.update(spec.get("env", {}))  # before vllm reads its environment
    # Directories of vLLM plugins (a `*.dist-info` with `vllm.general_plugins` entry points,
    # e.g. examples/vllm_cpu_kernels): found by this process and by the engine's own.
    paths = [str(p) for p in spec.get("plugin_paths", [])]
    if paths:
        sys.path[:0] = paths
        os.environ["PYTHONPATH"] = os.pathsep.join(
            paths + [x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x])
    if (spec.get("step_times") or spec.get("kill_after")
            or any(r.get("settle") for r in spec["requests"])):
        # `_settle` and the step timers send functions to the workers (collective_rpc),
        # which vLLM's msgpack channel to its own engine core passes only as a pickle.
        # Local processes only.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    if spec.get("log_level"):
        os.environ["VLLM_LOGGING_LEVEL"] = spec["log_level"]
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from histate_vllm.vllm_glue.seam.process import take_worker_steps, time_worker_steps

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
        tensor_parallel_size=spec.get("tensor_parallel_size", 1),
    )
    if spec.get("block_size"):
        kwargs["block_size"] = spec["block_size"]
    if spec.get("ssm_dtype"):
        # The recurrent state's dtype sets the KV block size (pages of both kinds match):
        # float32 states give the tiny model 384-token blocks, bfloat16 states 256.
        kwargs["mamba_ssm_cache_dtype"] = spec["ssm_dtype"]
    if spec.get("dense_states"):
        # Offer the state at every prefill chunk end to the connector, not only at the
        # prompt tail and shared-prefix junctions (vLLM's default retention).
        kwargs["prefix_cache_retention_interval"] = None
    if spec.get("speculative"):
        kwargs["speculative_config"] = spec["speculative"]
    if spec.get("connector") is not None:
        kwargs["kv_transfer_config"] = KVTransferConfig(
            kv_connector="HiStateConnector",
            kv_connector_module_path=(None if spec.get("by_name")
                                      else spec.get("module_path", "histate_vllm.connector")),
            kv_role="kv_both",
            kv_connector_extra_config=spec["connector"],
        )
    llm = LLM(**kwargs)
    layout = engine_layout(llm)
    print(f"[runner] engine: {layout['num_gpu_blocks']} blocks of {layout['block_size']} "
          f"tokens, {layout['ssm_dtype']} states", flush=True)
    if spec.get("warmup"):
        import random

        rng = random.Random("warmup")
        # Same sampling path as the timed requests, and long enough to run a full chunk;
        # twice, since the first pass over new shapes is slower than the second too.
        for _ in range(2):
            warm = [rng.randrange(2, 2000) for _ in range(spec["warmup"])]
            llm.generate([TokensPrompt(prompt_token_ids=warm)],
                         SamplingParams(max_tokens=2, temperature=0, logprobs=1), use_tqdm=False)
    if spec.get("step_times"):
        llm.collective_rpc(time_worker_steps)
    threads_start = engine_threads()  # after warm-up: the timed requests' CPU is the difference
    results = []
    for req in expand_requests(spec["requests"], layout, spec.get("prompt_block_size")):
        if "lazy_block_size" in req:
            req = _with_prompt(req, req["lazy_block_size"],
                               {r["name"]: r["token_ids"] for r in results})
        if req.get("settle"):
            _settle(llm, req["name"])
        if req.get("kill_pid"):  # a fault beside the engine (e.g. the fleet tier's master)
            import signal

            os.kill(req["kill_pid"], signal.SIGKILL)
            print(f"[runner] killed pid {req['kill_pid']} before {req['name']}", flush=True)
        # A batch: its requests go to the engine together (they queue, and a restore can
        # find other requests' prefills and loads in flight); one at a time otherwise.
        batch = req.get("batch") or [req]
        sps = [SamplingParams(max_tokens=r.get("max_tokens", 4), temperature=0,
                              logprobs=spec.get("logprobs", TOP_LOGPROBS),
                              extra_args={"kv_transfer_params": r["kv_transfer_params"]}
                              if r.get("kv_transfer_params") else None)
               for r in batch]
        if spec.get("step_times"):
            llm.collective_rpc(take_worker_steps)  # drop what ran between requests
        gpu_before, restored_before = _gpu_hits(llm), _counter()
        spec_before = _spec_counts(llm) if spec.get("speculative") else None
        ahead_before = _counter("ssd_states_ahead_read").get("", 0)
        t0 = time.perf_counter()
        prompts = [TokensPrompt(prompt_token_ids=r["prompt"]) for r in batch]
        outs = (_generate_together(llm, prompts, sps) if len(batch) > 1
                else llm.generate(prompts, sps, use_tqdm=False))
        wall = time.perf_counter() - t0
        # The worker's model steps during the request: [start s after the request was
        # sent, duration s, tokens scheduled] (perf_counter is one clock for all processes).
        steps = ([[t - t0, dt, n] for t, dt, n in llm.collective_rpc(take_worker_steps)[0]]
                 if spec.get("step_times") else None)
        gpu_hits = _gpu_hits(llm) - gpu_before
        restored = {t: n - restored_before.get(t, 0) for t, n in _counter().items()
                    if n > restored_before.get(t, 0)}
        ahead = _counter("ssd_states_ahead_read").get("", 0) - ahead_before
        drafts = ({k: v - spec_before[k] for k, v in _spec_counts(llm).items()}
                  if spec_before is not None else None)
        for r, out in zip(batch, outs):
            completion = out.outputs[0]
            metrics = out.metrics
            ttft = getattr(metrics, "first_token_latency", 0.0) or wall
            results.append(
                dict(
                    name=r["name"],
                    request_id=out.request_id,
                    num_prompt_tokens=len(r["prompt"]),
                    num_cached_tokens=out.num_cached_tokens or 0,
                    # Of those, served by the GPU prefix cache (for a batch: all of its
                    # requests together, under the batch's name).
                    **({"gpu_cached_tokens": gpu_hits} if len(batch) == 1 else {}),
                    # Restored by the connector, per tier ({} for a batch, as above).
                    **({"restored": restored} if len(batch) == 1 else {}),
                    # State pages of it read from copies written ahead of their KV.
                    **({"states_ahead": ahead} if len(batch) == 1 and ahead else {}),
                    # Speculative decoding during it: drafts, draft tokens, accepted tokens.
                    **({"spec": drafts} if drafts is not None and len(batch) == 1 else {}),
                    token_ids=list(completion.token_ids),
                    logprobs=[lp[tok].logprob
                              for tok, lp in zip(completion.token_ids, completion.logprobs)],
                    # Per step, the top tokens' logprobs ({token id: logprob}): a whole
                    # slice of the distribution, which a wrong state moves everywhere and
                    # rounding moves at a few logits (tests/engine/exactness.py).
                    top_logprobs=[{str(t): v.logprob for t, v in lp.items()}
                                  for lp in completion.logprobs],
                    ttft=ttft,
                    # Of it, in the engine core (its clock): waiting to be scheduled (a
                    # lookup or load in flight), and scheduled until the first token.
                    **_core_times(metrics),
                    wall=wall,
                    **({"steps": steps} if steps is not None and len(batch) == 1 else {}),
                    **({"flood": req["flood"]} if "flood" in req else {}),
                    **({"batch": req["name"]} if len(batch) > 1 else {}),
                )
            )
            print(f"[runner] {r['name']}: {len(r['prompt'])} tokens, "
                  f"{results[-1]['num_cached_tokens']} cached, {ttft:.3f}s", flush=True)
        if len(batch) > 1:
            results.append(dict(name=req["name"], gpu_cached_tokens=gpu_hits, wall=wall))
    rss = _engine_rss()
    threads = engine_threads()
    kill = spec.get("kill_after")
    if kill:
        _settle(llm, "the kill")
        if kill.get("fleet_dir"):
            _fleet_quiet(kill["fleet_dir"], kill.get("quiet_s", 2.0))
        else:  # a tier this process cannot list (Mooncake Store): time for the publishes
            time.sleep(kill.get("wait_s", 5.0))
    with open(out_path, "w") as f:
        json.dump(dict(engine=layout, results=results, rss=rss, threads=threads,
                       threads_start=threads_start), f)
    if kill:
        _kill_engine()
    del llm


def _fleet_quiet(fleet_dir: str, quiet_s: float, timeout: float = 120.0) -> None:
    """Wait until the engine's publishes to a fleet directory have stopped: no file added
    or changed for `quiet_s` (the engine publishes from its own thread once the SSD
    writes it settled have landed)."""
    def snapshot():
        return sorted((str(p), p.stat().st_mtime_ns) for p in Path(fleet_dir).rglob("*")
                      if p.is_file())

    t0 = time.perf_counter()
    last, since = snapshot(), time.perf_counter()
    while time.perf_counter() - since < quiet_s:
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"the fleet directory {fleet_dir} kept changing")
        time.sleep(0.2)
        now = snapshot()
        if now != last:
            last, since = now, time.perf_counter()
    print(f"[runner] fleet directory quiet: {sum('/mf/' in n for n, _ in last)} manifests",
          flush=True)


def _kill_engine() -> None:
    """SIGKILL the engine's processes and this one: nothing shuts down, flushes or
    unlocks (a server that died)."""
    import signal

    import psutil

    print("[runner] killing the engine (SIGKILL)", flush=True)
    for child in psutil.Process().children(recursive=True):
        child.send_signal(signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
