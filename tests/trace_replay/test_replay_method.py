"""Replay method (kv-cache-tester semantics): arrival gaps, gap cap, time scale, context limit."""

import math

import pytest
from _sim_helpers import SessionBuilder, rid

from trace_replay.model import Session, Workload
from trace_replay.sim import ReplaySettings
from trace_replay.sim.engine import limit_context
from trace_replay.simulate import SimConfig, prepare, run_policy

GiB = 1 << 30


def _recorded(*sessions) -> Workload:
    return Workload(name="r", block_size=64, sessions=tuple(sessions), arrivals="recorded")


def _run(wl, **replay):
    cfg = SimConfig(gpu_bytes=4 * GiB, block_tokens=64, replay=ReplaySettings(**replay))
    prep = prepare(wl, cfg)
    return prep, run_policy(prep, "vllm-marconi")


def _two_turns(t1: float, think: float) -> Session:
    s = SessionBuilder("A").turn(1000, out=1).turn(100, think=think, out=1).session()
    r0, r1 = s.requests
    from msgspec.structs import replace

    return replace(s, requests=(r0, replace(r1, t=t1)))


def _gap(prep, res) -> float:
    cost = SimConfig().cost()
    end0 = res.arrival[0] + res.ttft[0] + cost.decode_time(1)
    return res.arrival[rid(prep, "A", 1)] - end0


def test_recorded_traces_use_arrival_gaps_capped_at_60_s_by_default():
    wl = _recorded(_two_turns(t1=18.0, think=1995.0))
    prep, res = _run(wl)
    assert prep.replay.settings.gap == "arrival"
    assert _gap(prep, res) == pytest.approx(18.0)
    prep, res = _run(_recorded(_two_turns(t1=500.0, think=1.0)))
    assert _gap(prep, res) == pytest.approx(60.0)


def test_cap_then_time_scale_as_kv_cache_tester():
    wl = _recorded(_two_turns(t1=500.0, think=1.0))
    prep, res = _run(wl, max_delay=100.0, time_scale=0.5)
    assert _gap(prep, res) == pytest.approx(50.0)
    prep, res = _run(wl, max_delay=math.inf)
    assert _gap(prep, res) == pytest.approx(500.0)
    prep, res = _run(wl, gap="think", max_delay=math.inf)
    assert _gap(prep, res) == pytest.approx(1.0)


def test_context_limit_ends_the_session_at_its_first_longer_request():
    s = SessionBuilder("A").turn(1000).turn(1000).turn(1000).turn(10).session()
    wl = _recorded(s)
    out, dropped = limit_context(wl, 2500)
    assert [r.input_tokens for r in out.sessions[0].requests] == [1000, 2000]
    assert dropped == 2  # the shorter request after the limit is not replayed either
    assert limit_context(wl, 0) == (wl, 0)
    prep, res = _run(wl, max_context=2500)
    assert len(res.ttft) == 2 and prep.context_dropped == 2


def test_context_limit_drops_subagents_spawned_after_the_end():
    parent = SessionBuilder("P").turn(1000).turn(5000).session()  # t = 0, 1
    early = SessionBuilder("P/a", ns="P").turn(500).session()
    late = SessionBuilder("P/b", ns="P").turn(500).session()
    wl = _recorded(parent,
                   Session(id="P/a", start=0.5, requests=early.requests, kind="subagent",
                           parent="P", agent_id="a"),
                   Session(id="P/b", start=2.0, requests=late.requests, kind="subagent",
                           parent="P", agent_id="b"))
    out, dropped = limit_context(wl, 4000)
    assert [s.id for s in out.sessions] == ["P", "P/a"] and dropped == 2
