"""Views of vLLM's paged KV cache the copies address, checked once at start-up.

A page is one block of one layer: `tensor[b]` of an int8 tensor `[num_blocks, page_bytes]`,
one contiguous run of bytes; the block stride may be larger than the page (hybrid models
share one tensor between attention and state layers; block-outer layouts such as BLHNC
interleave layers). Every copy (vLLM's swap op, the Triton kernels, the torch fallback)
moves a page as that one run, so a layout where a block's bytes are not contiguous (LHBNC,
which ROCm attention backends prefer: heads outside blocks) would drop or misplace bytes.
The connector therefore asks vLLM for its canonical layout (LBHNC), and these checks stop
start-up with a clear error if the tensors it is given are anything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

# One layer's pages in a group: (cache tensor [num_blocks, page] int8, bytes, offset in key)
View = tuple[torch.Tensor, int, int]


class PageRef(Protocol):
    """What a group's layer says of its pages (vLLM's `CanonicalKVCacheRef` has both)."""

    tensor_idx: int
    page_size_bytes: int


class LayoutError(ValueError):
    """The KV cache tensors are not laid out as whole contiguous pages per block."""


def dense_page(block: torch.Tensor) -> bool:
    """Whether the elements of one block's page (`tensor[b]`, any shape) are one contiguous
    run: its dims, innermost first by stride, each exactly as wide as the ones inside it."""
    dims = sorted((s, n) for s, n in zip(block.stride(), block.shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def check_block_pages(tensor: torch.Tensor, name: str) -> None:
    """LayoutError unless every block of `tensor` (block dim first) is one contiguous page
    that no other block overlaps."""
    if tensor.dim() < 2:
        raise LayoutError(f"{name}: a paged cache has a block dimension and a page, "
                          f"got shape {tuple(tensor.shape)}")
    page = tensor[0]
    if not dense_page(page):
        raise LayoutError(
            f"{name}: a block's page is not one contiguous run of bytes (shape "
            f"{tuple(tensor.shape)}, strides {tensor.stride()}); HiState copies whole pages "
            "and needs vLLM's canonical KV cache layout LBHNC (heads inside blocks). An "
            "attention backend that keeps heads outside blocks (LHBNC) cannot be used with it"
        )
    if tensor.shape[0] > 1 and abs(tensor.stride(0)) < page.numel():
        raise LayoutError(
            f"{name}: block stride {tensor.stride(0)} elements is smaller than a page of "
            f"{page.numel()}: blocks overlap (strides {tensor.stride()})"
        )


def check_page_view(tensor: torch.Tensor, page_bytes: int, name: str) -> None:
    """LayoutError unless `tensor` is an int8 `[num_blocks, page]` view with contiguous
    pages at least `page_bytes` long and apart (torch itself keeps a view inside its
    storage)."""
    if tensor.dim() != 2 or tensor.element_size() != 1:
        raise LayoutError(f"{name}: expected an int8 [num_blocks, page] view, got "
                          f"{tensor.dtype} {tuple(tensor.shape)}")
    blocks, page = tensor.shape
    if page > 1 and tensor.stride(1) != 1:
        raise LayoutError(f"{name}: page bytes are strided ({tensor.stride()}); "
                          "HiState needs contiguous pages (vLLM's layout LBHNC)")
    if page_bytes > page:
        raise LayoutError(f"{name}: layer page of {page_bytes} bytes in a {page}-byte view")
    if blocks > 1 and tensor.stride(0) < page:
        raise LayoutError(f"{name}: block stride {tensor.stride(0)} < page {page}: "
                          "blocks overlap")


def group_views(tensors: Sequence[torch.Tensor], group_refs: Sequence[Sequence[PageRef]],
                key_bytes: int) -> list[list[View]]:
    """Per offloaded group, each layer's (page view, bytes, offset in the key), laid end to
    end, every view checked; LayoutError when one does not fit what the copies assume."""
    for i, t in enumerate(tensors):
        check_page_view(t, 0, f"KV cache tensor {i}")
    groups = []
    for g, refs in enumerate(group_refs):
        views, offset = [], 0
        for ref in refs:
            tensor = tensors[ref.tensor_idx]
            check_page_view(tensor, ref.page_size_bytes, f"group {g}, tensor {ref.tensor_idx}")
            views.append((tensor, ref.page_size_bytes, offset))
            offset += ref.page_size_bytes
        if offset > key_bytes:
            raise LayoutError(f"group {g} needs {offset} bytes per key, a slot has {key_bytes}")
        groups.append(views)
    return groups


def blocks_from_pointers(groups: Sequence[Sequence[View]], ptrs, sizes,
                         group_block_counts: Sequence[int],
                         group_data_ref_counts: Sequence[int]) -> tuple[list[int], list[int]]:
    """(blocks per group, block ids) of a job given as resolved page addresses.

    vLLM 0.34 hands workers `DevicePointers`: for each group, for each layer of the group,
    for each block, the address and size of its page (`base + block * block_stride`). The
    copies here address pages by block id, so this inverts that: block ids from the first
    layer's addresses, then every address and size of every layer checked against them. An
    address that is not one of this worker's pages (another layout, a foreign tensor) is a
    LayoutError, never a copy to the wrong place."""
    ptrs = np.asarray(ptrs, dtype=np.uint64)
    sizes = np.asarray(sizes, dtype=np.uint64)
    if len(group_block_counts) != len(groups):
        raise LayoutError(f"a job for {len(group_block_counts)} groups, this worker has "
                          f"{len(groups)}")
    counts, ids, at = [], [], 0
    for g, (n, refs) in enumerate(zip(group_block_counts, group_data_ref_counts)):
        counts.append(n)
        if n == 0:
            continue
        views = groups[g]
        if refs != len(views):
            raise LayoutError(f"group {g}: a job with {refs} layers, this worker has "
                              f"{len(views)}")
        tensor = views[0][0]
        base, stride = np.uint64(tensor.data_ptr()), tensor.stride(0)
        first = ptrs[at:at + n]
        offset = first - base  # wraps for an address below the tensor: caught below
        block = (offset // np.uint64(stride)).astype(np.int64)
        if ((offset % np.uint64(stride)).any() or (block < 0).any()
                or (block >= tensor.shape[0]).any()):
            raise LayoutError(f"group {g}: a page address outside this worker's cache")
        for r, (view, page_bytes, _) in enumerate(views):
            want = np.uint64(view.data_ptr()) + block.astype(np.uint64) * np.uint64(view.stride(0))
            run = slice(at + r * n, at + (r + 1) * n)
            if not np.array_equal(ptrs[run], want) or (sizes[run] != page_bytes).any():
                raise LayoutError(f"group {g}, layer {r}: page addresses or sizes differ "
                                  "from this worker's layout")
        ids.extend(block.tolist())
        at += n * refs
    if at != len(ptrs):
        raise LayoutError(f"{len(ptrs)} page addresses for {at} pages")
    return counts, ids
