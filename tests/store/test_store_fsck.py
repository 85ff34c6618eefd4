"""`python -m histate_vllm.store fsck DIR [--json] [--repair]`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import msgspec
import numpy as np
from store_helpers import (
    IDENTITY,
    assert_only_published_files,
    make_key,
    make_payload,
    read_checkpoint,
)

from histate_vllm.store import SSDStore
from histate_vllm.store.fsck import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD, BAD, GARBAGE = make_key("good", 1), make_key("bad", 1), make_key("garbage", 1)
C_GOOD, C_BAD = make_key("c-good"), make_key("c-bad")


def damaged_store(root) -> SSDStore:
    store = SSDStore(root, IDENTITY, budget_bytes=1 << 30)
    for ck in (C_GOOD, C_BAD):
        store.write_chunk(ck, make_payload(5000, ck.hex()), provenance="p")
    store.publish_checkpoint(
        GOOD, make_payload(100, "good"), position=528, chunk_keys=[C_GOOD], provenance="p"
    )
    store.publish_checkpoint(
        BAD, make_payload(100, "bad"), position=1056, chunk_keys=[C_GOOD, C_BAD], provenance="p"
    )
    with open(store.layout.chunk_path(C_BAD), "r+b") as f:  # a flipped payload byte
        f.seek(4096 + 77)
        f.write(b"\xff\xfe")
    os.makedirs(os.path.dirname(store.layout.manifest_path(GARBAGE)), exist_ok=True)
    with open(store.layout.manifest_path(GARBAGE), "wb") as f:
        f.write(b"not a manifest")
    store.write_chunk(make_key("orphan"), make_payload(10, 0), provenance="p")
    with open(os.path.join(store.layout.states_dir, ".s.st.999999999.ab.tmp"), "wb") as f:
        f.write(b"left by a crash")
    return store


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "histate_vllm.store", "fsck", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_fsck_reports_then_repairs(tmp_path):
    store = damaged_store(tmp_path)
    r = run_cli(str(tmp_path), "--json")
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] is False
    [s] = report["stores"]
    assert s["checkpoints_ok"] == 1
    assert [b["key"] for b in s["checkpoints_bad"]] == [BAD.hex()]
    assert [b["key"] for b in s["chunks_bad"]] == [C_BAD.hex()]
    assert "checksum" in s["chunks_bad"][0]["reason"]
    assert "garbage manifest" in s["skipped"][0]["reason"]
    reasons = sorted(o["reason"].split(":")[0] for o in s["orphans"])
    assert reasons == ["chunk no manifest names", "temporary file", "unusable manifest"]
    assert s["identity"]["model"] == IDENTITY.model
    # A check changes nothing.
    assert os.path.exists(store.layout.chunk_path(C_BAD))

    text = run_cli(str(tmp_path))
    assert text.returncode == 1
    assert "checkpoints ok: 1  bad: 1" in text.stdout and "problems found" in text.stdout

    r = run_cli(store.layout.dir, "--repair")  # an identity directory works too
    assert r.returncode == 0, r.stdout + r.stderr
    assert "repaired" in r.stdout
    assert_only_published_files(store)
    assert set(store.scan().checkpoints) == {GOOD}
    np.testing.assert_array_equal(read_checkpoint(store, GOOD, 100), make_payload(100, "good"))

    r = run_cli(str(tmp_path), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True


def test_fsck_of_several_identities_and_usage_errors(tmp_path, capsys):
    SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    SSDStore(tmp_path, msgspec.structs.replace(IDENTITY, tp_rank=1), budget_bytes=1 << 30)
    assert main(["fsck", str(tmp_path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["stores"]) == 2
    assert main(["fsck", str(tmp_path / "missing")]) == 2
    os.makedirs(tmp_path / "empty")
    assert main(["fsck", str(tmp_path / "empty")]) == 2


def test_fsck_finds_identity_without_identity_file(tmp_path, capsys):
    store = damaged_store(tmp_path)
    os.unlink(store.layout.identity_path)
    assert main(["fsck", str(tmp_path), "--json"]) == 1
    [s] = json.loads(capsys.readouterr().out)["stores"]
    assert s["identity"]["model"] == IDENTITY.model and s["checkpoints_ok"] == 1


def test_fsck_after_a_stop_mid_write_is_clean(tmp_path):
    """A SIGTERM mid-write leaves temporary files and chunks and states no manifest names
    yet: fsck reports them as leftovers, exit 0; an unknown file is still a
    problem."""
    store = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    store.write_chunk(C_GOOD, make_payload(5000, "g"), provenance="p")
    store.publish_checkpoint(GOOD, make_payload(100, "good"), position=528,
                             chunk_keys=[C_GOOD], provenance="p")
    store.write_chunk(make_key("unpublished"), make_payload(10, 0), provenance="p")
    sdir = store.layout.state_dir(BAD)
    os.makedirs(sdir, exist_ok=True)
    with open(os.path.join(sdir, BAD.hex() + ".1234.st"), "wb") as f:
        f.write(b"a state whose manifest was never written")
    with open(os.path.join(store.layout.chunks_dir, ".x.kv.999999999.ab.tmp"), "wb") as f:
        f.write(b"partial")
    r = run_cli(str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "leftovers of interrupted writes: 3 file(s)" in r.stdout and "clean" in r.stdout
    with open(os.path.join(store.layout.chunks_dir, "README"), "wb") as f:
        f.write(b"not the store's")
    r = run_cli(str(tmp_path))
    assert r.returncode == 1 and "unknown file" in r.stdout
