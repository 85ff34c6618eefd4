"""Checkpoints moving between engines' SSD stores through the fleet tier (a shared directory):
published from one store, pulled whole into another, never mixed with a chunk the puller
computed itself, and the scheduler never waiting on the tier past its deadlines."""

from __future__ import annotations

import threading
import time

import pytest

from histate_vllm.store import SSDStore
from histate_vllm.store.fleet import DirBackend, FleetMiss, FleetTier, FleetUnavailable
from histate_vllm.store.fleet.link import FleetLink
from histate_vllm.store.fleet.sync import publish_from_store, pull_into_store
from tests.store.test_fleet_tier import PAGE, identity, page

GB = 1 << 30


def ck(i: int) -> bytes:
    return i.to_bytes(4, "big") * 4 + b"\0\0\0\1"


def st(i: int) -> bytes:
    return i.to_bytes(4, "big") * 4 + b"\0\0\0\2"


def engine_store(root, ident=None) -> SSDStore:
    return SSDStore(root, ident or identity(), budget_bytes=GB, fsync=False, direct_io=False)


def write_session(store: SSDStore, n: int, seed: int = 0, states=(2, 4)) -> dict:
    """n KV chunks and a checkpoint after each block in `states`; returns the payloads."""
    chunks = {ck(i): page(seed * 1000 + i) for i in range(n)}
    for k, p in chunks.items():
        store.write_chunk(k, p, provenance="a")
    out = {}
    for b in states:
        state = page(seed * 1000 + 500 + b)
        store.publish_checkpoint(st(b), state, position=b * 256,
                                 chunk_keys=[ck(i) for i in range(b)], provenance="a")
        out[st(b)] = state
    return {"chunks": chunks, "states": out}


def read_back(store: SSDStore, key: bytes):
    m = store.load_manifest(key)
    state = bytearray(m.state_nbytes)
    store.read_checkpoint(key, state)
    chunks = []
    for c, n in zip(m.chunk_keys, m.chunk_nbytes):
        buf = bytearray(n)
        store.read_chunk(c, buf)
        chunks.append((c, bytes(buf)))
    return m.position, bytes(state), chunks


@pytest.fixture
def fleet(tmp_path):
    return lambda: FleetTier(DirBackend(tmp_path / "fleet", GB, fsync=False), identity())


def test_a_checkpoint_moves_whole_from_one_engine_store_to_another(tmp_path, fleet):
    a, b = engine_store(tmp_path / "a"), engine_store(tmp_path / "b")
    data = write_session(a, 4)
    assert publish_from_store(fleet(), a, st(4)) > 4 * PAGE
    pulled = pull_into_store(fleet(), b, st(4))
    assert (pulled.position, pulled.chunk_keys) == (4 * 256, tuple(ck(i) for i in range(4)))
    pos, state, chunks = read_back(b, st(4))
    assert pos == 1024 and state == data["states"][st(4)].tobytes()
    assert chunks == [(k, data["chunks"][k].tobytes()) for k in pulled.chunk_keys]
    assert st(4) in b.scan().checkpoints  # a restart finds it like the engine's own


def test_chunks_held_already_are_neither_sent_nor_read_again(tmp_path, fleet):
    a, b = engine_store(tmp_path / "a"), engine_store(tmp_path / "b")
    write_session(a, 4)
    tier = fleet()
    first = publish_from_store(tier, a, st(2))
    second = publish_from_store(tier, a, st(4))  # shares chunks 0-1 with the first
    obj = PAGE + 4096  # a payload and its header
    assert 3 * obj < first < 4 * obj and 3 * obj < second < 4 * obj  # not 5 objects
    assert pull_into_store(fleet(), b, st(2)).nbytes == 3 * PAGE  # 2 chunks, a state
    assert pull_into_store(fleet(), b, st(4)).nbytes == 3 * PAGE  # chunks 2-3, a state


def test_a_chunk_held_here_serves_as_it_is_and_the_manifest_names_its_bytes(tmp_path, fleet):
    a, b = engine_store(tmp_path / "a"), engine_store(tmp_path / "b")
    data = write_session(a, 4)
    publish_from_store(fleet(), a, st(4))
    own = page(77)  # b's own computation of chunk 1 (rounding may differ between engines)
    b.write_chunk(ck(1), own, provenance="b's own prefill")
    pulled = pull_into_store(fleet(), b, st(4))
    assert pulled.nbytes == 4 * PAGE  # chunks 0, 2, 3 and the state: chunk 1 not read
    _, state, chunks = read_back(b, st(4))  # every byte checked against its manifest
    assert state == data["states"][st(4)].tobytes()
    assert dict(chunks)[ck(1)] == own.tobytes() and dict(chunks)[ck(2)] == \
        data["chunks"][ck(2)].tobytes()


def test_a_corrupt_fleet_object_is_a_miss_and_leaves_no_checkpoint(tmp_path, fleet):
    a, b = engine_store(tmp_path / "a"), engine_store(tmp_path / "b")
    write_session(a, 4)
    publish_from_store(fleet(), a, st(4))
    (obj,) = [p for p in (tmp_path / "fleet").rglob("*") if "/st/" in str(p)][:1]
    data = bytearray(obj.read_bytes())
    data[-1] ^= 1
    obj.write_bytes(bytes(data))
    with pytest.raises(FleetMiss) as e:
        pull_into_store(fleet(), b, st(4))
    assert e.value.cause == "corrupt" and not b.has_checkpoint(st(4))


def test_another_model_or_weights_never_finds_the_checkpoint(tmp_path):
    # (A tenant's cache salt is in the block hashes, so in every key: another tenant asks
    # for other keys.)
    a, b = engine_store(tmp_path / "a"), engine_store(tmp_path / "b")
    write_session(a, 2, states=(2,))
    backend = DirBackend(tmp_path / "fleet", GB, fsync=False)
    publish_from_store(FleetTier(backend, identity()), a, st(2))
    for other in (identity(weights="w2"), identity(model="other")):
        with pytest.raises(FleetMiss) as e:
            pull_into_store(FleetTier(backend, other), engine_store(tmp_path / "c", other),
                            st(2))
        assert e.value.cause == "missing"
    assert not b.has_checkpoint(st(2))


# --- FleetLink: the scheduler's side ---


def link_for(tmp_path, name: str, backend=None, ranks: int = 1) -> FleetLink:
    backend = backend or DirBackend(tmp_path / "fleet", GB, fsync=False)
    idents = [identity(tp_rank=r, tp_size=ranks) for r in range(ranks)]
    stores = [engine_store(tmp_path / name, i) for i in idents]
    return FleetLink([FleetTier(backend, i) for i in idents],
                     [(lambda s=s: s) for s in stores]), stores


def wait_done(link: FleetLink, rid: str, timeout_s: float = 10.0) -> str:
    end = time.monotonic() + timeout_s
    while (s := link.status(rid)) == "pending" and time.monotonic() < end:
        link.wait(0.05)
    return s


def candidates(*blocks):
    return [(b * 256, [st(b)]) for b in sorted(blocks, reverse=True)]


def test_link_publishes_and_another_engine_pulls_the_deepest_checkpoint(tmp_path):
    la, (a,) = link_for(tmp_path, "a")
    lb, (b,) = link_for(tmp_path, "b")
    write_session(a, 4)
    la.publish(st(2))
    la.publish(st(4))
    la.drain(timeout_s=10)
    lb.fetch("r1", candidates(2, 3, 4), lambda p: True, 5.0, 5.0)
    assert wait_done(lb, "r1") == "done"
    (p,) = lb.take_pulled()
    assert p.key == st(4) and p.position == 1024 and b.has_checkpoint(st(4))
    assert lb.counts["fetch", "pulled"] == 1


def test_link_says_none_or_not_worth_without_pulling(tmp_path):
    la, (a,) = link_for(tmp_path, "a")
    lb, (b,) = link_for(tmp_path, "b")
    write_session(a, 4)
    la.publish(st(2))
    la.drain(timeout_s=10)
    lb.fetch("r1", candidates(3), lambda p: True, 5.0, 5.0)
    lb.fetch("r2", candidates(2), lambda p: False, 5.0, 5.0)
    assert wait_done(lb, "r1") == "done" and wait_done(lb, "r2") == "done"
    assert lb.take_pulled() == [] and not b.has_checkpoint(st(2))
    assert lb.counts["fetch", "none"] == 1 and lb.counts["fetch", "not_worth"] == 1


def test_every_rank_shard_or_none(tmp_path):
    la, sa = link_for(tmp_path, "a", ranks=2)
    lb, sb = link_for(tmp_path, "b", ranks=2)
    write_session(sa[0], 2, states=(2,))  # rank 1's shard never written: not published
    la.publish(st(2))
    la.drain(timeout_s=10)
    lb.fetch("r1", candidates(2), lambda p: True, 5.0, 5.0)
    assert wait_done(lb, "r1") == "done"
    assert lb.take_pulled() == [] and not any(s.has_checkpoint(st(2)) for s in sb)
    write_session(sa[1], 2, seed=1, states=(2,))
    la2, _ = link_for(tmp_path, "a", ranks=2)
    la2.publish(st(2))
    la2.drain(timeout_s=10)
    lb.fetch("r2", candidates(2), lambda p: True, 5.0, 5.0)
    assert wait_done(lb, "r2") == "done"
    assert [p.key for p in lb.take_pulled()] == [st(2)]
    assert all(s.has_checkpoint(st(2)) for s in sb)


class Hanging:
    """A backend whose calls block (a master that stopped answering) or fail."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.release = threading.Event()

    def exists(self, names):
        if self.fail:
            raise FleetUnavailable(111, "down")
        self.release.wait(30)
        return [False] * len(names)

    get = put = upsert = remove = exists


def test_an_unreachable_tier_answers_at_once_and_a_hung_one_by_the_deadline(tmp_path):
    down, _ = link_for(tmp_path, "a", backend=Hanging(fail=True))
    down.fetch("r1", candidates(2), lambda p: True, 5.0, 5.0)
    assert wait_done(down, "r1") == "done" and down.counts["fetch", "unavailable"] == 1
    hung_backend = Hanging()
    hung, _ = link_for(tmp_path, "b", backend=hung_backend)
    t0 = time.monotonic()
    hung.fetch("r1", candidates(2), lambda p: True, 0.2, 5.0)
    assert wait_done(hung, "r1") == "done"
    assert time.monotonic() - t0 < 2.0 and hung.counts["fetch", "deadline"] == 1
    hung_backend.release.set()


def test_publishes_beyond_the_queue_are_skipped_not_blocking(tmp_path):
    backend = Hanging()
    link, _ = link_for(tmp_path, "a", backend=backend)
    t0 = time.monotonic()
    for i in range(400):
        link.publish(st(i))
    assert time.monotonic() - t0 < 1.0
    assert link.counts["publish", "skipped_busy"] > 0
    backend.release.set()


def test_inspect_lists_the_fleet_tier_and_where_a_pulled_checkpoint_came_from(tmp_path,
                                                                              fleet, capsys):
    from histate_vllm.bookkeeping.log_inspect import main as inspect

    a, b = engine_store(tmp_path / "a"), engine_store(tmp_path / "b")
    write_session(a, 4)
    publish_from_store(fleet(), a, st(4))
    publish_from_store(fleet(), a, st(2))
    pull_into_store(fleet(), b, st(2))
    assert inspect([str(tmp_path / "b"), "--fleet-dir", str(tmp_path / "fleet")]) == 0
    out = capsys.readouterr().out
    assert out.count("fleet") >= 2 and "fleet:a" in out  # rows in the tier, and b's pull
    assert "1024" in out and "512" in out
