"""Disk full and read-only, injected at every write step: a clear StoreUnavailable,
one warning, nothing published is damaged, no temporary file is left behind.

Tests run as root, where a read-only directory does not stop writes, so failures are
injected through `fileio.SYS`, the seam every system call of a write path goes through.
Each test checks that its fault actually fired.
"""

from __future__ import annotations

import errno
import logging
import os

import numpy as np
import pytest
from store_helpers import (
    IDENTITY,
    assert_only_published_files,
    make_key,
    make_payload,
    read_checkpoint,
    read_chunk,
    tmp_files,
)

from histate_vllm.store import MissingEntry, SSDStore, StoreUnavailable, StoreWriter
from histate_vllm.store.sysio import SYS

FAILING_OPS = ("open", "write", "fsync", "rename", "mkdir")
ERRNOS = {errno.ENOSPC: "disk full", errno.EACCES: "permission denied", errno.EROFS: "read-only"}


class Injector:
    """Counts the store's system calls; the call number `fail_at` raises OSError(err)."""

    def __init__(self, monkeypatch, ops=FAILING_OPS, fail_at=None, err=errno.ENOSPC):
        self.calls: list[str] = []
        self.fail_at = fail_at
        self.err = err
        self.fired = False
        for name in ops:
            monkeypatch.setattr(SYS, name, self._wrap(name, getattr(SYS, name)))

    def _wrap(self, name, orig):
        def call(*args, **kwargs):
            self.calls.append(name)
            if self.fail_at is not None and len(self.calls) - 1 == self.fail_at:
                self.fired = True
                raise OSError(self.err, os.strerror(self.err))
            return orig(*args, **kwargs)

        return call


A, C0, C1, NEW = make_key("A", 1), make_key("c0"), make_key("c1"), make_key("new", 1)


def baseline(root, direct_io: bool = True) -> SSDStore:
    store = SSDStore(root, IDENTITY, budget_bytes=1 << 30, direct_io=direct_io)
    store.write_chunk(C0, make_payload(3000, "c0"), provenance="p")
    store.publish_checkpoint(
        A, make_payload(2000, "A"), position=528, chunk_keys=[C0], provenance="p"
    )
    return store


OPERATIONS = {
    "write_chunk": lambda s: s.write_chunk(C1, make_payload(3000, "c1"), provenance="p"),
    "publish": lambda s: s.publish_checkpoint(
        NEW, make_payload(2000, "new"), position=1056, chunk_keys=[C0], provenance="p"
    ),
    "republish": lambda s: s.publish_checkpoint(
        A, make_payload(2500, "A2"), position=528, chunk_keys=[C0], provenance="p2"
    ),
}


def check_after_failure(store: SSDStore, op: str) -> None:
    assert tmp_files(store) == []
    np.testing.assert_array_equal(read_chunk(store, C0, 3000), make_payload(3000, "c0"))
    a = read_checkpoint(store, A, store.scan().checkpoints[A].state_nbytes)
    # The old checkpoint, or (failure after the rename) the whole new one.
    assert any(np.array_equal(a, make_payload(n, s)) for n, s in [(2000, "A"), (2500, "A2")])
    if op == "publish" and store.has_checkpoint(NEW):
        np.testing.assert_array_equal(read_checkpoint(store, NEW, 2000), make_payload(2000, "new"))
    if op == "write_chunk" and store.has_chunk(C1):
        np.testing.assert_array_equal(read_chunk(store, C1, 3000), make_payload(3000, "c1"))
    store.collect_garbage(grace_s=0)
    assert_only_published_files(store)


@pytest.mark.parametrize("direct_io", [True, False], ids=["O_DIRECT", "buffered"])
@pytest.mark.parametrize("op", list(OPERATIONS))
def test_failure_at_every_write_step(tmp_path, monkeypatch, op, direct_io):
    counted = baseline(tmp_path / "count", direct_io)
    with monkeypatch.context() as m:
        counter = Injector(m)
        OPERATIONS[op](counted)
    steps = len(counter.calls)
    assert steps >= 6, counter.calls
    trials = 0
    for step in range(steps):
        for err, words in ERRNOS.items():
            root = tmp_path / f"{step}-{err}"
            store = baseline(root, direct_io)
            with monkeypatch.context() as m:
                inj = Injector(m, fail_at=step, err=err)
                with pytest.raises(StoreUnavailable, match=words) as e:
                    OPERATIONS[op](store)
            assert inj.fired and e.value.errno == err
            assert store.unavailable_reason is not None
            check_after_failure(SSDStore(root, IDENTITY, budget_bytes=1 << 30), op)
            trials += 1
    assert trials == steps * len(ERRNOS)


def test_one_warning_per_outage_and_recovery(tmp_path, monkeypatch, caplog):
    store = baseline(tmp_path)
    caplog.set_level(logging.WARNING, logger="histate_vllm.store")
    with monkeypatch.context() as m:
        inj = Injector(m, ops=("write",), fail_at=0, err=errno.ENOSPC)
        for i in range(5):
            inj.calls.clear()
            with pytest.raises(StoreUnavailable, match="disk full"):
                store.write_chunk(make_key(i), make_payload(10, i), provenance="p")
    warnings = [r for r in caplog.records if "disk full" in r.getMessage()]
    assert len(warnings) == 1
    assert "keeps serving" in warnings[0].getMessage()
    assert store.unavailable_reason == "disk full"
    store.write_chunk(make_key(9), make_payload(10, 9), provenance="p")
    assert store.unavailable_reason is None
    assert any("writable again" in r.getMessage() for r in caplog.records)


def test_store_on_unwritable_root_opens_and_degrades(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        inj = Injector(m, ops=("mkdir",), fail_at=0, err=errno.EROFS)
        store = SSDStore(tmp_path / "ro", IDENTITY, budget_bytes=1 << 30)
        assert inj.fired
        assert store.unavailable_reason == "read-only file system"
        assert store.scan().checkpoints == {}
        with pytest.raises(MissingEntry):
            store.read_chunk(C0, np.empty(10, np.uint8))
        inj.fail_at = len(inj.calls)
        with pytest.raises(StoreUnavailable):
            store.write_chunk(C0, make_payload(10, 0), provenance="p")


def test_delete_on_read_only_disk(tmp_path, monkeypatch):
    store = baseline(tmp_path)
    with monkeypatch.context() as m:
        inj = Injector(m, ops=("unlink",), fail_at=0, err=errno.EROFS)
        with pytest.raises(StoreUnavailable, match="read-only"):
            store.delete_checkpoint(A)
        assert inj.fired
    np.testing.assert_array_equal(read_checkpoint(store, A, 2000), make_payload(2000, "A"))


def test_writer_reports_disk_full_and_keeps_going(tmp_path, monkeypatch):
    store = baseline(tmp_path)
    writer = StoreWriter(store, max_pending_bytes=1 << 20)
    with monkeypatch.context() as m:
        inj = Injector(m, ops=("write",), fail_at=0, err=errno.ENOSPC)
        writer.submit_chunk(C1, make_payload(100, 1), provenance="p")
        writer.submit_checkpoint(
            NEW, make_payload(100, 2), position=1, chunk_keys=[C1], provenance="p"
        )
        assert writer.flush(timeout=10)
    assert inj.fired
    done = writer.drain_finished()
    assert [(c.key, c.ok) for c in done] == [(C1, False), (NEW, False)]
    assert "disk full" in done[0].reason
    assert "not written" in done[1].reason  # never published over a chunk it lacks
    writer.submit_chunk(C1, make_payload(100, 1), provenance="p")
    writer.close()
    assert [c.ok for c in writer.drain_finished()] == [True]
    assert not store.has_checkpoint(NEW)


def test_falls_back_to_buffered_writes_without_o_direct(tmp_path, monkeypatch):
    """Scenario: a file system (tmpfs, some FUSE) refuses O_DIRECT with EINVAL."""
    real_open = SYS.open
    refused = []

    def open_without_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(SYS, "open", open_without_direct)
    store = baseline(tmp_path)
    assert refused and not store.direct_io
    np.testing.assert_array_equal(read_checkpoint(store, A, 2000), make_payload(2000, "A"))
    assert tmp_files(store) == []
