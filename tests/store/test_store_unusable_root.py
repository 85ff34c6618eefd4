"""An ssd_dir that cannot be used at start-up: StoreUnusable saying why, never a crash in
the directory lock; the engine then serves DRAM-only (tests/vllm_glue)."""

from __future__ import annotations

import errno
import os

import pytest
from store_helpers import IDENTITY

from histate_vllm.store import StoreUnusable, lock
from histate_vllm.store.startup import open_for_engine


def open_engine(root):
    return open_for_engine(str(root), IDENTITY, budget_bytes=1 << 30)


def test_root_under_a_file(tmp_path):
    with pytest.raises(StoreUnusable, match="cannot create or open it: Not a directory"):
        open_engine("/dev/null/x")


def test_root_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"")
    with pytest.raises(StoreUnusable, match="not a directory"):
        open_engine(f)


def test_root_writable_by_others(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(StoreUnusable, match="writable by group or others"):
        open_engine(root)


def test_read_only_file_system(tmp_path, monkeypatch):
    def erofs(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    open_engine(tmp_path)[1].release()  # a store from an earlier run, now mounted ro
    monkeypatch.setattr(lock.os, "open", erofs)
    with pytest.raises(StoreUnusable, match="cannot take its lock: Read-only file system"):
        open_engine(tmp_path)
