"""An unusable ssd_dir: the spec serves DRAM-only and says why once."""

from __future__ import annotations

import os
from types import SimpleNamespace

from histate_vllm.store.format import StoreIdentity
from histate_vllm.vllm_glue import offloading_spec
from histate_vllm.vllm_glue.offloading_spec import HiStateSpec


def _spec(root, fsync=True):
    ident = StoreIdentity(model="m", dtype="float16", kv_layout="l", block_size=16, tp_rank=0,
                          tp_size=1, page_bytes=64, vllm_version="v")
    return SimpleNamespace(store_root=str(root), identity=ident,
                           histate=SimpleNamespace(ssd_bytes=1 << 30, ssd_fsync=fsync))


def test_unusable_root_gives_dram_only_with_one_warning(tmp_path, monkeypatch):
    said = []
    monkeypatch.setattr(offloading_spec.logger, "warning", lambda *a: said.append(a[0] % a[1:]))
    monkeypatch.setattr(offloading_spec, "_said_unusable", set())
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    spec = _spec(root)
    assert HiStateSpec.open_scheduler_store(spec) == (None, None, None)
    assert HiStateSpec.open_store(spec) is None
    assert len(said) == 1 and "writable by group or others" in said[0], said
    assert "DRAM only" in said[0]


def test_root_under_a_file_gives_dram_only(monkeypatch):
    monkeypatch.setattr(offloading_spec, "_said_unusable", set())
    assert HiStateSpec.open_scheduler_store(_spec("/dev/null/x")) == (None, None, None)


def test_the_store_syncs_as_configured(tmp_path):
    for fsync in (True, False):
        root = tmp_path / str(fsync)
        root.mkdir(mode=0o700)
        spec = _spec(root, fsync)
        spec._warn_unwritable = lambda store: None
        store = HiStateSpec.open_store(spec)
        assert store is not None and store.fsync is fsync
