"""Resuming inside old prompts: checkpoints where the policy plans them, in a real engine.

vLLM saves a recurrent state only where a prefill chunk ends; the connector points each
chunk end at the policy's next planned capture position (see
HiStateConnectorScheduler._steer_chunk_end). Engines, once per state dtype (so both block
sizes, 384 and 256 tokens, run on any machine):
  V  vLLM alone (prefix caching on, default retention): the baseline, with the block size
     the engine picks (C reports it; see test_connector_e2e's V for why).
  X  the same requests with HiStateConnector (DRAM only).
  C  cold reference, prefix caching off.
Requests: a 16k-token history H; at once an edit inside H (E0, while the GPU still holds
H); other sessions flood the GPU cache (1.25x its capacity); the same edit point again with
other text (EDIT); then three subagents forking after H's first 5,000 tokens.
"""

from __future__ import annotations

import random
import re

import pytest

from conftest import run_engine
from exactness import assert_same_as_alone, matches, measured_tolerance
from test_connector_e2e import whole_blocks

pytestmark = pytest.mark.engine

MiB = 1 << 20
rng = random.Random(4321)


def _tokens(n: int) -> list[int]:
    return [rng.randrange(2, 2000) for _ in range(n)]


H = _tokens(16000)
EDIT_AT = 11200
EDIT = H[:EDIT_AT] + _tokens(500)
E0 = H[:EDIT_AT] + _tokens(400)
FORK_AT = 5000
FORKS = {f"S{i}": H[:FORK_AT] + _tokens(n) for i, n in ((1, 800), (2, 700), (3, 600))}
CHECKED = {"E0": E0, "EDIT": EDIT, **FORKS}
REQUESTS = ([dict(name="H", prompt=H, max_tokens=4), dict(name="E0", prompt=E0, max_tokens=4),
             dict(name="F", flood=1.25, prompt_tokens=3000, max_tokens=8)]
            + [dict(name=n, prompt=p, max_tokens=4) for n, p in CHECKED.items() if n != "E0"])


def _engine(model, ssm_dtype, **spec) -> dict:
    # 96 blocks hold a 16k-token context at either block size (256 or 384 tokens).
    return dict(model=model, num_gpu_blocks=96, max_model_len=16896, ssm_dtype=ssm_dtype, **spec)


@pytest.fixture(scope="module")
def work(tmp_path_factory, ssm_dtype):
    return tmp_path_factory.mktemp(f"history-{ssm_dtype}")


@pytest.fixture(scope="module")
def alone(tiny_model, ssm_dtype, work, cold):
    run = run_engine(work, "V", _engine(tiny_model, ssm_dtype, block_size=cold.block_size,
                                        requests=REQUESTS))
    assert run.returncode == 0, run.log[-4000:]
    return run


@pytest.fixture(scope="module")
def histate(tiny_model, ssm_dtype, work):
    spec = _engine(tiny_model, ssm_dtype, log_level="DEBUG",
                   connector=dict(dram_bytes=256 * MiB), requests=REQUESTS)
    run = run_engine(work, "X", spec)
    assert run.returncode == 0, run.log[-4000:]
    return run


@pytest.fixture(scope="module")
def cold(tiny_model, ssm_dtype, work):
    spec = _engine(tiny_model, ssm_dtype, prefix_caching=False,
                   requests=[dict(name=n, prompt=p, max_tokens=4) for n, p in CHECKED.items()])
    run = run_engine(work, "C", spec)
    assert run.returncode == 0, run.log[-4000:]
    return run


def planned(run, name: str) -> list[int]:
    """The capture positions the connector logged for request `name`."""
    rid = re.escape(run[name]["request_id"])
    found = re.findall(rf"HiState: {rid}(?:-[0-9a-f]+)? resumes at \d+; checkpoints planned at \[([\d, ]*)\]",
                       run.log)
    assert found, f"no plan logged for {name}"
    return [int(p) for p in found[-1].split(",") if p.strip()]


def test_edit_resumes_from_the_nearest_planned_checkpoint(histate, alone):
    bs = histate.block_size
    plan = planned(histate, "H")
    inside = [p for p in plan if p < len(H) - bs]
    assert inside, f"no checkpoint planned inside the 16k history: {plan}"
    interval = plan[0]  # the first point of a segment that starts at 0
    # E0 branched off H at the same point and captured there (a learned branch boundary),
    # so the nearest checkpoint may be E0's.
    branch = planned(histate, "E0")
    expected = max([p for p in plan + branch if p <= EDIT_AT], default=0)
    hit = histate["EDIT"]["num_cached_tokens"]
    assert hit == expected, f"edit at {EDIT_AT} resumed at {hit}; plans {plan}, {branch}"
    assert EDIT_AT - hit < interval + bs, (EDIT_AT, hit, interval, bs)
    assert whole_blocks(EDIT_AT, bs) in branch, f"E0 kept no state at its branch point: {branch}"
    # The flood took H out of the GPU cache: vLLM alone recomputes the edit from scratch.
    assert alone["EDIT"]["num_cached_tokens"] == 0
    print(f"{bs}-token blocks: plan {plan}; edit at {EDIT_AT} resumed at {hit} "
          f"(vLLM alone {alone['EDIT']['num_cached_tokens']})")


def gpu_split(run, name: str) -> tuple[int, int] | None:
    """(GPU prefix-cache tokens, tokens loaded by the connector) from vLLM's debug log."""
    rid = re.escape(run[name]["request_id"])
    found = re.findall(rf"Request {rid}(?:-[0-9a-f]+)? hit (\d+) offloaded tokens after (\d+) GPU hit tokens",
                       run.log)
    return (int(found[-1][1]), int(found[-1][0])) if found else None


def test_edit_while_the_gpu_holds_the_history(histate, alone):
    """E0 comes while the GPU still holds all of H's attention KV, and states only where
    prefill chunks ended: at H's planned checkpoints (vLLM keeps them as junctions) and at
    H's end. It resumes at the nearest planned one before the edit; vLLM alone, which
    keeps H's end only, recomputes from scratch."""
    plan = planned(histate, "H")
    expected = max([p for p in plan if p <= EDIT_AT], default=0)
    hit = histate["E0"]["num_cached_tokens"]
    assert hit == expected, f"E0 resumed at {hit}; plan {plan}"
    assert hit >= alone["E0"]["num_cached_tokens"]
    print(f"{histate.block_size}-token blocks: E0 resumed at {hit} (GPU, connector: "
          f"{gpu_split(histate, 'E0')}); vLLM alone {alone['E0']['num_cached_tokens']}")


def test_forks_reuse_the_shared_prefix(histate, alone):
    bs = histate.block_size
    first, *later = FORKS
    assert histate[first]["num_cached_tokens"] >= alone[first]["num_cached_tokens"]
    for name in later:
        assert histate[name]["num_cached_tokens"] >= whole_blocks(FORK_AT, bs), name
    print({n: (alone[n]["num_cached_tokens"], histate[n]["num_cached_tokens"]) for n in FORKS})


def test_never_worse_than_vllm_alone(histate, alone):
    for name in ["H", *CHECKED]:
        assert histate[name]["num_cached_tokens"] >= alone[name]["num_cached_tokens"], name


@pytest.fixture(scope="module")
def tolerance(alone, cold):
    """vLLM's own noise: its prefix cache against the cold run (see exactness.py)."""
    return measured_tolerance([(alone, cold, CHECKED)])


@pytest.mark.parametrize("name", list(CHECKED))
def test_history_restores_are_exact(histate, cold, tolerance, name):
    ok, why = matches(histate[name], cold[name], tolerance)
    assert ok, f"{name} (cached {histate[name]['num_cached_tokens']}): {why}"


def test_nothing_restored_decodes_as_vllm_alone(histate, alone, tolerance):
    """H and the flood's prompts: the connector restores nothing into them, so they decode
    exactly as with vLLM alone (within its own noise)."""
    names = [n for n, r in histate.results.items() if "logprobs" in r and not r.get("restored")]
    assert "H" in names and len(names) > 2, names
    assert_same_as_alone(histate, alone, names, tolerance)
