"""The store and the event log are private to the engine's user."""

from __future__ import annotations

import os
import stat

import pytest
from store_helpers import IDENTITY, make_key, make_payload

from histate_vllm.store import SSDStore
from histate_vllm.store.lock import DirLock
from histate_vllm.store.trust import UnsafeStoreDir


@pytest.fixture(params=[0o022, 0o000])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _modes(top: str) -> dict[str, int]:
    out = {top: stat.S_IMODE(os.lstat(top).st_mode)}
    for d, dirs, files in os.walk(top):
        for n in dirs + files:
            p = os.path.join(d, n)
            out[p] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def test_store_files_are_private_whatever_the_umask(tmp_path, umask):
    root = tmp_path / "store"
    s = SSDStore(root, IDENTITY, budget_bytes=1 << 30)
    s.write_chunk(make_key("c"), make_payload(4096, "c"), provenance="t")
    s.publish_checkpoint(make_key("k"), make_payload(512, "k"), position=16,
                         chunk_keys=[make_key("c")], provenance="t")
    DirLock(s.layout.dir).release()
    modes = _modes(str(root))
    assert len(modes) > 10
    for path, mode in modes.items():
        want = 0o700 if os.path.isdir(path) else 0o600
        assert mode == want, f"{path}: {mode:o}"


def test_existing_identity_dir_is_made_private(tmp_path):
    s = SSDStore(tmp_path / "store", IDENTITY, budget_bytes=1 << 30)
    os.chmod(s.layout.dir, 0o755)  # as left by an earlier version
    SSDStore(tmp_path / "store", IDENTITY, budget_bytes=1 << 30)
    assert stat.S_IMODE(os.stat(s.layout.dir).st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_root_writable_by_others_is_refused(tmp_path, mode):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.raises(UnsafeStoreDir, match="writable by group or others"):
        SSDStore(root, IDENTITY, budget_bytes=1 << 30)
    assert os.listdir(root) == []  # nothing written into it


def test_root_of_another_user_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(root).st_uid + 1)
    with pytest.raises(UnsafeStoreDir, match="owned by uid"):
        SSDStore(root, IDENTITY, budget_bytes=1 << 30)


def test_root_is_created_private(tmp_path, umask):
    s = SSDStore(tmp_path / "a" / "store", IDENTITY, budget_bytes=1 << 30)
    assert stat.S_IMODE(os.stat(s.root).st_mode) == 0o700
