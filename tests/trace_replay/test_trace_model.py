"""Hashing, context building and the workload types (no trace files needed)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_replay import Request, Session, Workload, check_chained, coarsen, rekey
from trace_replay.context import Context, Namespace
from trace_replay.hashing import Chainer, mix64, mix64_array, namespace_seed

FAST = settings(max_examples=60, deadline=None)


def _common(a, b) -> int:
    m = min(len(a), len(b))
    d = np.flatnonzero(np.asarray(a[:m]) != np.asarray(b[:m]))
    return int(d[0]) if len(d) else m


@FAST
@given(st.integers(0, 2**63 - 1), st.lists(st.integers(0, 2**64 - 1), max_size=20))
def test_mix64_array_matches_scalar(prev, values):
    got = mix64_array(prev, np.array(values, dtype=np.uint64)).tolist()
    assert got == [mix64(prev, v) for v in values]
    assert all(0 <= x < 2**63 for x in got)


# Small alphabets make equal local ids at different prefixes common, the case chaining is for.
_streams = st.lists(st.lists(st.integers(0, 3), max_size=12), min_size=1, max_size=8)


@FAST
@given(_streams)
def test_chained_equal_iff_local_prefix_equal(streams):
    chainer = Chainer(namespace_seed("t"))
    chained = [chainer.chain(s) for s in streams]
    for a, ca in zip(streams, chained):
        # The fast path (copying the prefix shared with the previous call) changes nothing.
        assert np.array_equal(ca, Chainer(namespace_seed("t")).chain(a))
        for b, cb in zip(streams, chained):
            for i in range(min(len(a), len(b))):
                assert (ca[i] == cb[i]) == (a[: i + 1] == b[: i + 1])


def test_namespaces_do_not_collide():
    local = list(range(100))
    a = set(Chainer(namespace_seed("weka", "trace_1")).chain(local).tolist())
    b = set(Chainer(namespace_seed("weka", "trace_2")).chain(local).tolist())
    assert not a & b


_ops = st.lists(
    st.tuples(st.sampled_from(["append", "keep", "snap"]), st.integers(0, 300)), max_size=30
)


@FAST
@given(_ops, st.sampled_from([16, 64]))
def test_context_snapshots_are_prefix_consistent(ops, bs):
    ctx = Context(Namespace("ctx"), bs)
    snaps = []
    for op, n in ops:
        before = ctx.block_hashes()
        if op == "append":
            ctx.append(n)
            assert np.array_equal(ctx.block_hashes()[: len(before)], before)
        elif op == "keep":
            n = n % (ctx.n_tokens + 1)
            ctx.keep(n)
            assert np.array_equal(ctx.block_hashes(), before[: n // bs])
        assert len(ctx.block_hashes()) == ctx.n_tokens // bs
        snaps.append(ctx.block_hashes())
    for a in snaps:
        for b in snaps:
            k = _common(a, b)
            # Equal at i implies equal at all j < i: nothing equal after the first difference.
            assert not np.any(a[k : min(len(a), len(b))] == b[k : min(len(a), len(b))])


def test_context_cut_inside_block_renews_that_block():
    ctx = Context(Namespace("cut"), 64)
    ctx.append(256)
    old = ctx.block_hashes()
    ctx.keep(100)  # inside block 1
    ctx.append(156)
    new = ctx.block_hashes()
    assert new[0] == old[0] and not set(new[1:].tolist()) & set(old.tolist())


def test_fork_shares_prefix_only():
    base = Context(Namespace("base"), 64)
    base.append(640)
    a, b = base.fork(Namespace("a")), base.fork(Namespace("b"))
    a.append(640)
    b.append(640)
    assert _common(a.block_hashes(), b.block_hashes()) == 10


def _req(sid="s", i=0, ids=(1, 2), tokens=None, t=0.0):
    return Request(
        session_id=sid,
        index=i,
        t=t,
        think_time=0.0,
        input_tokens=tokens if tokens is not None else 64 * len(ids),
        output_tokens=1,
        block_hashes=list(ids),
    )


def test_request_is_immutable_hashable_and_compact_to_print():
    r = _req(ids=range(1000))
    assert r.block_hashes.dtype == np.int64 and not r.block_hashes.flags.writeable
    with pytest.raises(ValueError):
        r.block_hashes[0] = 5
    with pytest.raises(AttributeError):
        r.t = 1.0
    assert r == _req(ids=range(1000)) and hash(r) == hash(_req(ids=range(1000)))
    assert r != _req(ids=range(999), tokens=64000)
    assert "<1000 ids>" in repr(r) and len(repr(r)) < 400


def _wl(*sessions, bs=64):
    return Workload(name="w", block_size=bs, sessions=tuple(sessions))


def test_validate_names_the_problem():
    ok = Session(id="s", start=0.0, requests=(_req(),))
    _wl(ok).validate()
    with pytest.raises(ValueError, match="duplicate session id"):
        _wl(ok, ok).validate()
    with pytest.raises(ValueError, match="unknown parent"):
        _wl(Session(id="x", start=0, requests=(), parent="nope")).validate()
    with pytest.raises(ValueError, match="2 block ids for 200 tokens"):
        _wl(Session(id="s", start=0, requests=(_req(tokens=200),))).validate()
    with pytest.raises(ValueError, match="back in time"):
        _wl(Session(id="s", start=0, requests=(_req(t=5.0), _req(i=1, t=1.0)))).validate()


def test_iter_requests_is_in_arrival_order():
    a = Session(id="a", start=10.0, requests=(_req("a", 0, t=0.0), _req("a", 1, t=5.0)))
    b = Session(id="b", start=0.0, requests=(_req("b", 0, t=0.0), _req("b", 1, t=12.0)))
    got = [(when, r.session_id) for when, _s, r in _wl(a, b).iter_requests()]
    assert got == [(0.0, "b"), (10.0, "a"), (12.0, "b"), (15.0, "a")]


def test_coarsen_and_rekey_preserve_prefix_structure():
    ctx = Context(Namespace("c"), 64)
    ctx.append(64 * 20)
    r1 = _req(ids=ctx.block_hashes(), tokens=ctx.n_tokens)
    ctx.keep(64 * 13 + 5)
    ctx.append(64 * 9)
    r2 = _req(i=1, ids=ctx.block_hashes(), tokens=ctx.n_tokens)
    wl = _wl(Session(id="s", start=0, requests=(r1, r2))).validate()
    coarse = coarsen(wl, 256).validate()
    a, b = (r.block_hashes for r in coarse.sessions[0].requests)
    assert len(a) == 5 and _common(a, b) == 13 // 4
    assert np.array_equal(a, r1.block_hashes[3::4])
    with pytest.raises(ValueError, match="not a multiple"):
        coarsen(wl, 100)
    moved = rekey(wl.sessions, salt=1)
    m1, m2 = (r.block_hashes for r in moved[0].requests)
    assert moved[0].id == "s#1" and _common(m1, m2) == 13
    assert not set(m1.tolist()) & set(r1.block_hashes.tolist())
    check_chained(_wl(*wl.sessions, *moved))


def test_check_chained_detects_inconsistent_ids():
    good = _req(ids=(1, 2, 3), tokens=192)
    bad = _req(i=1, ids=(9, 2), tokens=128)  # id 2 after 9 here, after 1 before
    with pytest.raises(ValueError, match="block id 2"):
        check_chained(_wl(Session(id="s", start=0, requests=(good, bad))))
