"""The offline runner: its request list (floods sized from the engine, `settle` placed) and
its reports on the engine's processes."""

from __future__ import annotations

import subprocess
import sys

import psutil

from histate_vllm.vllm_glue import offline
from histate_vllm.vllm_glue.offline import expand_requests


def test_settle_waits_before_a_floods_first_prompt_only():
    layout = dict(block_size=256, num_gpu_blocks=64)
    reqs = [dict(name="A", prompt=[1, 2, 3]),
            dict(name="G", flood=1.25, prompt_tokens=3000, settle=True),
            dict(name="B", prompt=[4, 5], settle=True)]
    out = expand_requests(reqs, layout)
    flood = [r for r in out if r.get("flood") == "G"]
    assert sum(len(r["prompt"]) for r in flood) >= 1.25 * 256 * 64
    assert [r["settle"] for r in flood] == [True] + [False] * (len(flood) - 1)
    assert not out[0].get("settle") and out[-1]["settle"]


def test_engine_reports_skip_a_child_that_exits_while_read(monkeypatch):
    """vLLM's helpers exit at shutdown while the runner reads its children: a child gone
    between the listing and the read is left out (it once failed a whole engine run)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = psutil.Process(child.pid)
    child.wait()
    me = psutil.Process()
    monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: [gone, me])
    assert list(offline._engine_rss()) == [f"{me.pid}:{me.name()}"]
    assert {t["pid"] for t in offline.engine_threads()} == {me.pid}
