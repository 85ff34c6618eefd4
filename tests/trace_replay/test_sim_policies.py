"""Each simulated system on tiny hand-made workloads (64-token blocks, Qwen3.5-9B sizes:
2 MiB of KV per block, 49 MiB per checkpoint)."""

import pytest
from _sim_helpers import BS, MB, SessionBuilder, hits, rid, run, workload

from histate_vllm.policy import Tier
from histate_vllm.policy.core import HiStatePolicy
from histate_vllm.policy.lru import LRUPolicy
from trace_replay.policies import POLICIES, PolicyContext, make
from trace_replay.sim import SimClock
from trace_replay.simulate import SimConfig

GiB = 1 << 30


def _ctx(gpu=GiB, dram=GiB, ssd=GiB, chunk=8192):
    return PolicyContext(cost=SimConfig().cost(), block_tokens=BS, gpu_bytes=gpu,
                         dram_bytes=dram, ssd_bytes=ssd, chunk_tokens=chunk, clock=SimClock())


def _append():
    return workload(SessionBuilder("A").turn(1000).turn(500))


@pytest.mark.parametrize("policy", POLICIES)
def test_append_reuses_the_previous_prompt(policy):
    prep, res = run(_append(), policy, gpu=256 * MB, dram=GiB, ssd=GiB)
    h = hits(prep, res)
    assert h[("A", 0)] == 0
    assert h[("A", 1)] == (1000 - 1) // BS * BS  # the prompt-end checkpoint


def _flooded(think=100.0):
    """A's second turn comes after four other sessions flooded a one-session GPU cache."""
    a = SessionBuilder("A").turn(1000).turn(500, think=think)
    floods = [SessionBuilder(f"F{i}", start=5.0 + i).turn(1000) for i in range(4)]
    return workload(a, *floods)


def test_gpu_only_baseline_misses_after_a_flood_and_offload_restores():
    wl = _flooded()
    gpu = 100 * MB  # KV of one 1000-token prompt (30 MiB) + one state (49 MiB)
    prep, marconi = run(wl, "vllm-marconi", gpu=gpu)
    i = rid(prep, "A", 1)
    assert marconi.hit[i] == 0
    for policy in ("vllm-cpu", "vllm-disk", "sglang-hicache", "histate", "lru-disk"):
        _, res = run(wl, policy, gpu=gpu, dram=GiB, ssd=GiB)
        assert res.hit[i] == 960, policy
        assert res.gpu_hit[i] == 0, policy
        assert res.dram_bytes[i] > 0 and res.ssd_bytes[i] == 0, policy


def test_disk_tier_serves_what_dram_lost():
    wl = _flooded()
    prep, res = run(wl, "vllm-disk", gpu=100 * MB, dram=60 * MB, ssd=GiB)
    i = rid(prep, "A", 1)
    assert res.hit[i] == 960
    assert res.ssd_bytes[i] > 0
    _, cpu = run(wl, "vllm-cpu", gpu=100 * MB, dram=60 * MB)
    assert cpu.hit[i] == 0  # the DRAM-only baseline lost it


def test_restore_is_charged_to_ttft():
    wl = _flooded(think=100.0)
    prep, res = run(wl, "vllm-disk", gpu=100 * MB, dram=60 * MB, ssd=GiB)
    cost = SimConfig().cost()
    i = rid(prep, "A", 1)
    load = cost.load_time(res.dram_bytes[i], res.ssd_bytes[i])
    compute = cost.prefill_time(int(res.hit[i]), 1500)
    assert res.ttft[i] == pytest.approx(load + compute, rel=1e-6)


def _rewind():
    # A 40K-token first turn, then an edit from token 25000 on: a hit inside the old prompt.
    return workload(SessionBuilder("A").turn(40000).turn(500, cut=25000, label="rewind"))


def test_intermediate_checkpoints_serve_internal_hits():
    wl = _rewind()
    kw = {"gpu": 4 * GiB, "dram": 4 * GiB, "ssd": 4 * GiB}
    prep, unl = run(wl, "unlimited", **kw)
    i = rid(prep, "A", 1)
    assert unl.hit[i] == 25000 // BS * BS
    _, disk = run(wl, "vllm-disk", **kw)
    assert disk.hit[i] == 0  # only the prompt-end state exists, past the edit
    _, hs = run(wl, "histate", **kw)
    assert 0 < hs.hit[i] <= unl.hit[i]
    _, f32 = run(wl, "fixed-32", **kw)
    assert f32.hit[i] == 25000 // (32 * BS) * 32 * BS
    _, sg = run(wl, "sglang-hicache", chunk=8192, **kw)
    assert sg.hit[i] == 0  # SGLang 0.5 no_buffer: no state per prefill chunk
    _, sgc = run(wl, "sglang-hicache-chunks", chunk=8192, **kw)
    assert sgc.hit[i] == 3 * (8192 // BS * BS)  # its chunk-end states
    _, da = run(wl, "vllm-disk-align", chunk=8192, **kw)
    assert da.hit[i] == 3 * (8192 // BS * BS)


def test_junction_checkpoint_serves_the_next_fork():
    # Two edits at the same point: the first misses, its prefill leaves a state at the
    # junction, the second restores it (vLLM's junction / HiState's learned boundary).
    a = SessionBuilder("A").turn(6000).turn(300, cut=3000).turn(300, cut=3000)
    wl = workload(a)
    for policy in ("vllm-marconi", "vllm-disk", "histate"):
        prep, res = run(wl, policy, gpu=4 * GiB, dram=4 * GiB, ssd=4 * GiB)
        assert res.hit[rid(prep, "A", 2)] == 3000 // BS * BS, policy


def test_a_declared_breakpoint_serves_the_first_fork_there():
    """A new conversation keeps the first prompt's first 5,000 tokens (the tools): the
    client declared that point, so the first prompt leaves a state there and the first
    fork resumes from it; a client that declares nothing gets only the interval's."""
    import msgspec

    a = SessionBuilder("A").turn(20000).turn(300, cut=5000)
    a.reqs = [msgspec.structs.replace(r, breakpoints=(5000,)) for r in a.reqs]
    wl = workload(a)
    kw = {"gpu": 4 * GiB, "dram": 4 * GiB, "ssd": 4 * GiB}
    prep, hs = run(wl, "histate", **kw)
    assert hs.hit[rid(prep, "A", 1)] == 5000 // BS * BS
    prep, plain = run(wl, "histate", breakpoints="none", **kw)
    assert plain.hit[rid(prep, "A", 1)] < 5000 // BS * BS


def test_histate_drives_the_real_policy_core():
    assert isinstance(make("histate", _ctx()).core, HiStatePolicy)
    assert isinstance(make("lru-disk", _ctx()).core, LRUPolicy)
    assert make("histate", _ctx()).core.planner.model.fixed is None
    assert make("fixed-32", _ctx()).core.planner.model.fixed == 32 * BS
    assert make("align", _ctx(chunk=8192)).core.planner.model.fixed == 8192 // BS * BS


def test_histate_keeps_historical_checkpoints_on_ssd_and_the_terminal_in_dram():
    wl = workload(SessionBuilder("A").turn(40000))
    prep, _ = run(wl, "histate", gpu=4 * GiB, dram=4 * GiB, ssd=4 * GiB)
    ctx = _ctx(gpu=4 * GiB, dram=4 * GiB, ssd=4 * GiB)
    from trace_replay.sim import Simulator

    pol = make("histate", ctx)
    Simulator(prep.replay, ctx.cost, pol, ctx.clock).run()
    core = pol.core
    states = [e for e in core.index.entries.values() if e.kind.name == "STATE"]
    assert len(states) >= 2
    for e in states:
        where = core.where(e.key)
        if e.node.live_children:  # historical
            assert where == {Tier.SSD}, (e.node.position, where)
        else:  # terminal
            assert Tier.DRAM in where
    core.check_invariants()


def test_sglang_partitions_gpu_and_dram_half_and_half():
    pol = make("sglang-hicache", _ctx(gpu=100 * MB, dram=200 * MB))
    assert pol.gpu.caps == [50 * MB, 50 * MB]
    dram = pol.tiers[0]
    assert dram.kv.capacity == dram.st.capacity == 100 * MB
    assert pol.tiers[1].kv is pol.tiers[1].st  # one disk pool


def test_sglang_state_pool_evicts_states_independently_of_kv():
    # 160 MiB: 80 MiB of states holds one 49 MiB checkpoint, so B's state evicts A's while
    # A's KV stays; in one shared pool both sessions (2 x 69 MiB) fit.
    a = SessionBuilder("A").turn(640).turn(100, think=50.0)
    b = SessionBuilder("B", start=10.0).turn(640)
    prep, res = run(workload(a, b), "sglang-hicache", gpu=160 * MB)
    i = rid(prep, "A", 1)
    assert res.hit[i] == 0
    pol = make("sglang-hicache", _ctx(gpu=160 * MB))
    assert pol.gpu.caps[1] < 2 * pol.sb
    prep, res = run(workload(a, b), "vllm-marconi", gpu=160 * MB)
    assert res.hit[i] == 576


def test_unlimited_never_forgets():
    wl = _flooded(think=1e6)
    prep, res = run(wl, "unlimited", gpu=1, dram=0, ssd=0)
    assert res.hit[rid(prep, "A", 1)] == 960
    assert res.dram_bytes.sum() == res.ssd_bytes.sum() == 0


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy"):
        make("nope", _ctx())
