"""Names read from disk never become paths outside the store.

A writer of ssd_dir forges a manifest (its checksum is not keyed) naming
`../../victim` as its state file: the store deleted that file when a chunk the
manifest references was found corrupt, and when its key was published again."""

from __future__ import annotations

import os

import msgspec
import pytest
from store_helpers import make_key, make_payload

from histate_vllm.store.errors import StoreError
from histate_vllm.store.format import FormatError, decode_manifest, encode_manifest
from histate_vllm.store.layout import Layout


def _forge(store, key: bytes, victim) -> None:
    """Rewrite key's manifest to name `victim` (relative to the state dir)."""
    path = store.layout.manifest_path(key)
    with open(path, "rb") as f:
        m = decode_manifest(f.read())
    rel = os.path.relpath(victim, store.layout.state_dir(key))
    with open(path, "wb") as f:
        f.write(encode_manifest(msgspec.structs.replace(m, state_file=rel)))


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim"
    v.write_bytes(b"precious")
    return v


def _publish(store, payload_seed="k"):
    ck, key = make_key("c"), make_key("k")
    store.write_chunk(ck, make_payload(4096, "c"), provenance="t")
    store.publish_checkpoint(key, make_payload(512, payload_seed), position=16,
                             chunk_keys=[ck], provenance="t")
    return ck, key


def test_forged_state_file_is_not_deleted_on_republish(store, victim):
    _, key = _publish(store)
    _forge(store, key, victim)
    _publish(store, "other")
    assert victim.read_bytes() == b"precious"


def test_forged_state_file_is_not_deleted_on_corrupt_chunk(store, victim):
    ck, key = _publish(store)
    _forge(store, key, victim)
    with open(store.layout.chunk_path(ck), "r+b") as f:
        f.seek(5000)
        f.write(b"\xff\xff")
    buf = bytearray(4096)
    with pytest.raises(StoreError):
        store.read_chunk(ck, buf)
    assert victim.read_bytes() == b"precious"


def test_forged_manifest_is_skipped_by_the_scan(store, victim):
    _, key = _publish(store)
    _forge(store, key, victim)
    idx = store.scan()
    assert key not in idx.checkpoints
    assert any("outside the store" in r for _, r in idx.skipped)


@pytest.mark.parametrize("name", ["../x.st", "/etc/passwd", "..", "a/b"])
def test_state_path_refuses_non_names(name):
    with pytest.raises(ValueError):
        Layout("/r", "d").state_path(b"\x01", name)


def test_decode_refuses_other_key_state_file(store):
    _, key = _publish(store)
    with open(store.layout.manifest_path(key), "rb") as f:
        m = decode_manifest(f.read())
    bad = encode_manifest(msgspec.structs.replace(m, state_file="ab" + m.state_file[2:]))
    with pytest.raises(FormatError):
        decode_manifest(bad)


def test_long_request_id_does_not_fail_the_write(store):
    """A request id over 2 KiB failed every SSD write of that request: it is
    kept as provenance, cut to a readable head and a hash of the whole."""
    from histate_vllm.store.reader import peek_header

    rid = "r" * 5000
    ck, key = make_key("c"), make_key("k")
    store.write_chunk(ck, make_payload(4096, "c"), provenance=rid)
    store.publish_checkpoint(key, make_payload(512, "k"), position=16, chunk_keys=[ck],
                             provenance=rid + "x")
    prov = peek_header(store.layout.chunk_path(ck))[0].provenance
    assert prov.startswith("r" * 256) and "sha256:" in prov and len(prov.encode()) <= 2048
    info = store.scan().checkpoints[key]
    assert info.provenance != prov  # another id, another hash
