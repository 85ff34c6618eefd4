"""Metric definitions: percentiles, hit rate, reuse-sensitive requests, recovery."""

import numpy as np
import pytest

from trace_replay.metrics import hit_rate, percentiles, recovery, reuse_sensitive, summarize


def test_percentiles():
    t = np.arange(1, 101, dtype=float)
    p = percentiles(t)
    assert p["ttft_p50"] == pytest.approx(50.5)
    assert p["ttft_p99"] == pytest.approx(99.01)
    assert p["ttft_mean"] == pytest.approx(50.5)


def test_hit_rate_is_token_weighted():
    assert hit_rate(np.array([900, 0]), np.array([1000, 9000])) == pytest.approx(0.09)


def test_reuse_sensitive_and_recovery():
    inp = np.array([1000, 1000, 1000, 1000])
    unl = np.array([1000, 1000, 500, 0])
    disk = np.array([1000, 0, 500, 0])  # request 1: disk 100 points below Unlimited
    hs = np.array([1000, 800, 400, 0])  # request 2: histate 10 points below disk
    m = reuse_sensitive(inp, unl, disk, hs)
    assert m.tolist() == [False, True, True, False]
    assert recovery(hs, unl, m) == pytest.approx((800 + 400) / (1000 + 500))
    assert recovery(disk, unl, m) == pytest.approx(500 / 1500)
    # Exactly 5 points counts.
    assert reuse_sensitive(np.array([1000]), np.array([1000]), np.array([950]),
                           np.array([950])).tolist() == [True]
    assert reuse_sensitive(np.array([1000]), np.array([1000]), np.array([960]),
                           np.array([960])).tolist() == [False]


def test_a_kv_match_without_a_state_is_a_miss():
    # The simulator records the resume point as the hit; a policy with KV cached but no
    # state reports 0 there, so the hit rate only counts restorable tokens.
    s = summarize(np.array([1.0, 2.0]), np.array([0, 0]), np.array([1000, 1000]),
                  np.array(["append", "mutation"], dtype=object), None, None)
    assert s["hit_rate"] == 0.0
    assert s["mutation_count"] == 1 and s["mutation_ttft_mean"] == 2.0
    assert np.isnan(s["recovery"])


def test_request_classes_append_internal_fork_cold():
    from trace_replay.metrics import class_means, request_classes

    # chained ids: a block id names its whole prefix
    blocks = [
        [1, 2],        # a#0: cold
        [1, 2, 3],     # a#1: the previous prompt is its prefix -> append
        [1, 4],        # a#2: leaves a's context after block 1 -> internal
        [1, 2, 5],     # b#0 (a subagent of a): a's prefix -> fork
        [9],           # c#0: cold
        [1, 4, 6],     # a#3: append to a#2
    ]
    sessions = ["a", "a", "a", "b", "c", "a"]
    classes = request_classes(blocks, sessions, range(6))
    assert classes == ["cold", "append", "internal", "fork", "cold", "append"]
    m = class_means(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), np.array(classes, dtype=object))
    assert m["append"] == {"count": 2, "ttft_mean": 4.0}
    assert m["cold"]["ttft_mean"] == 3.0
    # the order requests were sent in decides: sent first, b#0 is cold
    classes = request_classes(blocks, sessions, [3, 0, 1, 2, 4, 5])
    assert classes[3] == "cold" and classes[0] == "fork"


def test_recovery_losses_split_what_unlimited_reused():
    """Three sensitive requests of 4-block prompts (B = 10): one restored whole, one whose
    KV was evicted past block 1, one with the KV held to block 3 but its deepest state at
    block 1, diverging inside a session's first prompt. The shares and recovery add to 1."""
    from trace_replay.metrics import cold_blocks, recovery_losses, request_classes

    B = 10
    blocks = [[1, 2, 3, 4],       # session a's first prompt
              [1, 2, 3, 4, 5],    # a's next turn
              [1, 2, 3, 9, 9],    # a rewrite: diverges after block 3 (of the first prompt)
              [1, 2, 3, 4, 5, 6]]  # another turn
    first = cold_blocks(blocks, request_classes(blocks, ["a"] * 4, [0, 1, 2, 3]))
    assert first == {1, 2, 3, 4}
    unl = np.array([0, 40, 30, 50])
    hit = np.array([0, 40, 10, 10])
    shared = np.array([0, 40, 30, 10])
    mask = np.array([False, True, True, True])
    got = recovery_losses(hit, shared, unl, mask, blocks, B, first)
    ref = 40 + 30 + 50
    assert got == pytest.approx({"lost_kv": 40 / ref, "lost_no_state": 20 / ref,
                                 "lost_no_state_first_segment": 20 / ref})
    assert recovery(hit, unl, mask) + got["lost_kv"] + got["lost_no_state"] == pytest.approx(1)
    # The same gap diverging in a later segment is not a first-segment loss.
    later = recovery_losses(hit, shared, unl, mask, blocks, B, {1, 2})
    assert later["lost_no_state_first_segment"] == 0.0
