"""Restores into page-aligned buffers read with O_DIRECT: the same bytes and the same
verification as buffered reads, odd sizes included; parallel reads in order."""

from __future__ import annotations

import os

import numpy as np
import pytest
from store_helpers import make_key, make_payload

from histate_vllm.store import CorruptEntry, Read, aligned_buffer
from histate_vllm.store.directio import is_aligned

SIZES = [1, 4095, 4096, 4097, 3 * 4096 + 17, 1 << 20]


def direct_used(store) -> bool:
    return store._direct_reads


@pytest.mark.parametrize("nbytes", SIZES)
def test_chunk_and_state_round_trip_through_direct_reads(store, nbytes):
    c, s = make_key(f"c{nbytes}"), make_key(f"s{nbytes}", 1)
    store.write_chunk(c, make_payload(nbytes, "c"), provenance="p")
    store.publish_checkpoint(s, make_payload(nbytes, "s"), position=1, chunk_keys=[c],
                             provenance="p")
    out = aligned_buffer(nbytes + 4096)
    assert is_aligned(memoryview(out))
    out[:] = 0xAB
    assert store.read_chunk(c, out) == nbytes
    np.testing.assert_array_equal(out[:nbytes], make_payload(nbytes, "c"))
    assert (out[nbytes:] == 0xAB).all()  # nothing written past the payload
    assert store.read_checkpoint(s, out) == nbytes
    np.testing.assert_array_equal(out[:nbytes], make_payload(nbytes, "s"))
    assert direct_used(store)  # ext4 under tmp_path takes O_DIRECT


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_direct_reads_verify_like_buffered_ones(store, damage):
    k = make_key(f"bad-{damage}")
    n = 3 * 4096 + 17
    store.write_chunk(k, make_payload(n, "x"), provenance="p")
    path = store.layout.chunk_path(k)
    with open(path, "r+b") as f:
        if damage == "flip":
            f.seek(4096 + n - 3)
            b = f.read(1)
            f.seek(4096 + n - 3)
            f.write(bytes([b[0] ^ 1]))
        elif damage == "truncate":
            f.truncate(4096 + n - 5)
        else:
            f.seek(0, os.SEEK_END)
            f.write(b"\0" * 7)
    with pytest.raises(CorruptEntry):
        store.read_chunk(k, aligned_buffer(n + 4096))
    assert not store.has_chunk(k)  # quarantined


def test_read_many_reads_in_parallel_and_yields_in_order(store):
    keys = [make_key(i) for i in range(9)]
    for i, k in enumerate(keys):
        store.write_chunk(k, make_payload(5000 + i, i), provenance="p")
    ring = [aligned_buffer(8192) for _ in range(3)]
    seen = []
    for i, n in store.read_many([Read(k, False, ring[i % 3]) for i, k in enumerate(keys)],
                                ahead=3):
        seen.append(i)
        assert n == 5000 + i
        np.testing.assert_array_equal(ring[i % 3][:n], make_payload(n, i))
    assert seen == list(range(9))


def test_read_many_raises_the_first_failure_in_order(store):
    keys = [make_key(f"m{i}") for i in range(4)]
    for i, k in enumerate(keys):
        if i != 2:
            store.write_chunk(k, make_payload(100, i), provenance="p")
    seen = []
    with pytest.raises(Exception, match="chunk"):
        for i, _ in store.read_many([Read(k, False, aligned_buffer(4096)) for k in keys]):
            seen.append(i)
    assert seen == [0, 1]
