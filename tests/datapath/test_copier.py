"""PageCopier on a CPU (no vllm): every layer of every key copied to host rows and back,
with the kernels and with the swap path (on a CPU the worker's: one memmove per page)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))
from store_helpers import make_payload  # noqa: E402

from histate_vllm.datapath.copier import PageCopier, host_swap_blocks_batch  # noqa: E402

NUM_BLOCKS = 16
# Two layers per key, of different sizes; the second cache has padding after each page.
PAGES = (1024, 512)
KEY_BYTES = sum(PAGES)


def key_bytes_of(caches, block: int) -> np.ndarray:
    return np.concatenate([c[block].numpy().view(np.uint8) for c in caches])


def fill_block(caches, block: int, payload: np.ndarray) -> None:
    caches[0][block] = torch.from_numpy(payload[:PAGES[0]].view(np.int8))
    caches[1][block] = torch.from_numpy(payload[PAGES[0]:].view(np.int8))


@pytest.mark.parametrize("backend", ["swap", "kernels", "staged"])
def test_copier_moves_every_layer_of_every_key_both_ways(backend):
    """"staged" is the kernels path a GPU takes (through a device buffer and whole-row
    copies), forced on the CPU, where its copies run synchronously."""
    caches = [torch.zeros((NUM_BLOCKS, PAGES[0]), dtype=torch.int8),
              torch.zeros((NUM_BLOCKS, PAGES[1] + 64), dtype=torch.int8)[:, :PAGES[1]]]
    groups = [[(caches[0], PAGES[0], 0), (caches[1], PAGES[1], PAGES[0])]]
    copier = PageCopier(groups, backend="swap" if backend == "swap" else "kernels",
                        swap_fn=host_swap_blocks_batch if backend == "swap" else None,
                        staged=backend == "staged")
    assert copier.backend == ("swap" if backend == "swap" else "kernels")
    rows = torch.zeros((6, KEY_BYTES), dtype=torch.int8)
    for b in (1, 8, 15):
        fill_block(caches, b, make_payload(KEY_BYTES, b))
    batch = copier.batch([(0, [15, 1, 8], [4, 0, 2])], rows, to_host=True)
    assert batch.nbytes == 3 * KEY_BYTES
    batch()
    for b, r in ((15, 4), (1, 0), (8, 2)):
        np.testing.assert_array_equal(rows[r].numpy().view(np.uint8), make_payload(KEY_BYTES, b))
    assert not rows[1].any() and not rows[3].any() and not rows[5].any()
    pad = caches[1].as_strided((NUM_BLOCKS, PAGES[1] + 64), (PAGES[1] + 64, 1)).clone()
    copier.batch([(0, [3, 11], [4, 2])], rows, to_host=False)()
    np.testing.assert_array_equal(key_bytes_of(caches, 3), make_payload(KEY_BYTES, 15))
    np.testing.assert_array_equal(key_bytes_of(caches, 11), make_payload(KEY_BYTES, 8))
    after = caches[1].as_strided((NUM_BLOCKS, PAGES[1] + 64), (PAGES[1] + 64, 1))
    assert torch.equal(after[:, PAGES[1]:], pad[:, PAGES[1]:])  # padding never written


def test_staged_copies_whole_padded_rows_in_runs_cut_at_registration_breaks():
    """Host rows padded to 4 KiB (HostRows): the staged path copies runs of whole rows, one
    contiguous range each, never across a registration break, and every key lands in its
    own row; bytes of a row past the group's pages are zeroed, not left stale."""
    from histate_vllm.datapath import copier as copier_mod
    from histate_vllm.datapath.hostmem import HostRows

    small = 100  # a group narrower than the row: a second group of 100-byte pages
    caches = [torch.zeros((NUM_BLOCKS, PAGES[0]), dtype=torch.int8),
              torch.zeros((NUM_BLOCKS, PAGES[1] + 64), dtype=torch.int8)[:, :PAGES[1]],
              torch.zeros((NUM_BLOCKS, small), dtype=torch.int8)]
    groups = [[(caches[0], PAGES[0], 0), (caches[1], PAGES[1], PAGES[0])],
              [(caches[2], small, 0)]]
    rows = HostRows(8, KEY_BYTES, pin=False)
    rows.tensor.fill_(9)
    copier = PageCopier(groups, staged=True)
    for b in range(NUM_BLOCKS):
        fill_block(caches, b, make_payload(KEY_BYTES, b))
        caches[2][b] = torch.from_numpy(make_payload(small, 100 + b).view(np.int8))
    assert copier_mod._runs(np.array([1, 2, 3, 5, 6, 7]), {6}) == [(0, 3, 1), (3, 4, 5),
                                                                  (4, 6, 6)]
    copier.batch([(0, [4, 9, 2, 7], [3, 1, 2, 6]), (1, [11], [7])], rows.tensor,
                 to_host=True, breaks=[2])()
    for b, r in ((4, 3), (9, 1), (2, 2), (7, 6)):
        np.testing.assert_array_equal(rows.array[r].view(np.uint8), make_payload(KEY_BYTES, b))
    np.testing.assert_array_equal(rows.array[7, :small].view(np.uint8),
                                  make_payload(small, 111))
    assert not rows.array[7, small:].any()  # zeroed past the group's pages
    assert (rows.array[[0, 4, 5]] == 9).all()  # rows not in the job untouched
    for c in caches:
        c.zero_()
    copier.batch([(0, [13, 0, 5], [6, 1, 3]), (1, [8], [7])], rows.tensor, to_host=False,
                 breaks=[2])()
    for b, r in ((13, 7), (0, 9), (5, 4)):
        np.testing.assert_array_equal(key_bytes_of(caches[:2], b), make_payload(KEY_BYTES, r))
    np.testing.assert_array_equal(caches[2][8].numpy().view(np.uint8), make_payload(small, 111))
    assert not caches[0][[1, 2, 3]].any()


def test_swap_backend_needs_the_op():
    with pytest.raises(ValueError, match="swap_blocks_batch"):
        PageCopier([[(torch.zeros(2, 8, dtype=torch.int8), 8, 0)]], backend="swap")


@pytest.mark.parametrize("to_host", [True, False])
def test_swap_refuses_an_index_out_of_range_before_copying(to_host):
    """The swap path copies by raw address: a bad block or row must raise, not write past
    the cache or the DRAM pool (an index op would have raised by itself)."""
    cache = torch.zeros((NUM_BLOCKS, 8), dtype=torch.int8)
    rows = torch.zeros((4, 8), dtype=torch.int8)
    copier = PageCopier([[(cache, 8, 0)]], swap_fn=host_swap_blocks_batch)
    for blocks, row_idx in (([NUM_BLOCKS], [0]), ([0], [4]), ([-1], [0]), ([1, 2], [3, -1])):
        with pytest.raises(IndexError, match="out of range"):
            copier.batch([(0, blocks, row_idx)], rows, to_host=to_host)()
    assert not cache.any() and not rows.any()
