"""A chunk recomputed with other bits (e.g. a leftover after a restart) never blocks the
checkpoints that follow it, and never meets a checkpoint computed over the old bits."""

from __future__ import annotations

import numpy as np
import pytest
from store_helpers import IDENTITY, make_key, make_payload, read_checkpoint, read_chunk

from histate_vllm.store import CorruptEntry, MissingEntry, SSDStore, StoreWriter

K, K2 = make_key("k"), make_key("k2")
OLD_CKPT, NEW_CKPT = make_key("old", 1), make_key("new", 1)


def test_replace_quarantines_the_old_chunk_and_its_checkpoints(store):
    old = make_payload(1000, "old bits")
    store.write_chunk(K, old, provenance="run-1")
    store.publish_checkpoint(OLD_CKPT, make_payload(300, "s1"), position=528, chunk_keys=[K],
                             provenance="run-1")
    new = make_payload(1000, "new bits")
    store.write_chunk(K, new, provenance="run-2", on_conflict="replace")
    np.testing.assert_array_equal(read_chunk(store, K, 1000), new)
    # The checkpoint computed over the old bits is gone, not spliced onto the new ones.
    assert not store.has_checkpoint(OLD_CKPT)
    with pytest.raises(MissingEntry):
        store.read_checkpoint(OLD_CKPT, np.empty(300, np.uint8))
    assert OLD_CKPT not in store.scan().checkpoints


def test_writer_after_restart_replaces_a_leftover_chunk(tmp_path):
    # Run 1 wrote chunk K, then died before publishing the checkpoint naming it.
    run1 = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    run1.write_chunk(K, make_payload(1000, "run-1 bits"), provenance="run-1")
    # Run 2 recomputes K with slightly different bits, then checkpoints over it.
    run2 = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    w = StoreWriter(run2, max_pending_bytes=1 << 20)
    new = make_payload(1000, "run-2 bits")
    state = make_payload(300, "state")
    assert w.submit_chunk(K, new, provenance="run-2")
    assert w.submit_checkpoint(NEW_CKPT, state, position=528, chunk_keys=[K],
                               provenance="run-2")
    # A second checkpoint on the same chunk, later in the process, is not blocked either.
    assert w.submit_chunk(K2, make_payload(1000, "k2"), provenance="run-2")
    assert w.submit_checkpoint(OLD_CKPT, state, position=1056, chunk_keys=[K, K2],
                               provenance="run-2")
    assert w.flush(timeout=10)
    assert all(c.ok for c in w.drain_finished())
    np.testing.assert_array_equal(read_chunk(run2, K, 1000), new)
    np.testing.assert_array_equal(read_checkpoint(run2, NEW_CKPT, 300), state)
    assert set(run2.scan().checkpoints) == {NEW_CKPT, OLD_CKPT}
    w.close()


def test_default_still_refuses_a_conflict(store):
    from histate_vllm.store import ChunkConflict

    store.write_chunk(K, make_payload(1000, 1), provenance="a")
    with pytest.raises(ChunkConflict):
        store.write_chunk(K, make_payload(1000, 2), provenance="b")


def test_checkpoint_pinned_to_replaced_bytes_fails_verification(store):
    # Even if a manifest escaped the quarantine (another process published it in
    # between), restoring it checks the chunk's pinned checksum.
    store.write_chunk(K, make_payload(1000, "old"), provenance="a")
    store.publish_checkpoint(OLD_CKPT, make_payload(300, "s"), position=528, chunk_keys=[K],
                             provenance="a")
    manifest = open(store.layout.manifest_path(OLD_CKPT), "rb").read()
    state_file = store.load_manifest(OLD_CKPT).state_file
    state = open(store.layout.state_path(OLD_CKPT, state_file), "rb").read()
    store.write_chunk(K, make_payload(1000, "new"), provenance="b", on_conflict="replace")
    with open(store.layout.state_path(OLD_CKPT, state_file), "wb") as f:
        f.write(state)
    with open(store.layout.manifest_path(OLD_CKPT), "wb") as f:
        f.write(manifest)
    with pytest.raises(CorruptEntry, match="other bytes"):
        store.read_checkpoint(OLD_CKPT, np.empty(300, np.uint8))
