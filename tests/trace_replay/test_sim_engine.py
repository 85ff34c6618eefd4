"""The event loop: queueing in TTFT, closed-loop think times, session admission, subagents."""

import pytest
from _sim_helpers import SessionBuilder, rid, run, workload

from trace_replay.model import Session, Workload
from trace_replay.sim import Replay, ReplaySettings, SimClock, Simulator
from trace_replay.simulate import SimConfig

GiB = 1 << 30


def test_ttft_includes_queueing_behind_other_prefills():
    wl = workload(SessionBuilder("A").turn(8000), SessionBuilder("B").turn(8000))
    _, res = run(wl, "vllm-marconi", gpu=4 * GiB)
    t = SimConfig().cost().prefill_time(0, 8000)
    assert sorted(res.ttft) == pytest.approx([t, 2 * t])


def test_charged_chunk_ends_cost_a_step_each():
    """One cold 30K-token prompt, HiState planning checkpoints inside it: free, its TTFT is
    the prefill alone; charged, each chunk end the plan adds to vLLM's 8,192-token split
    costs one weight pass (the planner, told that price, keeps some: they pay for it)."""
    wl = workload(SessionBuilder("A").turn(30_000))
    cost = SimConfig().cost()
    prep, free = run(wl, "histate", gpu=4 * GiB, dram=4 * GiB, chunk=8192)
    assert free.stats["chunk_ends_added"] == 0 and prep.ctx_args["step_cost_tokens"] == 0
    assert free.ttft[0] == pytest.approx(cost.prefill_time(0, 30_000))
    prep, charged = run(wl, "histate", gpu=4 * GiB, dram=4 * GiB, chunk=8192,
                        chunk_ends="charged")
    added = charged.stats["chunk_ends_added"]
    assert added >= 1 and prep.ctx_args["step_cost_tokens"] == pytest.approx(
        cost.step_cost_tokens)
    assert charged.ttft[0] == pytest.approx(cost.prefill_time(0, 30_000) + added * cost.tpot)


def test_closed_loop_think_time_and_decode():
    wl = workload(SessionBuilder("A").turn(1000, out=101).turn(100, think=30.0, out=5))
    _, res = run(wl, "vllm-marconi", gpu=4 * GiB)
    cost = SimConfig().cost()
    first = cost.prefill_time(0, 1000)
    assert res.arrival[1] == pytest.approx(first + cost.decode_time(101) + 30.0)
    assert res.ttft[1] == pytest.approx(cost.prefill_time(960, 1100))


def test_concurrency_limit_admits_the_next_session_when_one_ends():
    a = SessionBuilder("A").turn(1000).turn(100, think=10.0)
    b = SessionBuilder("B").turn(1000)
    prep, res = run(workload(a, b), "vllm-marconi", gpu=4 * GiB, concurrency=1)
    order = prep.replay.order
    first, second = (prep.replay.sessions[i].id for i in order)
    last_of_first = max(rid(prep, first, k) for k in range(len(prep.replay.sessions[order[0]]
                                                              .requests)))
    assert res.arrival[rid(prep, second, 0)] > res.arrival[last_of_first]


def test_subagents_start_after_their_spawning_request():
    parent = SessionBuilder("P").turn(1000).turn(200, think=5.0)
    child = SessionBuilder("P/agent_1", ns="P").turn(500)
    sessions = (parent.session(),
                Session(id="P/agent_1", start=1.5, requests=child.session().requests,
                        kind="subagent", parent="P", agent_id="agent_1"))
    wl = Workload(name="sub", block_size=64, sessions=sessions, arrivals="synthetic").validate()
    # P's request 1 has t=1.0 (SessionBuilder uses t = index): the child spawns 0.5 s later.
    prep, res = run(wl, "vllm-marconi", gpu=4 * GiB, concurrency=1)
    assert res.arrival[rid(prep, "P/agent_1", 0)] == pytest.approx(
        res.arrival[rid(prep, "P", 1)] + 0.5)
    assert prep.replay.order == [0]  # subagents never take a session slot


def test_ramp_spreads_the_first_sessions():
    wl = workload(*(SessionBuilder(f"S{i}").turn(100) for i in range(4)))
    cfg = SimConfig(gpu_bytes=GiB, block_tokens=64, replay=ReplaySettings(ramp=40.0))
    from trace_replay.simulate import prepare, run_policy

    res = run_policy(prepare(wl, cfg), "unlimited")
    assert sorted(res.arrival) == pytest.approx([0.0, 10.0, 20.0, 30.0])


def test_same_seed_same_order_and_results():
    wl = workload(*(SessionBuilder(f"S{i}").turn(500).turn(100) for i in range(5)))
    r1 = Replay(wl, ReplaySettings(seed=7, concurrency=2))
    r2 = Replay(wl, ReplaySettings(seed=7, concurrency=2))
    assert r1.order == r2.order
    _, a = run(wl, "histate", gpu=GiB, dram=GiB, ssd=GiB, concurrency=2)
    _, b = run(wl, "histate", gpu=GiB, dram=GiB, ssd=GiB, concurrency=2)
    assert a.ttft.tolist() == b.ttft.tolist()


def test_every_request_completes_once():
    wl = workload(*(SessionBuilder(f"S{i}").turn(300).turn(100).turn(50) for i in range(3)))
    _, res = run(wl, "vllm-disk", gpu=GiB, dram=GiB, ssd=GiB, concurrency=2)
    assert len(res.ttft) == 9 and (res.ttft > 0).all()
    clock = SimClock()
    assert clock() == 0.0
    assert isinstance(Simulator, type)



class _Scripted:
    """A policy that restores given (DRAM, SSD) bytes per session, to time the queues."""

    name = "scripted"

    def __init__(self, by_session: dict[str, tuple[float, float]]):
        self.by_session = by_session

    def lookup(self, job):
        job.dram_bytes, job.ssd_bytes = self.by_session[job.req.session_id]

    def loaded(self, job):
        pass

    prefilled = finished = loaded

    def stats(self):
        return {}


def test_an_ssd_read_does_not_hold_the_link_for_a_later_dram_restore():
    from trace_replay.simulate import prepare

    wl = workload(SessionBuilder("A").turn(1000), SessionBuilder("B", start=0.01).turn(1000))
    prep = prepare(wl, SimConfig(replay=ReplaySettings(concurrency=24)))
    cost = prep.config.cost()
    ssd, dram = 10e9, 2e9  # A reads 10 GB from SSD (2 s at 5 GB/s); B copies 2 GB from DRAM
    policy = _Scripted({"A": (0.0, ssd), "B": (dram, 0.0)})
    res = Simulator(prep.replay, cost, policy, SimClock()).run()
    a, b = (prep.replay.requests.index(r) for r in
            sorted(prep.replay.requests, key=lambda r: r.session_id))
    pf = cost.prefill_time(0, 1000)
    # B: its copy, then its prefill; A: its read and copy (a restore alone), its prefill.
    assert res.ttft[b] == pytest.approx(cost.h2d_time(dram) + pf, rel=1e-6)
    assert res.ttft[a] == pytest.approx(cost.load_time(0.0, ssd) + pf, rel=1e-6)
    assert cost.ssd_read_time(ssd) > 1.0  # B would have waited that long behind A before
