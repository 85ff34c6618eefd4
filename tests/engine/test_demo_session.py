"""Never worse than vLLM alone, turn by turn, on the demo's agent session.

The README's demo (examples/agent_demo.py) replays the same session with HiStateConnector
and on vLLM alone (with the block size the first engine reported); here both replays run
once per state dtype (384- and 256-token blocks). No turn may reuse fewer prompt tokens with
the connector than without it, and every request, the other sessions' included, must
decode the same greedy tokens in both: a drift shows wherever the demo runs.
"""

from __future__ import annotations

import json
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.engine

MiB = 1 << 20
sys.path.insert(0, str(REPO / "examples"))
from agent_demo import build_prompts, replay  # noqa: E402
from exactness import CAP, spread  # noqa: E402


@pytest.mark.parametrize("ssm_dtype", ["float32", "bfloat16"])
def test_no_turn_reuses_less_than_vllm_alone(tiny_model, tmp_path, ssm_dtype):
    trace = json.loads((REPO / "examples" / "traces" / "agent_session.json").read_text())
    runs = build_prompts(trace)
    connector = dict(dram_bytes=16 * MiB, ssd_dir=str(tmp_path / "ssd"), ssd_bytes=256 * MiB)
    hist, engines = replay(tiny_model, runs, connector, tmp_path, ssm_dtype)
    base, _ = replay(tiny_model, runs, None, tmp_path, ssm_dtype, engines[0]["block_size"])
    turns = [r["name"] for part in runs for r in part if r["shown"]]
    table = {t: (base[t]["num_cached_tokens"], hist[t]["num_cached_tokens"]) for t in turns}
    print(f"{ssm_dtype} ({engines[0]['block_size']}-token blocks), "
          f"reused by vLLM alone / with HiState: {table}")
    worse = {t: v for t, v in table.items() if v[1] < v[0]}
    assert not worse, f"turns that reuse less with HiState: {worse}"
    # The session's point: after the flood and after the restart HiState resumes, vLLM cannot.
    for turn in ("next step", "after restart"):
        assert table[turn][0] == 0 and table[turn][1] > 0, (turn, table[turn])
    assert base.keys() == hist.keys()
    differ = [n for n in base if base[n]["token_ids"] != hist[n]["token_ids"]]
    assert not differ, f"greedy tokens differ with HiState: {differ}"
    # Nothing restored (the first turn, the other sessions): the same logits up to rounding.
    spreads = {n: spread(hist[n], base[n]) for n in hist if not hist[n].get("restored")}
    print(f"{len(base)} requests, same greedy tokens; largest spread where nothing was "
          f"restored {max(spreads.values()):.3g}")
    assert max(spreads.values()) <= CAP, spreads
