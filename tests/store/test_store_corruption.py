"""Byte flips, truncation, deletion and garbage at each file kind: never a wrong restore.

Scenario for most tests: chunks c0..c2; checkpoint A at 1 block uses c0; checkpoint B
at 3 blocks uses c0..c2 (A is B's earlier fallback). Damage one file, then check what
the scan lists, what reads raise, and that whatever does read back is the exact bytes.
"""

from __future__ import annotations

import os

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import (
    IDENTITY,
    all_files,
    assert_only_published_files,
    make_key,
    make_payload,
    read_checkpoint,
)

from histate_vllm.store import CorruptEntry, MissingEntry, SSDStore, StoreError
from histate_vllm.store.format import MANIFEST_MAGIC

CHUNKS = [make_key(f"c{i}") for i in range(3)]
A, B = make_key("A", 1), make_key("B", 1)
CHUNK_BYTES, STATE_BYTES = 5000, 3000


def build(store: SSDStore) -> dict[bytes, np.ndarray]:
    truth = {}
    for i, k in enumerate(CHUNKS):
        truth[k] = make_payload(CHUNK_BYTES, f"c{i}")
        store.write_chunk(k, truth[k], provenance="run-1")
    for key, n in [(A, 1), (B, 3)]:
        truth[key] = make_payload(STATE_BYTES, key.hex())
        store.publish_checkpoint(
            key, truth[key], position=528 * n, chunk_keys=CHUNKS[:n], provenance="run-1"
        )
    return truth


def state_path(store: SSDStore, key: bytes) -> str:
    return store.layout.state_path(key, store.load_manifest(key).state_file)


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def truncate(path: str, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def restore_all(store: SSDStore, truth) -> set[bytes]:
    """Restore every listed checkpoint with its chunks; return those that verified."""
    ok = set()
    for key, info in store.scan().checkpoints.items():
        try:
            got = read_checkpoint(store, key, info.state_nbytes)
            chunks = [np.empty(CHUNK_BYTES, np.uint8) for _ in info.chunk_keys]
            for ck, out in zip(info.chunk_keys, chunks):
                store.read_chunk(ck, out)
        except (CorruptEntry, MissingEntry):  # MissingEntry: quarantined meanwhile
            continue
        np.testing.assert_array_equal(got, truth[key])
        for ck, out in zip(info.chunk_keys, chunks):
            np.testing.assert_array_equal(out, truth[ck])
        ok.add(key)
    return ok


def test_flipped_chunk_quarantines_every_checkpoint_using_it(store):
    truth = build(store)
    flip(store.layout.chunk_path(CHUNKS[0]), 4096 + 1234)
    with pytest.raises(CorruptEntry, match="checksum") as e:
        store.read_chunk(CHUNKS[0], np.empty(CHUNK_BYTES, np.uint8))
    assert set(e.value.quarantined) == {A, B}
    assert store.scan().checkpoints == {}
    assert len(os.listdir(store.layout.quarantine_dir)) == 3  # chunk + 2 manifests
    assert restore_all(store, truth) == set()


def test_flipped_later_chunk_falls_back_to_earlier_checkpoint(store):
    truth = build(store)
    flip(store.layout.chunk_path(CHUNKS[2]), 4096)
    with pytest.raises(CorruptEntry) as e:
        store.read_chunk(CHUNKS[2], np.empty(CHUNK_BYTES, np.uint8))
    assert e.value.quarantined == (B,)
    assert restore_all(store, truth) == {A}


@pytest.mark.parametrize("offset", [0, 9, 20, 60, 4095 - 100])
def test_flipped_chunk_header(store, offset):
    truth = build(store)
    flip(store.layout.chunk_path(CHUNKS[1]), offset)
    # Whatever the flip hit, what reads back is exact or refused.
    assert restore_all(store, truth) <= {A, B}
    assert A in restore_all(store, truth)


def test_flipped_state_quarantines_that_checkpoint_only(store):
    truth = build(store)
    flip(state_path(store, B), 4096 + STATE_BYTES - 1)
    with pytest.raises(CorruptEntry, match="checksum") as e:
        store.read_checkpoint(B, np.empty(STATE_BYTES, np.uint8))
    assert e.value.quarantined == (B,)
    assert set(store.scan().checkpoints) == {A}
    assert restore_all(store, truth) == {A}


def test_flipped_manifest_is_skipped_and_refused(store):
    truth = build(store)
    flip(store.layout.manifest_path(B), 40)
    index = store.scan()
    assert set(index.checkpoints) == {A}
    assert "checksum mismatch" in index.skipped[0][1]
    with pytest.raises(CorruptEntry, match="garbage manifest"):
        store.read_checkpoint(B, np.empty(STATE_BYTES, np.uint8))
    assert restore_all(store, truth) == {A}


@pytest.mark.parametrize("kind", ["chunk", "state", "manifest"])
@pytest.mark.parametrize("cut", [0, 10, 4096, -1])
def test_truncation(store, kind, cut):
    truth = build(store)
    path = {
        "chunk": store.layout.chunk_path(CHUNKS[1]),
        "state": state_path(store, B),
        "manifest": store.layout.manifest_path(B),
    }[kind]
    truncate(path, cut if cut >= 0 else os.path.getsize(path) - 1)
    index = store.scan()  # sizes alone show it: no payload read needed
    assert set(index.checkpoints) == {A}
    assert len(index.skipped) == 1
    assert restore_all(store, truth) == {A}
    with pytest.raises(StoreError):
        store.read_checkpoint(B, np.empty(STATE_BYTES, np.uint8))


def test_truncated_chunk_refused_at_read_even_without_scan(store):
    build(store)
    truncate(store.layout.chunk_path(CHUNKS[0]), 4096 + 10)
    with pytest.raises(CorruptEntry, match="truncated"):
        store.read_chunk(CHUNKS[0], np.empty(CHUNK_BYTES, np.uint8))


@pytest.mark.parametrize("kind", ["chunk", "state", "manifest"])
def test_deletion(store, kind):
    truth = build(store)
    path = {
        "chunk": store.layout.chunk_path(CHUNKS[2]),
        "state": state_path(store, B),
        "manifest": store.layout.manifest_path(B),
    }[kind]
    os.unlink(path)
    index = store.scan()
    assert set(index.checkpoints) == {A}
    assert restore_all(store, truth) == {A}
    with pytest.raises(StoreError):
        store.read_checkpoint(B, np.empty(STATE_BYTES, np.uint8))
    store.collect_garbage(grace_s=0)
    assert_only_published_files(store)


def test_chunk_rewritten_with_other_bytes_is_not_spliced(store):
    """Regression guard: B's manifest pins c2's checksum; new bytes under c2 break B."""
    truth = build(store)
    store.delete_chunk(CHUNKS[2])
    store.write_chunk(CHUNKS[2], make_payload(CHUNK_BYTES, "other run"), provenance="run-2")
    with pytest.raises(CorruptEntry, match="other bytes"):
        store.read_checkpoint(B, np.empty(STATE_BYTES, np.uint8))
    assert restore_all(store, truth) == {A}


GARBAGE = [
    b"",
    b"\x00" * 100,
    os.urandom(300),
    MANIFEST_MAGIC + b"\xff" * 8,
    msgspec.msgpack.encode({"version": 1, "key": b"x"}),
]


@pytest.mark.parametrize("data", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_manifests_are_skipped(store, data):
    truth = build(store)
    with open(store.layout.manifest_path(B), "wb") as f:
        f.write(data)
    junk_key = make_key("junk")
    os.makedirs(os.path.dirname(store.layout.manifest_path(junk_key)), exist_ok=True)
    with open(store.layout.manifest_path(junk_key), "wb") as f:
        f.write(data)
    index = store.scan()
    assert set(index.checkpoints) == {A}
    assert len(index.skipped) == 2
    assert restore_all(store, truth) == {A}
    store.collect_garbage()  # garbage goes at once, whatever the grace period
    assert not os.path.exists(store.layout.manifest_path(junk_key))


def test_manifest_under_another_keys_name_is_skipped(store):
    build(store)
    with open(store.layout.manifest_path(A), "rb") as f:
        data = f.read()
    with open(store.layout.manifest_path(B), "wb") as f:
        f.write(data)
    index = store.scan()
    assert set(index.checkpoints) == {A}
    assert "another key" in index.skipped[0][1]


def test_junk_files_never_crash_the_scan(store):
    build(store)
    for d in [
        store.layout.dir,
        *store.layout.top_dirs,
        os.path.join(store.layout.chunks_dir, "zz"),
    ]:
        os.makedirs(d, exist_ok=True)
        for name in ["junk", ".hidden", "x.kv", "ab.st", "zz.mf", ".a.b.tmp", "%%.mf"]:
            with open(os.path.join(d, name), "wb") as f:
                f.write(os.urandom(50))
    index = store.scan()
    assert set(index.checkpoints) == {A, B}
    assert len(index.orphans) > 0


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(which=st.integers(0, 10**6), offset=st.integers(0, 10**7), bit=st.integers(0, 7))
def test_any_single_bit_flip_never_restores_wrong_bytes(tmp_path_factory, which, offset, bit):
    store = SSDStore(tmp_path_factory.mktemp("s"), IDENTITY, budget_bytes=1 << 30, fsync=False)
    truth = build(store)
    needed_by_a = {store.layout.chunk_path(CHUNKS[0]), store.layout.manifest_path(A)}
    needed_by_a.add(state_path(store, A))
    files = [f for f in all_files(store) if not f.endswith("identity.json")]
    path = files[which % len(files)]
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(offset % size)
        b = f.read(1)[0]
        f.seek(offset % size)
        f.write(bytes([b ^ (1 << bit)]))
    reopened = SSDStore(store.root, IDENTITY, budget_bytes=1 << 30)
    restored = restore_all(reopened, truth)  # asserts exact bytes for what restores
    if path not in needed_by_a:
        assert A in restored, "damage to B's files must not take A down"


def test_missing_entries(store):
    with pytest.raises(MissingEntry):
        store.read_chunk(make_key("nope"), np.empty(1, np.uint8))
    with pytest.raises(MissingEntry):
        store.read_checkpoint(make_key("nope"), np.empty(1, np.uint8))
