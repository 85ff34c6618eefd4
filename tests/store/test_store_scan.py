"""Start-up scan speed at 10,000 checkpoints, and the garbage pass."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest
from store_helpers import (
    IDENTITY,
    assert_only_published_files,
    make_key,
    make_payload,
    read_checkpoint,
)

from histate_vllm.store import HEADER_BYTES, CorruptEntry, SSDStore
from histate_vllm.store.format import (
    FORMAT_VERSION,
    Kind,
    Manifest,
    PayloadHeader,
    checksum,
    default_algo,
    encode_header,
    encode_manifest,
)
from histate_vllm.store.layout import new_state_file

N_CHECKPOINTS, N_CHUNKS, REFS = 10_000, 10_000, 32


def fabricate(store: SSDStore, n_ckpt: int, n_chunks: int, refs: int) -> None:
    """Write a big store straight to disk in the store's format (no fsync, no renames):
    publishing 10k checkpoints through the API takes ~15 s on this machine."""
    layout, algo, digest = store.layout, default_algo(), store.layout.digest
    for d in (layout.chunks_dir, layout.states_dir, layout.manifests_dir):
        for i in range(256):
            os.makedirs(os.path.join(d, f"{i:02x}"), exist_ok=True)
    payload = b"\x07" * 64
    csum = checksum(algo, payload)
    chunks = [make_key(f"big-chunk{i}") for i in range(n_chunks)]
    for k in chunks:
        with open(layout.chunk_path(k), "wb") as f:
            f.write(encode_header(PayloadHeader(Kind.CHUNK, algo, 64, csum, digest, k, "p")))
            f.write(payload)
    for i in range(n_ckpt):
        key = make_key(f"big-ckpt{i}", 1)
        state_file = new_state_file(key)
        with open(layout.state_path(key, state_file), "wb") as f:
            f.write(encode_header(PayloadHeader(Kind.STATE, algo, 64, csum, digest, key, "p")))
            f.write(payload)
        start = i * (n_chunks - refs) // max(1, n_ckpt - 1)  # every chunk used
        m = Manifest(
            version=FORMAT_VERSION,
            identity=IDENTITY,
            key=key,
            position=i * 528,
            provenance=f"run{i}",
            state_file=state_file,
            state_nbytes=64,
            state_checksum=csum,
            state_algo=int(algo),
            chunk_keys=tuple(chunks[start : start + refs]),
            chunk_nbytes=(64,) * refs,
            chunk_checksums=(csum,) * refs,
            chunk_algos=(int(algo),) * refs,
            created_ns=time.time_ns(),
        )
        with open(layout.manifest_path(key), "wb") as f:
            f.write(encode_manifest(m))


def test_scan_of_10k_checkpoints_opens_manifests_only(tmp_path, monkeypatch):
    try:
        _scan_10k(tmp_path, monkeypatch)
    finally:  # 30k files: do not leave them for pytest's next start to delete
        shutil.rmtree(tmp_path, ignore_errors=True)


def _scan_10k(tmp_path, monkeypatch):
    store = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 40, fsync=False)
    fabricate(store, N_CHECKPOINTS, N_CHUNKS, REFS)
    # A few through the real API, to show the fabricated files are the real format.
    store.write_chunk(make_key("real-c"), make_payload(100, 1), provenance="real")
    store.publish_checkpoint(
        make_key("real", 1),
        make_payload(100, 2),
        position=1,
        chunk_keys=[make_key("real-c")],
        provenance="real",
    )
    reopened = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 40)
    # Start-up cost is what the scan opens: one manifest per checkpoint, never a
    # payload. Its speed is measured in benchmarks, not asserted here.
    opened: list[str] = []
    real_open = os.open

    def recording_open(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    wall, cpu = time.perf_counter(), time.process_time()
    index = reopened.scan()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    monkeypatch.setattr(os, "open", real_open)
    print(f"scan of {len(index.checkpoints)} checkpoints: {wall:.3f} s wall, {cpu:.3f} s cpu")
    assert len(index.checkpoints) == N_CHECKPOINTS + 1
    assert index.skipped == [] and index.orphans == []
    assert len(index.chunks) == N_CHUNKS + 1
    manifests = {reopened.layout.manifest_path(k) for k in index.checkpoints}
    assert sorted(opened) == sorted(manifests)
    info = index.checkpoints[make_key("big-ckpt5", 1)]
    assert info.position == 5 * 528 and len(info.chunk_keys) == REFS
    assert info.nbytes == HEADER_BYTES + 64 + os.path.getsize(
        reopened.layout.manifest_path(make_key("big-ckpt5", 1))
    )
    out = np.empty(64, np.uint8)
    reopened.read_checkpoint(make_key("big-ckpt5", 1), out)
    assert out.tobytes() == b"\x07" * 64


def _age(path: str, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_gc_removes_orphans_and_stale_tmp_but_spares_young_files(store):
    store.write_chunk(make_key("used"), make_payload(100, 1), provenance="p")
    store.publish_checkpoint(
        make_key("A", 1),
        make_payload(100, 2),
        position=1,
        chunk_keys=[make_key("used")],
        provenance="p",
    )
    store.write_chunk(make_key("old-orphan"), make_payload(100, 3), provenance="p")
    store.write_chunk(make_key("young-orphan"), make_payload(100, 4), provenance="p")
    _age(store.layout.chunk_path(make_key("old-orphan")), 3600)
    sdir = store.layout.state_dir(make_key("A", 1))
    dead_tmp = os.path.join(sdir, ".x.st.999999999.abcd.tmp")  # pid that cannot exist
    live_tmp = os.path.join(sdir, f".y.st.{os.getpid()}.abcd.tmp")  # our own, in flight
    for p in (dead_tmp, live_tmp):
        with open(p, "wb") as f:
            f.write(b"partial")
    report = store.collect_garbage(grace_s=600)
    assert sorted(report.removed) == sorted(
        [store.layout.chunk_path(make_key("old-orphan")), dead_tmp]
    )
    assert report.kept_young == 2
    assert os.path.exists(live_tmp)
    assert store.has_chunk(make_key("young-orphan"))
    store.collect_garbage(grace_s=0)
    assert_only_published_files(store)
    np.testing.assert_array_equal(
        read_checkpoint(store, make_key("A", 1), 100), make_payload(100, 2)
    )


def test_gc_spares_a_file_replaced_since_the_scan(store, monkeypatch):
    from histate_vllm.store import gc as gc_mod

    store.write_chunk(make_key("c"), make_payload(100, 1), provenance="p")
    path = store.layout.chunk_path(make_key("c"))
    real_scan = gc_mod.scan

    def scan_then_republish(*args, **kwargs):
        index = real_scan(*args, **kwargs)
        os.unlink(path)  # another process deletes and rewrites it meanwhile
        store.write_chunk(make_key("c"), make_payload(100, 1), provenance="p")
        return index

    monkeypatch.setattr(gc_mod, "scan", scan_then_republish)
    report = store.collect_garbage(grace_s=0)
    assert report.removed == [] and store.has_chunk(make_key("c"))


def test_background_gc_thread(store):
    store.write_chunk(make_key("orphan"), make_payload(10, 1), provenance="p")
    t = store.start_background_gc(grace_s=0)
    t.join(timeout=10)
    assert not t.is_alive()
    assert not store.has_chunk(make_key("orphan"))


def test_quarantine_is_capped(tmp_path):
    store = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30, quarantine_keep=3)
    for i in range(5):
        store.write_chunk(make_key(i), make_payload(100, i), provenance="p")
        with open(store.layout.chunk_path(make_key(i)), "r+b") as f:
            f.truncate(5000)
        with pytest.raises(CorruptEntry):
            store.read_chunk(make_key(i), np.empty(100, np.uint8))
    assert len(os.listdir(store.layout.quarantine_dir)) == 3
