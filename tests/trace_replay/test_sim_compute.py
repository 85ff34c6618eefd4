"""Shared prefill (vLLM's long_prefill_token_threshold): the queue, then in the event loop."""

import pytest
from _sim_helpers import SessionBuilder, run, workload

from trace_replay.sim import ReplaySettings
from trace_replay.sim.compute import SharedPrefill
from trace_replay.simulate import SimConfig

GiB = 1 << 30


def drain(q: SharedPrefill, arrivals: list[tuple[float, float, str]]) -> dict[str, float]:
    """Feed (time, seconds, name) in order; return each prefill's finish time."""
    out: dict[str, float] = {}
    pending = sorted(arrivals, key=lambda a: a[0])  # stable: ties keep their order
    while pending or q.active:
        nxt = q.next_completion()
        if pending and (nxt is None or pending[0][0] <= nxt):
            t, w, name = pending.pop(0)
            out.update({p: t for p in q.add(t, w, name)})
        else:
            out.update({p: nxt for p in q.wake(nxt)})
    return out


def test_one_at_a_time_is_fifo():
    done = drain(SharedPrefill(1), [(0.0, 4.0, "a"), (1.0, 1.0, "b"), (1.5, 2.0, "c")])
    assert done == pytest.approx({"a": 4.0, "b": 5.0, "c": 7.0})


def test_k_prefills_share_the_gpu_and_the_rest_wait_in_order():
    done = drain(SharedPrefill(2), [(0.0, 2.0, "a"), (0.0, 2.0, "b"), (0.0, 1.0, "c")])
    # a and b halve the GPU (both end at 4); c waits for a place, then runs alone.
    assert done == pytest.approx({"a": 4.0, "b": 4.0, "c": 5.0})


def test_a_short_prefill_passes_a_long_one():
    done = drain(SharedPrefill(2), [(0.0, 10.0, "long"), (1.0, 0.5, "short")])
    assert done["short"] == pytest.approx(2.0)  # 0.5 s of work at half speed
    assert done["long"] == pytest.approx(10.5)  # the work is conserved


def test_zero_length_prefill_finishes_at_once_and_k_must_be_positive():
    q = SharedPrefill(2)
    assert q.add(3.0, 0.0, "x") == ["x"]
    with pytest.raises(ValueError, match=">= 1"):
        SharedPrefill(0)
    with pytest.raises(ValueError, match="concurrent_prefills"):
        ReplaySettings(concurrent_prefills=0).resolved(workload(SessionBuilder("A").turn(10)))


def test_event_loop_lets_a_cached_request_past_a_cold_prefill():
    wl = workload(SessionBuilder("L").turn(64000), SessionBuilder("S", start=0.1).turn(2000))
    cost = SimConfig().cost()
    long_t, short_t = cost.prefill_time(0, 64000), cost.prefill_time(0, 2000)
    assert long_t > 10 * short_t
    _, fifo = run(wl, "vllm-marconi", gpu=4 * GiB)
    _, shared = run(wl, "vllm-marconi", gpu=4 * GiB, prefills=2)
    # FIFO: S waits for the whole cold prefill; shared: it runs beside it at half speed.
    assert fifo.ttft[1] == pytest.approx(long_t - 0.1 + short_t)
    assert shared.ttft[1] == pytest.approx(2 * short_t)
    assert shared.ttft[0] == pytest.approx(long_t + short_t)
