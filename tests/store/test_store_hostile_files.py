"""Odd or hostile files in ssd_dir: skipped with a reason, never followed, never read
unbounded, and fsck finishes with a message and an exit status."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest
from store_helpers import make_key, make_payload

from histate_vllm.store.lock import DirLock


@pytest.fixture
def published(store):
    store.write_chunk(make_key("c"), make_payload(4096, "c"), provenance="t")
    store.publish_checkpoint(make_key("k"), make_payload(512, "k"), position=16,
                             chunk_keys=[make_key("c")], provenance="t")
    return store


def _bounded():
    """A child's memory cap: reading /dev/zero whole fails there, not on the machine."""
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run_bounded(args):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=60, preexec_fn=_bounded)


def fsck(root, *args):
    """fsck in a child with a deadline and a memory cap: a hang or an unbounded read
    fails the test instead of the suite."""
    p = run_bounded(["-m", "histate_vllm", "fsck", str(root), *args])
    assert "Traceback" not in p.stderr, p.stderr
    return p


def scan_within(store) -> dict:
    """store.scan() in a bounded child (see `fsck`): checkpoint keys, orphan reasons."""
    here = os.path.dirname(__file__)
    code = (f"import sys, json; sys.path.insert(0, {here!r}); from store_helpers import "
            "IDENTITY; from histate_vllm.store import SSDStore; "
            f"i = SSDStore({store.root!r}, IDENTITY, budget_bytes=1).scan(); "
            "print(json.dumps({'checkpoints': [k.hex() for k in i.checkpoints], "
            "'orphans': [o.reason for o in i.orphans]}))")
    p = run_bounded(["-c", code])
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.splitlines()[-1])


def _fan(store) -> str:
    d = os.path.join(store.layout.manifests_dir, "ab")
    os.makedirs(d, exist_ok=True)
    return d


def test_fifo_manifest_is_skipped_not_waited_on(published):
    os.mkfifo(os.path.join(_fan(published), "ab01.mf"))
    idx = scan_within(published)
    assert make_key("k").hex() in idx["checkpoints"]
    assert "not a regular file" in idx["orphans"]
    p = fsck(published.root)
    assert p.returncode == 1 and "not a regular file" in p.stdout


def test_manifest_linked_to_dev_zero_is_not_read(published):
    os.symlink("/dev/zero", os.path.join(_fan(published), "ab02.mf"))
    assert make_key("k").hex() in scan_within(published)["checkpoints"]
    p = fsck(published.root)
    assert p.returncode == 1 and "not a regular file" in p.stdout


def test_identity_linked_to_dev_zero(published, tmp_path):
    ipath = published.layout.identity_path
    os.remove(ipath)
    os.symlink("/dev/zero", ipath)
    assert fsck(published.root).returncode == 0  # the identity comes from a manifest
    here = os.path.dirname(__file__)
    code = (f"import sys; sys.path.insert(0, {here!r}); from store_helpers import IDENTITY; "
            "from histate_vllm.store import SSDStore; "
            f"SSDStore({published.root!r}, IDENTITY, budget_bytes=1)")
    p = run_bounded(["-c", code])
    assert p.returncode == 0, p.stderr[-2000:]
    assert not os.path.islink(ipath)  # replaced by the identity, never read through


def test_oversized_manifest_is_skipped(published, monkeypatch):
    from histate_vllm.store import scan as scan_mod

    path = published.layout.manifest_path(make_key("k"))
    monkeypatch.setattr(scan_mod.read_small_file, "__defaults__", (100,))
    idx = published.scan()
    assert (path, "garbage manifest: larger than 100 bytes, more than its format allows") \
        in idx.skipped


def test_symlink_loops_give_a_report_not_a_traceback(published):
    os.symlink("loop", os.path.join(published.root, "loop"))
    os.symlink("loop2", os.path.join(published.layout.dir, "loop2"))
    os.symlink("l3", os.path.join(published.layout.chunks_dir, "l3"))
    p = fsck(published.root)
    assert p.returncode == 1, p.stderr
    assert "checkpoints ok: 1" in p.stdout


def test_symlinked_chunk_is_not_read_through(published, tmp_path):
    outside = tmp_path / "outside"
    path = published.layout.chunk_path(make_key("c"))
    os.rename(path, outside)
    os.symlink(outside, path)
    assert make_key("k") not in published.scan().checkpoints
    buf = bytearray(4096)
    with pytest.raises(Exception) as e:
        published.read_chunk(make_key("c"), buf)
    assert "regular file" in str(e.value) or "missing" in str(e.value)
    assert outside.exists()  # quarantine moves the link, never its target


def test_lock_file_link_does_not_overwrite_its_target(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"precious")
    d = tmp_path / "store"
    d.mkdir()
    os.symlink(target, d / "engine.lock")
    with pytest.raises(OSError):
        DirLock(str(d))
    assert target.read_bytes() == b"precious"
