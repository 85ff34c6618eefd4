"""vLLM 0.34's own hybrid offloading in the simulator: ARC eviction, periodic checkpoints
(`prefix_cache_retention_interval`), and its default setting equal to vllm-disk."""

from _sim_helpers import BS, MB, SessionBuilder, hits, rid, run, workload

from trace_replay.policies import NATIVE
from trace_replay.policies.checkpoints import periodic
from trace_replay.sim.arc import ArcStore

GiB = 1 << 30


def test_arc_keeps_what_is_read_twice_over_a_scan():
    """A key read again (T2) survives a scan of new keys that evicts LRU's equivalent."""
    arc = ArcStore(4)
    for k in (1, 2):
        arc.put(k, 1)
    arc.touch(1)  # 1 is now frequent
    for k in (10, 11, 12, 13):  # a scan of keys seen once
        arc.put(k, 1)
    assert 1 in arc and 2 not in arc
    assert arc.used <= arc.capacity and arc.evictions == 2


def test_arc_adapts_to_ghost_hits():
    arc = ArcStore(2)
    for k in (1, 2, 3):  # 1 evicted from T1 into B1
        arc.put(k, 1)
    assert 1 not in arc and 1 in arc.b1
    arc.put(1, 1)  # a B1 ghost stored again: recency matters more, T1's target grows
    assert arc.target > 0 and 1 in arc and 1 not in arc.b1


def test_arc_refuses_a_key_larger_than_the_store():
    arc = ArcStore(10)
    assert not arc.put(1, 11) and len(arc) == 0


def test_periodic_checkpoints_are_absolute_multiples():
    assert periodic(0, 1000, 256, 64) == [256, 512, 768]
    assert periodic(300, 1000, 256, 64) == [512, 768]
    assert periodic(0, 100, 30, 64) == [64]  # at least one block apart


def test_default_retention_is_vllm_disk():
    wl = workload(SessionBuilder("A").turn(3000).turn(500), SessionBuilder("B").turn(1000))
    _, disk = run(wl, "vllm-disk", gpu=100 * MB, dram=GiB, ssd=GiB)
    _, native = run(wl, "vllm034-lru", gpu=100 * MB, dram=GiB, ssd=GiB)
    assert list(native.hit) == list(disk.hit)


def test_retention_interval_lets_an_edit_resume_inside_the_old_prompt():
    """An edit at 2000 tokens into a 3000-token prompt, after a flood: with the default only
    the prompt end was kept (nothing to resume from); with a checkpoint every 16 blocks
    (1024 tokens) it resumes at the last one before the edit."""
    a = SessionBuilder("A").turn(3000).turn(300, think=100.0, cut=2000)
    floods = [SessionBuilder(f"F{i}", start=5.0 + i).turn(3000) for i in range(4)]
    wl = workload(a, *floods)
    prep, r0 = run(wl, "vllm034-lru", gpu=200 * MB, dram=8 * GiB, ssd=8 * GiB)
    _, r16 = run(wl, "vllm034-lru-r16", gpu=200 * MB, dram=8 * GiB, ssd=8 * GiB)
    i = rid(prep, "A", 1)
    assert r0.hit[i] == 0
    assert r16.hit[i] == 2000 // (16 * BS) * 16 * BS
    assert "vllm034-arc-r16" in NATIVE and len(NATIVE) == 12
