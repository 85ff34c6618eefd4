"""Capacity's price (ghost.py) and how it, with the internal-hit rate, moves the interval."""

import pytest
from _helpers import Clock, FakeManager, chain
from test_gds import BT, KVB, STB, store

from histate_vllm.policy import IntervalModel, Tier, make_policy
from histate_vllm.policy.ghost import Ghost


def build(dram, ssd=0):
    """An adaptive-interval core (test_gds's fixes the interval)."""
    clock = Clock()
    core = make_policy("histate", budgets={Tier.DRAM: dram, Tier.SSD: ssd}, block_tokens=BT,
                       clock=clock, kv_bytes_per_token=1.0)
    return core, FakeManager(core), clock


def test_price_is_recomputed_over_deleted_bytes_within_the_horizon():
    g = Ghost(half_life_bytes=1 << 40)
    assert g.price is None  # nothing deleted: nothing measured
    g.deleted(b"a", 100, now=0.0, horizon=10.0)
    g.deleted(b"b", 100, now=1.0, horizon=10.0)
    assert g.price == 0.0  # deleted, not wanted (yet)
    assert g.take(b"a", now=5.0, horizon=10.0)
    g.recomputed(100)
    assert g.price == pytest.approx(0.5)
    assert not g.take(b"a", now=6.0, horizon=10.0)  # each block counts once
    assert not g.take(b"b", now=20.0, horizon=10.0)  # past the horizon: not displaced
    g.deleted(b"c", 100, now=30.0, horizon=10.0)
    assert b"b" not in g.blocks  # aged out as it was passed


def test_interval_weight_uses_price_and_hit_rate_once_measured():
    m = IntervalModel(BT)
    m.observe_kv_chunk(BT * KVB)
    m.observe_checkpoint(STB * KVB)
    paper = m.choose(64 * BT)
    assert m.weight == m.pressure  # nothing measured: the paper's model
    m.price = 0.0  # eviction deletes only what nobody reads again
    assert m.choose(64 * BT) == BT
    m.price = 1.0
    for _ in range(4096):
        m.observe_segment(False)  # internal hits are rare: a checkpoint seldom pays
    assert m.hit_rate < 0.01
    assert m.choose(64 * BT) > paper
    for _ in range(4096):
        m.observe_segment(True)
    assert m.hit_rate > 0.9 and m.choose(64 * BT) == paper


def _fill(mgr, clock, sessions, blocks):
    for s in sessions:
        store(mgr, s, blocks, [blocks])
        clock.advance(10)


def test_the_core_prices_capacity_by_what_comes_back():
    """Sessions that never return: eviction deletes dead data, the price is 0 and the next
    plan checkpoints every block. A session that returns to deleted KV raises the price."""
    core, mgr, clock = build(dram=6 * (8 * KVB + STB))
    dead = [chain(range(8), salt=bytes([i])) for i in range(12)]
    _fill(mgr, clock, dead, 8)
    assert core.ghost.price == 0.0 and core.ghost.blocks
    fresh = chain(range(16), salt=b"new")
    core.plan_captures("r", fresh, 16 * BT + 1, 0)
    assert core.interval.price == 0.0
    assert core.plan_captures("r2", fresh, 16 * BT + 1, 0) == [BT * i for i in range(1, 17)]
    # The oldest dead session comes back: its deleted KV is recomputed.
    back = dead[0] + chain(range(4), salt=b"more")
    core.plan_captures("r3", back, 12 * BT + 1, 0)
    assert core.interval.price > 0.0


def test_ghost_memory_is_bounded(monkeypatch):
    from histate_vllm.policy import ghost

    monkeypatch.setattr(ghost, "MAX_BLOCKS", 4)
    g = Ghost(1 << 20)
    for i in range(10):
        g.deleted(bytes([i]), 1, now=float(i), horizon=1e9)
    assert len(g.blocks) <= 5

