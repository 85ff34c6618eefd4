"""Synthetic workloads: determinism, the mutation microbenchmark, agent context patterns."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_replay import check_chained, synth
from trace_replay.synth import Shape

SMALL = Shape(n_sessions=4, turns=12, system_tokens=1024, new_tokens=1024, output_tokens=128)


def _common(a, b) -> int:
    m = min(len(a), len(b))
    d = np.flatnonzero(a[:m] != b[:m])
    return int(d[0]) if len(d) else m


def _all_ids(wl) -> set:
    return set(np.concatenate([r.block_hashes for s in wl.sessions for r in s.requests]).tolist())


GENERATORS = {
    "mutation": lambda seed: synth.mutation_benchmark(
        0.1, n_sessions=4, new_tokens=1024, seed=seed
    ),
    "append": lambda seed: synth.append_pattern(Shape(**{**_fields(SMALL), "seed": seed})),
    "rewind": lambda seed: synth.rewind_edit_pattern(
        Shape(**{**_fields(SMALL), "seed": seed}), p=0.3
    ),
    "truncation": lambda seed: synth.truncation_pattern(
        Shape(**{**_fields(SMALL), "seed": seed}), p=0.3
    ),
    "compaction": lambda seed: synth.compaction_pattern(
        Shape(**{**_fields(SMALL), "seed": seed}), compact_at=8192, summary_tokens=512
    ),
    "forks": lambda seed: synth.subagent_fork_pattern(Shape(**{**_fields(SMALL), "seed": seed})),
    "mixed": lambda seed: synth.mixed_agent_pattern(
        Shape(**{**_fields(SMALL), "seed": seed}), compact_at=12000, every=4
    ),
}


def _fields(shape):
    return {f: getattr(shape, f) for f in shape.__struct_fields__}


@pytest.mark.parametrize("name", GENERATORS)
def test_generators_are_deterministic_and_chained(name):
    a, b, c = GENERATORS[name](1), GENERATORS[name](1), GENERATORS[name](2)
    assert a == b
    assert a != c and not _all_ids(a) & _all_ids(c)  # the seed names every namespace
    check_chained(a)
    a.validate()


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from(synth.MUTATION_RATES), st.sampled_from([16, 64]))
def test_mutation_benchmark_properties(seed, p, bs):
    wl = synth.mutation_benchmark(
        p, n_sessions=3, turns=8, new_tokens=1024, output_tokens=256, block_size=bs, seed=seed
    )
    check_chained(wl)
    seen: set = set()
    for s in wl.sessions:
        for prev, cur in zip(s.requests, s.requests[1:]):
            k = _common(prev.block_hashes, cur.block_hashes)
            if cur.label == "mutation":
                # cut at an internal 256-token boundary of the previous prompt
                cut = cur.input_tokens - 1024
                assert cut % 256 == 0 and 0 < cut < prev.input_tokens
                assert k == cut // bs
            else:
                assert cur.label == "append"
                assert cur.input_tokens == prev.input_tokens + 256 + 1024
                assert k == len(prev.block_hashes)  # extends the whole previous prompt
            # everything after the shared prefix is new to the whole workload so far
            assert not set(cur.block_hashes[k:].tolist()) & seen
            seen.update(prev.block_hashes.tolist())
        seen.update(s.requests[-1].block_hashes.tolist())


def test_mutation_benchmark_defaults_match_the_paper():
    wl = synth.mutation_benchmark()
    assert len(wl.sessions) == 24 and all(len(s.requests) == 16 for s in wl.sessions)
    r = wl.sessions[0].requests
    assert [x.input_tokens for x in r[:3]] == [8192, 8192 * 2 + 256, 8192 * 3 + 512]
    assert all(x.output_tokens == 256 for x in r) and r[1].think_time == 180.0
    assert wl.block_size == 64 and all(0 <= s.start < 180 for s in wl.sessions)
    assert all(x.label in ("initial", "append") for s in wl.sessions for x in s.requests)


@pytest.mark.parametrize("p", synth.MUTATION_RATES)
def test_mutation_rate_is_about_p(p):
    n, turns = 400, 16
    wl = synth.mutation_benchmark(
        p, n_sessions=n, turns=turns, new_tokens=256, output_tokens=16, seed=7
    )
    eligible = n * (turns - 1)
    hits = sum(r.label == "mutation" for s in wl.sessions for r in s.requests)
    sigma = (eligible * p * (1 - p)) ** 0.5
    assert abs(hits - eligible * p) <= 4 * sigma + 1


def test_sessions_share_only_the_system_prompt():
    wl = synth.append_pattern(SMALL)
    firsts = [s.requests[-1].block_hashes for s in wl.sessions]
    assert all(_common(firsts[0], f) == 1024 // 64 for f in firsts[1:])
    mb = synth.mutation_benchmark(n_sessions=3, shared_prefix_tokens=640)
    a, b = (s.requests[0].block_hashes for s in mb.sessions[:2])
    assert _common(a, b) == 10


def _pairs(wl, label):
    for s in wl.sessions:
        for prev, cur in zip(s.requests, s.requests[1:]):
            if cur.label == label:
                yield prev, cur


def test_rewind_keeps_prefix_up_to_the_edit():
    wl = synth.rewind_edit_pattern(SMALL, p=0.4)
    pairs = list(_pairs(wl, "rewind"))
    assert pairs
    for prev, cur in pairs:
        k = _common(prev.block_hashes, cur.block_hashes)
        assert 1024 // 64 <= k < len(prev.block_hashes)  # edit inside an earlier input


def test_truncation_drops_a_middle_span():
    wl = synth.truncation_pattern(SMALL, p=0.4, keep_head=0.3, keep_tail=0.3, marker_tokens=16)
    pairs = list(_pairs(wl, "truncate"))
    assert pairs
    for prev, cur in pairs:
        k = _common(prev.block_hashes, cur.block_hashes)
        assert k < len(prev.block_hashes)
        # the tail after the dropped span is kept but behind a changed prefix: new ids
        assert not set(cur.block_hashes[k:].tolist()) & set(prev.block_hashes.tolist())


def test_compaction_replaces_history_with_summary():
    wl = synth.compaction_pattern(SMALL, compact_at=8192, summary_tokens=512)
    pairs = list(_pairs(wl, "compact"))
    assert pairs
    for prev, cur in pairs:
        assert _common(prev.block_hashes, cur.block_hashes) == 1024 // 64
        assert cur.input_tokens < prev.input_tokens
    assert max(r.input_tokens for s in wl.sessions for r in s.requests) <= 8192


@pytest.mark.parametrize("inherit", [False, True])
def test_subagent_forks(inherit):
    wl = synth.subagent_fork_pattern(
        SMALL, every=4, forks=3, sub_turns=2, inherit_parent_context=inherit
    )
    mains = {s.id: s for s in wl.sessions if s.kind == "main"}
    subs = [s for s in wl.sessions if s.kind == "subagent"]
    assert len(subs) == SMALL.n_sessions * 3 * (SMALL.turns // 4)
    for s in subs:
        parent = mains[s.parent]
        spawn = next(r for r in parent.requests if parent.start + r.t == s.start)
        assert all(r.kind == "subagent" and r.agent_id == s.agent_id for r in s.requests)
        k = _common(spawn.block_hashes, s.requests[0].block_hashes)
        if inherit:  # forked from the parent's context after the spawning turn
            assert k == len(spawn.block_hashes)
        else:
            assert k == 0
    if not inherit:  # siblings share the subagent system prompt (2048 tokens)
        a, b = subs[0].requests[0].block_hashes, subs[1].requests[0].block_hashes
        assert _common(a, b) == 2048 // 64
