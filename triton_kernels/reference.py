"""Pure torch (and numpy) versions: the CPU backend and the definition the Triton kernels match."""

from __future__ import annotations

import numpy as np
import torch

from .pages import WORDS_ONLY as _WORDS_ONLY
from .pages import block_ids, byte_range, out_rows, page_rows

_M32 = 1 << 32


def gather_pages(cache, ids, offset=0, nbytes=None, out=None) -> torch.Tensor:
    rows = page_rows(cache)
    offset, nbytes = byte_range(rows, offset, nbytes)
    idx = block_ids(ids, rows.device)
    if out is None:
        return rows[:, offset:offset + nbytes].index_select(0, idx)
    torch.index_select(rows[:, offset:offset + nbytes], 0, idx, out=out_rows(out, len(idx), nbytes))
    return out


def scatter_pages(cache, ids, buf, offset=0, nbytes=None) -> None:
    rows = page_rows(cache)
    offset, nbytes = byte_range(rows, offset, nbytes)
    idx = block_ids(ids, rows.device)
    src = buf.reshape(-1).view(torch.uint8).view(len(idx), nbytes)
    rows[:, offset:offset + nbytes].index_copy_(0, idx, src)  # writes through the view


def checksum_words(words: torch.Tensor) -> torch.Tensor:
    """hs32x2 of each row of `[k, m]` uint32 words (given as int64 in [0, 2**32))."""
    pos = torch.arange(1, words.shape[1] + 1, dtype=torch.int64, device=words.device)
    a = words.sum(1) % _M32  # m < 2**31 words of < 2**32: no int64 overflow
    b = ((words * pos) % _M32).sum(1) % _M32
    return (b << 32) | a  # bit pattern of the unsigned 64-bit value


def checksum_pages(cache, ids, offset=0, nbytes=None) -> torch.Tensor:
    data = gather_pages(cache, ids, offset, nbytes)
    if offset % 4 or data.shape[1] % 4:
        raise ValueError(_WORDS_ONLY)
    return checksum_words(data.view(torch.int32).to(torch.int64) % _M32)


def checksum_bytes(buf, page_bytes: int) -> np.ndarray:
    """hs32x2 of each `page_bytes` slice of a bytes-like `buf`, as uint64: needs only numpy."""
    w = np.frombuffer(buf, dtype="<u4").reshape(-1, page_bytes // 4).astype(np.uint64)
    pos = np.arange(1, w.shape[1] + 1, dtype=np.uint64)
    a = w.sum(1, dtype=np.uint64) % _M32
    b = ((w * pos) % _M32).sum(1, dtype=np.uint64) % _M32
    return (b << np.uint64(32)) | a
