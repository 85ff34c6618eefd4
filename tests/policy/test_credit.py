"""Checkpoints on credit (the core's `credit` option): storage is free until eviction first
deletes KV, and what was checkpointed on that credit displaces nothing."""

import pytest
from _helpers import Clock, FakeManager, chain, kv_item, st_item
from test_gds import BT, KVB, STB, state_key, store

from histate_vllm.policy import IntervalModel, Tier, make_key, make_policy
from histate_vllm.policy.ghost import Ghost


def build(dram, ssd=0, credit=True):
    clock = Clock()
    core = make_policy("histate", budgets={Tier.DRAM: dram, Tier.SSD: ssd}, block_tokens=BT,
                       clock=clock, kv_bytes_per_token=1.0, credit=credit)
    return core, FakeManager(core), clock


def test_storage_is_free_on_credit():
    m = IntervalModel(BT)
    m.observe_kv_chunk(BT * KVB)
    m.observe_checkpoint(STB * KVB)
    paper = m.choose(64 * BT)
    m.on_credit = True
    assert m.choose(64 * BT) == BT < paper
    m.on_credit = False  # eviction has deleted: the paper's model until a price is measured
    assert m.choose(64 * BT) == paper


def test_a_young_ghost_does_not_price_capacity():
    g = Ghost(half_life_bytes=1 << 40, mature=True)
    g.deleted(b"a", 100, now=0.0, horizon=1e9)
    assert g.deletions == 1 and g.price is None  # deleted, not yet unwanted for long
    g.age(now=5.0, after=10.0)
    assert g.price is None
    g.age(now=10.0, after=10.0)
    assert g.price == 0.0  # unwanted for one reuse interval: priced
    g.deleted(b"b", 100, now=20.0, horizon=1e9)
    assert g.take(b"b", now=21.0, horizon=1e9)
    g.recomputed(100)
    assert g.price == pytest.approx(1.0)  # wanted counts at once


def test_wanted_before_any_deletion_matures_prices_it_dear():
    g = Ghost(half_life_bytes=1 << 40, mature=True)
    g.deleted(b"a", 100, now=0.0, horizon=1e9)
    assert g.take(b"a", now=1.0, horizon=1e9)
    g.recomputed(100)
    assert g.price == 1.0


def test_credit_plans_dense_checkpoints_until_eviction_deletes():
    dense, paper = (build(dram=1 << 30, credit=c)[0] for c in (True, False))
    a = chain(range(16))
    got = dense.plan_captures("r", a, 16 * BT + 1, 0)
    assert got == [BT * i for i in range(1, 17)]
    assert len(paper.plan_captures("r", a, 16 * BT + 1, 0)) < len(got)


def test_dram_pressure_deletes_a_checkpoint_on_credit_instead_of_moving_it():
    """A checkpoint taken on credit never queues an SSD write ahead of KV: DRAM pressure
    deletes it (without credit it moves to SSD: test_gds's states_lead test)."""
    for credit in (True, False):
        core, mgr, clock = build(dram=8 * KVB + 2 * STB, ssd=1 << 20, credit=credit)
        a, b = chain(range(8), salt=b"a"), chain(range(8), salt=b"b")
        core.plan_captures("r", a, 8 * BT + 1, 0)
        store(mgr, a, 8, [4, 8], req="r")
        mid = state_key(a, 4)
        assert core.index.entries[mid].node.credit == credit
        core.request_finished("r")
        clock.advance(10)
        adm = core.admit([kv_item(b, 0, BT, KVB)], Tier.DRAM)
        assert (mid, Tier.DRAM) in adm.evict and (mid in adm.spill) != credit
        for k in adm.spill:
            core.committed(k, Tier.SSD, True)
        assert core.where(mid) == (frozenset() if credit else {Tier.SSD})
        assert all(core.where(make_key(h, 0)) for h in a)  # no KV lost either way
        core.check_invariants()


def test_once_eviction_deletes_checkpoints_on_credit_go_first():
    """The first KV deletion ends the credit: no new plan is dense, and the intermediate
    checkpoints taken on credit are evicted before older data."""
    core, mgr, clock = build(dram=36 * KVB + 4 * STB)
    old = [chain(range(8), salt=bytes([i])) for i in range(3)]
    for h in old:  # older than a's checkpoints
        mgr.admit([kv_item(h, i, BT, KVB) for i in range(8)], Tier.DRAM)
        mgr.commit(Tier.DRAM)
        clock.advance(10)
    a = chain(range(8), salt=b"a")
    core.plan_captures("r", a, 8 * BT + 1, 0)
    store(mgr, a, 8, [2, 4, 6, 8], req="r")
    core.request_finished("r")
    credit = [state_key(a, b) for b in (2, 4, 6)]
    assert all(core.index.entries[k].node.credit for k in credit)
    clock.advance(10)
    assert core.ghost.deletions == 0 and core.interval.on_credit
    h = chain(range(8), salt=b"fill")
    mgr.admit([kv_item(h, i, BT, KVB) for i in range(8)], Tier.DRAM)  # deletes KV
    mgr.commit(Tier.DRAM)
    assert core.ghost.deletions
    core.plan_captures("s", chain(range(16), salt=b"s"), 16 * BT + 1, 0)
    assert not core.interval.on_credit and core.ev.credit_due
    assert all(core.where(k) for k in credit)
    kept = [x for x in old if all(core.where(make_key(b, 0)) for b in x)]
    assert kept  # older KV that GDS alone would evict next
    clock.advance(10)
    h = chain(range(8), salt=b"more")
    mgr.admit([kv_item(h, i, BT, KVB) for i in range(2)], Tier.DRAM)
    mgr.commit(Tier.DRAM)
    assert not all(core.where(k) for k in credit)  # a checkpoint on credit went first
    assert all(core.where(make_key(b, 0)) for x in kept for b in x)
    mgr.check()
    core.check_invariants()


def test_a_checkpoint_on_credit_takes_free_room_only():
    """Admitting it never evicts: with DRAM full it is refused, with a reason."""
    for credit in (True, False):
        core, mgr, clock = build(dram=8 * KVB + STB, credit=credit)
        a = chain(range(8), salt=b"a")
        core.plan_captures("r", a, 8 * BT + 1, 0)
        mgr.admit([kv_item(a, i, BT, KVB, "r") for i in range(8)], Tier.DRAM)
        mgr.commit(Tier.DRAM)
        got = mgr.admit([st_item(a, 3, BT, STB, req="r"), st_item(a, 5, BT, STB, req="r")],
                        Tier.DRAM)
        mgr.commit(Tier.DRAM)
        if credit:
            assert got == [state_key(a, 4)]  # the first fits; the second would evict
            assert any("planned on credit" in e.reason for e in core.drain_events()
                       if e.op == "reject")
        assert all(core.where(make_key(h, 0)) for h in a)
        mgr.check()
