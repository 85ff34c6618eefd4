"""Round trips, idempotence, replacement, identity isolation, restart, deletes."""

from __future__ import annotations

import os
import shutil

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import (
    IDENTITY,
    all_files,
    make_key,
    make_payload,
    read_checkpoint,
    read_chunk,
    tmp_files,
)

from histate_vllm.store import (
    HEADER_BYTES,
    ChunkConflict,
    CorruptEntry,
    MissingEntry,
    SSDStore,
    aligned_buffer,
)


@pytest.mark.parametrize("nbytes", [0, 1, 4095, 4096, (1 << 20) + 3])
def test_chunk_round_trip(store, nbytes):
    data = make_payload(nbytes, nbytes)
    assert store.write_chunk(make_key(1), data, provenance="run-a") == HEADER_BYTES + nbytes
    np.testing.assert_array_equal(read_chunk(store, make_key(1), nbytes), data)
    assert tmp_files(store) == []


@pytest.mark.parametrize("aligned", [True, False], ids=["page-aligned", "unaligned"])
@pytest.mark.parametrize("nbytes", [0, 4096, 4097, (40 << 20) + 5, (70 << 20) + 4096])
def test_large_and_aligned_payloads(store, aligned, nbytes):
    """O_DIRECT paths: zero-copy from aligned memory (64 MiB pieces), else through
    the 32 MiB staging buffer; a partial last block is padded, then truncated."""
    data = aligned_buffer(nbytes + 1)[:nbytes] if aligned else np.empty(nbytes + 1, np.uint8)[1:]
    data[:] = make_payload(min(nbytes, 1 << 20), nbytes).repeat(max(1, -(-nbytes // (1 << 20))))[
        :nbytes
    ]
    assert store.write_chunk(make_key(1), data, provenance="p") == HEADER_BYTES + nbytes
    assert os.path.getsize(store.layout.chunk_path(make_key(1))) == HEADER_BYTES + nbytes
    np.testing.assert_array_equal(read_chunk(store, make_key(1), nbytes), data)


def test_checkpoint_round_trip_and_index(store):
    chunks = [make_key(i) for i in range(3)]
    for i, k in enumerate(chunks):
        store.write_chunk(k, make_payload(10_000, i), provenance="run-a")
    state = make_payload(50_000, "state")
    ck = make_key("ck", group=1)
    size = store.publish_checkpoint(
        ck, state, position=3 * 528, chunk_keys=chunks, provenance="run-a"
    )
    np.testing.assert_array_equal(read_checkpoint(store, ck, 50_000), state)
    index = store.scan()
    info = index.checkpoints[ck]
    assert (info.position, info.chunk_keys, info.provenance) == (1584, tuple(chunks), "run-a")
    assert info.nbytes == size and info.state_nbytes == 50_000
    assert index.chunks == dict.fromkeys(chunks, HEADER_BYTES + 10_000)
    assert index.total_bytes == size + 3 * (HEADER_BYTES + 10_000)
    assert index.chunk_refcounts() == dict.fromkeys(chunks, 1)
    assert index.referencing(chunks[0]) == [ck]
    assert index.skipped == [] and index.orphans == []
    m = store.load_manifest(ck)
    assert m.identity == IDENTITY and list(m.chunk_keys) == chunks


def test_payload_buffer_types(store):
    f32 = np.arange(1000, dtype=np.float32).reshape(10, 100)
    for i, payload in enumerate([b"abc", bytearray(b"xyz!"), memoryview(b"12345"), f32]):
        n = store.write_chunk(make_key(i), payload, provenance="p") - HEADER_BYTES
        out = np.empty(n, np.uint8)
        store.read_chunk(make_key(i), out)
        assert out.tobytes() == memoryview(payload).tobytes()
    with pytest.raises(ValueError, match="contiguous"):
        store.write_chunk(make_key(9), f32[:, ::2], provenance="p")
    # Reads go into any writable buffer big enough, e.g. a float32 array.
    back = np.empty_like(f32)
    store.read_chunk(make_key(3), back)
    np.testing.assert_array_equal(back, f32)


def test_output_buffer_checked(store):
    store.write_chunk(make_key(1), make_payload(100, 1), provenance="p")
    with pytest.raises(ValueError, match="holds 99 bytes"):
        store.read_chunk(make_key(1), np.empty(99, np.uint8))
    with pytest.raises(ValueError, match="read-only"):
        store.read_chunk(make_key(1), bytes(100))
    # A bigger buffer is fine: the payload fills its front.
    big = np.zeros(200, np.uint8)
    assert store.read_chunk(make_key(1), big) == 100


def test_write_chunk_is_idempotent_and_write_once(store):
    data = make_payload(1000, 1)
    store.write_chunk(make_key(1), data, provenance="run-a")
    path = store.layout.chunk_path(make_key(1))
    before = os.stat(path)
    assert store.write_chunk(make_key(1), data.copy(), provenance="run-b") == before.st_size
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    # Same tokens, different bytes (another computation): refused, file untouched.
    with pytest.raises(ChunkConflict, match="run-a"):
        store.write_chunk(make_key(1), make_payload(1000, 2), provenance="run-c")
    np.testing.assert_array_equal(read_chunk(store, make_key(1), 1000), data)


def test_write_chunk_replaces_an_invalid_file(store):
    path = store.layout.chunk_path(make_key(1))
    store.write_chunk(make_key(1), make_payload(1000, 1), provenance="p")
    with open(path, "r+b") as f:
        f.truncate(100)
    data = make_payload(1000, 2)
    store.write_chunk(make_key(1), data, provenance="p")
    np.testing.assert_array_equal(read_chunk(store, make_key(1), 1000), data)


def test_publish_with_missing_chunk_raises_and_writes_nothing(store):
    store.write_chunk(make_key(1), make_payload(10, 1), provenance="p")
    with pytest.raises(MissingEntry, match="write it first"):
        store.publish_checkpoint(
            make_key("ck"),
            make_payload(10, 2),
            position=1,
            chunk_keys=[make_key(1), make_key(2)],
            provenance="p",
        )
    assert not store.has_checkpoint(make_key("ck"))
    assert [f for f in all_files(store) if "/states/" in f] == []


def test_republish_replaces_and_identical_publish_is_a_noop(store):
    store.write_chunk(make_key(1), make_payload(10, 1), provenance="p")
    ck = make_key("ck")
    kw = {"position": 7, "chunk_keys": [make_key(1)], "provenance": "p"}
    store.publish_checkpoint(ck, make_payload(100, "v1"), **kw)
    mpath = store.layout.manifest_path(ck)
    before = os.stat(mpath)
    store.publish_checkpoint(ck, make_payload(100, "v1"), **kw)
    assert os.stat(mpath).st_mtime_ns == before.st_mtime_ns
    v2 = make_payload(120, "v2")
    store.publish_checkpoint(ck, v2, **kw)
    np.testing.assert_array_equal(read_checkpoint(store, ck, 120), v2)
    states = [f for f in all_files(store) if "/states/" in f]
    assert len(states) == 1, "the replaced state file must be removed"


def test_identities_are_kept_apart(tmp_path):
    a = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    other = msgspec.structs.replace(IDENTITY, tp_rank=1)
    b = SSDStore(tmp_path, other, budget_bytes=1 << 30)
    assert a.layout.dir != b.layout.dir
    a.write_chunk(make_key(1), make_payload(10, 1), provenance="p")
    a.publish_checkpoint(
        make_key("ck"),
        make_payload(10, 2),
        position=1,
        chunk_keys=[make_key(1)],
        provenance="p",
    )
    assert b.scan().checkpoints == {}
    with pytest.raises(MissingEntry):
        b.read_checkpoint(make_key("ck"), np.empty(10, np.uint8))
    # Files copied into the other identity's directory are never matched.
    for src, dst in [
        (a.layout.chunk_path(make_key(1)), b.layout.chunk_path(make_key(1))),
        (a.layout.manifest_path(make_key("ck")), b.layout.manifest_path(make_key("ck"))),
    ]:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy(src, dst)
    index = b.scan()
    assert index.checkpoints == {}
    assert "other identity" in index.skipped[0][1]
    with pytest.raises(CorruptEntry, match="another key or identity"):
        b.read_checkpoint(make_key("ck"), np.empty(10, np.uint8))
    with pytest.raises(CorruptEntry, match="another identity"):
        b.read_chunk(make_key(1), np.empty(10, np.uint8))
    assert set(a.scan().checkpoints) == {make_key("ck")}, "a's entries are untouched"


def test_identity_digest_is_stable():
    assert IDENTITY.digest() == IDENTITY.digest()
    assert len(IDENTITY.digest()) == 16
    assert msgspec.structs.replace(IDENTITY, dtype="float16").digest() != IDENTITY.digest()


def test_restart_sees_published_entries(tmp_path):
    s1 = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    s1.write_chunk(make_key(1), make_payload(100, 1), provenance="p")
    state = make_payload(200, 2)
    s1.publish_checkpoint(
        make_key("ck"), state, position=5, chunk_keys=[make_key(1)], provenance="p"
    )
    del s1
    s2 = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    assert set(s2.scan().checkpoints) == {make_key("ck")}
    np.testing.assert_array_equal(read_checkpoint(s2, make_key("ck"), 200), state)


def test_deletes_usage_and_budget(store):
    for i in range(2):
        store.write_chunk(make_key(i), make_payload(1000, i), provenance="p")
    for j in range(2):
        store.publish_checkpoint(
            make_key(f"ck{j}"),
            make_payload(500, j),
            position=j,
            chunk_keys=[make_key(j)],
            provenance="p",
        )
    usage = store.usage_bytes()
    assert usage == sum(os.path.getsize(f) for f in all_files(store))
    store.budget_bytes = usage - 100
    assert store.over_budget() == 100
    owned = store.scan().checkpoints[make_key("ck0")].nbytes
    assert store.delete_checkpoint(make_key("ck0")) == owned
    assert make_key("ck0") not in store.scan().checkpoints
    assert store.delete_checkpoint(make_key("ck0")) == 0
    assert store.delete_chunk(make_key(0)) == HEADER_BYTES + 1000
    # Deleting a chunk still in use unlists the checkpoint that needs it.
    store.delete_chunk(make_key(1))
    index = store.scan()
    assert index.checkpoints == {}
    assert "missing" in index.skipped[0][1]
    assert store.over_budget() == 0


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    sizes=st.lists(st.integers(0, 70_000), min_size=1, max_size=5),
    state_size=st.integers(0, 70_000),
    seed=st.integers(0, 2**32),
)
def test_round_trip_property(tmp_path_factory, sizes, state_size, seed):
    store = SSDStore(tmp_path_factory.mktemp("s"), IDENTITY, budget_bytes=1 << 30, fsync=False)
    keys = [make_key(f"{seed}-{i}") for i in range(len(sizes))]
    datas = [make_payload(n, f"{seed}-{i}") for i, n in enumerate(sizes)]
    for k, d in zip(keys, datas):
        store.write_chunk(k, d, provenance="p")
    state = make_payload(state_size, seed)
    ck = make_key(f"{seed}-ck")
    store.publish_checkpoint(ck, state, position=seed, chunk_keys=keys, provenance=str(seed))
    reopened = SSDStore(store.root, IDENTITY, budget_bytes=1 << 30)
    info = reopened.scan().checkpoints[ck]
    assert info.position == seed and info.chunk_keys == tuple(keys)
    np.testing.assert_array_equal(read_checkpoint(reopened, ck, state_size), state)
    for k, d in zip(keys, datas):
        np.testing.assert_array_equal(read_chunk(reopened, k, len(d)), d)
