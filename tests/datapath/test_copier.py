"""PageCopier on a CPU (no vllm): every layer of every key copied to host rows and back,
with the kernels and with the swap path, whose descriptors are checked with memmove."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "store"))
from store_helpers import make_payload  # noqa: E402

from histate_vllm.datapath.copier import PageCopier  # noqa: E402

NUM_BLOCKS = 16
# Two layers per key, of different sizes; the second cache has padding after each page.
PAGES = (1024, 512)
KEY_BYTES = sum(PAGES)


def key_bytes_of(caches, block: int) -> np.ndarray:
    return np.concatenate([c[block].numpy().view(np.uint8) for c in caches])


def fill_block(caches, block: int, payload: np.ndarray) -> None:
    caches[0][block] = torch.from_numpy(payload[:PAGES[0]].view(np.int8))
    caches[1][block] = torch.from_numpy(payload[PAGES[0]:].view(np.int8))


def memmove_batch(src, dst, sizes, is_src_access_order_any=False):
    for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist()):
        ctypes.memmove(d, s, n)


@pytest.mark.parametrize("backend", ["swap", "kernels"])
def test_copier_moves_every_layer_of_every_key_both_ways(backend):
    caches = [torch.zeros((NUM_BLOCKS, PAGES[0]), dtype=torch.int8),
              torch.zeros((NUM_BLOCKS, PAGES[1] + 64), dtype=torch.int8)[:, :PAGES[1]]]
    groups = [[(caches[0], PAGES[0], 0), (caches[1], PAGES[1], PAGES[0])]]
    copier = PageCopier(groups, backend=backend,
                        swap_fn=memmove_batch if backend == "swap" else None)
    assert copier.backend == backend
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
