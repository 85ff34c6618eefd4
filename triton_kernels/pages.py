"""The byte view both backends share: a paged cache as `[num_blocks, page_bytes]` uint8 rows."""

from __future__ import annotations

import torch


def page_rows(cache: torch.Tensor) -> torch.Tensor:
    """`cache` viewed as uint8 rows, one per block, sharing its storage (never a copy)."""
    if cache.dim() < 2:
        raise ValueError("a paged cache has a block dimension and a page")
    rows = cache.view(cache.shape[0], -1)  # raises rather than copy when a page is strided
    if rows.shape[1] > 1 and rows.stride(1) != 1:
        raise ValueError("each page must be contiguous")
    return rows.view(torch.uint8)


def byte_range(rows: torch.Tensor, offset: int, nbytes: int | None) -> tuple[int, int]:
    page = rows.shape[1]
    if nbytes is None:
        nbytes = page - offset
    if offset < 0 or nbytes < 0 or offset + nbytes > page:
        raise ValueError(f"byte range [{offset}, {offset}+{nbytes}) outside a {page}-byte page")
    return offset, nbytes


def block_ids(ids, device: torch.device) -> torch.Tensor:
    idx = torch.as_tensor(ids, dtype=torch.int64).contiguous()
    if device.type == "cpu" or idx.device == device:
        return idx.to(device)
    # From pinned memory, without waiting: a plain .to(device) syncs the current stream,
    # which stalls the calling thread behind every kernel queued before the copy.
    return idx.pin_memory().to(device, non_blocking=True)


def out_rows(out: torch.Tensor, count: int, nbytes: int) -> torch.Tensor:
    """A caller's destination buffer as `[count, nbytes]` uint8, sharing its storage."""
    if not out.is_contiguous() or out.numel() * out.element_size() != count * nbytes:
        raise ValueError(f"out must be a contiguous buffer of {count} x {nbytes} bytes")
    return out.view(-1).view(torch.uint8).view(count, nbytes)


def word_size(rows: torch.Tensor, offset: int, nbytes: int, *buffers: torch.Tensor) -> int:
    """The widest element (8, 4, 2 or 1 bytes) that every address and length is a multiple of."""
    items = [offset, nbytes, rows.stride(0), rows.data_ptr()]
    items += [b.data_ptr() for b in buffers]
    for w in (8, 4, 2, 1):
        if all(x % w == 0 for x in items):
            return w
    return 1


WORDS_ONLY = "the checksum reads 32-bit words: offset and nbytes must be multiples of 4"

WORD_DTYPE = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
