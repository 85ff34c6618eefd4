"""The offline runner's request list: floods sized from the engine, `settle` placed."""

from __future__ import annotations

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
