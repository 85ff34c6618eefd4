"""Scenario tests of unified GDS eviction and asymmetric placement."""

import pytest
from _helpers import ST_G, Clock, FakeManager, chain, kv_item, st_item

from histate_vllm.policy import Item, Kind, Tier, make_key, make_policy

BT = 256
KVB = 256  # one KV chunk = 256 bytes, so one token = 1 byte
STB = 1570  # one checkpoint ~ 1,570 KV-token equivalents (Qwen3.5-9B)


def build(policy="histate", dram=1 << 30, ssd=1 << 30, **kw):
    clock = Clock()
    kw.setdefault("kv_bytes_per_token", 1.0) if policy == "histate" else None
    core = make_policy(policy, budgets={Tier.DRAM: dram, Tier.SSD: ssd}, block_tokens=BT,
                       interval=1 << 30, clock=clock, **kw)
    return core, FakeManager(core), clock


def store(mgr, hashes, nblocks, states, kv_tier=Tier.DRAM, st_tier=Tier.DRAM, req=""):
    """Admit KV for blocks [0, nblocks) and checkpoints after the given block counts."""
    kv = [kv_item(hashes, i, BT, KVB, req) for i in range(nblocks)
          if not mgr.core.where(make_key(hashes[i], 0))]
    mgr.admit(kv, kv_tier)
    mgr.commit(kv_tier)
    st = [st_item(hashes, b - 1, BT, STB, terminal=b == max(states), req=req) for b in states]
    mgr.admit(st, st_tier)
    mgr.commit(st_tier)


def state_key(hashes, blocks):
    return make_key(hashes[blocks - 1], 1)


def figure7(policy, refresh_all=False):
    """Paper Fig. 7. B holds S1 (after a long prefix), S2 (just after S1) and terminal S3;
    C holds terminal S6. KV lives in DRAM, checkpoints on SSD with room for four; one must go.
    B's latest turn hit S3 recently; C has been waiting (its S6 is older)."""
    core, mgr, clock = build(policy, ssd=4 * STB, terminal_reuse=0.5, tau=120.0) \
        if policy == "histate" else build(policy, ssd=4 * STB)
    b = chain(range(48), salt=b"B")
    c = chain(range(40), salt=b"C")
    store(mgr, b, 32, [32], st_tier=Tier.SSD)  # S1 at 8,192
    clock.advance(10)
    store(mgr, c, 40, [40], st_tier=Tier.SSD)  # S6 at 10,240
    clock.advance(10)
    store(mgr, b, 48, [34, 48], st_tier=Tier.SSD)  # S2 at 8,704, S3 at 12,288
    clock.advance(100)
    hit = core.restorable(b)
    assert hit.position == 48 * BT
    keys = list(hit.kv_keys) + list(hit.state_keys)
    if refresh_all:  # what "LRU + refresh-all" does on this hit
        keys += [state_key(b, 32), state_key(b, 34)]
    core.hit(keys)
    clock.advance(1)
    evicted = core.set_budget(Tier.SSD, 3 * STB)
    mgr.drop(evicted)
    mgr.check()
    names = {state_key(b, 32): "S1", state_key(b, 34): "S2", state_key(b, 48): "S3",
             state_key(c, 40): "S6"}
    return [names.get(k, k) for k, _ in evicted], core, b


def test_figure7_lru_evicts_s1():
    assert figure7("lru")[0] == ["S1"]


def test_figure7_lru_refresh_all_evicts_s6():
    assert figure7("lru", refresh_all=True)[0] == ["S6"]


def test_figure7_histate_evicts_s2_and_a_fork_at_s2_resumes_from_s1():
    evicted, core, b = figure7("histate")
    assert evicted == ["S2"]
    fork = b[:34] + chain(["x"], salt=b[33])
    hit = core.restorable(fork)
    assert hit.position == 32 * BT  # recompute only the short S1 -> S2 gap
    assert hit.shared == 34 * BT


def test_evicting_an_intermediate_checkpoint_keeps_its_kv():
    core, mgr, clock = build(dram=1 << 30)
    h = chain(range(16))
    store(mgr, h, 16, [4, 8, 16])
    used = core.usage(Tier.DRAM)
    evicted = core.set_budget(Tier.DRAM, used - 1)
    assert [k for k, _ in evicted] in ([state_key(h, 4)], [state_key(h, 8)])
    mgr.drop(evicted)
    assert core.restorable(h).position == 16 * BT
    assert all(core.where(make_key(x, 0)) for x in h)
    core.check_invariants()


def test_terminal_bundle_takes_its_last_kv_segment_but_no_shared_chunk():
    core, mgr, clock = build(terminal_reuse=0.1)  # terminal reuse rare: bundles are cheap
    a = chain(range(12), salt=b"A")
    store(mgr, a, 12, [4, 12])
    clock.advance(50)
    b = chain(range(12), salt=b"B")
    store(mgr, b, 12, [12])
    clock.advance(50)
    # Units: A@4 alone, A@12 + its 8 KV chunks, B@12 + its 12 chunks. A's bundle is the
    # oldest and cheapest per byte.
    evicted = core.set_budget(Tier.DRAM, core.usage(Tier.DRAM) - 1)
    mgr.drop(evicted)
    gone = {k for k, _ in evicted}
    assert state_key(a, 12) in gone
    assert {make_key(x, 0) for x in a[4:12]} <= gone
    assert not gone & {make_key(x, 0) for x in a[:4]}  # still used by the checkpoint at 4
    assert core.restorable(a).position == 4 * BT
    core.check_invariants()


def test_branch_point_outlives_its_leaves():
    core, mgr, clock = build(terminal_reuse=0.0)  # leaves worth nothing, branch still stays
    trunk = list(range(8))
    x = chain(trunk + ["x"] * 8)
    y = chain(trunk + ["y"] * 8)
    store(mgr, x, 16, [8, 16])
    store(mgr, y, 16, [16])
    clock.advance(1000)
    core.hit([state_key(x, 16)])  # leaves are fresher than the branch point
    core.hit([state_key(y, 16)])
    order = []
    while core.where(state_key(x, 8)):
        ev = core.set_budget(Tier.DRAM, core.usage(Tier.DRAM) - 1)
        assert ev
        mgr.drop(ev)
        order += [k for k, _ in ev if k in (state_key(x, 8), state_key(x, 16), state_key(y, 16))]
        core.check_invariants()
    assert order[-1] == state_key(x, 8)


def test_refresh_all_protects_history_of_an_active_session():
    core, mgr, clock = build(terminal_reuse=0.5)
    a = chain(range(40), salt=b"A")
    store(mgr, a, 40, [20, 40])
    clock.advance(10)
    other = chain(range(40), salt=b"O")
    store(mgr, other, 40, [20, 40])
    clock.advance(500)
    hit = core.restorable(a)
    core.hit(hit.kv_keys + hit.state_keys)  # refreshes A@20 too
    clock.advance(1)
    ev = core.set_budget(Tier.DRAM, core.usage(Tier.DRAM) - 1)
    assert state_key(a, 20) not in {k for k, _ in ev}
    assert {state_key(other, 20), state_key(other, 40)} & {k for k, _ in ev}


def test_placement_kv_dram_history_ssd_terminal_dram():
    core, mgr, clock = build()
    h = chain(range(16))
    store(mgr, h, 8, [8], req="r1")
    mgr.copy_down()
    assert core.where(state_key(h, 8)) == {Tier.DRAM, Tier.SSD}  # terminal: both
    assert core.where(make_key(h[0], 0)) == {Tier.DRAM, Tier.SSD}
    store(mgr, h, 16, [16], req="r2")  # next turn: the checkpoint at 8 becomes history
    mgr.copy_down()
    assert core.where(state_key(h, 8)) == {Tier.SSD}
    assert core.where(state_key(h, 16)) == {Tier.DRAM, Tier.SSD}
    assert Tier.DRAM in core.where(make_key(h[3], 0))
    mgr.check()
    core.check_invariants()


def test_demote_before_delete():
    core, mgr, clock = build()
    h = chain(range(8))
    store(mgr, h, 8, [8])
    mgr.copy_down()
    ev = core.set_budget(Tier.DRAM, core.usage(Tier.DRAM) // 2)
    mgr.drop(ev)
    assert ev and all(t == Tier.DRAM for _, t in ev)
    assert state_key(h, 8) in {k for k, _ in ev}  # a state copy goes before KV copies
    assert core.restorable(h).position == 8 * BT  # nothing lost, only demoted
    ev2 = core.set_budget(Tier.DRAM, 0)
    mgr.drop(ev2)
    assert core.restorable(h).position == 8 * BT and core.restorable(h).kv_tier == Tier.SSD
    mgr.check()


def test_a_terminal_checkpoint_leaves_dram_in_recency_order_with_the_kv():
    """A session's next turn reads its terminal checkpoint with its KV: under DRAM pressure
    the least recently touched copies give way first, KV chunk or terminal checkpoint.
    Ranked below every KV chunk, the terminal checkpoints of sessions idle for
    seconds went to SSD while KV untouched for minutes stayed in DRAM."""
    core, mgr, clock = build()
    a, b = chain(range(8), salt=b"a"), chain(range(8), salt=b"b")
    mgr.admit([kv_item(a, i, BT, KVB) for i in range(8)], Tier.DRAM)  # KV nobody resumes
    mgr.commit(Tier.DRAM)
    clock.advance(100)
    store(mgr, b, 8, [8])
    mgr.copy_down()
    clock.advance(100)
    core.hit(list(core.restorable(b).kv_keys) + [state_key(b, 8)])  # b's next turn
    ev = core.set_budget(Tier.DRAM, core.usage(Tier.DRAM) - STB)
    mgr.drop(ev)
    gone = {k for k, _ in ev}
    assert gone and gone <= {make_key(h, 0) for h in a}  # a's KV, untouched since
    assert core.where(state_key(b, 8)) == {Tier.DRAM, Tier.SSD}
    assert core.restorable(b).position == 8 * BT
    mgr.check()
    core.check_invariants()


def test_pinned_keys_are_never_evicted():
    core, mgr, clock = build()
    h = chain(range(8))
    store(mgr, h, 8, [8])
    hit = core.restorable(h)
    keys = hit.kv_keys + hit.state_keys
    core.pin(keys)
    assert core.set_budget(Tier.DRAM, 0) == []
    core.unpin(keys)
    ev = core.set_budget(Tier.DRAM, 0)
    assert {k for k, _ in ev} == set(keys)
    core.check_invariants()


@pytest.mark.parametrize("policy", ["histate", "lru"])
def test_shed_deletes_the_least_valued_and_never_a_pinned_copy(policy):
    """The manager ran out of slots within budget: `shed` deletes from DRAM in the policy's
    own eviction order (the older session first, whole units), never a pinned copy."""
    core, mgr, clock = build(policy)
    old, new = chain(range(4), salt=b"old"), chain(range(4), salt=b"new")
    store(mgr, old, 4, [4])
    clock.advance(100)
    store(mgr, new, 4, [4])
    clock.advance(1)
    out = core.shed(Tier.DRAM, KVB)
    assert out and all(t is Tier.DRAM for _, t in out)
    gone = {k for k, _ in out}
    assert not gone & {make_key(h, g) for h in new for g in (0, 1)}
    mgr.drop(out)
    mgr.check()
    hit = core.restorable(new)
    core.pin(hit.kv_keys + hit.state_keys)
    while core.shed(Tier.DRAM, KVB):  # everything else goes; the pinned copies stay
        pass
    assert core.restorable(new).position == 4 * BT
    core.check_invariants()


def test_lost_kv_chunk_takes_dependent_checkpoints_along():
    core, mgr, clock = build()
    h = chain(range(8))
    store(mgr, h, 8, [2, 8])
    core.remove(make_key(h[4], 0), Tier.DRAM, "checksum mismatch")
    mgr.stored[Tier.DRAM].discard(make_key(h[4], 0))
    drops = core.demotions(Tier.DRAM)
    assert drops == [state_key(h, 8)]
    mgr.stored[Tier.DRAM].discard(state_key(h, 8))
    assert core.restorable(h).position == 2 * BT
    mgr.check()
    core.check_invariants()


def test_state_without_its_kv_is_refused_with_a_reason():
    core, mgr, clock = build()
    h = chain(range(8))
    store(mgr, h, 4, [])
    assert mgr.admit([st_item(h, 7, BT, STB)], Tier.DRAM) == []
    evs = [e for e in core.drain_events() if e.op == "reject"]
    assert evs and "KV chunks before it are missing" in evs[-1].reason


def test_state_outside_the_plan_takes_free_room_only():
    # Room for the KV and the planned terminal state, not one more state.
    core, mgr, clock = build(dram=8 * KVB + STB)
    h = chain(range(8))
    plan = core.plan_captures("r", h, 8 * BT + 1, 0)
    assert plan == [8 * BT]
    store(mgr, h, 8, [], req="r")
    assert mgr.admit([st_item(h, 7, BT, STB, req="r")], Tier.DRAM) != []
    mgr.commit(Tier.DRAM)
    assert mgr.admit([st_item(h, 3, BT, STB, req="r")], Tier.DRAM) == []
    assert core.where(state_key(h, 8)), "the unplanned state displaced the planned one"
    assert "not in the capture plan" in core.explain(h, 4 * BT)


def test_state_outside_the_plan_is_kept_when_it_fits():
    # vLLM under dense retention offers a state at every chunk end and serves GPU hits
    # from them: kept in free room, HiState is never worse than vLLM alone.
    core, mgr, clock = build()
    h = chain(range(8))
    core.plan_captures("r", h, 8 * BT + 1, 0)
    store(mgr, h, 8, [8], req="r")
    assert mgr.admit([st_item(h, 3, BT, STB, req="r")], Tier.DRAM) != []
    mgr.commit(Tier.DRAM)
    assert core.restorable(h[:6]).position == 4 * BT
    core.check_invariants()


def test_identities_never_match():
    core, mgr, clock = build(identity=b"model-a")
    h = chain(range(4))
    store(mgr, h, 4, [4])
    assert core.restorable(h).position == 4 * BT
    assert core.restorable(h, identity=b"model-b").position == 0
    assert core.restorable(h, identity=b"model-b").shared == 0


def test_restart_restores_by_mtime_and_trims_to_budget():
    core, mgr, clock = build()
    a, b = chain(range(4), salt=b"a"), chain(range(4), salt=b"b")
    items, mtimes = [], []
    for hs, t in ((a, 10.0), (b, 20.0)):
        items += [kv_item(hs, i, BT, KVB) for i in range(4)] + [st_item(hs, 3, BT, STB)]
        mtimes += [t] * 5
    fresh, _, _ = build(ssd=4 * KVB + STB + 100)
    dropped = fresh.restore_resident(items, Tier.SSD, last_access=mtimes)
    assert state_key(a, 4) in dropped  # the older trajectory goes
    assert fresh.restorable(b).position == 4 * BT and fresh.restorable(a).position == 0
    assert not [e for e in fresh.drain_events() if e.op == "admit"]
    fresh.check_invariants()


def test_restart_restores_a_one_block_checkpoint():
    # A checkpoint at the first block has no parent; restoring it once hung start-up.
    h = chain(range(1), salt=b"short")
    fresh, _, _ = build()
    assert fresh.restore_resident([kv_item(h, 0, BT, KVB), st_item(h, 0, BT, STB)], Tier.SSD) == []
    assert fresh.restorable(h).position == BT
    fresh.check_invariants()


def test_an_item_that_is_its_own_parent_is_refused():
    h = chain(range(1))
    bad = Item(make_key(h[0], ST_G), h[0], h[0], Kind.STATE, BT, STB)
    core, _, _ = build()
    with pytest.raises(ValueError, match="its own block as its parent"):
        core.restore_resident([kv_item(h, 0, BT, KVB), bad], Tier.SSD)


def test_data_from_before_a_restart_goes_before_new_sessions():
    core, mgr, clock = build()
    a, b = chain(range(8), salt=b"a"), chain(range(8), salt=b"b")
    old = [kv_item(a, i, BT, KVB) for i in range(8)] + [st_item(a, 7, BT, STB, terminal=True)]
    assert core.restore_resident(old, Tier.SSD) == []
    for it in old:
        mgr.items[it.key] = it
        mgr.stored[Tier.SSD].add(it.key)
    clock.advance(5)
    store(mgr, b, 8, [8], st_tier=Tier.SSD, kv_tier=Tier.SSD)
    clock.advance(5)
    ev = core.set_budget(Tier.SSD, core.usage(Tier.SSD) - 1)
    mgr.drop(ev)
    assert state_key(a, 8) in {k for k, _ in ev}
    assert core.restorable(b).position == 8 * BT
    mgr.check()
    core.check_invariants()


def test_ssd_pressure_drops_restart_backups_first():
    """DRAM and SSD add up: an SSD copy of what DRAM holds (a KV chunk, a terminal checkpoint)
    exists only so a restart finds it, so under SSD pressure it goes first (least recently
    touched first, KV before checkpoints) and nothing is deleted: every prefix stays restorable."""
    core, mgr, clock = build(terminal_reuse=0.5)
    a, b = chain(range(8), salt=b"a"), chain(range(8), salt=b"b")
    store(mgr, a, 8, [8])
    clock.advance(100)
    store(mgr, b, 8, [8])
    mgr.copy_down()
    ev = core.set_budget(Tier.SSD, core.usage(Tier.SSD) - 1)
    mgr.drop(ev)
    assert len(ev) == 1 and ev[0][1] == Tier.SSD and ev[0][0].endswith(bytes(4))  # a KV chunk
    assert core.where(ev[0][0]) == {Tier.DRAM}
    assert core.restorable(b).position == 8 * BT and core.restorable(a).position == 8 * BT
    mgr.check()
    core.check_invariants()


def test_dram_pressure_moves_kv_to_ssd():
    """What DRAM pressure evicts is moved to SSD (the manager copies it), not deleted: the
    least recently touched KV chunks first; the terminal checkpoint keeps its DRAM home."""
    core, mgr, clock = build(dram=12 * 256 + STB, terminal_reuse=0.5)
    a, b = chain(range(8), salt=b"a"), chain(range(8), salt=b"b")
    store(mgr, a, 8, [8])
    clock.advance(100)
    adm = core.admit([kv_item(b, i, BT, KVB) for i in range(8)], Tier.DRAM)
    assert adm.spill and all(Tier.DRAM == t for k, t in adm.evict if k in adm.spill)
    for k in adm.spill:
        core.committed(k, Tier.SSD, True)
    assert core.where(state_key(a, 8)) == {Tier.DRAM}
    where = [core.where(make_key(h, 0)) for h in a]
    assert where.count(frozenset({Tier.SSD})) == 4 and all(where)  # moved, none deleted
    assert core.restorable(a).position == 8 * BT
    core.check_invariants()


def test_dram_pressure_moves_a_historical_checkpoint_once_its_kv_is_on_ssd():
    """A historical checkpoint held in DRAM alone (its SSD write had to wait for its KV) is
    what DRAM pressure moves down first, but only once every KV chunk before it is on SSD:
    its manifest names them. Until then it waits in DRAM, and KV chunks move instead.
    (With states_lead off; on, the default, it moves at once: the test after next.)"""
    core, mgr, clock = build(dram=8 * KVB + 2 * STB, terminal_reuse=0.5, states_lead=False)
    a, b = chain(range(8), salt=b"a"), chain(range(8), salt=b"b")
    store(mgr, a, 8, [4, 8])  # history at 4 blocks, terminal at 8: all in DRAM only
    mid = state_key(a, 4)
    assert core.where(mid) == {Tier.DRAM}
    clock.advance(10)
    adm = core.admit([kv_item(b, 0, BT, KVB)], Tier.DRAM)
    assert mid not in adm.spill and adm.spill and all(k.endswith(bytes(4)) for k in adm.spill)
    for k in adm.spill:
        core.committed(k, Tier.SSD, True)
    for k in adm.accepted:
        core.committed(k, Tier.DRAM, True)
    # Every KV chunk before it now on SSD (backed): it goes before any KV chunk.
    for i in range(4):
        k = make_key(a[i], 0)
        if Tier.SSD not in core.where(k):
            core.admit([kv_item(a, i, BT, KVB)], Tier.SSD)
            core.committed(k, Tier.SSD, True)
    adm = core.admit([kv_item(b, 1, BT, KVB)], Tier.DRAM)
    assert adm.evict[0] == (mid, Tier.DRAM) and mid in adm.spill
    core.committed(mid, Tier.SSD, True)
    assert core.where(mid) == {Tier.SSD}
    assert core.restorable(a[:4]).position == 4 * BT
    core.check_invariants()


def test_drop_stuck_deletes_a_historical_checkpoint_that_cannot_move_down():
    """With drop_stuck, a historical checkpoint held in DRAM alone whose KV is not on SSD
    (so it cannot move there) and not hit within tau is deleted in its stage-1 turn instead
    of waiting while KV chunks move down in its place; one hit within tau waits."""
    for wait, deleted in ((1.0, False), (None, True)):
        core, mgr, clock = build(dram=8 * KVB + 2 * STB, terminal_reuse=0.5, drop_stuck=True,
                                 states_lead=False)
        a, b = chain(range(8), salt=b"a"), chain(range(8), salt=b"b")
        store(mgr, a, 8, [4, 8])  # history at 4 blocks, terminal at 8: all in DRAM only
        mid = state_key(a, 4)
        clock.advance(wait if wait is not None else core.ev.tau + 1)
        adm = core.admit([kv_item(b, 0, BT, KVB)], Tier.DRAM)
        assert ((mid, Tier.DRAM) in adm.evict) == deleted and mid not in adm.spill
        assert core.where(mid) == (frozenset() if deleted else {Tier.DRAM})
        # for it, no KV chunk moved; without it, KV chunks move (as without drop_stuck)
        assert any(k.endswith(bytes(4)) for k in adm.spill) != deleted
        for k in adm.spill:
            core.committed(k, Tier.SSD, True)
        assert core.restorable(a).position == 8 * BT  # the terminal checkpoint stays
        core.check_invariants()


def test_states_lead_moves_a_historical_checkpoint_before_its_kv():
    """With states_lead (the default), DRAM pressure moves a historical checkpoint held
    in DRAM alone to SSD first, though no KV chunk before it is there: its KV stays in DRAM,
    and the checkpoint still restores from SSD with that KV."""
    core, mgr, clock = build(dram=8 * KVB + 2 * STB, terminal_reuse=0.5, states_lead=True)
    a, b = chain(range(8), salt=b"a"), chain(range(8), salt=b"b")
    store(mgr, a, 8, [4, 8])  # history at 4 blocks, terminal at 8: all in DRAM only
    mid = state_key(a, 4)
    clock.advance(10)
    adm = core.admit([kv_item(b, 0, BT, KVB)], Tier.DRAM)
    assert adm.spill == [mid] and adm.evict == [(mid, Tier.DRAM)]
    core.committed(mid, Tier.SSD, True)
    assert core.where(mid) == {Tier.SSD}
    assert all(core.where(make_key(h, 0)) == {Tier.DRAM} for h in a)  # no KV moved
    assert core.restorable(a[:4]).position == 4 * BT
    core.check_invariants()


def test_a_prefill_in_flight_keeps_the_kv_under_its_own_checkpoints():
    """Mid-prefill, the checkpoint a request has just left is a leaf bundle (nothing below
    it yet): evicting it would take its KV segment along, the state at the request's end
    would then be refused (KV before it missing), and the next turn would find nothing.
    What a request still in flight has stored is not evicted; newer data is refused."""
    clock = Clock()
    core = make_policy("histate", budgets={Tier.DRAM: 8 * KVB + 2 * STB, Tier.SSD: 0},
                       block_tokens=BT, interval=4 * BT, clock=clock, kv_bytes_per_token=1.0)
    mgr = FakeManager(core)
    a, b = chain(range(8), salt=b"a"), chain(range(11), salt=b"b")
    assert core.plan_captures("r", a, 8 * BT + 1, 0) == [4 * BT, 8 * BT]
    # r's first prefill step: 4 blocks and the planned checkpoint at their end.
    mgr.admit([kv_item(a, i, BT, KVB, "r") for i in range(4)], Tier.DRAM)
    mgr.admit([st_item(a, 3, BT, STB, req="r")], Tier.DRAM)
    mgr.commit(Tier.DRAM)
    clock.advance(10)
    # Another session's KV: more than the free room; only r's bundle could make more.
    mgr.admit([kv_item(b, i, BT, KVB, "o") for i in range(11)], Tier.DRAM)
    mgr.commit(Tier.DRAM)
    assert core.where(state_key(a, 4)) == {Tier.DRAM}
    assert all(core.where(make_key(a[i], 0)) for i in range(4))
    # r's second step: the rest of its KV and the state at its end.
    mgr.admit([kv_item(a, i, BT, KVB, "r") for i in range(4, 8)], Tier.DRAM)
    mgr.admit([st_item(a, 7, BT, STB, terminal=True, req="r")], Tier.DRAM)
    mgr.commit(Tier.DRAM)
    core.request_finished("r")
    assert core.restorable(a).position == 8 * BT
    mgr.check()
    core.check_invariants()


def test_a_mass_removal_leaves_no_stale_heap_entries():
    """Heap entries of forgotten keys and pruned nodes go at the next compaction: left in,
    every flush after a mass removal compacted the whole heap again (quadratic)."""
    core, mgr, clock = build()
    for s in range(300):
        store(mgr, chain(range(8), salt=s.to_bytes(2, "big")), 8, [8])
    mgr.copy_down()  # SSD backups: every KV chunk is held twice (a stage-1 candidate)
    stale = sum(len(core.ev.sheaps[t]) for t in (Tier.DRAM, Tier.SSD))
    assert stale > 1024
    for key in list(mgr.items):
        for t in core.where(key):
            core.remove(key, t, "test")
    for t in (Tier.DRAM, Tier.SSD):
        core.demotions(t)  # flushes, compacting what outgrew the index
    assert not core.index.entries
    for t in (Tier.DRAM, Tier.SSD):
        assert len(core.ev.sheaps[t]) == 0
        assert len(core.ev.heaps[t]) <= 1024  # under its own compaction bound (no units)
    core.check_invariants()
