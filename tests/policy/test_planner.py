import math

import pytest
from _helpers import Clock, FakeManager, chain, kv_item, st_item

from histate_vllm.policy import IntervalModel, Tier, make_policy
from histate_vllm.policy.interval import recompute_cost
from histate_vllm.policy.planner import LEARNED, CapturePlanner

BT = 256


def test_recompute_cost_matches_the_sum():
    for length in (1, 7, 256, 1000, 4096):
        for interval in (1, 3, 256, 1024, 5000):
            direct = sum(t % interval for t in range(length)) / length
            assert recompute_cost(length, interval) == pytest.approx(direct)


def test_interval_is_the_discrete_minimum_near_the_continuous_one():
    m = IntervalModel(BT)
    m.observe_kv_chunk(BT * 32 * 1024)  # 32 KiB per token
    m.observe_checkpoint(int(51.5e6))  # Qwen3.5-9B: ~1,570 token equivalents
    assert m.ns_tokens == pytest.approx(51.5e6 / (32 * 1024))
    for length in (4096, 32768, 131072):
        got = m.choose(length)
        assert got % BT == 0
        ns, pr = round(m.ns_tokens), round(m.pressure, 3)

        def cost(i):
            return pr * length / i * ns + recompute_cost(length, i)

        best = min(range(BT, length + BT, BT), key=cost)
        assert cost(got) == pytest.approx(cost(best))
        assert abs(got - math.sqrt(2 * length * m.ns_tokens)) <= 0.25 * got


def test_pressure_moves_the_interval():
    m = IntervalModel(BT)
    base = m.choose(65536)
    for _ in range(50):
        m.observe_residence(False, 100.0)  # KV stays long
        m.observe_residence(True, 10.0)  # checkpoints vanish fast -> sparser
    assert m.pressure > 1 and m.choose(65536) > base
    m2 = IntervalModel(BT)
    for _ in range(50):
        m2.observe_residence(False, 10.0)
        m2.observe_residence(True, 100.0)
    assert m2.choose(65536) < base


def test_fixed_interval_and_cap():
    p = CapturePlanner(BT, IntervalModel(BT, fixed=1000), max_intermediate=4)
    plan = p.plan(num_prompt_tokens=20 * 768 + 1, hit_tokens=0, restorable=0, shared=0)
    assert plan.interval == 768  # rounded down to blocks
    assert plan.positions[-1] == 20 * 768
    assert len(plan.positions) == 4 + 1 and "capped" in plan.reason
    assert all(x % BT == 0 for x in plan.positions)


def test_prompt_end_keeps_the_last_token():
    p = CapturePlanner(BT, IntervalModel(BT, fixed=10 * BT))
    assert p.plan(4 * BT, 0, 0, 0).positions == [3 * BT]
    assert p.plan(4 * BT + 1, 0, 0, 0).positions == [4 * BT]
    assert p.plan(4 * BT + 1, 4 * BT, 4 * BT, 4 * BT).positions == []


def test_learned_boundary_needs_512_tokens_past_the_restore_point():
    p = CapturePlanner(BT, IntervalModel(BT, fixed=100 * BT))
    plan = p.plan(40 * BT, hit_tokens=16 * BT, restorable=16 * BT, shared=18 * BT)
    assert plan.labels.get(18 * BT) == LEARNED
    plan = p.plan(40 * BT, hit_tokens=16 * BT, restorable=16 * BT, shared=17 * BT)
    assert 17 * BT not in plan.positions and "no learned boundary" in plan.reason


def test_gufo_edit_example():
    """Gufo fig. 3: 8,192-token history, checkpoints every 2,048; an edit at token 7,001
    restores 6,144 (the deepest checkpoint before the edit) and learns the divergence point."""
    clock = Clock()
    core = make_policy("histate", budgets={Tier.DRAM: 1 << 30, Tier.SSD: 1 << 30},
                       block_tokens=BT, interval=2048, clock=clock)
    mgr = FakeManager(core)
    tokens = list(range(8193))
    hashes = chain([tuple(tokens[i:i + BT]) for i in range(0, 8192, BT)])
    plan = core.plan_captures("A", hashes, len(tokens), 0)
    assert plan == [2048, 4096, 6144, 8192]
    items = [kv_item(hashes, i, BT, 1000, req="A") for i in range(len(hashes))]
    items += [st_item(hashes, p // BT - 1, BT, 4000, req="A", terminal=p == 8192) for p in plan]
    assert len(mgr.admit(items, Tier.DRAM)) == len(items)
    mgr.commit(Tier.DRAM)
    core.request_finished("A")

    edited = tokens[:7000] + [-1] + tokens[7001:]
    ehashes = chain([tuple(edited[i:i + BT]) for i in range(0, 8192, BT)])
    hit = core.restorable(ehashes)
    assert hit.position == 6144
    assert hit.shared == 7000 // BT * BT  # 6,912: KV still matches up to the edited block
    assert len(hit.kv_keys) == 6144 // BT and len(hit.state_keys) == 1
    plan = core.plan_captures("B", ehashes, len(edited), hit.position)
    assert 6912 in plan and plan[-1] == 8192  # learned boundary + prompt end
    text = core.explain(ehashes, 8192)
    assert "deepest restorable position now: 6144" in text


def test_the_first_message_end_is_a_checkpoint_inside_the_new_segment():
    from histate_vllm.policy.planner import BOUNDARY

    p = CapturePlanner(BT, IntervalModel(BT, fixed=100 * BT))
    plan = p.plan(10 * BT + 1, 0, 0, 0, boundaries=[3 * BT + 10])
    assert plan.labels[3 * BT] == BOUNDARY and plan.positions == [3 * BT, 10 * BT]
    # Before the resume point or past the prompt end it adds nothing.
    assert p.plan(10 * BT + 1, 4 * BT, 4 * BT, 4 * BT, boundaries=[3 * BT]).positions == [
        10 * BT]
    assert p.plan(10 * BT + 1, 0, 0, 0, boundaries=[12 * BT]).positions == [10 * BT]


def test_no_interval_checkpoints_when_capped_at_zero():
    p = CapturePlanner(BT, IntervalModel(BT, fixed=2 * BT), max_intermediate=0)
    plan = p.plan(num_prompt_tokens=20 * BT + 1, hit_tokens=0, restorable=0, shared=0)
    assert plan.positions == [20 * BT]  # the prompt end only
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError, match="max_intermediate"):
            CapturePlanner(BT, IntervalModel(BT), max_intermediate=bad)


def test_a_checkpoints_engine_step_is_part_of_its_cost():
    """Where chunk ends are priced a checkpoint also costs the step it adds: with storage
    free (eviction deletes only what nobody reads again) the interval is still more than
    one block."""
    m = IntervalModel(BT)
    m.price = 0.0
    assert m.choose(64 * BT) == BT
    assert m.choose(64 * BT, step_tokens=4 * BT) > BT
    assert m.choose(64 * BT, step_tokens=4 * BT) < m.choose(64 * BT, step_tokens=64 * BT)


def test_capping_the_points_keeps_the_step_cost_in_the_fork_placement(monkeypatch):
    """With more interval points than `max_intermediate`, the thinning stride must not
    stand in for the engine step cost that prices each checkpoint in `place`."""
    import histate_vllm.policy.planner as planner_mod

    seen = []
    real = planner_mod.place

    def spy(*args, **kw):
        seen.append(kw["min_gain"])
        return real(*args, **kw)

    monkeypatch.setattr(planner_mod, "place", spy)
    step = 256
    p = CapturePlanner(BT, IntervalModel(BT), max_intermediate=2, chunk_tokens=8 * BT,
                       step_cost_tokens=step)
    p.forks.observe(40 * BT + 10)
    plan = p.plan(num_prompt_tokens=400 * BT + 1, hit_tokens=0, restorable=0, shared=0)
    assert "capped" in plan.reason and seen
    m = p.model
    assert seen[-1] == pytest.approx(0.5 * (m.weight * m.ns_tokens + step))
