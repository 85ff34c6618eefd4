"""The Triton kernels. One program moves or sums one BLOCK-element chunk of one page.

Pages are addressed in the widest word their offsets allow (see pages.word_size), so a
4-byte-aligned range moves as int32/int64 loads rather than bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pages import WORDS_ONLY as _WORDS_ONLY
from .pages import WORD_DTYPE, block_ids, byte_range, out_rows, page_rows, word_size

BLOCK = 1024
_M32 = 1 << 32  # host side
# The same in the kernel. A jit function may read a module global only if it is a
# tl.constexpr: compiling for a GPU refuses a plain int ("Cannot access global variable"),
# though the interpreter allows it. Too big for int32, so Triton types it as int64.
_M32_K: tl.constexpr = tl.constexpr(1 << 32)


@triton.jit
def _gather(rows, ids, out, stride, off, n, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    page = tl.load(ids + i).to(tl.int64) * stride + off  # int64: caches exceed 2**31 words
    v = tl.load(rows + page + offs, mask=mask)
    tl.store(out + i.to(tl.int64) * n + offs, v, mask=mask)


@triton.jit
def _scatter(rows, ids, buf, stride, off, n, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    page = tl.load(ids + i).to(tl.int64) * stride + off
    v = tl.load(buf + i.to(tl.int64) * n + offs, mask=mask)
    tl.store(rows + page + offs, v, mask=mask)


@triton.jit
def _checksum(rows, ids, part, stride, off, n, nchunks, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    page = tl.load(ids + i).to(tl.int64) * stride + off
    w = tl.load(rows + page + offs, mask=mask, other=0).to(tl.int64)
    w = tl.where(w < 0, w + _M32_K, w)  # the int32 word read as unsigned
    pos = (offs + 1).to(tl.int64)
    # Partial sums stay below 2**63 (BLOCK terms < 2**32 each); the host folds them mod 2**32.
    a = tl.sum(w, axis=0)
    b = tl.sum((w * pos) % _M32_K, axis=0)
    slot = part + (i.to(tl.int64) * nchunks + c) * 2
    tl.store(slot, a)
    tl.store(slot + 1, b)


def _words(cache, offset, nbytes, *buffers):
    rows = page_rows(cache)
    offset, nbytes = byte_range(rows, offset, nbytes)
    w = word_size(rows, offset, nbytes, *buffers)
    # Cut each row at the range's end so an odd page size does not block the wider view.
    return rows[:, :offset + nbytes].view(WORD_DTYPE[w]), offset // w, nbytes // w, w


def gather_pages(cache, ids, offset=0, nbytes=None, out=None, block=BLOCK) -> torch.Tensor:
    rows = page_rows(cache)
    offset, nbytes = byte_range(rows, offset, nbytes)
    idx = block_ids(ids, rows.device)
    if out is None:
        out = torch.empty(len(idx), nbytes, dtype=torch.uint8, device=rows.device)
    dst = out_rows(out, len(idx), nbytes)
    words, off, n, w = _words(cache, offset, nbytes, dst)
    if len(idx) and n:
        grid = (len(idx), triton.cdiv(n, block))
        _gather[grid](words, idx, dst.view(WORD_DTYPE[w]), words.stride(0), off, n, BLOCK=block)
    return out


def scatter_pages(cache, ids, buf, offset=0, nbytes=None, block=BLOCK) -> None:
    rows = page_rows(cache)
    offset, nbytes = byte_range(rows, offset, nbytes)
    idx = block_ids(ids, rows.device)
    src = buf.reshape(-1).view(torch.uint8).view(len(idx), nbytes)
    words, off, n, w = _words(cache, offset, nbytes, src)
    if len(idx) and n:
        grid = (len(idx), triton.cdiv(n, block))
        _scatter[grid](words, idx, src.view(WORD_DTYPE[w]), words.stride(0), off, n, BLOCK=block)


def checksum_pages(cache, ids, offset=0, nbytes=None, block=BLOCK) -> torch.Tensor:
    rows = page_rows(cache)
    offset, nbytes = byte_range(rows, offset, nbytes)
    if offset % 4 or nbytes % 4 or rows.stride(0) % 4 or rows.data_ptr() % 4:
        raise ValueError(_WORDS_ONLY)
    idx = block_ids(ids, rows.device)
    words, n = rows[:, :offset + nbytes].view(torch.int32), nbytes // 4
    nchunks = max(1, triton.cdiv(n, block))
    part = torch.zeros(len(idx), nchunks, 2, dtype=torch.int64, device=rows.device)
    if len(idx) and n:
        _checksum[(len(idx), nchunks)](
            words, idx, part, words.stride(0), offset // 4, n, nchunks, BLOCK=block
        )
    a = part[..., 0].sum(1) % _M32
    b = part[..., 1].sum(1) % _M32
    return (b << 32) | a
