"""A fleet of simulated engines: the fleet tier restores a moved session whole or not at
all, the routers' rules, one engine equal to the single-engine simulator, determinism."""

from types import SimpleNamespace

import numpy as np
from _sim_helpers import BS, MB, SessionBuilder, rid, workload
from msgspec.structs import replace as replace_struct

from trace_replay.policies.base import PolicyContext
from trace_replay.policies.fleet import FleetHiState
from trace_replay.policies.histate import _KVS, _STS
from trace_replay.sim import ReplaySettings, SimClock
from trace_replay.sim.fleet import ConsistentHash, FleetTierModel, LeastLoaded
from trace_replay.sim.job import Job
from trace_replay.simulate import SimConfig, prepare, run_policy
from trace_replay.simulate_fleet import FleetConfig, run_row

GiB = 1 << 30
FAST = {"fleet_read_bw": 100e9, "fleet_write_bw": 100e9}  # a fleet restore always pays


def config(**kw) -> SimConfig:
    return SimConfig(gpu_bytes=kw.pop("gpu", 64 * MB), dram_bytes=GiB, ssd_bytes=4 * GiB,
                     block_tokens=BS, replay=ReplaySettings(concurrency=8, **kw))


def by_turn(job, session, engines):
    """Turn k of every session on engine k % N: each later turn lands elsewhere."""
    return job.req.index % len(engines)


def moved_session():
    return workload(SessionBuilder("A").turn(3000).turn(400, think=5.0))


def test_a_session_moved_to_another_engine_restores_from_the_fleet_tier():
    prep = prepare(moved_session(), config())
    fleet = FleetConfig(engines=2, **FAST)
    with_tier, tier = run_row(prep, fleet, "load+fleet", route=by_turn)
    without, _ = run_row(prep, fleet, "load", route=by_turn)
    second = rid(prep, "A", 1)
    assert list(with_tier.engine) == [0, 1]
    assert without.hit[second] == 0  # engine 1 never saw the session
    # The checkpoint engine 0 left at turn 0's prompt end (2944 = 46 blocks), restored whole.
    assert with_tier.hit[second] == 2944
    assert with_tier.fleet_bytes[second] > 0 and with_tier.ssd_bytes[second] == 0
    assert with_tier.ttft[second] < without.ttft[second]
    assert tier["publish_ok"] >= 1 and with_tier.stats["fleet_restores"] == 1


def test_a_slow_fleet_tier_is_not_read_when_recomputing_is_faster():
    prep = prepare(moved_session(), config())
    res, _ = run_row(prep, FleetConfig(engines=2, fleet_read_bw=0.01e9), "load+fleet",
                     route=by_turn)
    assert res.hit[rid(prep, "A", 1)] == 0 and res.stats["fleet_restores_declined"] == 1


def fleet_policy(prep, tier):
    ctx = PolicyContext(cost=prep.config.cost(), clock=SimClock(), drive=prep.config.drive(),
                        **prep.ctx_args)
    return FleetHiState(ctx, tier, FleetConfig(**FAST).link(), 0.001)


def test_a_checkpoint_missing_a_chunk_in_the_fleet_tier_is_not_restored():
    prep = prepare(moved_session(), config())
    req = prep.replay.requests[1]
    hb = Job(1, req, prep.replay.blocks[1], 0.0, BS).hashes_bytes()
    whole, holed = FleetTierModel(GiB), FleetTierModel(GiB)
    for tier in (whole, holed):
        for i, h in enumerate(hb[:46]):
            if tier is whole or i != 10:  # chunk 10 evicted from the second
                tier.objects.put(h + _KVS, 1)
        tier.objects.put(hb[45] + _STS, 1)
    for tier, expect in ((whole, 46), (holed, 0)):
        job = Job(1, req, prep.replay.blocks[1], 0.0, BS)
        fleet_policy(prep, tier).lookup(job)
        assert job.resume == expect * BS
        assert (job.fleet_bytes > 0) == (expect > 0)


def test_the_fleet_tier_evicts_least_recently_used_chunks_first():
    tier = FleetTierModel(10)
    tier.land(b"s1", [(b"c1", 3), (b"c2", 3)], 2, ok=True)
    tier.touch([b"c1"])
    tier.land(b"s2", [(b"c3", 3)], 2, ok=True)  # 13 > 10: c2 (oldest unread) goes
    assert b"c2" not in tier and b"c1" in tier and b"s1" in tier and b"s2" in tier
    assert tier.to_upload(b"s1", [b"c1"]) is None  # published already
    assert tier.to_upload(b"s3", [b"c1", b"c2"]) == [b"c2"]
    tier.land(b"s4", [(b"c4", 1)], 1, ok=False)  # dropped by its link's queue
    assert b"s4" not in tier and tier.stats["publish_dropped"] == 1


def test_consistent_hash_keeps_a_session_and_its_subagents_on_one_engine():
    main = SessionBuilder("M").turn(500).turn(100)
    sub = SessionBuilder("S", start=0.5, base=main.ctx).turn(200)
    wl = workload(main, sub)
    wl = replace_struct(wl, sessions=(wl.sessions[0], replace_struct(
        wl.sessions[1], kind="subagent", parent="M")))
    prep = prepare(wl, config())
    route = ConsistentHash(prep.replay, 4)
    again = ConsistentHash(prep.replay, 4)
    picks = {route(None, s, []) for s in range(2)}
    assert len(picks) == 1 and picks == {again(None, 0, [])}
    spread = {ConsistentHash(prep.replay, 4)(None, 0, []) for _ in range(3)}
    assert len(spread) == 1


def test_least_loaded_picks_the_fewest_outstanding_tokens_then_requests_then_rotates():
    route = LeastLoaded(None, 3)
    e = [SimpleNamespace(outstanding=0, in_flight=0) for _ in range(3)]
    assert [route(None, 0, e) for _ in range(4)] == [0, 1, 2, 0]  # idle: round robin
    e[0].in_flight = e[1].in_flight = 1
    assert route(None, 0, e) == 2  # no prefill queued anywhere: fewest requests
    e[2].outstanding = 5000
    assert route(None, 0, e) in (0, 1)
    e[0].outstanding = 100
    assert route(None, 0, e) == 1


def floods():
    a = SessionBuilder("A").turn(3000).turn(300, think=20.0).turn(300, think=20.0)
    return workload(a, *(SessionBuilder(f"F{i}", start=2.0 + i).turn(2500).turn(200)
                         for i in range(5)))


def test_one_engine_is_the_single_engine_simulator():
    prep = prepare(floods(), config(gpu=200 * MB))
    single = run_policy(prep, "histate")
    for row in ("hash", "load"):
        fleet, _ = run_row(prep, FleetConfig(engines=1), row)
        assert np.array_equal(fleet.ttft, single.ttft) and np.array_equal(fleet.hit, single.hit)


def test_the_same_seed_gives_the_same_fleet_run():
    prep = prepare(floods(), config(gpu=200 * MB, seed=3))
    for row in ("hash", "load", "load+fleet", "load+native"):
        a, _ = run_row(prep, FleetConfig(engines=3), row)
        b, _ = run_row(prep, FleetConfig(engines=3), row)
        assert np.array_equal(a.ttft, b.ttft) and np.array_equal(a.engine, b.engine)
        assert np.array_equal(a.hit, b.hit)


def test_native_offloading_shares_its_file_tier_across_engines():
    prep = prepare(moved_session(), config())
    res, files = run_row(prep, FleetConfig(engines=2, **FAST), "load+native", route=by_turn)
    second = rid(prep, "A", 1)
    assert res.hit[second] > 0 and res.fleet_bytes[second] > 0 and res.dram_bytes[second] == 0
    assert files["file_used_bytes"] > 0


def test_bounded_hash_keeps_sessions_home_unless_their_engine_is_overloaded():
    from types import SimpleNamespace

    from trace_replay.sim.fleet import BoundedHash, ConsistentHash

    replay = SimpleNamespace(sessions=[SimpleNamespace(id=f"s{i}", parent=None)
                                       for i in range(40)])
    plain, bounded = ConsistentHash(replay, 4), BoundedHash(replay, 4)
    idle = [SimpleNamespace(outstanding=0) for _ in range(4)]
    job = SimpleNamespace(input_tokens=1000)
    homes = [plain(job, s, idle) for s in range(40)]
    assert [bounded(job, s, idle) for s in range(40)] == homes
    busy = [SimpleNamespace(outstanding=200_000 if e == homes[0] else 0) for e in range(4)]
    moved = bounded(job, 0, busy)
    assert moved != homes[0]  # off the overloaded engine
    assert all(bounded(job, s, busy) == homes[s] for s in range(40) if homes[s] != homes[0])
