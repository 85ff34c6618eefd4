"""Telemetry (miss causes, counts, summary) and the on-disk event log, without vLLM."""

import os

from histate_vllm.bookkeeping.eventlog import (
    EventLogWriter,
    Lookup,
    fingerprints,
    log_files,
    read_log,
)
from histate_vllm.bookkeeping.telemetry import Telemetry, reason_label, summary
from histate_vllm.policy import Tier, make_key
from histate_vllm.policy import events as ev

from tests.bookkeeping.test_orchestration import BT, build, hashes, store


def telemetry(orch):
    t = Telemetry(BT, clock=lambda: 0.0)
    orch.on_events = lambda events: t.on_events(events, lambda k: k not in orch.entries)
    return t


def writing(orch):
    def f(node):
        return any((e := orch.entries.get(make_key(node, g))) is not None and not e.readable
                   for g in (0, 1))
    return f


def test_first_sight_is_not_a_miss_and_each_request_counts_once():
    orch, policy, _, _ = build()
    t = telemetry(orch)
    hb = hashes(4)
    assert t.lookup("r", hb, 0, 3 * BT, policy.restorable(hb).shared, writing(orch)) is None
    assert t.lookup("r", hb, 0, 3 * BT, 4 * BT, writing(orch)) is None  # already looked up
    delta, _ = t.take()
    assert delta == {("lookups", ()): 1}


def test_no_checkpoint_where_kv_is_shared():
    orch, policy, _, _ = build()
    t = telemetry(orch)
    hb = hashes(6)
    store(orch, "a", hb[:4], states={2})  # KV of 4 blocks, a checkpoint at block 2 only
    hit = policy.restorable(hb)
    assert (hit.position, hit.shared) == (2 * BT, 4 * BT)
    # vLLM resumed from the checkpoint: blocks 3-4 were shared but had no state.
    miss = t.lookup("b", hb, 2 * BT, 5 * BT, hit.shared, writing(orch))
    assert miss == ("no_checkpoint", 2 * BT)
    delta, _ = t.take()
    assert delta[("misses", ("no_checkpoint",))] == 1
    assert delta[("missed_tokens", ("no_checkpoint",))] == 2 * BT


def test_evicted_checkpoints_and_their_reasons_are_counted():
    orch, policy, _, _ = build(slots=8, ssd_keys=0)
    t = telemetry(orch)
    a = hashes(3, b"a")
    stored, _ = store(orch, "a", a, states={3})
    store(orch, "b", hashes(4, b"b"), states={4})  # 8 slots: a's keys must go
    orch.take_ssd_writes()  # drains the policy's events, as every engine step does
    delta, _ = t.take()
    evicted = {k: v for k, v in delta.items() if k[0] == "evictions"}
    gone = [k for k in stored if k not in orch.entries]
    assert gone and sum(evicted.values()) == len(gone)
    assert all(labels[0] == "dram" and labels[1].startswith("gds") for _, labels in evicted)
    miss = t.lookup("a2", a, 0, 3 * BT, policy.restorable(a).shared, writing(orch))
    assert miss is not None and miss[0] == "evicted"


def test_corrupt_and_still_writing():
    orch, policy, _, _ = build(ssd_keys=64)
    t = telemetry(orch)
    hb = hashes(3)
    store(orch, "a", hb, states={2, 3})
    state = make_key(hb[1], 1)  # historical: once on SSD, its DRAM copy goes
    assert orch.entries[state].on_ssd and orch.entries[state].slot < 0
    orch.on_ssd_lost([state], "corrupt or missing on restore")
    orch.take_ssd_writes()
    prompt = hb[:2] + hashes(1, b"x")
    assert t.lookup("b", prompt, 0, 2 * BT, policy.restorable(prompt).shared,
                    writing(orch)) == ("corrupt", 2 * BT)
    # An admitted write that has not landed yet.
    c = hashes(2, b"c")
    orch.note_hit("c", 0)
    keys = [make_key(c[0], 0), make_key(c[1], 0), make_key(c[1], 1)]
    orch.offer("c", keys, [BT, 2 * BT, 2 * BT], c, 2 * BT + 1)
    assert t.lookup("d", c + hashes(1, b"y"), 0, 2 * BT, 0, writing(orch)) == ("writing", 2 * BT)


def test_corrupt_when_the_lost_state_is_the_deepest_evidence():
    orch, _, _, _ = build()
    t = telemetry(orch)
    hb = hashes(2)
    t.on_events([ev.Event(op=ev.REMOVE, t=0.0, key=make_key(hb[1], 1), node=hb[1],
                          tier=Tier.SSD, reason="corrupt or missing on restore")],
                lambda k: True)
    assert t.lookup("r", hb + hashes(1, b"z"), 0, 2 * BT, 0, lambda n: False) == \
        ("corrupt", 2 * BT)


def test_restores_count_tokens_per_tier_and_failed_loads_are_misses():
    now = [0.0]
    t = Telemetry(BT, clock=lambda: now[0])
    t.load_issued("r", {"dram": 2 * BT, "ssd": BT}, {"dram": 2000, "ssd": 1500})
    now[0] = 0.25
    t.load_done("r")
    t.load_issued("s", {"ssd": BT})
    t.load_failed(["s", "unknown"])
    t.load_done("s")
    delta, samples = t.take()
    assert delta[("restored_tokens", ("dram",))] == 2 * BT
    assert delta[("restored_tokens", ("ssd",))] == BT  # the failed load restored nothing
    assert delta[("restored_bytes", ("dram",))] == 2000
    assert delta[("restored_bytes", ("ssd",))] == 1500
    assert delta[("restores", ("ssd",))] == 1
    assert delta[("misses", ("corrupt",))] == 1 and delta[("missed_tokens", ("corrupt",))] == BT
    assert samples == {("restore_seconds", ("ssd",)): [0.25]}
    assert t.take() == ({}, {})


def test_summary_is_silent_when_idle():
    t = Telemetry(BT, clock=lambda: 0.0)
    assert summary(t.window(), {}) is None
    t.add("lookups")
    t.add("restored_tokens", 512, ("ssd",))
    t.add("misses", 1, ("evicted",))
    line = summary(t.window(), {"DRAM MiB": 1.5})
    assert line.startswith("HiState: 1 lookups, restored tokens ssd=512, 1 misses (evicted=1)")
    assert line.endswith("DRAM MiB 1.5")
    assert summary(t.window(), {}) is None


def test_reason_labels_are_bounded():
    assert reason_label("GDS leaf bundle for DRAM: H=0.123 C=4.0") == "gds_leaf_bundle_for_dram"
    assert reason_label("position 512 is not in the plan") == "position_is_not_in_the_plan"
    assert reason_label("") == "unspecified"


def test_event_log_round_trip_rotation_and_torn_tail(tmp_path):
    w = EventLogWriter(str(tmp_path), max_bytes=4096, keep=2, interval=3600)
    fp = fingerprints(list(range(1000)), BT)
    assert len(fp) == 3 and fp == fingerprints(list(range(800)), BT)
    for i in range(200):
        w.append(events=[ev.Event(op=ev.ADMIT, t=float(i), key=b"k%d" % i, tier=Tier.DRAM)],
                 lookups=[Lookup(t=float(i), request_id=f"r{i}", prompt_tokens=1000,
                                 block_tokens=BT, covered=0, gpu=0, position=0, shared=0,
                                 fps=fp)])
        w.flush()
    w.close()
    files = log_files(str(tmp_path))
    assert [os.path.basename(f) for f in files] == ["events.log.1", "events.log"]
    assert all(os.path.getsize(f) <= 4096 for f in files)
    events, lookups = read_log(str(tmp_path))
    ts = [e.t for e in events]
    assert ts == sorted(ts) and ts[-1] == 199.0 and len(ts) < 200  # oldest rotated away
    assert [lk.request_id for lk in lookups][-1] == "r199" and lookups[-1].fps == fp
    with open(files[-1], "ab") as f:
        f.write(b"\x00\x00\x10\x00partial")  # a crash mid-frame
    assert read_log(str(tmp_path))[0] == events


def test_a_restore_cut_to_the_free_gpu_blocks_is_its_own_cause():
    """The policy could restore to its checkpoint at block 4, but the connector cut the
    restore to 2 blocks (free GPU blocks, restore_admission.py): that cut, not a missing
    checkpoint, is why vLLM resumed short."""
    orch, policy, _, _ = build()
    t = telemetry(orch)
    hb = hashes(6)
    store(orch, "a", hb[:4], states={2, 4})
    hit = policy.restorable(hb)
    assert (hit.position, hit.shared) == (4 * BT, 4 * BT)
    miss = t.lookup("b", hb, 2 * BT, 5 * BT, hit.shared, writing(orch),
                    restorable=hit.position, limit=3 * BT)
    assert miss == ("gpu_full", 2 * BT)
    # Control: the same lookup without the cut is a shared prefix without its checkpoint
    # used, which the old accounting called no_checkpoint.
    assert Telemetry(BT, clock=lambda: 0.0).lookup(
        "b", hb, 2 * BT, 5 * BT, hit.shared, writing(orch), restorable=hit.position) == \
        ("no_checkpoint", 2 * BT)
    # A cut that reaches past the deepest checkpoint decided nothing.
    assert Telemetry(BT, clock=lambda: 0.0).lookup(
        "c", hb, 2 * BT, 5 * BT, hit.shared, writing(orch), restorable=hit.position,
        limit=4 * BT) == ("no_checkpoint", 2 * BT)
