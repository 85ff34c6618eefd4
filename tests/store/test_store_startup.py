"""Engine start-up over a store: one engine per directory, ranks reconciled, orphans
collected without reading a payload, earlier reset generations removed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import msgspec
import pytest
from store_helpers import IDENTITY, all_files, make_key, make_payload

from histate_vllm.store import SSDStore
from histate_vllm.store.fsck import fsck_store, is_clean
from histate_vllm.store.lock import DirLock, StoreLocked
from histate_vllm.store.reset import RESET_MARK, rank_identity, reset_identity
from histate_vllm.store.startup import open_for_engine

TP2 = msgspec.structs.replace(IDENTITY, tp_size=2)


def publish(store: SSDStore, name: str, chunks: list[str], position: int = 528) -> bytes:
    keys = [make_key(c) for c in chunks]
    for k, c in zip(keys, chunks):
        store.write_chunk(k, make_payload(100, c), provenance="p")
    key = make_key(name, 1)
    store.publish_checkpoint(key, make_payload(50, name), position=position, chunk_keys=keys,
                             provenance="p")
    return key


def open_engine(root, identity=IDENTITY, **kw):
    return open_for_engine(root, identity, budget_bytes=1 << 30, **kw)


def test_second_engine_is_refused_naming_the_first(tmp_path):
    store, lock, _, _ = open_engine(tmp_path)
    with pytest.raises(StoreLocked, match=f"pid {os.getpid()}") as e:
        open_engine(tmp_path)
    assert "own 'ssd_dir'" in str(e.value)
    lock.release()
    _, lock2, _, _ = open_engine(tmp_path)  # free again once released
    lock2.release()


def test_lock_is_dropped_when_the_holder_dies(tmp_path):
    d = str(tmp_path)
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.getcwd()!r})
        from histate_vllm.store.lock import DirLock
        DirLock({d!r})
        os._exit(0)  # no cleanup: the kernel drops the lock
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
    DirLock(d).release()


def test_other_process_holding_the_lock_is_named(tmp_path):
    d = str(tmp_path)
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from histate_vllm.store.lock import DirLock
        DirLock({d!r}); print("locked", flush=True); time.sleep(30)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        with pytest.raises(StoreLocked, match=f"pid {p.pid} on"):
            DirLock(d)
    finally:
        p.kill()
        p.wait()


def test_orphans_of_a_killed_run_are_collected_at_start(tmp_path):
    # A normal stop kills the engine mid-write: chunks no manifest names yet, a state
    # file without its manifest, a temporary file.
    run1 = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    kept = publish(run1, "kept", ["a", "b"])
    run1.write_chunk(make_key("orphan"), make_payload(100, "o"), provenance="p")
    with open(os.path.join(run1.layout.chunks_dir, ".x.kv.999999.ab.tmp"), "wb") as f:
        f.write(b"partial")
    # fsck calls them what they are: leftovers of a stop, not a broken store.
    r = fsck_store(run1.layout.dir, repair=False, grace_s=0)
    assert is_clean(r) and len(r["orphans"]) == 2 and all(o["leftover"] for o in r["orphans"])
    store, lock, index, report = open_engine(tmp_path)
    assert report.orphans_removed == 2 and set(index.checkpoints) == {kept}
    assert is_clean(fsck_store(store.layout.dir, repair=False, grace_s=0))
    lock.release()


def test_young_orphans_are_kept_with_a_grace_period(tmp_path):
    run1 = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    run1.write_chunk(make_key("orphan"), make_payload(100, "o"), provenance="p")
    store, lock, _, report = open_engine(tmp_path, grace_s=600)
    assert report.orphans_removed == 0 and report.orphans_kept_young == 1
    assert store.has_chunk(make_key("orphan"))
    lock.release()


def test_start_up_reads_no_payload(tmp_path, monkeypatch):
    run1 = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    publish(run1, "c", ["a"])
    run1.write_chunk(make_key("orphan"), make_payload(100, "o"), provenance="p")
    import histate_vllm.store.reader as reader

    def no_reads(*a, **k):
        raise AssertionError("start-up read a payload")

    monkeypatch.setattr(reader, "read_into", no_reads)
    monkeypatch.setattr(reader, "verify_stream", no_reads)
    monkeypatch.setattr(reader, "peek_header", no_reads)
    _, lock, index, _ = open_engine(tmp_path)
    assert len(index.checkpoints) == 1
    lock.release()


def test_ranks_keep_only_what_every_rank_holds(tmp_path):
    r0 = SSDStore(tmp_path, rank_identity(TP2, 0), budget_bytes=1 << 30)
    r1 = SSDStore(tmp_path, rank_identity(TP2, 1), budget_bytes=1 << 30)
    both = [publish(s, "both", ["a", "b"]) for s in (r0, r1)][0]
    only0 = publish(r0, "only0", ["a", "c"], position=1056)  # rank 1 died before it
    only1 = publish(r1, "only1", ["d"])  # rank 0 died before it
    differ = [publish(s, "differ", ["a"], position=p) for s, p in ((r0, 528), (r1, 1056))][0]
    _, lock, index, report = open_engine(tmp_path, TP2)
    assert set(index.checkpoints) == {both}
    assert set(index.chunks) == {make_key("a"), make_key("b")}
    assert report.rank_mismatches == 4  # only0, differ on rank 0; only1, differ on rank 1
    for s in (r0, r1):
        assert set(s.scan().checkpoints) == {both} and s.scan().orphans == []
        assert not s.has_checkpoint(only0) and not s.has_checkpoint(only1)
        assert not s.has_checkpoint(differ)
    assert not r0.has_chunk(make_key("c")) and not r1.has_chunk(make_key("d"))
    lock.release()


def test_rank_without_a_directory_here_is_left_alone(tmp_path):
    # Another node's rank: its store is on that node's disk.
    r0 = SSDStore(tmp_path, rank_identity(TP2, 0), budget_bytes=1 << 30)
    key = publish(r0, "c", ["a"])
    _, lock, index, _ = open_engine(tmp_path, TP2)
    assert set(index.checkpoints) == {key}
    assert not os.path.exists(os.path.join(tmp_path, rank_identity(TP2, 1).digest()))
    lock.release()


def test_reset_generations_are_removed_at_start(tmp_path):
    base = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    kept = publish(base, "kept", ["a"])
    ours = SSDStore(tmp_path, reset_identity(IDENTITY, "g1"), budget_bytes=1)
    tp2 = SSDStore(tmp_path, reset_identity(rank_identity(TP2, 1), "g1"), budget_bytes=1)
    for g in (ours, tp2):
        publish(g, "after reset", ["z"])
    other_model = msgspec.structs.replace(IDENTITY, model="other")
    other = SSDStore(tmp_path, reset_identity(other_model, "g1"), budget_bytes=1)
    publish(other, "x", ["y"])
    _, lock, index, report = open_engine(tmp_path)
    assert report.reset_dirs_removed == [ours.layout.dir]  # TP=2 is another identity
    assert set(index.checkpoints) == {kept}
    assert os.path.isdir(other.layout.dir) and os.path.isdir(tp2.layout.dir)
    lock.release()


def test_reset_identity_is_its_own_directory_and_base_is_recovered():
    ident = reset_identity(IDENTITY, "g1")
    assert ident.digest() != IDENTITY.digest() and RESET_MARK in ident.extra
    again = reset_identity(ident, "g2")
    assert again.extra.count(RESET_MARK) == 1 and again.extra.endswith("g2")


def test_unpinned_weights_wipe_the_store_at_start(tmp_path):
    ident = msgspec.structs.replace(IDENTITY, weights="unpinned: dummy weights")
    run1 = SSDStore(tmp_path, ident, budget_bytes=1 << 30)
    publish(run1, "c", ["a"])
    store, lock, index, _ = open_engine(tmp_path, ident)
    assert index.checkpoints == {}
    assert [f for f in all_files(store) if "/chunks/" in f or "/manifests/" in f] == []
    lock.release()


def test_lock_waits_for_a_predecessor_that_is_exiting(tmp_path):
    import threading
    import time

    first = DirLock(str(tmp_path))
    released = threading.Event()

    def exit_later():
        time.sleep(0.3)
        released.set()  # before the release, so a waiter that got in early sees it unset
        first.release()

    threading.Thread(target=exit_later).start()
    second = DirLock(str(tmp_path), wait_s=10)
    assert released.is_set()  # it waited for the predecessor rather than taking over
    second.release()
