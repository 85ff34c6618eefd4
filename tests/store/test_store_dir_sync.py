"""A publish fsyncs every directory that one of its entries was renamed into, unless this
process already synced it after that rename: fewer fsyncs, the same durability."""

from __future__ import annotations

import os

import pytest
from store_helpers import IDENTITY, make_payload

from histate_vllm.store import SSDStore, publish


def key(first: int, name: str, group: int = 0) -> bytes:
    """A key in fan-out directory `first` (its first byte)."""
    return bytes([first]) + name.encode().ljust(31, b".") + group.to_bytes(4, "big")


@pytest.fixture
def synced(monkeypatch):
    calls: list[str] = []
    real = publish.fsync_dir

    def record(path: str) -> None:
        calls.append(os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path))
        real(path)

    monkeypatch.setattr(publish, "fsync_dir", record)
    return calls


def test_publish_syncs_each_directory_once_per_rename_into_it(tmp_path, synced):
    store = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    c1, c2, c3 = key(0xAB, "c1"), key(0xAB, "c2"), key(0xCD, "c3")
    for c in (c1, c3):
        store.write_chunk(c, make_payload(100, c.hex()), provenance="p")
    store.publish_checkpoint(key(0x01, "A", 1), make_payload(10, "A"), position=1,
                             chunk_keys=[c1, c3], provenance="p")
    assert {"chunks/ab", "chunks/cd", "states/01"} <= set(synced)
    synced.clear()
    # Nothing renamed into chunks/ab or chunks/cd since: only the new state's directory.
    store.publish_checkpoint(key(0x02, "B", 1), make_payload(10, "B"), position=1,
                             chunk_keys=[c1, c3], provenance="p")
    assert "chunks/ab" not in synced and "chunks/cd" not in synced and "states/02" in synced
    synced.clear()
    store.write_chunk(c2, make_payload(100, "c2"), provenance="p")  # a new entry in ab
    store.publish_checkpoint(key(0x02, "C", 1), make_payload(10, "C"), position=1,
                             chunk_keys=[c1, c2, c3], provenance="p")
    assert "chunks/ab" in synced and "chunks/cd" not in synced


def test_a_new_process_syncs_directories_a_previous_one_wrote(tmp_path, synced):
    c = key(0xAB, "c")
    SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30).write_chunk(
        c, make_payload(100, "c"), provenance="p")  # then the process dies, unsynced
    store = SSDStore(tmp_path, IDENTITY, budget_bytes=1 << 30)
    synced.clear()
    store.publish_checkpoint(key(0x01, "A", 1), make_payload(10, "A"), position=1,
                             chunk_keys=[c], provenance="p")
    assert "chunks/ab" in synced
