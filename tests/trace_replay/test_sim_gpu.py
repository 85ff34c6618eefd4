"""The simulator's GPU prefix cache: one LRU pool of KV blocks and states, as vLLM's."""

from trace_replay.sim.gpu import GpuPrefixCache


def test_passed_states_are_cached_not_held():
    """A prefilled request holds its KV and the state it runs on; the states its prefill
    passed are freed (vLLM's align mode retires them) yet still hit until evicted."""
    gpu = GpuPrefixCache(capacity=100, kv_bytes=1, state_bytes=3)
    keys = [1, ~1, 2, 3, ~3]  # a state after block 1 (passed) and at the prompt end (3)
    gpu.acquire(keys)
    held = gpu.retire_states(keys, keep=~3)
    assert held == [1, 2, 3, ~3]
    assert gpu.refs[~1] == 0 and gpu.refs[~3] == 1
    assert gpu.hit([1, 2, 3], 3) == (3, 3)
    assert gpu.hit([1, 5], 2) == (1, 1)  # the passed state still serves a fork after block 1
    gpu.release(reversed(held))
    assert all(v == 0 for v in gpu.refs.values())


def test_passed_states_go_before_the_kv_freed_later():
    gpu = GpuPrefixCache(capacity=9, kv_bytes=1, state_bytes=3)
    keys = [1, ~1, 2, 3, ~3]  # 1 + 3 + 1 + 1 + 3 = 9 bytes: full
    gpu.acquire(keys)
    held = gpu.retire_states(keys, keep=~3)
    gpu.release(reversed(held))
    gpu.acquire([7])  # one byte more: the least recently freed goes, the passed state
    assert ~1 not in gpu and all(k in gpu for k in held)
