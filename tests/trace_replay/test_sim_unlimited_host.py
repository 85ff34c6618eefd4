"""Unlimited-host: Unlimited's hits, paid for with the host-to-device copy of what the GPU
prefix cache does not hold; the limit any offloading cache is measured against."""

import numpy as np
from _sim_helpers import BS, MB, SessionBuilder, rid, run, workload

GiB = 1 << 30


def _flooded_edit():
    """A's second turn edits inside its first prompt after four other sessions flooded a
    GPU cache too small to keep A's blocks."""
    a = SessionBuilder("A").turn(3000).turn(300, think=100.0, cut=2000)
    floods = [SessionBuilder(f"F{i}", start=5.0 + i).turn(3000) for i in range(4)]
    return workload(a, *floods)


def test_same_hits_as_unlimited_but_the_copy_is_paid():
    wl = _flooded_edit()
    prep, free = run(wl, "unlimited", gpu=200 * MB)
    _, host = run(wl, "unlimited-host", gpu=200 * MB)
    assert list(host.hit) == list(free.hit)
    i = rid(prep, "A", 1)
    assert host.hit[i] == 2000 // BS * BS  # a state at every block: resumes at the edit
    assert host.gpu_hit[i] < host.hit[i]  # the flood pushed A's blocks off the GPU
    assert host.dram_bytes[i] > 0 and free.dram_bytes[i] == 0
    assert host.ttft[i] > free.ttft[i]
    assert np.all(host.ttft >= free.ttft - 1e-9)


def test_no_tiered_cache_reuses_more():
    wl = _flooded_edit()
    _, host = run(wl, "unlimited-host", gpu=200 * MB)
    for policy in ("histate", "vllm034-lru-r16", "vllm-disk"):
        _, r = run(wl, policy, gpu=200 * MB, dram=8 * GiB, ssd=8 * GiB)
        assert np.all(r.hit <= host.hit), policy


def test_appends_on_a_large_gpu_cache_copy_nothing():
    wl = workload(SessionBuilder("A").turn(3000).turn(300, think=100.0).turn(200, think=50.0))
    _, free = run(wl, "unlimited", gpu=4 * GiB)
    _, host = run(wl, "unlimited-host", gpu=4 * GiB)
    assert float(host.dram_bytes.sum()) == 0.0
    assert list(host.hit) == list(free.hit) and list(host.ttft) == list(free.ttft)


def test_an_edit_copies_from_the_deepest_gpu_state_on():
    """The GPU still holds A's KV but no state at the edit: vLLM's hit is 0 (a hybrid hit
    needs a state), so the KV before the edit and the state there come over the link, as
    an offloading connector loads them."""
    wl = workload(SessionBuilder("A").turn(3000).turn(300, think=100.0, cut=2000))
    prep, host = run(wl, "unlimited-host", gpu=4 * GiB)
    i = rid(prep, "A", 1)
    assert host.gpu_hit[i] == 0 and host.hit[i] == 2000 // BS * BS
    assert host.dram_bytes[i] > 0
