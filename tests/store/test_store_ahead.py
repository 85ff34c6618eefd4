"""States written ahead of their chunks (`write_state_ahead`): read back verified by this
process only, never listed by a scan, removed by the next start, replaced by a publish."""

from __future__ import annotations

import os

import numpy as np
import pytest
from store_helpers import IDENTITY, all_files, make_key, make_payload, read_checkpoint

from histate_vllm.store import HEADER_BYTES, CorruptEntry, MissingEntry
from histate_vllm.store.startup import open_for_engine
from histate_vllm.store.writer import StoreWriter


def _state_files(store):
    return [f for f in all_files(store) if f.startswith(store.layout.dir + "/states")]


def test_a_state_written_ahead_reads_back_and_no_scan_lists_it(store):
    data = make_payload(5000, "s")
    key = make_key("st", 1)
    assert store.write_state_ahead(key, data, provenance="r") == HEADER_BYTES + 5000
    assert store.has_checkpoint(key)
    np.testing.assert_array_equal(read_checkpoint(store, key, 5000), data)
    index = store.scan()
    assert key not in index.checkpoints and len(index.orphans) == 1  # no manifest names it
    # Written again (a later copy): the first file goes.
    store.write_state_ahead(key, make_payload(5000, "t"), provenance="r")
    assert len(_state_files(store)) == 1
    store.delete_checkpoint(key)
    assert not store.has_checkpoint(key) and _state_files(store) == []
    with pytest.raises(MissingEntry):
        read_checkpoint(store, key, 5000)


@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
def test_a_damaged_state_written_ahead_is_caught_and_forgotten(store, damage):
    """Negative control of the read: a wrong byte, a short file or a missing one raises
    CorruptEntry (the caller recomputes), and the state is forgotten."""
    key = make_key("st", 1)
    store.write_state_ahead(key, make_payload(5000, "s"), provenance="r")
    (path,) = _state_files(store)
    if damage == "remove":
        os.unlink(path)
    else:
        with open(path, "r+b") as f:
            if damage == "flip":
                f.seek(HEADER_BYTES + 1234)
                b = f.read(1)
                f.seek(HEADER_BYTES + 1234)
                f.write(bytes([b[0] ^ 1]))
            else:
                f.truncate(HEADER_BYTES + 100)
    with pytest.raises(CorruptEntry):
        read_checkpoint(store, key, 5000)
    assert not store.has_checkpoint(key) and _state_files(store) == []


def test_a_publish_replaces_the_state_written_ahead(store):
    chunk = make_key("kv", 0)
    store.write_chunk(chunk, make_payload(300, "c"), provenance="r")
    key = make_key("st", 1)
    store.write_state_ahead(key, make_payload(5000, "a"), provenance="r")
    data = make_payload(5000, "p")
    store.publish_checkpoint(key, data, position=256, chunk_keys=[chunk], provenance="r")
    assert len(_state_files(store)) == 1 and key in store.scan().checkpoints
    np.testing.assert_array_equal(read_checkpoint(store, key, 5000), data)


def test_a_restart_drops_states_written_ahead(tmp_path):
    root = str(tmp_path / "ssd")
    store, lock, _, _ = open_for_engine(root, IDENTITY, budget_bytes=1 << 30)
    key = make_key("st", 1)
    store.write_state_ahead(key, make_payload(5000, "s"), provenance="r")
    lock.release()
    again, lock, index, report = open_for_engine(root, IDENTITY, budget_bytes=1 << 30)
    try:
        assert key not in index.checkpoints and not again.has_checkpoint(key)
        assert report.orphans_removed == 1 and _state_files(again) == []
    finally:
        lock.release()


def test_the_writer_writes_a_state_ahead_of_chunks_it_never_saw(store):
    writer = StoreWriter(store, max_pending_bytes=1 << 20)
    try:
        key = make_key("st", 1)
        assert writer.submit_checkpoint(key, make_payload(4096, "s"), position=512,
                                        chunk_keys=[make_key("kv", 0), make_key("kv", 1)],
                                        provenance="r", ahead=True)
        writer.flush()
        (done,) = writer.drain_finished()
        assert done.ok and done.key == key and store.has_checkpoint(key)
    finally:
        writer.close()
