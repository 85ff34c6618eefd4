"""Internal-hit depths learned online move the interval checkpoints (forks.py)."""

from _helpers import Clock, chain

from histate_vllm.policy import Tier, make_key, make_policy
from histate_vllm.policy.forks import ForkDepths, place
from histate_vllm.policy.types import Item, Kind

BT = 256


def test_place_moves_a_checkpoint_onto_observed_depths():
    grid = [4096, 8192, 12288]
    got = place(0, 16384, 3, grid, [3072] * 10, BT)
    assert len(got) == 3 and 3072 in got
    assert place(0, 16384, 3, grid, [], BT) == grid


def test_window_keeps_recent_depths():
    f = ForkDepths(window=2)
    for d in (1, 2, 3):
        f.observe(d)
    assert f.inside(0, 10) == [2, 3]


def cached_context(terminal_state: bool):
    """A policy holding the KV of one 64-block context `a` (and its prompt-end state)."""
    core = make_policy("histate", budgets={Tier.DRAM: 1 << 40, Tier.SSD: 1 << 40},
                       block_tokens=BT, clock=Clock(), kv_groups=[0], state_groups=[1],
                       kv_bytes_per_token=1.0)
    a = chain(range(64), salt=b"a")
    items = [Item(make_key(a[i], 0), a[i], a[i - 1] if i else None, Kind.KV, (i + 1) * BT,
                  BT) for i in range(64)]
    if terminal_state:
        items.append(Item(make_key(a[63], 1), a[63], a[62], Kind.STATE, 64 * BT, 4 * BT,
                          terminal=True))
    adm = core.admit(items, Tier.DRAM)
    for k in adm.accepted:
        core.committed(k, Tier.DRAM, True)
    return core, a


def test_policy_learns_a_fork_depth_and_plans_there():
    core, a = cached_context(terminal_state=False)
    b = a[:10] + chain(range(10, 64), salt=b"b")  # leaves a's context at 10 blocks
    core.plan_captures("b", b, 64 * BT, 0)
    assert list(core.planner.forks.depths) == [10 * BT]
    c = chain(range(64), salt=b"c")  # a new context of the same length
    plan = core.plan_captures("c", c, 64 * BT + 1, 0)
    assert 10 * BT in plan


def test_place_adds_checkpoints_only_where_they_pay():
    # Nothing observed: the interval model's grid, untouched.
    assert place(0, 16384, 0, [], [], BT, min_gain=100.0) == []
    # A cluster of forks inside a segment too short for an interval point gets one...
    got = place(0, 8192, 0, [], [6144] * 8, BT, min_gain=1000.0)
    assert got == [6144]
    # ...unless one checkpoint costs more than the recomputation it saves.
    assert place(0, 8192, 0, [], [6144] * 8, BT, min_gain=1e6) == []
    # Never more than k_max.
    assert len(place(0, 1 << 20, 0, [], list(range(BT, 1 << 20, 4 * BT)), BT,
                     min_gain=1.0, k_max=3)) == 3


def test_tail_forks_are_learned_relative_to_the_end():
    f = ForkDepths()
    f.observe(40 * BT, tail=BT)
    # Absolute depth outside the segment; the tail fork lands one block before its end.
    assert f.inside(0, 20 * BT) == [19 * BT]


def test_policy_learns_a_tail_fork_and_plans_one_block_before_the_end():
    """An agent rewrote the last block of its previous prompt: the next long segment gets a
    checkpoint one block before its end, at any absolute depth."""
    core, a = cached_context(terminal_state=True)
    b = a[:63] + chain(range(63, 80), salt=b"b")  # the last block of a's prompt rewritten
    core.plan_captures("b", b, 80 * BT, 0)
    assert list(core.planner.forks.tails) == [BT]
    c = chain(range(100), salt=b"c")
    plan = core.plan_captures("c", c, 100 * BT + 1, 0)
    assert 99 * BT in plan and 100 * BT in plan
